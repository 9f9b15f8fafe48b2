"""Sampler and trainer disagree: how much, and the truncated importance weight that corrects for it.

A sampler that is not the trainer (vLLM with its own kernels, a bfloat16 engine beside
a float32 trainer) samples from pi_sampler, a slightly different distribution from the
trainer's pi_trainer with the same weights. PPO's ratio is taken against pi_trainer
(the recomputed old log-probs), so the samples are off-policy by pi_trainer / pi_sampler.

Inputs are `[B, T]` token arrays: `trainer_logprobs` (the trainer's recomputed
log-probs of the sampled tokens), `sampler_logprobs` (the sampler's, of the
distribution it sampled from) and `mask` (1.0 on the response tokens that count).
"""

from __future__ import annotations

from typing import Dict, Tuple

import chex
import jax
import jax.numpy as jnp

from mathrl_jax.losses.aggregate import masked_mean


def _check(trainer_logprobs, sampler_logprobs, mask) -> Tuple[chex.Array, chex.Array, chex.Array]:
    chex.assert_rank([trainer_logprobs, sampler_logprobs, mask], 2)
    chex.assert_equal_shape([trainer_logprobs, sampler_logprobs, mask])
    return tuple(jnp.asarray(a, jnp.float32) for a in (trainer_logprobs, sampler_logprobs, mask))


def sampler_mismatch_metrics(
    trainer_logprobs: chex.Array,
    sampler_logprobs: chex.Array,
    mask: chex.Array,
    *,
    ratio_bounds: Tuple[float, float] = (0.5, 2.0),
) -> Dict[str, chex.Array]:
    """How far the sampler's log-probs are from the trainer's, over the masked tokens.

      logprob_diff        = mean |log pi_trainer - log pi_sampler|
      ratio_outside       = share of tokens with pi_trainer / pi_sampler outside `ratio_bounds`
      kl_sampler_trainer  = mean (log pi_sampler - log pi_trainer), a k1 estimate of KL(pi_sampler || pi_trainer)

    Sources: verl's rollout-correction metrics (`rollout_probs_diff`, the off-policy
    k1 KL); the [0.5, 2] band is TRL's and verl's default for a token "out of bounds".
    """
    trainer, sampler, mask = _check(trainer_logprobs, sampler_logprobs, mask)
    low, high = ratio_bounds
    log_ratio = jnp.where(mask > 0, trainer - sampler, 0.0)
    outside = (log_ratio < jnp.log(low)) | (log_ratio > jnp.log(high))
    return {
        "logprob_diff": masked_mean(jnp.abs(log_ratio), mask),
        "ratio_outside": masked_mean(outside.astype(jnp.float32), mask),
        "kl_sampler_trainer": masked_mean(-log_ratio, mask),
    }


def truncated_importance_weights(
    trainer_logprobs: chex.Array,
    sampler_logprobs: chex.Array,
    mask: chex.Array,
    *,
    cap: float = 2.0,
    log_ratio_clamp: float = 20.0,
) -> Tuple[chex.Array, Dict[str, chex.Array]]:
    """Truncated importance sampling (TIS): the per-token weight w_t = min(pi_trainer / pi_sampler, C).

      w_t = min(exp(clamp(log pi_trainer(y_t) - log pi_sampler(y_t), -c, c)), C)    on masked tokens, 0 elsewhere

    A constant (no gradient): it multiplies each token's policy loss, so the
    gradient is that of the trainer's own policy up to the truncation. Truncation
    at C bounds the variance a few tokens with a tiny pi_sampler would bring.
    Source: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
    Off-Policy RL Training" (verl `tis_imp_ratio_cap`, PR #2953; TRL
    `vllm_importance_sampling_cap`, #4530); C = 2 is their default.

    Returns:
      (weights `[B, T]` float32, metrics): `weight_mean` (mean weight over the
      mask) and `truncated_fraction` (share of tokens whose weight was cut to C).
    """
    if not cap > 0:
        raise ValueError(f"truncated_importance_weights: cap={cap!r}, expected > 0")
    trainer, sampler, mask = _check(trainer_logprobs, sampler_logprobs, mask)
    log_ratio = jnp.clip(trainer - sampler, -log_ratio_clamp, log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    weights = jax.lax.stop_gradient(jnp.where(mask > 0, jnp.minimum(ratio, cap), 0.0))
    metrics = {
        "weight_mean": masked_mean(weights, mask),
        "truncated_fraction": masked_mean((ratio > cap).astype(jnp.float32), mask),
    }
    return weights, metrics
