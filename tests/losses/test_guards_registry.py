"""Update guards (importance-ratio and approx-KL early stops), the name
registries, and the documentation contract of `mathrl_jax.losses`."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mathrl_jax import losses
from mathrl_jax.losses import (
    ADVANTAGE_ESTIMATORS,
    KL_KINDS,
    POLICY_LOSSES,
    VALUE_LOSSES,
    approx_kl_exceeds,
    get_advantage_estimator,
    get_kl_estimator,
    get_policy_loss,
    get_value_loss,
    importance_ratio_exceeds,
    kl_penalty,
    register_advantage_estimator,
    register_policy_loss,
)
from tests.losses import np_reference_policy as ref

B, T = 6, 10
SEEDS = st.integers(0, 2**31 - 1)

_ratio_guard = jax.jit(importance_ratio_exceeds)
_kl_guard = jax.jit(approx_kl_exceeds)


def guard_data(seed, scale):
    rng = np.random.RandomState(seed)
    logprobs = (-np.abs(rng.randn(B, T)) * 2.0).astype(np.float32)
    old = (logprobs - rng.randn(B, T) * scale).astype(np.float32)
    mask = (rng.rand(B, T) < 0.7).astype(np.float32)
    mask[0, 0] = 1.0
    return logprobs, old, mask


# --------------------------------------------------------------------------- importance ratio guard


@given(seed=SEEDS, scale=st.sampled_from([0.1, 0.5, 1.5]), offset=st.sampled_from([-1e-2, 1e-2]))
def test_importance_ratio_guard_matches_numpy(seed, scale, offset):
    logprobs, old, mask = guard_data(seed, scale)
    mean_ratio = ref.mean_importance_ratio(logprobs, old, mask)
    threshold = mean_ratio * (1.0 + offset)  # 1% either side of the true value
    out = _ratio_guard(logprobs, old, mask, threshold)
    assert out.shape == () and out.dtype == jnp.bool_
    assert bool(out) == (mean_ratio > threshold)


def test_importance_ratio_guard_boundary_is_strict():
    logprobs = jnp.full((2, 4), -1.5)
    mask = jnp.ones((2, 4))
    # r = 1 exactly on every token: mean 8 / (8 + 1e-8) == 1.0 in float32.
    assert not bool(_ratio_guard(logprobs, logprobs, mask, 1.0))
    assert bool(_ratio_guard(logprobs, logprobs, mask, 0.999))
    # The default threshold is 5.
    assert not bool(importance_ratio_exceeds(logprobs, logprobs, mask))
    assert bool(importance_ratio_exceeds(logprobs, logprobs - jnp.log(6.0), mask))


def test_importance_ratio_guard_ignores_masked_tokens_and_clamps():
    logprobs = np.zeros((2, 4), np.float32)
    old = np.zeros((2, 4), np.float32)
    mask = np.ones((2, 4), np.float32)
    mask[1, 2:] = 0.0
    old[1, 2:] = -1e4  # ratio e^{1e4} on masked tokens
    assert not bool(_ratio_guard(logprobs, old, mask, 1.5))
    # On a counted token the log ratio is clamped at 20 before exp: the mean stays finite.
    old[0, 0] = -1e4
    mean = (np.exp(20.0) + 5.0) / 6.0
    assert bool(_ratio_guard(logprobs, old, mask, mean * 0.999))
    assert not bool(_ratio_guard(logprobs, old, mask, mean * 1.001))


# --------------------------------------------------------------------------- approx KL guard


@given(seed=SEEDS, scale=st.sampled_from([0.05, 0.2, 0.5]), offset=st.sampled_from([-1e-2, 1e-2]))
def test_approx_kl_guard_matches_numpy(seed, scale, offset):
    logprobs, old, mask = guard_data(seed, scale)
    kl = ref.mean_k3_new_over_old(logprobs, old, mask)
    target = kl * (1.0 + offset)
    out = _kl_guard(logprobs, old, mask, target)
    assert out.shape == () and out.dtype == jnp.bool_
    assert bool(out) == (kl > target)


def test_approx_kl_guard_direction_and_boundary():
    logprobs = np.zeros((1, 4), np.float32)
    old = np.zeros((1, 4), np.float32)
    mask = np.ones((1, 4), np.float32)
    # Identical policies: the estimate is exactly 0, and the comparison is strict.
    assert not bool(_kl_guard(logprobs, old, mask, 0.0))
    assert bool(_kl_guard(logprobs, old, mask, -1e-9))
    # r = pi / pi_old = 2 on every token: (r - 1) - log r = 1 - log 2 = 0.3069.
    new = logprobs + np.log(2.0).astype(np.float32)
    assert bool(_kl_guard(new, old, mask, 0.30))
    assert not bool(_kl_guard(new, old, mask, 0.31))
    # r = 1/2: (1/2 - 1) + log 2 = 0.1931 (the estimator is not symmetric in the two policies).
    half = logprobs - np.log(2.0).astype(np.float32)
    assert bool(_kl_guard(half, old, mask, 0.19))
    assert not bool(_kl_guard(half, old, mask, 0.20))
    # Default target 0.02.
    assert not bool(approx_kl_exceeds(logprobs, old, mask))
    assert bool(approx_kl_exceeds(new, old, mask))


def test_approx_kl_guard_ignores_masked_tokens():
    logprobs = np.zeros((2, 3), np.float32)
    old = np.zeros((2, 3), np.float32)
    mask = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
    old[1, 1:] = 30.0
    logprobs[1, 2] = np.nan
    assert not bool(_kl_guard(logprobs, old, mask, 1e-6))


def test_guards_compose_under_jit_with_lax_cond():
    logprobs, old, mask = guard_data(0, 0.3)

    @jax.jit
    def step(lp, o, m):
        skip = importance_ratio_exceeds(lp, o, m, threshold=5.0) | approx_kl_exceeds(lp, o, m, target_kl=0.02)
        return jax.lax.cond(skip, lambda: jnp.zeros(()), lambda: jnp.ones(())), skip

    value, skip = step(logprobs, old, mask)
    kl = ref.mean_k3_new_over_old(logprobs, old, mask)
    ratio = ref.mean_importance_ratio(logprobs, old, mask)
    assert bool(skip) == (kl > 0.02 or ratio > 5.0)
    assert float(value) == (0.0 if bool(skip) else 1.0)


# --------------------------------------------------------------------------- registry


def test_every_registered_name_resolves():
    for name, fn in POLICY_LOSSES.items():
        assert get_policy_loss(name) is fn and callable(fn)
    for name, fn in VALUE_LOSSES.items():
        assert get_value_loss(name) is fn and callable(fn)
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        assert get_advantage_estimator(name) is fn and callable(fn)
    assert {"ppo", "decoupled_ppo", "gspo", "reinforce"} <= set(POLICY_LOSSES)
    assert {"gae", "grpo", "drgrpo", "rloo", "rebn"} <= set(ADVANTAGE_ESTIMATORS)
    assert "clipped" in VALUE_LOSSES


def test_registered_policy_losses_share_the_signature():
    rng = np.random.RandomState(0)
    logprobs = (-np.abs(rng.randn(B, T))).astype(np.float32)
    old = (logprobs + 0.1 * rng.randn(B, T)).astype(np.float32)
    adv = rng.randn(B, T).astype(np.float32)
    mask = np.ones((B, T), np.float32)
    for name in ("ppo", "decoupled_ppo", "gspo", "reinforce"):
        extra = {"proximal_logprobs": old} if name == "decoupled_ppo" else {}
        loss, metrics = get_policy_loss(name)(logprobs, old, adv, mask, **extra)
        assert loss.shape == () and np.isfinite(float(loss)), name
        assert "policy_loss" in metrics and "approx_kl" in metrics, name


@pytest.mark.parametrize(
    "getter,table",
    [
        (get_policy_loss, POLICY_LOSSES),
        (get_value_loss, VALUE_LOSSES),
        (get_advantage_estimator, ADVANTAGE_ESTIMATORS),
    ],
)
def test_unknown_names_raise_listing_the_valid_names(getter, table):
    with pytest.raises(ValueError) as info:
        getter("no_such_thing")
    message = str(info.value)
    assert "'no_such_thing'" in message
    for name in table:
        assert name in message


def test_unknown_kl_estimator_raises_listing_the_kinds():
    with pytest.raises(ValueError) as info:
        get_kl_estimator("k9")
    assert "'k9'" in str(info.value)
    for kind in KL_KINDS:
        assert kind in str(info.value)


@pytest.mark.parametrize("kind", list(KL_KINDS))
def test_get_kl_estimator_for_every_kind(kind):
    rng = np.random.RandomState(1)
    logprobs = (-np.abs(rng.randn(3, 4))).astype(np.float32)
    ref_logprobs = (logprobs + rng.randn(3, 4)).astype(np.float32)
    estimator = get_kl_estimator(kind)
    got = np.asarray(estimator(logprobs, ref_logprobs))
    np.testing.assert_allclose(got, np.asarray(kl_penalty(logprobs, ref_logprobs, kind)), rtol=1e-6)
    np.testing.assert_allclose(got, ref.kl_per_token(logprobs, ref_logprobs, kind), rtol=1e-5, atol=1e-6)


def test_register_policy_loss():
    def my_loss(logprobs, old_logprobs, advantages, mask, **kwargs):
        """l = 0 (test)."""
        return jnp.zeros(()), {}

    def other_loss(logprobs, old_logprobs, advantages, mask, **kwargs):
        """l = 1 (test)."""
        return jnp.ones(()), {}

    assert "test_my_loss" not in POLICY_LOSSES
    try:
        assert register_policy_loss("test_my_loss", my_loss) is my_loss
        assert get_policy_loss("test_my_loss") is my_loss
        # Re-registering the same function is a no-op; a different one is refused.
        register_policy_loss("test_my_loss", my_loss)
        with pytest.raises(ValueError, match="test_my_loss"):
            register_policy_loss("test_my_loss", other_loss)
        assert get_policy_loss("test_my_loss") is my_loss
        # Built-in names are protected too.
        with pytest.raises(ValueError, match="ppo"):
            register_policy_loss("ppo", other_loss)
        assert get_policy_loss("ppo") is losses.ppo_clip_loss
    finally:
        POLICY_LOSSES.pop("test_my_loss", None)
    assert "test_my_loss" not in POLICY_LOSSES


def test_register_advantage_estimator():
    def my_estimator(scores):
        """A = s (test)."""
        return scores

    try:
        assert register_advantage_estimator("test_identity", my_estimator) is my_estimator
        assert get_advantage_estimator("test_identity") is my_estimator
        with pytest.raises(ValueError, match="grpo"):
            register_advantage_estimator("grpo", my_estimator)
    finally:
        ADVANTAGE_ESTIMATORS.pop("test_identity", None)


# --------------------------------------------------------------------------- documentation


def _public_functions():
    return [
        (name, obj)
        for name in losses.__all__
        if inspect.isfunction(obj := getattr(losses, name)) and not name.startswith("_")
    ]


def test_every_public_function_has_a_docstring():
    functions = _public_functions()
    assert len(functions) > 30
    missing = [name for name, fn in functions if not (fn.__doc__ or "").strip()]
    assert not missing, f"public functions without a docstring: {missing}"


@pytest.mark.parametrize(
    "name",
    [
        "ppo_clip_loss",
        "decoupled_ppo_loss",
        "gspo_loss",
        "reinforce_loss",
        "clipped_value_loss",
        "huber",
        "kl_k1",
        "kl_k2",
        "kl_k3",
        "kl_penalized_rewards",
        "masked_mean",
        "masked_var",
        "importance_ratio_exceeds",
        "approx_kl_exceeds",
        "explained_variance",
    ],
)
def test_loss_docstrings_give_a_formula_or_source(name):
    doc = getattr(losses, name).__doc__
    has_formula = "=" in doc
    has_source = any(
        word in doc for word in ("Source", "et al.", "verl", "AReaL", "RLinf", "OpenR", "Huber 19", "Schulman")
    )
    assert has_formula or has_source, name


def test_module_docstrings_present():
    from mathrl_jax.losses import aggregate, guards, kl, policy, registry, value

    for module in (losses, aggregate, guards, kl, policy, registry, value):
        assert (module.__doc__ or "").strip(), module.__name__
