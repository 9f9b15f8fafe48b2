"""Masked reductions and loss aggregation against the float64 NumPy reference:
all four `loss_agg_mode`s, padding invariance, and exact micro-batch gradient
accumulation through `denominator=`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mathrl_jax.losses import (
    LOSS_AGG_MODE_NAMES,
    LOSS_AGG_MODES,
    TRL_LOSS_TYPES,
    aggregate_loss,
    canonical_loss_agg_mode,
    loss_denominator,
    loss_numerator,
    masked_mean,
    masked_sum,
    masked_var,
    ppo_clip_loss,
)
from tests.losses import np_reference_policy as ref

B, T = 6, 10
SEEDS = st.integers(0, 2**31 - 1)

# (mode, norm_constant): every mode, and sum-norm with its default C = T and an explicit C.
MODE_CASES = [
    ("token-mean", None),
    ("seq-mean-token-mean", None),
    ("seq-mean-token-sum", None),
    ("seq-mean-token-sum-norm", None),
    ("seq-mean-token-sum-norm", 37.0),
]
MODE_IDS = [f"{m}-C{c}" for m, c in MODE_CASES]


def random_mask(rng, batch=B, length=T, empty_row_prob=0.25):
    """Non-contiguous 0/1 masks with some all-zero rows."""
    mask = (rng.rand(batch, length) < rng.uniform(0.2, 0.9)).astype(np.float32)
    mask[rng.rand(batch) < empty_row_prob] = 0.0
    return mask


def random_loss(rng, batch=B, length=T):
    return (rng.randn(batch, length) * 2.0).astype(np.float32)


# jit(value_and_grad(aggregate_loss)) with (mode, norm_constant) static.
_aggregate_grad = jax.jit(jax.value_and_grad(aggregate_loss), static_argnums=(2, 3))


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize("mode,norm_constant", MODE_CASES, ids=MODE_IDS)
@given(seed=SEEDS)
def test_aggregate_matches_numpy(mode, norm_constant, seed):
    rng = np.random.RandomState(seed)
    loss_mat, mask = random_loss(rng), random_mask(rng)
    got = aggregate_loss(loss_mat, mask, mode, norm_constant)
    want = ref.aggregate(loss_mat, mask, mode, norm_constant)
    assert got.dtype == jnp.float32 and got.shape == ()
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6)
    # numerator / denominator decomposition matches too.
    np.testing.assert_allclose(
        float(loss_numerator(loss_mat, mask, mode, norm_constant)),
        ref.loss_numerator(loss_mat, mask, mode, norm_constant),
        rtol=1e-5,
        atol=1e-6,
    )
    assert float(loss_denominator(mask, mode)) == ref.loss_denominator(mask, mode)


def test_aggregate_hand_computed():
    loss_mat = np.array([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0], [7.0, 7.0, 7.0, 7.0]], np.float32)
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
    # token-mean: (1 + 2 + 100) / 6; rows: [3, 100] with lengths [2, 4]; the empty row is ignored.
    assert float(aggregate_loss(loss_mat, mask, "token-mean")) == pytest.approx(103 / 6)
    assert float(aggregate_loss(loss_mat, mask, "seq-mean-token-mean")) == pytest.approx((1.5 + 25.0) / 2)
    assert float(aggregate_loss(loss_mat, mask, "seq-mean-token-sum")) == pytest.approx((3 + 100) / 2)
    assert float(aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm")) == pytest.approx((3 / 4 + 100 / 4) / 2)
    assert float(aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", 10.0)) == pytest.approx((0.3 + 10.0) / 2)


def test_default_norm_constant_is_padded_length():
    rng = np.random.RandomState(0)
    loss_mat, mask = random_loss(rng), random_mask(rng, empty_row_prob=0.0)
    default = aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm")
    explicit = aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", float(T))
    np.testing.assert_allclose(float(default), float(explicit), rtol=1e-6)
    np.testing.assert_allclose(float(default), ref.aggregate(loss_mat, mask, "seq-mean-token-sum-norm", T), rtol=1e-5)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_all_zero_rows_are_excluded_from_sequence_means(mode):
    rng = np.random.RandomState(1)
    loss_mat, mask = random_loss(rng, 4), random_mask(rng, 4, empty_row_prob=0.0)
    mask[:, 0] = 1.0
    with_empty = np.concatenate([loss_mat, rng.randn(3, T).astype(np.float32) * 100], 0)
    mask_empty = np.concatenate([mask, np.zeros((3, T), np.float32)], 0)
    # Rows with an all-zero mask placed in the middle too.
    order = np.array([0, 4, 1, 5, 2, 6, 3])
    a = aggregate_loss(loss_mat, mask, mode, 25.0 if mode.endswith("norm") else None)
    b = aggregate_loss(with_empty[order], mask_empty[order], mode, 25.0 if mode.endswith("norm") else None)
    np.testing.assert_allclose(float(a), float(b), rtol=1e-6)
    expected_den = float(mask.sum()) if mode == "token-mean" else 4.0
    assert float(loss_denominator(mask_empty, mode)) == expected_den


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_all_masked_batch_is_zero_not_nan(mode):
    loss_mat = np.ones((3, 5), np.float32)
    mask = np.zeros((3, 5), np.float32)
    value, g = _aggregate_grad(loss_mat, mask, mode, None, None)
    assert float(value) == 0.0
    assert float(loss_denominator(mask, mode)) == 1.0
    assert np.all(np.asarray(g) == 0.0)


# --------------------------------------------------------------------------- padding invariance


def _garbage(rng, shape):
    g = rng.randn(*shape).astype(np.float32) * 1e4
    g.flat[::3] = np.inf
    g.flat[1::3] = np.nan
    g.flat[2::5] = -np.inf
    return g


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@given(seed=SEEDS)
def test_padding_columns_and_rows_do_not_change_the_loss(mode, seed):
    rng = np.random.RandomState(seed)
    loss_mat, mask = random_loss(rng), random_mask(rng)
    # sum-norm's default C = T changes with T: use an explicit constant.
    norm_constant = 30.0 if mode == "seq-mean-token-sum-norm" else None
    base = aggregate_loss(loss_mat, mask, mode, norm_constant)

    pad_cols = 4
    padded = np.concatenate([loss_mat, _garbage(rng, (B, pad_cols))], 1)
    padded_mask = np.concatenate([mask, np.zeros((B, pad_cols), np.float32)], 1)
    padded = np.concatenate([padded, _garbage(rng, (2, T + pad_cols))], 0)
    padded_mask = np.concatenate([padded_mask, np.zeros((2, T + pad_cols), np.float32)], 0)
    # Garbage also on masked-out entries inside the original block.
    padded[:B, :T][mask == 0] = np.nan

    out, grad = _aggregate_grad(padded, padded_mask, mode, norm_constant, None)
    assert np.isfinite(float(out))
    # Same terms, possibly summed in another order: float32 rounding only.
    np.testing.assert_allclose(float(out), float(base), rtol=1e-5, atol=1e-5)
    grad = np.asarray(grad)
    assert np.all(np.isfinite(grad))
    assert np.all(grad[padded_mask == 0] == 0.0)


# --------------------------------------------------------------------------- micro-batch accumulation


MICRO_SPLITS = [(0, 3), (3, 4), (4, 8)]  # uneven micro-batches of an 8-row batch


def _micro_batch_data(seed, batch=8, length=T):
    rng = np.random.RandomState(seed)
    mask = random_mask(rng, batch, length, empty_row_prob=0.2)
    mask[0, :2] = 1.0  # at least one counted token
    loss_mat = random_loss(rng, batch, length)
    logprobs = (-np.abs(rng.randn(batch, length)) - 0.1).astype(np.float32)
    old = (logprobs + 0.3 * rng.randn(batch, length)).astype(np.float32)
    adv = rng.randn(batch, length).astype(np.float32)
    return loss_mat, mask, logprobs, old, adv


@pytest.mark.parametrize("mode,norm_constant", MODE_CASES, ids=MODE_IDS)
@given(seed=SEEDS)
def test_micro_batch_accumulation_of_aggregate_is_exact(mode, norm_constant, seed):
    loss_mat, mask, *_ = _micro_batch_data(seed)
    full_den = loss_denominator(mask, mode)
    full_val, full_grad = _aggregate_grad(loss_mat, mask, mode, norm_constant, None)
    acc_val, parts = 0.0, []
    for lo, hi in MICRO_SPLITS:
        # Uneven micro-batches, padded to 4 rows with all-masked garbage rows (one compiled shape).
        rows = hi - lo
        micro_loss = np.concatenate([loss_mat[lo:hi], np.full((4 - rows, T), 1e3, np.float32)])
        micro_mask = np.concatenate([mask[lo:hi], np.zeros((4 - rows, T), np.float32)])
        v, g = _aggregate_grad(micro_loss, micro_mask, mode, norm_constant, full_den)
        acc_val += float(v)
        parts.append(np.asarray(g)[:rows])
    np.testing.assert_allclose(acc_val, float(full_val), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(parts, 0), np.asarray(full_grad), rtol=1e-6, atol=1e-7)


_FEATURES = np.random.RandomState(123).randn(8, T, 5).astype(np.float32)


def _policy_objective(theta, base_logprobs, features, old, adv, mask, mode, norm_constant, denominator):
    # A shared "parameter" theta feeds every token, so micro-batch gradients must be summed.
    logprobs = base_logprobs + 0.1 * jnp.tanh(features @ theta)
    loss, _ = ppo_clip_loss(
        logprobs,
        old,
        adv,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        loss_agg_mode=mode,
        norm_constant=norm_constant,
        denominator=denominator,
    )
    return loss


_policy_grad = jax.jit(jax.value_and_grad(_policy_objective), static_argnames=("mode", "norm_constant"))


@pytest.mark.parametrize("mode,norm_constant", MODE_CASES, ids=MODE_IDS)
@given(seed=SEEDS)
def test_micro_batch_accumulation_of_ppo_gradient_is_exact(mode, norm_constant, seed):
    _, mask, logprobs, old, adv = _micro_batch_data(seed)
    theta = jnp.asarray(np.random.RandomState(seed % 1000).randn(5).astype(np.float32))
    full_den = loss_denominator(mask, mode)
    full_val, full_grad = _policy_grad(
        theta, logprobs, _FEATURES, old, adv, mask, mode=mode, norm_constant=norm_constant, denominator=None
    )
    acc_val, acc_grad = 0.0, np.zeros(5, np.float64)

    def micro(x, lo, hi, fill=0.0):
        # Uneven micro-batches padded to 4 rows with all-masked rows (one compiled shape).
        pad = np.full((4 - (hi - lo),) + x.shape[1:], fill, x.dtype)
        return np.concatenate([x[lo:hi], pad], 0)

    for lo, hi in MICRO_SPLITS:
        v, g = _policy_grad(
            theta,
            micro(logprobs, lo, hi, -3.0),
            micro(_FEATURES, lo, hi, 1.0),
            micro(old, lo, hi, -1.0),
            micro(adv, lo, hi, 5.0),
            micro(mask, lo, hi),
            mode=mode,
            norm_constant=norm_constant,
            denominator=full_den,
        )
        acc_val += float(v)
        acc_grad += np.asarray(g, np.float64)
    np.testing.assert_allclose(acc_val, float(full_val), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(acc_grad, np.asarray(full_grad), rtol=1e-5, atol=1e-6)


def test_micro_batches_without_shared_denominator_are_not_exact():
    """Negative control: the per-micro-batch default denominator gives a different gradient."""
    loss_mat = np.ones((2, 4), np.float32)
    mask = np.array([[1, 0, 0, 0], [1, 1, 1, 1]], np.float32)
    full = _aggregate_grad(loss_mat, mask, "token-mean", None, None)[1]
    own = [_aggregate_grad(loss_mat[i : i + 1], mask[i : i + 1], "token-mean", None, None)[1] for i in (0, 1)]
    assert not np.allclose(np.concatenate(own, 0), np.asarray(full))
    np.testing.assert_allclose(np.asarray(full), mask / 5.0, rtol=1e-6)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("bad", ["token_mean", "seq-mean", "mean", ""])
def test_unknown_mode_raises_and_names_it(bad):
    loss_mat = jnp.ones((2, 3))
    mask = jnp.ones((2, 3))
    for call in (
        lambda: aggregate_loss(loss_mat, mask, bad),
        lambda: loss_denominator(mask, bad),
        lambda: loss_numerator(loss_mat, mask, bad),
        lambda: ppo_clip_loss(
            jnp.ones((B, T)), jnp.ones((B, T)), jnp.ones((B, T)), jnp.ones((B, T)), loss_agg_mode=bad
        ),
    ):
        with pytest.raises(ValueError) as info:
            call()
        assert repr(bad) in str(info.value)
        assert "token-mean" in str(info.value)  # lists the valid modes


@pytest.mark.parametrize("constant", [0.0, -3.0])
def test_nonpositive_norm_constant_raises(constant):
    with pytest.raises(ValueError, match="norm_constant"):
        aggregate_loss(jnp.ones((2, 3)), jnp.ones((2, 3)), "seq-mean-token-sum-norm", constant)


# --------------------------------------------------------------------------- masked reductions


@given(seed=SEEDS)
def test_masked_var_matches_numpy(seed):
    rng = np.random.RandomState(seed)
    x = (rng.randn(B, T) * 3 + 1).astype(np.float32)
    mask = random_mask(rng, empty_row_prob=0.0)
    mask[0, :2] = 1.0  # at least two counted entries
    vals = ref.masked_values(x, mask)
    np.testing.assert_allclose(float(masked_var(x, mask)), np.var(vals, ddof=1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(masked_var(x, mask, unbiased=False)), np.var(vals, ddof=0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(masked_mean(x, mask)), ref.masked_mean(x, mask), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(masked_sum(x, mask)), ref.masked_sum(x, mask), rtol=1e-5, atol=1e-5)


def test_masked_var_single_entry_is_zero():
    x = jnp.array([[3.0, 5.0, 7.0]])
    mask = jnp.array([[0.0, 1.0, 0.0]])
    assert float(masked_var(x, mask)) == 0.0
    assert float(masked_var(x, mask, unbiased=False)) == 0.0


def test_masked_mean_along_axis():
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    m = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
    np.testing.assert_allclose(np.asarray(masked_mean(x, m, axis=-1)), [2.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(masked_sum(x, m, axis=0)), [1.0, 0.0, 3.0], rtol=1e-6)


def test_nonfinite_masked_entries_do_not_leak():
    x = np.array([[1.0, np.inf, 3.0, np.nan], [-np.inf, 2.0, np.nan, 4.0]], np.float32)
    m = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]], np.float32)
    assert float(masked_sum(x, m)) == 10.0
    np.testing.assert_allclose(float(masked_mean(x, m)), 2.5, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(masked_mean(x, m, axis=-1)), [2.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(float(masked_var(x, m)), np.var([1, 3, 2, 4], ddof=1), rtol=1e-5)
    g = np.asarray(jax.jit(jax.grad(masked_mean))(x, m))
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, m / 4.0, rtol=1e-6)


def _trl_loss(loss_type, per_token_loss, mask, max_completion_length, micro_batches=1):
    """TRL's `GRPOTrainer._compute_loss` aggregation (one process), written out: `grpo`, `dr_grpo`, `dapo` (over
    the whole batch's tokens, `num_items_in_batch`), `bnpo` (each micro-batch by its own tokens, averaged over
    gradient accumulation)."""
    l, m = np.asarray(per_token_loss, np.float64), np.asarray(mask, np.float64)
    if loss_type == "grpo":
        return ((l * m).sum(-1) / np.maximum(m.sum(-1), 1.0)).mean()
    if loss_type == "dr_grpo":
        return (l * m).sum() / (l.shape[0] * max_completion_length)
    if loss_type == "dapo":
        return (l * m).sum() / m.sum()
    chunks = zip(np.split(l, micro_batches), np.split(m, micro_batches))
    return np.mean([(lc * mc).sum() / max(mc.sum(), 1.0) for lc, mc in chunks])


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
@given(seed=SEEDS)
def test_trl_loss_types_are_the_modes_that_compute_trls_formulas(loss_type, seed):
    """Each TRL `loss_type` name, as `canonical_loss_agg_mode` reads it (with the trainer's norm constant, the
    generation budget, for dr_grpo), aggregates as TRL's formula does, on batches whose every row holds a token
    (TRL's sequence means count empty rows too). bnpo agrees on one micro-batch; over several, TRL averages each
    micro-batch's token mean, where token-mean here is the whole minibatch's (TRL's dapo)."""
    rng = np.random.RandomState(seed)
    mask = random_mask(rng, empty_row_prob=0.0)
    mask[:, 0] = 1.0
    loss = random_loss(rng)
    max_completion_length = T + 3  # the budget, beyond the batch's padded width
    mode = canonical_loss_agg_mode(loss_type)
    assert mode in LOSS_AGG_MODES and loss_type in LOSS_AGG_MODE_NAMES and TRL_LOSS_TYPES[loss_type] == mode
    norm = float(max_completion_length) if mode == "seq-mean-token-sum-norm" else None
    got = float(aggregate_loss(jnp.asarray(loss), jnp.asarray(mask), mode, norm_constant=norm))
    np.testing.assert_allclose(got, _trl_loss(loss_type, loss, mask, max_completion_length), rtol=1e-5, atol=1e-6)
    if loss_type == "bnpo":  # the one documented difference: per-micro-batch means vs the minibatch's
        uneven = mask.copy()
        uneven[: B // 2, 1:] = 0.0  # first half: one token a row; second half: many
        whole = float(aggregate_loss(jnp.asarray(loss), jnp.asarray(uneven), mode))
        np.testing.assert_allclose(whole, _trl_loss("dapo", loss, uneven, max_completion_length), rtol=1e-5, atol=1e-6)
        trl_two_micro_batches = _trl_loss("bnpo", loss, uneven, max_completion_length, micro_batches=2)
        assert not np.isclose(whole, trl_two_micro_batches, rtol=1e-4)


def test_canonical_loss_agg_mode_keeps_ours_and_refuses_unknown_names():
    assert [canonical_loss_agg_mode(m) for m in LOSS_AGG_MODES] == list(LOSS_AGG_MODES)
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'sum'.*dr_grpo"):
        canonical_loss_agg_mode("sum")
