"""Pure predicates an update step uses to skip or stop policy updates.

Both return a boolean scalar array, so they work inside `jax.jit` with
`jax.lax.cond` / `jnp.where` rather than Python control flow.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from mathrl_jax.losses.aggregate import masked_mean
from mathrl_jax.losses.kl import kl_k3
from mathrl_jax.losses.policy import clamped_log_ratio


def importance_ratio_exceeds(
    logprobs: chex.Array,
    old_logprobs: chex.Array,
    mask: chex.Array,
    threshold: float = 5.0,
    log_ratio_clamp: float = 20.0,
) -> chex.Array:
    """True when the masked mean importance ratio mean_t r_t exceeds `threshold`.

    RLinf's minibatch early stop (`early_stop_imp_ratio`, default 5.0): such a
    minibatch is too far off-policy and its policy loss is dropped.
    Arrays are `[B, T]`; returns a bool scalar.
    """
    chex.assert_rank([logprobs, old_logprobs, mask], 2)
    chex.assert_equal_shape([logprobs, old_logprobs, mask])
    ratio = jnp.exp(
        clamped_log_ratio(jnp.asarray(logprobs, jnp.float32), jnp.asarray(old_logprobs, jnp.float32), log_ratio_clamp)
    )
    return masked_mean(ratio, jnp.asarray(mask, jnp.float32)) > threshold


def approx_kl_exceeds(
    logprobs: chex.Array,
    old_logprobs: chex.Array,
    mask: chex.Array,
    target_kl: float = 0.02,
) -> chex.Array:
    """True when the k3 estimate of KL(pi_old || pi), token-mean over the mask, exceeds `target_kl`.

      approx_kl = mean_t [(r_t - 1) - log r_t],   r_t = pi / pi_old

    OpenR's PPO trainers skip the policy step of a minibatch when this exceeds
    0.02. Arrays are `[B, T]`; returns a bool scalar.
    """
    chex.assert_rank([logprobs, old_logprobs, mask], 2)
    chex.assert_equal_shape([logprobs, old_logprobs, mask])
    # k3 with the roles of the two policies swapped: r = pi / pi_old.
    per_token = kl_k3(old_logprobs, logprobs)
    return masked_mean(per_token, jnp.asarray(mask, jnp.float32)) > target_kl
