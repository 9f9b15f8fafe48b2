"""Per-token KL penalties between the policy and a frozen reference policy.

With d_t = log pi(y_t) - log pi_ref(y_t) for a token sampled from pi, the
estimators of KL(pi || pi_ref) are (Schulman 2020, "Approximating KL
Divergence"; names as in verl `kl_penalty`):

| kind | aliases          | per-token value                              |
|------|------------------|----------------------------------------------|
| k1   | kl               | d                                            |
| abs  |                  | |d|                                          |
| k2   | mse              | d^2 / 2                                      |
| k3   | low_var_kl       | exp(-d) + d - 1, with -d clamped to [-20, 20] and the result to [-10, 10] |

Use them in the loss (`kl_loss`, GRPO's beta * KL term) or in the reward
(`kl_penalized_rewards`, PPO/InstructGPT's r_t - beta * KL_t).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import chex
import jax
import jax.numpy as jnp

from mathrl_jax.losses.aggregate import aggregate_loss, masked_mean

_ALIASES = {"kl": "k1", "k1": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
KL_KINDS = tuple(sorted(_ALIASES))


def _log_ratio(logprobs: chex.Array, ref_logprobs: chex.Array) -> chex.Array:
    chex.assert_equal_shape([logprobs, ref_logprobs])
    return jnp.asarray(logprobs, jnp.float32) - jnp.asarray(ref_logprobs, jnp.float32)


def kl_k1(logprobs: chex.Array, ref_logprobs: chex.Array) -> chex.Array:
    """k1 = log pi - log pi_ref: unbiased, high variance, can be negative."""
    return _log_ratio(logprobs, ref_logprobs)


def kl_abs(logprobs: chex.Array, ref_logprobs: chex.Array) -> chex.Array:
    """|log pi - log pi_ref|."""
    return jnp.abs(_log_ratio(logprobs, ref_logprobs))


def kl_k2(logprobs: chex.Array, ref_logprobs: chex.Array) -> chex.Array:
    """k2 = (log pi - log pi_ref)^2 / 2: biased, low variance, non-negative."""
    return 0.5 * jnp.square(_log_ratio(logprobs, ref_logprobs))


def kl_k3(
    logprobs: chex.Array,
    ref_logprobs: chex.Array,
    log_ratio_clamp: float = 20.0,
    value_clamp: float = 10.0,
) -> chex.Array:
    """k3 = r - log r - 1 with r = pi_ref / pi: unbiased, low variance, >= 0.

    As verl's `low_var_kl` (used by GRPO, Shao et al. 2024 eq. 4): log r is
    clamped to [-20, 20] before `exp` and the result to [-10, 10].
    """
    log_r = jnp.clip(-_log_ratio(logprobs, ref_logprobs), -log_ratio_clamp, log_ratio_clamp)
    # expm1(x) - x is exp(x) - 1 - x without float32 cancellation near 0 (stays >= 0).
    return jnp.clip(jnp.expm1(log_r) - log_r, -value_clamp, value_clamp)


_ESTIMATORS = {"k1": kl_k1, "abs": kl_abs, "k2": kl_k2, "k3": kl_k3}


def kl_penalty(logprobs: chex.Array, ref_logprobs: chex.Array, kind: str = "k3") -> chex.Array:
    """Per-token KL estimate of `kind` (see the module table); same shape as the inputs."""
    if kind not in _ALIASES:
        raise ValueError(f"unknown KL kind {kind!r}; expected one of {', '.join(KL_KINDS)}")
    return _ESTIMATORS[_ALIASES[kind]](logprobs, ref_logprobs)


def kl_loss(
    logprobs: chex.Array,
    ref_logprobs: chex.Array,
    mask: chex.Array,
    *,
    kind: str = "k3",
    loss_agg_mode: str = "token-mean",
    norm_constant: Optional[float] = None,
    denominator: Optional[chex.Array] = None,
) -> Tuple[chex.Array, Dict[str, chex.Array]]:
    """KL(pi || pi_ref) as a loss term on `[B, T]` arrays, aggregated like the policy loss.

    The caller scales it by beta (GRPO: beta = 0.04 with k3). `ref_logprobs` is a
    constant. Returns (loss, {"kl": token-mean KL}).
    """
    chex.assert_rank([logprobs, ref_logprobs, mask], 2)
    chex.assert_equal_shape([logprobs, ref_logprobs, mask])
    per_token = kl_penalty(logprobs, jax.lax.stop_gradient(ref_logprobs), kind)
    mask = jnp.asarray(mask, jnp.float32)
    loss = aggregate_loss(per_token, mask, loss_agg_mode, norm_constant, denominator)
    return loss, {"kl": masked_mean(per_token, mask), "kl_loss": loss}


def kl_penalized_rewards(
    token_rewards: chex.Array,
    logprobs: chex.Array,
    ref_logprobs: chex.Array,
    mask: chex.Array,
    *,
    beta: float,
    kind: str = "k1",
) -> Tuple[chex.Array, Dict[str, chex.Array]]:
    """r'_t = r_t - beta * KL_t on response tokens (Ouyang et al. 2022; verl `apply_kl_penalty`).

    Args:
      token_rewards: `[B, T]` rewards (typically the score on the last token).
      logprobs, ref_logprobs: `[B, T]` log-probs of the sampling and reference policies.
      mask: `[B, T]`.
      beta: KL coefficient.
      kind: KL estimator (verl's default in the reward is k1).

    Returns:
      (`[B, T]` float32 penalised rewards, zero outside the mask;
       {"kl": token-mean KL, "kl_coef": beta}).
    """
    chex.assert_rank([token_rewards, logprobs, ref_logprobs, mask], 2)
    chex.assert_equal_shape([token_rewards, logprobs, ref_logprobs, mask])
    mask = jnp.asarray(mask, jnp.float32)
    per_token = jnp.where(mask > 0, jax.lax.stop_gradient(kl_penalty(logprobs, ref_logprobs, kind)), 0.0)
    rewards = jnp.where(mask > 0, jnp.asarray(token_rewards, jnp.float32) - beta * per_token, 0.0)
    metrics = {"kl": masked_mean(per_token, mask), "kl_coef": jnp.asarray(beta, jnp.float32)}
    return rewards, metrics
