"""The RL itself learns: from a warm checkpoint that prefers a wrong answer, a few GRPO iterations of the
real loop (sampler, math verifier, advantages, masked update) raise the training reward far above the
same run with the verifier's rewards shuffled (the control). A sign or masking error anywhere on that
path makes the two runs alike, or the real one worse, and fails the margin."""

import os

import numpy as np
import pytest
from flax import nnx

from mathrl_jax.configs import default
from mathrl_jax.data import arithmetic
from mathrl_jax.models import QwenForCausalLM, export_checkpoint, write_tiny_checkpoint
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.train import loop, sft

# One-digit a+b / a-b (155 distinct problems): a small model memorises them in seconds.
LEVEL = 1
RIGHT_FRACTION = 0.3  # the warm-start's teacher writes the right answer this often, else its negation


def noisy_examples(codec, problems, seed):
    """The warm-start's imitation data: "\\boxed{answer}" 30% of the time, "\\boxed{-answer}" otherwise.

    One slip shared by every problem (a "-" sign), as the default's teacher drops every carry alike: what RL
    learns on some prompts carries over to the others.
    """
    rng = np.random.default_rng(seed)
    examples = []
    for problem in problems:
        if problem.answer == "0":  # -0 is 0: no slip to make
            continue
        sign = "" if rng.random() < RIGHT_FRACTION else "-"
        target = codec.encode(f"\\boxed{{{sign}{problem.answer}}}") + [codec.eos_token_id]
        examples.append((codec.encode(problem.question), target))
    return examples


@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory):
    """A small checkpoint that puts about 70% of its probability on a wrong sign and 30% on the right answer."""
    root = tmp_path_factory.mktemp("learning")
    initial = os.path.join(root, "initial")
    config = write_tiny_checkpoint(
        initial,
        seed=0,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
    )
    codec = TextCodec(initial)
    problems = arithmetic.arithmetic_problems(2000, seed=1, level=LEVEL, question_format="{expr}=")
    model = QwenForCausalLM(config, rngs=nnx.Rngs(0))
    state = sft.supervised_warmstart(
        model,
        noisy_examples(codec, problems, seed=0),
        steps=300,
        batch_size=32,
        learning_rate=3e-3,
        warmup_steps=20,
        seed=0,
        pad_id=codec.pad_token_id,
    )
    warm = os.path.join(root, "warm")
    export_checkpoint(state, config, warm, tokenizer_dir=initial)
    return warm


def rl_config(model_dir, run_dir, **overrides):
    config = default.get_config()
    config.model_name_or_path = model_dir
    config.run_dir = str(run_dir)
    config.warmstart.steps = 0
    config.arithmetic.levels = (LEVEL,)
    config.arithmetic.num_train = 512
    config.arithmetic.num_eval = 8
    config.num_eval_problems = 8
    config.n_rollout_threads = 16
    config.group_size = 8
    config.max_new_tokens = 12
    config.num_iterations = 12
    config.num_mini_batch = 2
    config.lr = 3e-4
    config.warmup_steps = 0
    config.eval_interval = 0
    config.save_interval = 0
    config.export_final = False
    config.progress = False
    config.reward.num_workers = 1
    config.update(overrides)
    return config


def training_accuracy(config):
    history = []
    loop.train(config, on_metrics=lambda i, m: history.append(m["rollout/accuracy"]))
    return np.asarray(history)


def test_rl_beats_the_shuffled_reward_control(warm_dir, tmp_path):
    real = training_accuracy(rl_config(warm_dir, tmp_path / "real"))
    control = training_accuracy(rl_config(warm_dir, tmp_path / "control", shuffle_rewards=True))
    # Both start from the same checkpoint on the same prompts and samples: the first iteration is identical.
    assert real[0] == control[0]
    assert 0.03 < real[0] < 0.6, real  # the warm-start leaves room: mostly wrong, right answers within reach
    last = slice(-3, None)  # 3 iterations x 128 samples: about +-0.05 of sampling noise
    assert real[last].mean() > real[0] + 0.2, (real, control)
    assert real[last].mean() > control[last].mean() + 0.2, (real, control)
    assert control[last].mean() < control[:3].mean() + 0.1, control  # no information, no gain


# One algorithm per family, the same warm checkpoint and margin: what a family's own machinery could break (a
# critic fit on the wrong entries, GAE's credit on the wrong tokens; advantages or ratios from a stale policy
# version) makes the run no better than its control. Slow: two runs each, over CI's budget beside the rest.
FAMILIES = {
    "critic": {"algorithm_name": "ppo", "group_size": 1, "n_rollout_threads": 128, "critic_lr": 1e-3},
    "asynchronous": {"algorithm_name": "async_ppo", "max_head_offpolicyness": 2},
}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_beats_its_control(family, warm_dir, tmp_path):
    real = training_accuracy(rl_config(warm_dir, tmp_path / "real", **FAMILIES[family]))
    control = training_accuracy(rl_config(warm_dir, tmp_path / "control", shuffle_rewards=True, **FAMILIES[family]))
    assert 0.03 < real[0] < 0.6, real
    last = slice(-3, None)
    assert real[last].mean() > real[0] + 0.2, (real, control)
    assert real[last].mean() > control[last].mean() + 0.2, (real, control)
