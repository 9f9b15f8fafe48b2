"""Supervised warm-start: the batch layout against `Rollouts.to_batch`, the loss against a NumPy
cross-entropy of unpadded forward passes, padding invariance, training progress and determinism."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mathrl_jax.data.arithmetic import arithmetic_problems
from mathrl_jax.models import QwenForCausalLM, char_tokenizer, tiny_config
from mathrl_jax.sampling import Rollouts
from mathrl_jax.train.warmstart._sft import (
    example_order,
    sft_batch,
    sft_examples,
    sft_loss,
    sft_optimizer,
    sft_schedule,
    supervised_warmstart,
)

# A 2-layer, narrow model: compiles in about a second on CPU.
CONFIG = tiny_config(
    num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1
)
EOS, PAD = 2, 0
TOKENIZER = char_tokenizer.build_char_tokenizer()
PROBLEMS = arithmetic_problems(24, seed=3, level=1, question_format="{expr}=", unique=True)
EXAMPLES = sft_examples(PROBLEMS, TOKENIZER, EOS)


@functools.lru_cache(maxsize=None)
def peaked_state(seed=0):
    """(graphdef, state) with weights scaled up so logits are far from uniform (no argmax ties)."""
    graphdef, state = nnx.split(QwenForCausalLM(CONFIG, rngs=nnx.Rngs(seed)))
    return graphdef, jax.tree.map(lambda x: x * 6.0 if x.ndim == 2 else x, state)


LOSS = jax.jit(sft_loss, static_argnums=0)
WIDTH = 32  # every unpadded reference forward is right-padded to one width: one compiled program


@functools.partial(jax.jit, static_argnums=0)
def forward(graphdef, state, ids):
    return nnx.merge(graphdef, state)(ids)[0]


def leaves_equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# ------------------------------------------------------------------------------------ sft_examples / sft_batch


def test_sft_examples_encode_the_boxed_answer_and_eos():
    for problem, (prompt, target) in zip(PROBLEMS, EXAMPLES):
        assert TOKENIZER.decode(prompt) == problem.question
        assert len(prompt) == len(problem.question)  # one id per character
        assert target[-1] == EOS
        assert TOKENIZER.decode(target[:-1]) == "\\boxed{" + problem.answer + "}"


def test_sft_batch_matches_rollouts_to_batch_layout():
    prompts = [p for p, _ in EXAMPLES[:5]] + [[7]]
    targets = [t for _, t in EXAMPLES[:5]] + [[9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, EOS]]
    batch = sft_batch(prompts, targets, PAD)
    zeros = [np.zeros(len(t), np.float32) for t in targets]
    reference = Rollouts(
        prompt_ids=prompts,
        completion_ids=targets,
        logprobs=zeros,
        policy_logprobs=zeros,
        finish_reasons=["stop"] * len(prompts),
        stop_reasons=[EOS] * len(prompts),
        prompt_indices=np.arange(len(prompts), dtype=np.int32),
        policy_version=0,
    ).to_batch(PAD)
    for key in ("input_ids", "attention_mask", "response_mask", "prompt_length"):
        np.testing.assert_array_equal(batch[key], reference[key], err_msg=key)
        assert batch[key].dtype == reference[key].dtype, key
    # The layout itself: prompt i ends at column P, its target starts there.
    p = int(batch["prompt_length"])
    for i, (prompt, target) in enumerate(zip(prompts, targets)):
        row = batch["input_ids"][i]
        assert row[p - len(prompt) : p].tolist() == prompt
        assert row[p : p + len(target)].tolist() == target
        assert batch["response_mask"][i].sum() == len(target)
        assert batch["attention_mask"][i].sum() == len(prompt) + len(target)


def test_sft_batch_fixed_widths_and_errors():
    prompts, targets = [EXAMPLES[0][0]], [EXAMPLES[0][1]]
    batch = sft_batch(prompts, targets, PAD, prompt_length=10, max_length=30)
    assert batch["input_ids"].shape == (1, 30)
    assert batch["input_ids"][0, 10 : 10 + len(targets[0])].tolist() == targets[0]
    assert (batch["input_ids"][0, 10 + len(targets[0]) :] == PAD).all()
    with pytest.raises(ValueError, match="prompt_length=2"):
        sft_batch(prompts, targets, PAD, prompt_length=2)
    with pytest.raises(ValueError, match="max_length=12"):
        sft_batch(prompts, targets, PAD, prompt_length=10, max_length=12)
    with pytest.raises(ValueError, match=r"target_ids\[1\] is empty"):
        sft_batch([[5], [6]], [[7], []], PAD)
    with pytest.raises(ValueError, match="2 prompts but 1 targets"):
        sft_batch([[5], [6]], [[7]], PAD)
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] has negative token ids \[-4\]"):
        sft_batch([[5, -4]], [[7]], PAD)


# ------------------------------------------------------------------------------------ sft_loss


def numpy_reference(graphdef, state, examples):
    """Token-mean cross-entropy and argmax accuracy of the targets, from float64 log-softmax of
    one forward pass per example with no left padding."""
    nll, correct = [], []
    for prompt, target in examples:
        # Causal attention: tokens after the sequence cannot change its logits.
        ids = np.zeros((1, WIDTH), np.int32)
        ids[0, : len(prompt) + len(target)] = prompt + target
        logits = np.asarray(forward(graphdef, state, ids)[0], np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        for t, token in enumerate(target):
            row = len(prompt) + t - 1  # the logits before the token
            nll.append(-log_softmax[row, token])
            correct.append(np.argmax(logits[row]) == token)
    return float(np.mean(nll)), float(np.mean(correct))


def test_sft_loss_equals_numpy_cross_entropy():
    graphdef, state = peaked_state()
    examples = EXAMPLES[:6]
    batch = sft_batch([p for p, _ in examples], [t for _, t in examples], PAD)
    loss, metrics = LOSS(graphdef, state, batch)
    expected_loss, expected_accuracy = numpy_reference(graphdef, state, examples)
    assert loss.dtype == jnp.float32
    np.testing.assert_allclose(float(loss), expected_loss, rtol=2e-5)
    np.testing.assert_allclose(float(metrics["loss"]), expected_loss, rtol=2e-5)
    np.testing.assert_allclose(float(metrics["token_accuracy"]), expected_accuracy, atol=1e-6)
    assert float(metrics["num_tokens"]) == sum(len(t) for _, t in examples)


def test_sft_loss_is_invariant_to_padding():
    graphdef, state = peaked_state()
    prompts, targets = [p for p, _ in EXAMPLES[:6]], [t for _, t in EXAMPLES[:6]]
    tight = sft_batch(prompts, targets, PAD)
    # 7 more columns of left padding before every prompt, right padding to 40, and a row of padding only.
    wide = sft_batch(prompts, targets, PAD, prompt_length=int(tight["prompt_length"]) + 7, max_length=40)
    wide = {
        k: np.concatenate([v, np.full_like(v[:1], PAD if k == "input_ids" else 0)])
        for k, v in wide.items()
        if k != "prompt_length"
    }
    assert wide["input_ids"].shape[1] > tight["input_ids"].shape[1]
    loss_tight, m_tight = LOSS(graphdef, state, tight)
    loss_wide, m_wide = LOSS(graphdef, state, wide)
    np.testing.assert_allclose(float(loss_wide), float(loss_tight), rtol=1e-5)
    assert float(m_wide["token_accuracy"]) == float(m_tight["token_accuracy"])
    assert float(m_wide["sequence_accuracy"]) == float(m_tight["sequence_accuracy"])


# ------------------------------------------------------------------------------------ training


def test_example_order_is_epochs_of_permutations():
    order = example_order(10, steps=7, batch_size=4, seed=5)  # 28 draws: epochs 0, 1 and part of 2
    assert order.shape == (7, 4)
    flat = order.reshape(-1)
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    key = jax.random.key(5)  # epoch e: the permutation of fold_in(key(seed), e)
    epochs = [np.asarray(jax.random.permutation(jax.random.fold_in(key, e), 10)) for e in range(3)]
    np.testing.assert_array_equal(flat, np.concatenate(epochs)[:28])
    np.testing.assert_array_equal(order, example_order(10, steps=7, batch_size=4, seed=5))
    assert not np.array_equal(order, example_order(10, steps=7, batch_size=4, seed=6))


def test_sft_schedule_warmup_then_cosine_or_constant():
    cosine = sft_schedule(1e-3, steps=100, warmup_steps=10)
    assert float(cosine(0)) == 0.0
    np.testing.assert_allclose(float(cosine(5)), 5e-4, rtol=1e-6)
    np.testing.assert_allclose(float(cosine(10)), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(cosine(100)), 1e-4, rtol=1e-5)
    constant = sft_schedule(1e-3, steps=100, warmup_steps=10, schedule="constant")
    np.testing.assert_allclose([float(constant(s)) for s in (5, 10, 99)], [5e-4, 1e-3, 1e-3], rtol=1e-6)
    with pytest.raises(ValueError, match="'linear'"):
        sft_schedule(1e-3, 100, 0, schedule="linear")


def test_constant_schedule_needs_no_length():
    # The warm-start builds its constant-schedule optimizer with steps=0 (one compile for any length).
    optimizer, lr = sft_optimizer(1e-3, 0, 10, "constant", 0.1, 0.0, 1.0)
    np.testing.assert_allclose([float(lr(s)) for s in (0, 5, 10, 10_000)], [0.0, 5e-4, 1e-3, 1e-3], rtol=1e-6)
    params = {"w": jnp.ones(3)}
    updates, _ = optimizer.update({"w": jnp.ones(3)}, optimizer.init(params), params)
    assert float(jnp.abs(updates["w"]).sum()) == 0.0  # step 0 of the warm-up: lr 0


@pytest.fixture(scope="module")
def trained():
    """Two identical runs, and one with another seed, with their logs and evaluation calls."""
    model = QwenForCausalLM(CONFIG, rngs=nnx.Rngs(0))
    before = nnx.state(model)
    before = jax.tree.map(np.array, before)
    kwargs = dict(steps=40, batch_size=8, learning_rate=3e-3, warmup_steps=4, log_every=10)
    logs, evals = [], []
    state_a = supervised_warmstart(
        model,
        EXAMPLES,
        seed=0,
        log_fn=lambda step, m: logs.append((step, m)),
        eval_every=20,
        eval_fn=lambda step, s: evals.append((step, jax.tree.map(np.array, s))),
        **kwargs,
    )
    state_b = supervised_warmstart(nnx.split(model), EXAMPLES, seed=0, **kwargs)
    state_c = supervised_warmstart(model, EXAMPLES, seed=1, **kwargs)
    # eval_fn returning True stops the run there.
    stopped_at = []
    state_d = supervised_warmstart(
        model, EXAMPLES, seed=0, eval_every=10, eval_fn=lambda step, s: stopped_at.append(step) or step == 20, **kwargs
    )
    return dict(
        model=model,
        before=before,
        a=state_a,
        b=state_b,
        c=state_c,
        d=state_d,
        stopped_at=stopped_at,
        logs=logs,
        evals=evals,
    )


def test_warmstart_reduces_the_training_loss(trained):
    graphdef = nnx.graphdef(trained["model"])
    # The first 6 training examples: the batch shape of the loss tests, so the compiled loss is reused.
    batch = sft_batch([p for p, _ in EXAMPLES[:6]], [t for _, t in EXAMPLES[:6]], PAD)
    loss_before, m_before = LOSS(graphdef, trained["before"], batch)
    loss_after, m_after = LOSS(graphdef, trained["a"], batch)
    assert float(loss_after) < 0.6 * float(loss_before), (float(loss_before), float(loss_after))
    assert float(m_after["token_accuracy"]) > float(m_before["token_accuracy"])
    # The logged step losses fall too.
    steps = [s for s, _ in trained["logs"]]
    assert steps == [10, 20, 30, 40]
    assert trained["logs"][-1][1]["loss"] < trained["logs"][0][1]["loss"]
    assert set(trained["logs"][0][1]) >= {"loss", "token_accuracy", "grad_norm", "learning_rate"}


def test_warmstart_is_deterministic_from_the_seed_and_leaves_the_model_alone(trained):
    assert leaves_equal(trained["a"], trained["b"])  # a module or its (graphdef, state): the same run
    assert not leaves_equal(trained["a"], trained["c"])  # another seed, another example order
    assert leaves_equal(nnx.state(trained["model"]), trained["before"])
    assert [s for s, _ in trained["evals"]] == [20, 40]
    assert leaves_equal(trained["evals"][-1][1], trained["a"])
    assert not leaves_equal(trained["evals"][0][1], trained["a"])
    # Stopped by eval_fn after step 20: the state of the full run at step 20.
    assert trained["stopped_at"] == [10, 20]
    assert leaves_equal(trained["d"], trained["evals"][0][1])


def test_warmstart_zero_steps_and_bad_arguments():
    model = QwenForCausalLM(CONFIG, rngs=nnx.Rngs(0))
    state = supervised_warmstart(model, EXAMPLES, steps=0, batch_size=4, learning_rate=1e-3, seed=0)
    assert leaves_equal(state, nnx.state(model))
    good = dict(steps=1, batch_size=4, learning_rate=1e-3, seed=0)
    for bad, match in [
        (dict(steps=-1), "steps=-1"),
        (dict(batch_size=0), "batch_size=0"),
        (dict(learning_rate=0.0), "learning_rate=0.0"),
        (dict(learning_rate=float("nan")), "learning_rate=nan"),
        (dict(warmup_steps=-2), "warmup_steps=-2"),
        (dict(schedule="step"), "'step'"),
    ]:
        with pytest.raises(ValueError, match=match):
            supervised_warmstart(model, EXAMPLES, **{**good, **bad})
    with pytest.raises(ValueError, match="no examples"):
        supervised_warmstart(model, [], **good)
    with pytest.raises(ValueError, match=r"examples\[1\]"):
        supervised_warmstart(model, [EXAMPLES[0], ([5],)], **good)
    with pytest.raises(ValueError, match=r"examples\[0\] has token ids >= the model's vocab_size 100"):
        supervised_warmstart(model, [([5, 6], [100, EOS])], **good)
