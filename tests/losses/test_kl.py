"""KL estimators (k1, abs, k2, k3 and their aliases) against NumPy, their
properties, a Monte-Carlo check of unbiasedness, and the loss / reward uses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mathrl_jax.losses import (
    KL_KINDS,
    kl_abs,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_loss,
    kl_penalized_rewards,
    kl_penalty,
)
from tests.losses import np_reference_policy as ref

B, T = 6, 10
SEEDS = st.integers(0, 2**31 - 1)
ALL_KINDS = ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"]
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def kl_data(seed, scale=1.0):
    rng = np.random.RandomState(seed)
    logprobs = (-np.abs(rng.randn(B, T)) * 2.0).astype(np.float32)
    ref_logprobs = (logprobs + rng.randn(B, T) * scale).astype(np.float32)
    mask = (rng.rand(B, T) < 0.7).astype(np.float32)
    mask[rng.rand(B) < 0.2] = 0.0
    return logprobs, ref_logprobs, mask


def test_kl_kinds_are_the_documented_names():
    assert set(KL_KINDS) == set(ALL_KINDS)


@pytest.mark.parametrize("kind", ALL_KINDS)
@given(seed=SEEDS)
def test_per_token_estimators_match_numpy(kind, seed):
    logprobs, ref_logprobs, _ = kl_data(seed, scale=2.0)
    got = kl_penalty(logprobs, ref_logprobs, kind)
    assert got.shape == (B, T) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), ref.kl_per_token(logprobs, ref_logprobs, kind), rtol=1e-5, atol=1e-6)


def test_named_estimators_are_the_formulas():
    d = np.array([[-2.0, -0.5, 0.0, 0.25, 2.0]], np.float32)
    zero = np.zeros_like(d)
    np.testing.assert_allclose(np.asarray(kl_k1(d, zero)), d)
    np.testing.assert_allclose(np.asarray(kl_abs(d, zero)), np.abs(d))
    np.testing.assert_allclose(np.asarray(kl_k2(d, zero)), 0.5 * d**2)
    np.testing.assert_allclose(np.asarray(kl_k3(d, zero)), np.exp(-d.astype(np.float64)) + d - 1, rtol=1e-5, atol=1e-7)
    # The sign convention: d = log pi - log pi_ref.
    np.testing.assert_allclose(np.asarray(kl_k1(zero, d)), -d)


def test_k3_clamps():
    # d = 50: -d clamped to -20 -> e^-20 + 20 - 1 = 19.0...; result clamped to 10.
    # d = -50: -d clamped to 20 -> e^20 - 21; result clamped to 10.
    # d = 5: e^-5 + 4, unclamped.  d = -2: e^2 - 3, unclamped.
    d = np.array([[50.0, -50.0, 5.0, -2.0, 1e6, -1e6]], np.float32)
    got = np.asarray(jax.jit(kl_k3)(d, np.zeros_like(d)))
    np.testing.assert_allclose(got[0], [10.0, 10.0, np.exp(-5.0) + 4.0, np.exp(2.0) - 3.0, 10.0, 10.0], rtol=1e-6)
    # Custom clamps are arguments.
    got = np.asarray(jax.jit(kl_k3)(d, np.zeros_like(d), log_ratio_clamp=3.0, value_clamp=100.0))
    np.testing.assert_allclose(got[0, :2], [np.exp(-3.0) + 3.0 - 1.0, np.exp(3.0) - 3.0 - 1.0], rtol=1e-6)
    g = jax.jit(jax.grad(lambda x: jnp.sum(kl_k3(x, jnp.zeros_like(x)))))(jnp.asarray(d))
    assert np.all(np.isfinite(np.asarray(g)))


FLOATS = st.floats(-60.0, 60.0, allow_nan=False, width=32)


@given(d=hnp.arrays(np.float32, (4, 8), elements=FLOATS))
def test_k2_and_k3_are_nonnegative(d):
    zero = np.zeros_like(d)
    assert np.all(np.asarray(kl_k2(d, zero)) >= 0.0)
    assert np.all(np.asarray(kl_abs(d, zero)) >= 0.0)
    k3 = np.asarray(kl_k3(d, zero))
    # exp(-d) + d - 1 >= 0; float32 cancellation near d = 0 can leave one ulp of 1.0 below 0.
    assert np.all(k3 >= -1.2e-7)
    assert np.all(k3 <= 10.0)


def test_k3_is_exactly_nonnegative_in_float32():
    # e.g. d = -2.369e-4 gives k3 = -5.96e-8 on CPU; a dense grid around 0 makes the
    # failure independent of the backend's exp rounding.
    d = np.concatenate([[-2.369e-4], np.linspace(-1e-2, 1e-2, 20001)]).astype(np.float32).reshape(1, -1)
    assert np.all(np.asarray(kl_k3(d, np.zeros_like(d))) >= 0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_k1_and_k3_are_unbiased_monte_carlo(seed):
    """Tokens y ~ p: E[k1] = E[k3] = KL(p || q) with d = log p(y) - log q(y)."""
    rng = np.random.RandomState(seed)
    vocab, n = 12, 200_000
    p = rng.dirichlet(np.ones(vocab))
    q = rng.dirichlet(np.ones(vocab))
    exact = float(np.sum(p * (np.log(p) - np.log(q))))
    tokens = rng.choice(vocab, size=n, p=p)
    logp = np.log(p)[tokens].astype(np.float32).reshape(1, n)
    logq = np.log(q)[tokens].astype(np.float32).reshape(1, n)
    for estimator in (kl_k1, kl_k3):
        samples = np.asarray(estimator(logp, logq), np.float64)
        stderr = samples.std() / np.sqrt(n)
        assert abs(samples.mean() - exact) < 5 * stderr + 1e-4, (estimator.__name__, samples.mean(), exact)
    # k3 has lower variance than k1 when p and q are close.
    q_close = 0.9 * p + 0.1 * q
    logq = np.log(q_close)[tokens].astype(np.float32).reshape(1, n)
    assert np.var(np.asarray(kl_k3(logp, logq))) < np.var(np.asarray(kl_k1(logp, logq)))


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "abs"])
@pytest.mark.parametrize("mode", MODES)
def test_kl_loss_aggregates_like_the_policy_loss(kind, mode):
    logprobs, ref_logprobs, mask = kl_data(5)
    loss, metrics = kl_loss(logprobs, ref_logprobs, mask, kind=kind, loss_agg_mode=mode)
    per_token = ref.kl_per_token(logprobs, ref_logprobs, kind)
    np.testing.assert_allclose(float(loss), ref.aggregate(per_token, mask, mode), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["kl"]), ref.masked_mean(per_token, mask), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["kl_loss"]), float(loss), rtol=1e-6)


_kl_loss_grads = jax.jit(jax.grad(lambda lp, rl, m: kl_loss(lp, rl, m, kind="k3")[0], argnums=(0, 1)))


@given(seed=SEEDS)
def test_kl_loss_gradient(seed):
    logprobs, ref_logprobs, mask = kl_data(seed)
    g_lp, g_ref = _kl_loss_grads(logprobs, ref_logprobs, mask)
    assert np.all(np.asarray(g_ref) == 0.0)  # the reference policy is a constant
    # d k3 / d logp = 1 - exp(ref - logp), over the token count; 0 where k3 is clamped at 10.
    d = logprobs.astype(np.float64) - ref_logprobs
    unclamped = np.exp(-d) + d - 1.0 < 10.0
    want = np.where(unclamped, 1.0 - np.exp(-d), 0.0) * mask / max(mask.sum(), 1.0)
    np.testing.assert_allclose(np.asarray(g_lp), want, rtol=1e-4, atol=1e-7)


def test_kl_loss_padding_invariance():
    logprobs, ref_logprobs, mask = kl_data(3)
    pad = lambda x, v: np.pad(x, ((0, 1), (0, 2)), constant_values=v)  # noqa: E731
    a, ma = kl_loss(logprobs, ref_logprobs, mask)
    b, mb = kl_loss(pad(logprobs, -1e4), pad(ref_logprobs, 1e4), pad(mask, 0.0))
    np.testing.assert_allclose(float(a), float(b), rtol=1e-6)
    np.testing.assert_allclose(float(ma["kl"]), float(mb["kl"]), rtol=1e-6)


@pytest.mark.parametrize("kind", ["k1", "k3"])
@given(seed=SEEDS, beta=st.floats(0.0, 1.0))
def test_kl_penalized_rewards(kind, seed, beta):
    logprobs, ref_logprobs, mask = kl_data(seed)
    rewards = np.random.RandomState(seed + 1).randn(B, T).astype(np.float32)
    out, metrics = kl_penalized_rewards(rewards, logprobs, ref_logprobs, mask, beta=beta, kind=kind)
    per_token = ref.kl_per_token(logprobs, ref_logprobs, kind)
    want = np.where(mask > 0, rewards - beta * per_token, 0.0)
    assert out.dtype == jnp.float32 and out.shape == (B, T)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(out)[mask == 0] == 0.0)
    np.testing.assert_allclose(float(metrics["kl"]), ref.masked_mean(per_token, mask), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["kl_coef"]), beta, rtol=1e-6, atol=1e-30)


def test_kl_penalized_rewards_default_kind_is_k1_and_ignores_masked_garbage():
    logprobs = np.array([[-1.0, -2.0, np.nan]], np.float32)
    ref_logprobs = np.array([[-1.5, -1.0, 3.0]], np.float32)
    rewards = np.array([[0.0, 1.0, 5.0]], np.float32)
    mask = np.array([[1.0, 1.0, 0.0]], np.float32)
    out, metrics = kl_penalized_rewards(rewards, logprobs, ref_logprobs, mask, beta=0.1)
    np.testing.assert_allclose(np.asarray(out), [[-0.05, 1.1, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(float(metrics["kl"]), (0.5 - 1.0) / 2, rtol=1e-6)


@pytest.mark.parametrize("bad", ["k4", "KL", "low-var-kl", ""])
def test_unknown_kind_raises(bad):
    x = jnp.zeros((2, 3))
    for call in (
        lambda: kl_penalty(x, x, bad),
        lambda: kl_loss(x, x, x, kind=bad),
        lambda: kl_penalized_rewards(x, x, x, x, beta=0.1, kind=bad),
    ):
        with pytest.raises(ValueError) as info:
            call()
        assert repr(bad) in str(info.value)
        assert "low_var_kl" in str(info.value)


def test_kl_functions_jit():
    logprobs, ref_logprobs, mask = kl_data(0)
    f = jax.jit(lambda a, b, m: (kl_loss(a, b, m, kind="low_var_kl")[0], kl_penalized_rewards(m, a, b, m, beta=0.5)[0]))
    loss, rewards = f(logprobs, ref_logprobs, mask)
    np.testing.assert_allclose(float(loss), float(kl_loss(logprobs, ref_logprobs, mask, kind="k3")[0]), rtol=1e-6)
    assert rewards.shape == (B, T)
