"""Policy losses (PPO clip / clip-higher / dual clip, AReaL decoupled PPO, GSPO,
REINFORCE) against the float64 NumPy reference, their metrics, and properties
of their gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mathrl_jax.losses import (
    decoupled_ppo_loss,
    gspo_loss,
    loss_denominator,
    ppo_clip_loss,
    reinforce_loss,
)
from tests.losses import np_reference_policy as ref

B, T = 6, 10
SEEDS = st.integers(0, 2**31 - 1)

PPO_METRICS = {
    "clip_fraction",
    "clip_fraction_high",
    "clip_fraction_low",
    "dual_clip_fraction",
    "approx_kl",
    "ratio_mean",
    "ratio_max",
    "policy_loss",
}
DECOUPLED_METRICS = PPO_METRICS | {"behaviour_weight_mean", "behaviour_kl", "behaviour_capped_fraction"}


def random_mask(rng, batch=B, length=T, empty_row_prob=0.2):
    mask = (rng.rand(batch, length) < rng.uniform(0.3, 0.95)).astype(np.float32)
    mask[rng.rand(batch) < empty_row_prob] = 0.0
    return mask


def policy_data(seed, batch=B, length=T, log_ratio_scale=0.6):
    """logprobs, old_logprobs (log r ~ N(0, scale)), advantages, mask; float32."""
    rng = np.random.RandomState(seed)
    logprobs = (-np.abs(rng.randn(batch, length)) * 2.0 - 0.01).astype(np.float32)
    old = (logprobs - rng.randn(batch, length) * log_ratio_scale).astype(np.float32)
    adv = rng.randn(batch, length).astype(np.float32)
    mask = random_mask(rng, batch, length)
    return logprobs, old, adv, mask


def assume_away_from_kinks(values, mask, boundaries, tol=1e-6):
    """Skip the rare example with a counted value within `tol` of a kink of the loss (a clip
    boundary), where float32 and the float64 reference may legitimately take different
    branches (or JAX splits the gradient of a tie)."""
    counted = np.asarray(values, np.float64)[np.asarray(mask) > 0]
    for b in boundaries:
        if b is not None:
            assume(np.all(np.abs(counted - b) > tol * max(1.0, abs(b))))


def ppo_boundaries(clip_low=0.2, clip_high=None, clip_c=None, **_):
    clip_high = clip_low if clip_high is None else clip_high
    return [1.0 - clip_low, 1.0 + clip_high, clip_c]


def token_ratios(logprobs, old):
    return np.exp(np.clip(np.asarray(logprobs, np.float64) - old, -20.0, 20.0))


def sequence_ratios(logprobs, old, mask):
    """s_i broadcast over tokens, from the float64 reference."""
    s = np.exp(ref.gspo_sequence_log_ratios(logprobs, old, mask))
    return np.repeat(s[:, None], np.asarray(mask).shape[1], 1)


def assert_metrics_close(got, want, rtol=1e-5, atol=1e-6):
    assert set(got) == set(want), (sorted(got), sorted(want))
    for name, value in want.items():
        assert got[name].shape == (), name
        assert got[name].dtype == jnp.float32, name
        np.testing.assert_allclose(float(got[name]), value, rtol=rtol, atol=atol, err_msg=name)


def eager(fn, **kwargs):
    """fn with fixed keyword arguments, run op by op. For the many-example property tests at
    the shared [6, 10] shape this is faster than compiling one program per configuration."""
    return functools.partial(fn, **kwargs)


@functools.lru_cache(maxsize=None)
def jitted(fn, **kwargs):
    """jit(fn with fixed keyword arguments); cached so each config compiles once."""
    return jax.jit(functools.partial(fn, **kwargs))


@functools.lru_cache(maxsize=None)
def jitted_grad(fn, **kwargs):
    """jit(grad of the loss w.r.t. logprobs, the first argument)."""
    return jax.jit(jax.grad(lambda *a, **kw: fn(*a, **kwargs, **kw)[0]))


# --------------------------------------------------------------------------- PPO clip


PPO_CONFIGS = {
    "symmetric": dict(clip_low=0.2),
    "clip_higher": dict(clip_low=0.2, clip_high=0.28),
    "dual_clip": dict(clip_low=0.2, clip_high=0.28, clip_c=3.0),
    "dual_clip_seq_mean": dict(clip_low=0.1, clip_c=3.0, loss_agg_mode="seq-mean-token-mean"),
    "sum_norm": dict(clip_low=0.2, loss_agg_mode="seq-mean-token-sum-norm", norm_constant=16.0),
}


def _ref_kwargs(kwargs):
    out = dict(kwargs)
    if "loss_agg_mode" in out:
        out["mode"] = out.pop("loss_agg_mode")
    return out


@pytest.mark.parametrize("config", list(PPO_CONFIGS))
@given(seed=SEEDS)
def test_ppo_clip_matches_numpy(config, seed):
    kwargs = PPO_CONFIGS[config]
    logprobs, old, adv, mask = policy_data(seed, log_ratio_scale=0.8)
    assume_away_from_kinks(token_ratios(logprobs, old), mask, ppo_boundaries(**kwargs))
    loss, metrics = eager(ppo_clip_loss, **kwargs)(logprobs, old, adv, mask)
    want_loss, want_metrics = ref.ppo_clip(logprobs, old, adv, mask, **_ref_kwargs(kwargs))
    assert loss.dtype == jnp.float32 and loss.shape == ()
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, atol=1e-6)
    assert set(metrics) == PPO_METRICS
    assert_metrics_close(metrics, want_metrics)


def test_ppo_clip_metrics_hand_computed():
    # ratios e^{log r}: 1.5 (A>0: clipped high), 0.5 (A<0: clipped low), 1.5 (A<0: unclipped),
    # 5.0 (A<0: dual clip with c=3), 1.0 (A>0), and one masked token.
    ratios = np.array([[1.5, 0.5, 1.5, 5.0, 1.0, 100.0]])
    adv = np.array([[1.0, -1.0, -1.0, -2.0, 0.5, 1.0]], np.float32)
    mask = np.array([[1, 1, 1, 1, 1, 0]], np.float32)
    old = np.full((1, 6), -2.0, np.float32)
    logprobs = (old + np.log(ratios)).astype(np.float32)
    loss, m = jitted(ppo_clip_loss, clip_low=0.2, clip_high=0.28, clip_c=3.0)(logprobs, old, adv, mask)
    r = np.exp(np.asarray(logprobs, np.float64) - old)
    per_token = [-1.0 * 1.28, 1.0 * 0.8, 1.0 * r[0, 2], 2.0 * 3.0, -0.5 * r[0, 4]]
    np.testing.assert_allclose(float(loss), np.mean(per_token), rtol=1e-5)
    np.testing.assert_allclose(float(m["clip_fraction"]), 2 / 5, atol=1e-6)
    np.testing.assert_allclose(float(m["clip_fraction_high"]), 1 / 5, atol=1e-6)
    np.testing.assert_allclose(float(m["clip_fraction_low"]), 1 / 5, atol=1e-6)
    np.testing.assert_allclose(float(m["dual_clip_fraction"]), 1 / 5, atol=1e-6)
    np.testing.assert_allclose(float(m["ratio_max"]), 5.0, rtol=1e-5)  # the masked 100 is ignored
    np.testing.assert_allclose(float(m["ratio_mean"]), r[0, :5].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m["approx_kl"]), -np.log(r[0, :5]).mean(), rtol=1e-5, atol=1e-6)
    assert float(m["policy_loss"]) == float(loss)


def test_log_ratio_clamp():
    logprobs = np.array([[-1.0, -60.0, -1.0, -2.0]], np.float32)
    # old - new = 50 twice (ratio e^-50 -> e^-20), new - old = 50 (ratio e^50 -> e^20), one
    # ordinary token inside the clip range (ratio e^0.05).
    old = np.array([[49.0, -10.0, -51.0, -2.05]], np.float32)
    adv = np.array([[-1.0, 1.0, -0.5, 2.0]], np.float32)
    mask = np.ones((1, 4), np.float32)
    for kwargs in (dict(), dict(clip_c=3.0)):
        loss, m = jitted(ppo_clip_loss, **kwargs)(logprobs, old, adv, mask)
        want_loss, want_m = ref.ppo_clip(logprobs, old, adv, mask, **kwargs)
        assert np.isfinite(float(loss))
        np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
        assert_metrics_close(m, want_m)
        np.testing.assert_allclose(float(m["ratio_max"]), np.exp(20.0), rtol=1e-5)
        # approx_kl is the mean of old - new with the *clamped* log ratio: (20 + 20 - 20 - 0.05) / 4.
        np.testing.assert_allclose(float(m["approx_kl"]), (20.0 + 20.0 - 20.0 - 0.05) / 4, rtol=1e-5)
        g = np.asarray(jitted_grad(ppo_clip_loss, **kwargs)(logprobs, old, adv, mask))
        assert np.all(np.isfinite(g))
        assert g[0, 0] == 0.0 and g[0, 1] == 0.0 and g[0, 2] == 0.0  # clamped tokens carry no gradient
        assert g[0, 3] != 0.0
    # Without the clamp the reference (unclamped) formula is followed.
    loss, m = jitted(ppo_clip_loss, log_ratio_clamp=None)(logprobs, old, adv, mask)
    want_loss, want_m = ref.ppo_clip(logprobs, old, adv, mask, log_ratio_clamp=None)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-4)
    np.testing.assert_allclose(float(m["ratio_max"]), np.exp(50.0), rtol=1e-4)


GRAD_CONFIGS = {
    "symmetric": dict(clip_low=0.2),
    "clip_higher": dict(clip_low=0.2, clip_high=0.28),
    "dual_clip": dict(clip_low=0.2, clip_high=0.28, clip_c=3.0),
}


@pytest.mark.parametrize("config", list(GRAD_CONFIGS))
@given(seed=SEEDS)
def test_ppo_gradient_is_zero_exactly_where_a_clip_is_active(config, seed):
    kwargs = GRAD_CONFIGS[config]
    eps_low = kwargs["clip_low"]
    eps_high = kwargs.get("clip_high", eps_low)
    clip_c = kwargs.get("clip_c")
    logprobs, old, adv, mask = policy_data(seed, log_ratio_scale=0.8)
    grad = np.asarray(jitted_grad(ppo_clip_loss, **kwargs)(logprobs, old, adv, mask))

    ratio = np.exp(np.asarray(logprobs, np.float64) - old)
    a = adv.astype(np.float64)
    clip_active = ((ratio > 1 + eps_high) & (a > 0)) | ((ratio < 1 - eps_low) & (a < 0))
    if clip_c is not None:
        clip_active |= (a < 0) & (ratio > clip_c)  # -A r > -A c: the dual clip bound is the loss
    # Stay away from the kinks, where float32 and float64 may disagree.
    boundaries = [1 + eps_high, 1 - eps_low] + ([clip_c] if clip_c else [])
    safe = np.all([np.abs(ratio - b) > 1e-4 for b in boundaries], axis=0) & (np.abs(a) > 1e-3)
    counted = (mask > 0) & safe

    assert np.all(grad[mask == 0] == 0.0)
    assert np.all(grad[counted & clip_active] == 0.0)
    assert np.all(grad[counted & ~clip_active] != 0.0)
    # Where no clip is active, d l / d log pi = -A r, divided by the token count.
    n = max(mask.sum(), 1.0)
    want = -a * ratio / n
    sel = counted & ~clip_active
    np.testing.assert_allclose(grad[sel], want[sel], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "bad",
    [
        dict(clip_c=1.0),
        dict(clip_c=0.5),
        dict(clip_low=1.0),
        dict(clip_low=1.5),
        dict(clip_low=-0.1),
        dict(clip_high=-0.1),
    ],
)
def test_invalid_clip_arguments_raise(bad):
    logprobs, old, adv, mask = policy_data(0)
    value = list(bad.values())[0]
    name = list(bad.keys())[0]
    with pytest.raises(ValueError, match=name) as info:
        ppo_clip_loss(logprobs, old, adv, mask, **bad)
    assert str(value) in str(info.value)
    with pytest.raises(ValueError, match=name):
        decoupled_ppo_loss(logprobs, old, adv, mask, proximal_logprobs=old, **bad)
    if name != "clip_c":
        with pytest.raises(ValueError, match=name):
            gspo_loss(logprobs, old, adv, mask, **bad)


# --------------------------------------------------------------------------- decoupled PPO (AReaL)


def decoupled_data(seed, behaviour_scale=0.8):
    rng = np.random.RandomState(seed + 1)
    logprobs, prox, adv, mask = policy_data(seed, log_ratio_scale=0.6)
    behav = (prox - rng.randn(*prox.shape) * behaviour_scale).astype(np.float32)
    return logprobs, behav, prox, adv, mask


DECOUPLED_CONFIGS = {
    "no_cap": dict(clip_low=0.2),
    "cap2": dict(clip_low=0.2, clip_high=0.28, behaviour_weight_cap=2.0),
    "cap_dual_seq_mean": dict(clip_low=0.2, clip_c=3.0, behaviour_weight_cap=1.5, loss_agg_mode="seq-mean-token-mean"),
}


@pytest.mark.parametrize("config", list(DECOUPLED_CONFIGS))
@given(seed=SEEDS)
def test_decoupled_ppo_matches_numpy(config, seed):
    kwargs = DECOUPLED_CONFIGS[config]
    logprobs, behav, prox, adv, mask = decoupled_data(seed)
    assume_away_from_kinks(token_ratios(logprobs, prox), mask, ppo_boundaries(**kwargs))
    assume_away_from_kinks(token_ratios(prox, behav), mask, [kwargs.get("behaviour_weight_cap")])
    loss, metrics = eager(decoupled_ppo_loss, **kwargs)(logprobs, behav, adv, mask, proximal_logprobs=prox)
    want_loss, want_metrics = ref.decoupled_ppo(logprobs, behav, adv, mask, prox, **_ref_kwargs(kwargs))
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, atol=1e-6)
    assert set(metrics) == DECOUPLED_METRICS
    assert_metrics_close(metrics, want_metrics, rtol=1e-5, atol=1e-6)


def test_decoupled_capped_tokens_count_in_the_denominator():
    logprobs = np.array([[-1.0, -1.0, -1.0]], np.float32)
    prox = np.array([[-1.0, -1.0, -1.0]], np.float32)  # r = 1 on every token
    behav = np.array([[-1.0, -3.0, -1.0]], np.float32)  # w = 1, e^2 (> cap), 1
    adv = np.array([[1.0, 1.0, 2.0]], np.float32)
    mask = np.ones((1, 3), np.float32)
    loss, m = jitted(decoupled_ppo_loss, behaviour_weight_cap=5.0)(logprobs, behav, adv, mask, proximal_logprobs=prox)
    # Token 2 is dropped but still counted: (-1 + 0 - 2) / 3.
    np.testing.assert_allclose(float(loss), -1.0, rtol=1e-6)
    np.testing.assert_allclose(float(m["behaviour_capped_fraction"]), 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(float(m["behaviour_weight_mean"]), 1.0, rtol=1e-6)
    np.testing.assert_allclose(float(m["behaviour_kl"]), 0.0, atol=1e-7)
    g = np.asarray(
        jitted_grad(decoupled_ppo_loss, behaviour_weight_cap=5.0)(logprobs, behav, adv, mask, proximal_logprobs=prox)
    )
    np.testing.assert_allclose(g, [[-1 / 3, 0.0, -2 / 3]], rtol=1e-6)
    # Without a cap the weight e^2 is used.
    loss, m = jitted(decoupled_ppo_loss)(logprobs, behav, adv, mask, proximal_logprobs=prox)
    np.testing.assert_allclose(float(loss), (-1 - np.exp(2.0) - 2) / 3, rtol=1e-6)
    assert float(m["behaviour_capped_fraction"]) == 0.0


@given(seed=SEEDS)
def test_decoupled_with_proximal_equal_to_behaviour_is_ppo(seed):
    kwargs = dict(clip_low=0.2, clip_high=0.28, clip_c=3.0)
    logprobs, old, adv, mask = policy_data(seed)
    loss_d, m_d = eager(decoupled_ppo_loss, behaviour_weight_cap=1.0, **kwargs)(
        logprobs, old, adv, mask, proximal_logprobs=old
    )
    loss_p, m_p = eager(ppo_clip_loss, **kwargs)(logprobs, old, adv, mask)
    np.testing.assert_allclose(float(loss_d), float(loss_p), rtol=1e-6, atol=1e-7)
    for name in PPO_METRICS:
        np.testing.assert_allclose(float(m_d[name]), float(m_p[name]), rtol=1e-6, atol=1e-7, err_msg=name)
    if mask.sum() > 0:
        np.testing.assert_allclose(float(m_d["behaviour_weight_mean"]), 1.0, rtol=1e-6)
    assert float(m_d["behaviour_kl"]) == 0.0 and float(m_d["behaviour_capped_fraction"]) == 0.0
    g_d = jitted_grad(decoupled_ppo_loss, behaviour_weight_cap=1.0, **kwargs)(
        logprobs, old, adv, mask, proximal_logprobs=old
    )
    g_p = jitted_grad(ppo_clip_loss, **kwargs)(logprobs, old, adv, mask)
    np.testing.assert_allclose(np.asarray(g_d), np.asarray(g_p), rtol=1e-6, atol=1e-8)


def test_decoupled_proximal_and_behaviour_are_constants():
    logprobs, behav, prox, adv, mask = decoupled_data(3)
    f = lambda lp, px, bh: decoupled_ppo_loss(lp, bh, adv, mask, proximal_logprobs=px)[0]  # noqa: E731
    g_prox, g_behav = jax.jit(jax.grad(f, argnums=(1, 2)))(logprobs, prox, behav)
    assert np.all(np.asarray(g_prox) == 0.0) and np.all(np.asarray(g_behav) == 0.0)


# --------------------------------------------------------------------------- GSPO


def gspo_data(seed, seq_scale=5e-4, token_scale=2e-3, batch=B, length=T):
    """Sequence log ratios around the GSPO clip range (eps = 3e-4 / 4e-4); sequence-level A."""
    rng = np.random.RandomState(seed)
    logprobs = (-np.abs(rng.randn(batch, length)) * 2.0 - 0.01).astype(np.float32)
    offsets = rng.randn(batch, 1) * seq_scale
    old = (logprobs - offsets - rng.randn(batch, length) * token_scale).astype(np.float32)
    adv = np.repeat(rng.randn(batch, 1), length, 1).astype(np.float32)
    mask = random_mask(rng, batch, length)
    return logprobs, old, adv, mask


GSPO_CONFIGS = {
    "default": (dict(), dict()),
    "wide_token_mean": (
        dict(clip_low=0.2, clip_high=0.28, loss_agg_mode="token-mean"),
        dict(seq_scale=0.3, token_scale=0.5),
    ),
    "ratio_max": (dict(clip_low=0.2, clip_high=0.28, log_ratio_max=0.25), dict(seq_scale=0.3, token_scale=0.3)),
}


@pytest.mark.parametrize("config", list(GSPO_CONFIGS))
@given(seed=SEEDS)
def test_gspo_matches_numpy(config, seed):
    kwargs, data_kwargs = GSPO_CONFIGS[config]
    logprobs, old, adv, mask = gspo_data(seed, **data_kwargs)
    boundaries = ppo_boundaries(kwargs.get("clip_low", 3e-4), kwargs.get("clip_high", 4e-4))
    assume_away_from_kinks(sequence_ratios(logprobs, old, mask), mask, boundaries, tol=3e-7)
    loss, metrics = eager(gspo_loss, **kwargs)(logprobs, old, adv, mask)
    want_loss, want_metrics = ref.gspo(logprobs, old, adv, mask, **_ref_kwargs(kwargs))
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, atol=1e-6)
    assert set(metrics) == PPO_METRICS
    # Clip fractions of sequence ratios within ~1e-7 of the boundary may flip in float32.
    assert_metrics_close(metrics, want_metrics, rtol=1e-5, atol=1e-6)


def test_gspo_token_ratio_value_is_the_sequence_ratio():
    logprobs = np.array([[-1.0, -2.0, -3.0, -9.0], [-0.5, -0.5, -0.5, -0.5]], np.float32)
    old = np.array([[-1.1, -1.9, -3.3, 0.0], [-0.5, -0.5, -0.5, -0.5]], np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.float32)
    adv = np.array([[1.0] * 4, [-1.0] * 4], np.float32)
    _, m = jitted(gspo_loss, clip_low=0.5, clip_high=0.5)(logprobs, old, adv, mask)
    s0 = np.exp((0.1 - 0.1 + 0.3) / 3)  # the masked token (log ratio -9) does not count
    np.testing.assert_allclose(float(m["ratio_max"]), s0, rtol=1e-5)
    np.testing.assert_allclose(float(m["ratio_mean"]), (3 * s0 + 4 * 1.0) / 7, rtol=1e-5)
    # The ratio is clamped at exp(log_ratio_max) (verl: 10).
    big = old.copy()
    big[0, :3] -= 12.0
    loss, m = jitted(gspo_loss)(logprobs, big, adv, mask)
    np.testing.assert_allclose(float(m["ratio_max"]), np.exp(10.0), rtol=1e-5)
    assert np.isfinite(float(loss))


@settings(max_examples=6)
@given(seed=SEEDS)
def test_gspo_gradient_matches_finite_differences_of_the_numpy_loss(seed):
    logprobs, old, adv, mask = gspo_data(seed, batch=4, length=6)
    assume_away_from_kinks(sequence_ratios(logprobs, old, mask), mask, ppo_boundaries(3e-4, 4e-4), tol=1e-6)
    grad = np.asarray(jitted_grad(gspo_loss)(logprobs, old, adv, mask))
    # The loss value as a float64 function of logprobs (GSPO's objective: the
    # sequence ratio depends on every token through the length-normalised mean).
    fd = ref.central_difference(lambda lp: ref.gspo(lp, old, adv, mask)[0], logprobs, h=1e-7)
    np.testing.assert_allclose(grad, fd, rtol=2e-3, atol=2e-6)


@given(seed=SEEDS)
def test_gspo_unclipped_gradient_formula(seed):
    # A clip range so wide that no sequence is clipped: d loss / d logp_it = -A_i s_i m_it / (|y_i| N).
    logprobs, old, adv, mask = gspo_data(seed, seq_scale=0.3, token_scale=0.3)
    grad = np.asarray(jitted_grad(gspo_loss, clip_low=0.99, clip_high=100.0)(logprobs, old, adv, mask))
    want = ref.gspo_grad_unclipped(logprobs, old, adv, mask)
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-8)


def test_gspo_gradient_zero_on_clipped_or_ratio_capped_sequences():
    logprobs = np.full((3, 4), -1.0, np.float32)
    # Sequence log ratios: +0.5 (A>0, clipped high), +12 (A<0, capped at log 10, unclipped branch), 0.
    old = np.stack([np.full(4, -1.5), np.full(4, -13.0), np.full(4, -1.0)]).astype(np.float32)
    adv = np.repeat(np.array([[1.0], [-1.0], [2.0]], np.float32), 4, 1)
    mask = np.ones((3, 4), np.float32)
    g = np.asarray(jitted_grad(gspo_loss, clip_low=0.2, clip_high=0.28)(logprobs, old, adv, mask))
    assert np.all(g[0] == 0.0)
    assert np.all(g[1] == 0.0)
    np.testing.assert_allclose(g[2], -2.0 * 1.0 / (4 * 3), rtol=1e-6)


# --------------------------------------------------------------------------- REINFORCE


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@given(seed=SEEDS)
def test_reinforce_matches_numpy(mode, seed):
    logprobs, old, adv, mask = policy_data(seed)
    loss, metrics = eager(reinforce_loss, loss_agg_mode=mode)(logprobs, old, adv, mask)
    want_loss, want_metrics = ref.reinforce(logprobs, old, adv, mask, mode=mode)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, atol=1e-6)
    assert_metrics_close(metrics, want_metrics)


@given(seed=SEEDS)
def test_reinforce_gradient_is_minus_advantage_over_token_count(seed):
    logprobs, old, adv, mask = policy_data(seed)
    grad = np.asarray(jitted_grad(reinforce_loss)(logprobs, old, adv, mask))
    np.testing.assert_allclose(grad, -adv * mask / max(mask.sum(), 1.0), rtol=1e-6, atol=1e-9)


# --------------------------------------------------------------------------- every loss: jit, grad, bf16, padding

LOSS_NAMES = ["ppo", "decoupled", "gspo", "reinforce"]
LOSS_KWARGS = {
    "ppo": (ppo_clip_loss, dict(clip_low=0.2, clip_high=0.28, clip_c=3.0)),
    "decoupled": (decoupled_ppo_loss, dict(clip_c=3.0, behaviour_weight_cap=3.0)),
    "gspo": (gspo_loss, dict(clip_low=0.05, clip_high=0.1)),
    "reinforce": (reinforce_loss, dict()),
}


def _call(name, logprobs, old, adv, mask, extra, **more):
    fn, kwargs = LOSS_KWARGS[name]
    if name == "decoupled":
        kwargs = dict(kwargs, proximal_logprobs=extra)
    return fn(logprobs, old, adv, mask, **kwargs, **more)


_call_jit = jax.jit(_call, static_argnums=0)
_value_and_grad_jit = jax.jit(jax.value_and_grad(_call, argnums=1, has_aux=True), static_argnums=0)


def _all_inputs(seed=7):
    logprobs, behav, prox, adv, mask = decoupled_data(seed)
    mask[0, :] = 1.0
    return logprobs, behav, adv, mask, prox


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_loss_jits_and_differentiates(name):
    logprobs, old, adv, mask, prox = _all_inputs()
    eager_loss, eager_m = _call(name, logprobs, old, adv, mask, prox)
    (jit_loss, jit_m), jit_g = _value_and_grad_jit(name, logprobs, old, adv, mask, prox)
    np.testing.assert_allclose(float(jit_loss), float(eager_loss), rtol=1e-6, atol=1e-7)
    assert set(jit_m) == set(eager_m)
    for k in eager_m:
        np.testing.assert_allclose(float(jit_m[k]), float(eager_m[k]), rtol=1e-6, atol=1e-7, err_msg=k)
    jit_g = np.asarray(jit_g)
    assert jit_g.shape == logprobs.shape and jit_g.dtype == np.float32
    assert np.all(np.isfinite(jit_g))
    assert np.any(jit_g != 0.0)
    assert np.all(jit_g[mask == 0] == 0.0)
    # Advantages and old log-probs are constants: no gradient flows into them.
    g_const = jax.jit(jax.grad(lambda a, o: _call(name, logprobs, o, a, mask, prox)[0], argnums=(0, 1)))(adv, old)
    assert all(np.all(np.asarray(g) == 0.0) for g in g_const)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_bfloat16_inputs_give_float32_outputs(name):
    logprobs, old, adv, mask, prox = _all_inputs()
    bf = [jnp.asarray(x, jnp.bfloat16) for x in (logprobs, old, adv, mask, prox)]
    up = [x.astype(jnp.float32) for x in bf]
    loss_bf, m_bf = _call(name, *bf)
    loss_up, m_up = _call(name, *up)
    loss_f32, _ = _call(name, logprobs, old, adv, mask, prox)
    assert loss_bf.dtype == jnp.float32
    assert all(v.dtype == jnp.float32 for v in m_bf.values())
    # All arithmetic is float32 on the upcast values: identical up to float32 rounding.
    np.testing.assert_allclose(float(loss_bf), float(loss_up), rtol=1e-6, atol=1e-7)
    for k in m_up:
        np.testing.assert_allclose(float(m_bf[k]), float(m_up[k]), rtol=1e-6, atol=1e-7, err_msg=k)
    # ... and close to the float32-input loss (bf16 keeps ~3 significant digits of each input).
    np.testing.assert_allclose(float(loss_bf), float(loss_f32), rtol=0.05, atol=0.05)
    g = jax.grad(lambda lp: _call(name, lp, *bf[1:])[0])(bf[0])
    assert g.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(g, np.float32)))


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_padding_does_not_change_any_loss(name):
    logprobs, old, adv, mask, prox = _all_inputs(11)
    rng = np.random.RandomState(0)

    def pad(x, scale):
        cols = (rng.randn(B, 3) * scale).astype(np.float32)
        x = np.concatenate([x, cols], 1)
        return np.concatenate([x, (rng.randn(2, T + 3) * scale).astype(np.float32)], 0)

    padded = [pad(logprobs, 500.0), pad(old, 500.0), pad(adv, 1e3), np.pad(mask, ((0, 2), (0, 3))), pad(prox, 500.0)]
    padded[0][:B, :T][mask == 0] = 700.0  # garbage under the mask inside the block too

    (loss, m), g = _value_and_grad_jit(name, logprobs, old, adv, mask, prox)
    (loss_p, m_p), g_p = _value_and_grad_jit(name, *padded)
    np.testing.assert_allclose(float(loss_p), float(loss), rtol=1e-5, atol=1e-7)
    for k in m:
        np.testing.assert_allclose(float(m_p[k]), float(m[k]), rtol=1e-5, atol=1e-7, err_msg=k)
    g_p = np.asarray(g_p)
    assert np.all(np.isfinite(g_p))
    np.testing.assert_allclose(g_p[:B, :T][mask > 0], np.asarray(g)[mask > 0], rtol=1e-5, atol=1e-8)
    assert np.all(g_p[np.asarray(padded[3]) == 0] == 0.0)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_denominator_argument_is_used_by_every_loss(name):
    logprobs, old, adv, mask, prox = _all_inputs()
    base, _ = _call_jit(name, logprobs, old, adv, mask, prox)
    mode = "seq-mean-token-mean" if name == "gspo" else "token-mean"
    halved, _ = _call(name, logprobs, old, adv, mask, prox, denominator=2 * loss_denominator(mask, mode))
    np.testing.assert_allclose(float(halved), float(base) / 2, rtol=1e-6)
