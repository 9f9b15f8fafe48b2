"""The RL itself learns: from a warm checkpoint that prefers a wrong answer, a few GRPO iterations of the
real loop (sampler, math verifier, advantages, masked update) raise the training reward far above the
same run with the verifier's rewards shuffled (the control). A sign or masking error anywhere on that
path makes the two runs alike, or the real one worse, and fails the margin."""

import os
import shutil

import numpy as np
import pytest
from flax import nnx

from mathrl_jax.configs import default
from mathrl_jax.data import arithmetic
from mathrl_jax.models import QwenForCausalLM, export_checkpoint, write_tiny_checkpoint
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.train import loop
from mathrl_jax.train.warmstart import _sft as sft

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


@pytest.fixture(scope="module")
def carry_warm_dir(tmp_path_factory):
    """The offline default's warm-start, as the build makes it: the tiny model imitating the teacher that works
    two-digit a+b / a-b column by column ("7+8=15,5+3+1=9,\\boxed{95}") and drops the carry 70% of the time."""
    from mathrl_jax.train.setup import _sections as sections
    from mathrl_jax.train.warmstart._warmstart import warmstart_examples

    root = tmp_path_factory.mktemp("carry")
    initial = os.path.join(root, "initial")
    model_config = write_tiny_checkpoint(initial, seed=0)
    codec = TextCodec(initial)
    config = default.get_config()
    settings = sections.warmstart_settings(config)
    problems = arithmetic.arithmetic_problems(4000, seed=1, level=2, question_format="{expr}=")
    state = sft.supervised_warmstart(
        QwenForCausalLM(model_config, rngs=nnx.Rngs(0)),
        warmstart_examples(settings, codec, problems),
        steps=settings.steps,
        batch_size=settings.batch_size,
        learning_rate=settings.lr,
        warmup_steps=settings.warmup_steps,
        seed=0,
        pad_id=codec.pad_token_id,
    )
    warm = os.path.join(root, "warm")
    export_checkpoint(state, model_config, warm, tokenizer_dir=initial)
    return warm


@pytest.mark.slow
def test_step_level_process_rewards_alone_beat_their_control(carry_warm_dir, tmp_path):
    """APPO (OpenR: an action per reasoning step, action-level GAE, a critic) trained on the process verifier's
    step scores alone, no outcome reward: the slip (a dropped carry) is one step's fault, so the credit must reach
    that step. A split in the wrong place, or step scores on the wrong actions, leaves it no better than the
    control (the step scores shuffled across responses)."""
    steps = dict(
        algorithm_name="appo",
        prm_model_name_or_path="arithmetic_steps",
        reward_source="prm",
        step_separator=",",
        group_size=1,
        n_rollout_threads=128,
        max_new_tokens=40,
        lr=3e-5,
        critic_lr=1e-3,
    )

    def run(name, **extra):
        config = rl_config(carry_warm_dir, tmp_path / name, **steps, **extra)
        config.arithmetic.levels = (2,)
        return training_accuracy(config)

    real, control = run("real"), run("control", shuffle_rewards=True)
    assert 0.2 < real[0] < 0.8, real  # the warm-start drops most carries
    last = slice(-3, None)
    assert real[last].mean() > real[0] + 0.15, (real, control)
    assert real[last].mean() > control[last].mean() + 0.15, (real, control)


@pytest.mark.slow
def test_multi_turn_rebn_beats_its_control_on_the_offline_game(tmp_path):
    """The offline game (configs/guess_number_tiny.py): a warm-start on the binary-search teacher's games (which
    slips to the smallest candidate 70% of the time), then REINFORCE with ReBN over whole games. The greedy success
    rate on held-out games rises over the control's (each turn's reward given to another turn). Advantages on the
    wrong turns (a turn mask shifted by one), or returns that do not reach the turns before the win, leave the
    policy no better than the control."""
    from mathrl_jax.configs import guess_number_tiny

    def config(name, **extra):
        c = guess_number_tiny.get_config()
        c.update(run_dir=str(tmp_path / name), progress=False, save_interval=0, export_final=False, **extra)
        c.num_eval_problems = 100
        c.reward.num_workers = 1
        return c

    real = loop.train(config("real"))
    shutil.copytree(tmp_path / "real" / "initial_model", tmp_path / "control" / "initial_model")
    shutil.copytree(tmp_path / "real" / "warmstart_model", tmp_path / "control" / "warmstart_model")
    control = loop.train(config("control", shuffle_rewards=True))
    real_curve = [accuracy for _, accuracy in real["eval"]]
    control_curve = [accuracy for _, accuracy in control["eval"]]
    assert real_curve[0] == control_curve[0] < 0.6, (real_curve, control_curve)  # the same warm-started policy
    assert real_curve[-1] > real_curve[0] + 0.15, (real_curve, control_curve)
    assert real_curve[-1] > control_curve[-1] + 0.15, (real_curve, control_curve)
