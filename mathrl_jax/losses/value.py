"""Critic losses: clipped value regression with MSE or Huber error."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import chex
import jax
import jax.numpy as jnp

from mathrl_jax.losses.aggregate import aggregate_loss, masked_mean, masked_var

VALUE_LOSS_TYPES = ("mse", "huber", "huber_one_sided")


def huber(error: chex.Array, delta: float) -> chex.Array:
    """Huber(e) = e^2 / 2 if |e| <= delta else delta (|e| - delta / 2) (Huber 1964)."""
    abs_error = jnp.abs(error)
    return jnp.where(abs_error <= delta, 0.5 * jnp.square(error), delta * (abs_error - 0.5 * delta))


def huber_one_sided(error: chex.Array, delta: float) -> chex.Array:
    """OpenR's `huber_loss`: e^2 / 2 if |e| <= delta, delta (|e| - delta / 2) if e > delta, and 0 if e < -delta.

    Source: OpenR `train/mat/utils/util.py` `huber_loss` (`b = (e > d)`). Its large
    negative errors (a value far above its return) give no loss and no gradient;
    with OpenR's delta = 10 and rewards in [0, 1] they do not occur. Offered to
    reproduce OpenR; `huber` is the symmetric loss.
    """
    return jnp.where(
        jnp.abs(error) <= delta, 0.5 * jnp.square(error), jnp.where(error > delta, delta * (error - 0.5 * delta), 0.0)
    )


def clipped_value_loss(
    values: chex.Array,
    old_values: chex.Array,
    returns: chex.Array,
    mask: chex.Array,
    *,
    clip_range: Optional[float] = 0.2,
    loss_type: str = "mse",
    huber_delta: float = 10.0,
    loss_agg_mode: str = "token-mean",
    norm_constant: Optional[float] = None,
    denominator: Optional[chex.Array] = None,
) -> Tuple[chex.Array, Dict[str, chex.Array]]:
    """PPO's clipped value loss.

      V_clip = clip(V, V_old - eps_v, V_old + eps_v)
      l_t    = max(f(R_t - V_t), f(R_t - V_clip_t)),   f = e^2 / 2  or  Huber_delta(e)

    Sources: Schulman et al. 2017 / OpenAI baselines (clipped value loss); the
    Huber variant and delta = 10 as in OpenR's MAPPO-style critic trainer
    (`use_huber_loss`, `huber_delta`); verl `compute_value_loss` (MSE / 2).

    Args:
      values: `[B, T]` current critic predictions (differentiated).
      old_values: `[B, T]` predictions at rollout time (constants).
      returns: `[B, T]` regression targets (constants).
      mask: `[B, T]` 1.0 where the value counts.
      clip_range: eps_v, or None for the unclipped loss.
      loss_type: "mse", "huber" or "huber_one_sided" (OpenR's).
      huber_delta: delta of the Huber loss.
      loss_agg_mode, norm_constant, denominator: see `aggregate.aggregate_loss`.

    Returns:
      (loss, metrics) with `value_loss`, `value_clip_fraction` (clipped term
      larger), `value_mean`, `explained_variance` (1 - Var[R - V] / Var[R]).
    """
    chex.assert_rank([values, old_values, returns, mask], 2)
    chex.assert_equal_shape([values, old_values, returns, mask])
    if loss_type not in VALUE_LOSS_TYPES:
        raise ValueError(f"unknown value loss_type {loss_type!r}; expected one of {VALUE_LOSS_TYPES}")
    if clip_range is not None and clip_range < 0:
        raise ValueError(f"clip_range must be >= 0 or None, got {clip_range}")
    values = jnp.asarray(values, jnp.float32)
    old_values = jax.lax.stop_gradient(jnp.asarray(old_values, jnp.float32))
    returns = jax.lax.stop_gradient(jnp.asarray(returns, jnp.float32))
    mask = jnp.asarray(mask, jnp.float32)

    def error_loss(error):
        if loss_type == "mse":
            return 0.5 * jnp.square(error)
        return (huber if loss_type == "huber" else huber_one_sided)(error, huber_delta)

    unclipped = error_loss(returns - values)
    if clip_range is None:
        loss_mat = unclipped
        clip_fraction = jnp.zeros((), jnp.float32)
    else:
        # Clipping V itself (not V - V_old) keeps V_clip == V bit for bit inside the range.
        clipped_values = jnp.clip(values, old_values - clip_range, old_values + clip_range)
        clipped = error_loss(returns - clipped_values)
        loss_mat = jnp.maximum(unclipped, clipped)
        clip_fraction = masked_mean((clipped > unclipped).astype(jnp.float32), mask)
    loss = aggregate_loss(loss_mat, mask, loss_agg_mode, norm_constant, denominator)
    metrics = {
        "value_loss": loss,
        "value_clip_fraction": clip_fraction,
        "value_mean": masked_mean(values, mask),
        "explained_variance": explained_variance(values, returns, mask),
    }
    return loss, metrics


def explained_variance(values: chex.Array, returns: chex.Array, mask: chex.Array) -> chex.Array:
    """1 - Var[R - V] / Var[R] over the masked entries (1 is perfect, <= 0 is useless; 0 when none counts)."""
    values = jax.lax.stop_gradient(jnp.asarray(values, jnp.float32))
    returns = jnp.asarray(returns, jnp.float32)
    var_returns = masked_var(returns, mask, unbiased=False)
    var_residual = masked_var(returns - values, mask, unbiased=False)
    return jnp.where(jnp.sum(mask) > 0, 1.0 - var_residual / (var_returns + 1e-8), 0.0)
