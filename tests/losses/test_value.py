"""Clipped value loss (MSE / Huber), its metrics and gradient, against NumPy."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mathrl_jax.losses import clipped_value_loss, explained_variance, huber
from tests.losses import np_reference_policy as ref

B, T = 6, 10
SEEDS = st.integers(0, 2**31 - 1)

CONFIGS = {
    "mse_clip": dict(clip_range=0.2, loss_type="mse"),
    "mse_noclip": dict(clip_range=None, loss_type="mse"),
    "huber_clip": dict(clip_range=0.3, loss_type="huber", huber_delta=1.0),
    "huber_noclip": dict(clip_range=None, loss_type="huber", huber_delta=1.0),
    "huber_default_delta": dict(clip_range=0.2, loss_type="huber"),
    "mse_seq_mean": dict(clip_range=0.2, loss_type="mse", loss_agg_mode="seq-mean-token-mean"),
    "huber_sum_norm": dict(clip_range=0.2, loss_type="huber", huber_delta=0.5, loss_agg_mode="seq-mean-token-sum-norm"),
}


def value_data(seed):
    """Values and old values on a dyadic grid (multiples of 1/64), where V - V_old and
    V_old + (V - V_old) are exact in float32, so the clip indicators are unambiguous
    (see `test_clip_fraction_not_inflated_by_rounding` for what happens off the grid)."""
    rng = np.random.RandomState(seed)
    old_values = (np.round(rng.randn(B, T) * 64) / 64).astype(np.float32)
    values = (old_values + np.round(rng.randn(B, T) * 0.4 * 64) / 64).astype(np.float32)
    returns = (old_values + rng.randn(B, T) * 2.0).astype(np.float32)
    mask = (rng.rand(B, T) < 0.75).astype(np.float32)
    mask[rng.rand(B) < 0.2] = 0.0
    return values, old_values, returns, mask


def _ref_kwargs(kwargs):
    out = dict(kwargs)
    if "loss_agg_mode" in out:
        out["mode"] = out.pop("loss_agg_mode")
    return out


@functools.lru_cache(maxsize=None)
def _grad_fn(items):
    kwargs = dict(items)
    return jax.jit(jax.grad(lambda v, o, r, m: clipped_value_loss(v, o, r, m, **kwargs)[0], argnums=(0, 1, 2)))


@functools.lru_cache(maxsize=None)
def _jit_loss(**kwargs):
    return jax.jit(functools.partial(clipped_value_loss, **kwargs))


@pytest.mark.parametrize("config", list(CONFIGS))
@given(seed=SEEDS)
def test_clipped_value_loss_matches_numpy(config, seed):
    kwargs = CONFIGS[config]
    values, old_values, returns, mask = value_data(seed)
    loss, metrics = clipped_value_loss(values, old_values, returns, mask, **kwargs)
    want_loss, want_metrics, _, _ = ref.clipped_value(values, old_values, returns, mask, **_ref_kwargs(kwargs))
    assert loss.dtype == jnp.float32 and loss.shape == ()
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, atol=1e-6)
    assert set(metrics) == set(want_metrics)
    for name, value in want_metrics.items():
        assert metrics[name].dtype == jnp.float32
        np.testing.assert_allclose(float(metrics[name]), value, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("config", ["mse_clip", "huber_clip", "mse_noclip", "huber_sum_norm"])
@given(seed=SEEDS)
def test_value_gradient(config, seed):
    kwargs = CONFIGS[config]
    values, old_values, returns, mask = value_data(seed)
    g_v, g_old, g_ret = _grad_fn(tuple(sorted(kwargs.items())))(values, old_values, returns, mask)
    g_v = np.asarray(g_v)
    _, _, want, clipped_larger = ref.clipped_value(values, old_values, returns, mask, **_ref_kwargs(kwargs))
    # Old values and returns are constants.
    assert np.all(np.asarray(g_old) == 0.0) and np.all(np.asarray(g_ret) == 0.0)
    assert np.all(g_v[mask == 0] == 0.0)
    if kwargs["clip_range"] is not None:
        # Zero exactly where the clipped term is strictly the max (the clip is then active).
        active = (clipped_larger > 0) & (mask > 0)
        assert np.all(np.abs(values - old_values)[active] > kwargs["clip_range"] - 1e-6)
        assert np.all(g_v[active] == 0.0)
    np.testing.assert_allclose(g_v, want, rtol=1e-4, atol=1e-7)


def test_value_loss_hand_computed():
    # token 0: V moved 1.0 away from V_old towards R; clip 0.2 keeps V_clip far from R -> clipped term larger.
    # token 1: V moved away from R; unclipped term larger.  token 2: inside the clip range.
    values = np.array([[1.0, -0.5, 0.1]], np.float32)
    old_values = np.array([[0.0, 0.0, 0.0]], np.float32)
    returns = np.array([[1.0, 1.0, 0.5]], np.float32)
    mask = np.ones((1, 3), np.float32)
    loss, m = _jit_loss(clip_range=0.2)(values, old_values, returns, mask)
    per_token = [0.5 * 0.8**2, 0.5 * 1.5**2, 0.5 * 0.4**2]
    np.testing.assert_allclose(float(loss), np.mean(per_token), rtol=1e-6)
    np.testing.assert_allclose(float(m["value_clip_fraction"]), 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(float(m["value_mean"]), np.mean(values), rtol=1e-6)
    g = np.asarray(_grad_fn((("clip_range", 0.2),))(values, old_values, returns, mask)[0])
    np.testing.assert_allclose(g, [[0.0, -1.5 / 3, -0.4 / 3]], rtol=1e-6)
    loss, m = _jit_loss(clip_range=None)(values, old_values, returns, mask)
    np.testing.assert_allclose(float(loss), np.mean([0.0, 0.5 * 1.5**2, 0.5 * 0.4**2]), rtol=1e-6)
    assert float(m["value_clip_fraction"]) == 0.0


def test_clip_fraction_not_inflated_by_rounding():
    # Minimal case: V = 0.02, V_old = -0.08, R = 0.3, clip_range = 0.5. |V - V_old| = 0.1, the
    # clip is inactive, yet V_old + (V - V_old) = 0.019999996 != V and the fraction is 1.0.
    values = jnp.array([[0.02]])
    old_values = jnp.array([[-0.08]])
    returns = jnp.array([[0.3]])
    _, metrics = _jit_loss(clip_range=0.5)(values, old_values, returns, jnp.ones((1, 1)))
    single = float(metrics["value_clip_fraction"])
    # Many random tokens, every one inside the clip range: the fraction must be exactly 0.
    # (On CPU about 30 of these 4096 tokens are counted as clipped.)
    rng = np.random.RandomState(0)
    old_values = rng.randn(64, 64).astype(np.float32)
    values = (old_values + rng.uniform(-0.4, 0.4, (64, 64))).astype(np.float32)
    returns = (old_values + rng.randn(64, 64) * 2.0).astype(np.float32)
    _, metrics = _jit_loss(clip_range=0.5)(values, old_values, returns, np.ones((64, 64), np.float32))
    assert single == 0.0 and float(metrics["value_clip_fraction"]) == 0.0


@given(e=hnp.arrays(np.float32, (3, 7), elements=st.floats(-50, 50, width=32)), delta=st.sampled_from([0.5, 1.0, 10.0]))
def test_huber_matches_numpy_and_is_symmetric(e, delta):
    got = np.asarray(huber(e, delta))
    np.testing.assert_allclose(got, ref.huber(e, delta), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got, np.asarray(huber(-e, delta)))
    assert np.all(got >= 0.0)
    # Never above the squared error (up to float32 rounding).
    assert np.all(got <= 0.5 * e.astype(np.float64) ** 2 * (1 + 1e-6) + 1e-6)


def test_huber_branches():
    e = np.array([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0], np.float32)
    np.testing.assert_allclose(
        np.asarray(jax.jit(huber, static_argnums=1)(e, 1.0)), [2.5, 0.5, 0.125, 0.0, 0.125, 0.5, 2.5], rtol=1e-6
    )
    g = np.asarray(jax.jit(jax.grad(lambda x: jnp.sum(huber(x, 1.0))))(e))
    np.testing.assert_allclose(g, [-1.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.0], rtol=1e-6)


@given(seed=SEEDS)
def test_explained_variance_matches_numpy(seed):
    values, _, returns, mask = value_data(seed)
    mask[0, :3] = 1.0
    got = float(explained_variance(values, returns, mask))
    np.testing.assert_allclose(got, ref.explained_variance(values, returns, mask), rtol=1e-4, atol=1e-5)


def test_explained_variance_extremes_and_masking():
    returns = np.array([[1.0, 2.0, 3.0, 4.0, 100.0]], np.float32)
    mask = np.array([[1, 1, 1, 1, 0]], np.float32)
    perfect = returns.copy()
    perfect[0, 4] = -1e6  # masked: ignored
    np.testing.assert_allclose(float(explained_variance(perfect, returns, mask)), 1.0, atol=1e-6)
    # Predicting the mean explains nothing: 1 - Var[R - c] / Var[R] = 0.
    mean_pred = np.full_like(returns, 2.5)
    np.testing.assert_allclose(float(explained_variance(mean_pred, returns, mask)), 0.0, atol=1e-6)
    g = jax.grad(lambda v: explained_variance(v, returns, mask))(jnp.asarray(mean_pred))
    assert np.all(np.asarray(g) == 0.0)  # a metric: no gradient into the critic


def test_value_loss_padding_invariance():
    values, old_values, returns, mask = value_data(2)
    pad = lambda x, v: np.pad(x, ((0, 2), (0, 3)), constant_values=v)  # noqa: E731
    f = _jit_loss(loss_type="huber", huber_delta=1.0)
    a, ma = f(values, old_values, returns, mask)
    b, mb = f(pad(values, 1e3), pad(old_values, -1e3), pad(returns, 7.0), pad(mask, 0.0))
    np.testing.assert_allclose(float(a), float(b), rtol=1e-6)
    for k in ma:
        np.testing.assert_allclose(float(ma[k]), float(mb[k]), rtol=1e-5, atol=1e-6, err_msg=k)


def test_value_loss_bfloat16_and_jit():
    values, old_values, returns, mask = value_data(4)
    bf = [jnp.asarray(x, jnp.bfloat16) for x in (values, old_values, returns, mask)]
    f = _jit_loss(loss_type="huber", huber_delta=1.0)
    loss_bf, m_bf = f(*bf)
    loss_up, _ = f(*[x.astype(jnp.float32) for x in bf])
    assert loss_bf.dtype == jnp.float32 and all(v.dtype == jnp.float32 for v in m_bf.values())
    np.testing.assert_allclose(float(loss_bf), float(loss_up), rtol=1e-6)


@pytest.mark.parametrize("bad", ["l2", "MSE", "smooth_l1", ""])
def test_bad_loss_type_raises(bad):
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError) as info:
        clipped_value_loss(x, x, x, x, loss_type=bad)
    assert repr(bad) in str(info.value) and "huber" in str(info.value)


def test_negative_clip_range_raises():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="clip_range"):
        clipped_value_loss(x, x, x, x, clip_range=-0.1)


def test_one_sided_huber_is_openrs_formula():
    """OpenR util.huber_loss: a = |e| <= d, b = e > d; a e^2 / 2 + b d (|e| - d / 2): errors below -d give 0."""
    from mathrl_jax.losses import huber, huber_one_sided

    e = np.array([-25.0, -10.5, -10.0, -3.0, 0.0, 2.5, 10.0, 10.5, 25.0], np.float32)
    d = 10.0
    a, b = (np.abs(e) <= d).astype(np.float32), (e > d).astype(np.float32)
    np.testing.assert_allclose(huber_one_sided(jnp.asarray(e), d), a * e**2 / 2 + b * d * (np.abs(e) - d / 2))
    inside = np.abs(e) <= d
    np.testing.assert_allclose(np.asarray(huber_one_sided(jnp.asarray(e), d))[inside], np.asarray(huber(e, d))[inside])
    assert float(huber_one_sided(jnp.asarray(-25.0), d)) == 0.0 and float(huber(jnp.asarray(-25.0), d)) == 200.0
