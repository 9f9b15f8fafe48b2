"""Policy-gradient losses on `[B, T]` token arrays.

All losses share the positional signature
`(logprobs, old_logprobs, advantages, mask)`:

  logprobs:      `[B, T]` log pi_theta(y_t | y_<t) of the taken tokens (differentiated).
  old_logprobs:  `[B, T]` log-probs of the same tokens under the policy that
                 sampled them (the behaviour policy); treated as constants.
  advantages:    `[B, T]` per-token advantages; treated as constants.
  mask:          `[B, T]` 1.0 on response tokens that count, 0.0 elsewhere.

and return `(loss, metrics)`: a float32 scalar and a flat dict of float32
scalars. Every metric is a token-mean over the mask. The keyword arguments
`loss_agg_mode`, `norm_constant` and `denominator` are passed to
`aggregate.aggregate_loss` (see there for exact micro-batch accumulation).
Inputs may be bfloat16; all arithmetic is float32.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import chex
import jax
import jax.numpy as jnp

from mathrl_jax.losses.action_decomposition import action_starts_from_index, action_sums
from mathrl_jax.losses.aggregate import aggregate_loss, masked_mean

Metrics = Dict[str, chex.Array]


def _as_f32(*arrays):
    return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


def _check_token_arrays(*arrays) -> None:
    chex.assert_rank(arrays, 2)
    chex.assert_equal_shape(arrays)


def clamped_log_ratio(
    logprobs: chex.Array, old_logprobs: chex.Array, log_ratio_clamp: Optional[float] = 20.0
) -> chex.Array:
    """log r = log pi - log pi_old, clamped to [-c, c] before any `exp` (verl: c = 20).

    The clamp keeps `exp` finite when a token's probability collapsed between
    sampling and training; it also zeroes the gradient of those tokens.
    """
    log_ratio = logprobs - jax.lax.stop_gradient(old_logprobs)
    if log_ratio_clamp is not None:
        log_ratio = jnp.clip(log_ratio, -log_ratio_clamp, log_ratio_clamp)
    return log_ratio


def _clipped_surrogate(
    ratio: chex.Array,
    advantages: chex.Array,
    clip_low: float,
    clip_high: float,
    clip_c: Optional[float],
) -> Tuple[chex.Array, Dict[str, chex.Array]]:
    """Per-token PPO loss max(-A r, -A clip(r)) with optional dual clip, and its indicators."""
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = jnp.maximum(unclipped, clipped)
    indicators = {
        # The clipped branch is the active one (its gradient is zero).
        "clip_fraction": (clipped > unclipped).astype(jnp.float32),
        "clip_fraction_high": ((ratio > 1.0 + clip_high) & (advantages > 0)).astype(jnp.float32),
        "clip_fraction_low": ((ratio < 1.0 - clip_low) & (advantages < 0)).astype(jnp.float32),
    }
    if clip_c is not None:
        # Dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games"):
        # for A < 0 the loss is also bounded above by -A c.
        dual_bound = -advantages * clip_c
        dual_active = (advantages < 0) & (loss > dual_bound)
        loss = jnp.where(advantages < 0, jnp.minimum(loss, dual_bound), loss)
        indicators["dual_clip_fraction"] = dual_active.astype(jnp.float32)
    else:
        indicators["dual_clip_fraction"] = jnp.zeros_like(ratio)
    return loss, indicators


def _check_clip_args(clip_low: float, clip_high: float, clip_c: Optional[float]) -> None:
    if not (0.0 <= clip_low < 1.0):
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"clip_c (dual clip) must be > 1.0, got {clip_c}")


def _ratio_metrics(log_ratio: chex.Array, ratio: chex.Array, mask: chex.Array) -> Metrics:
    return {
        # k1 estimate of KL(pi_old || pi) on the sampled tokens, as verl's `ppo_kl`.
        "approx_kl": masked_mean(-log_ratio, mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": jnp.max(jnp.where(mask > 0, ratio, -jnp.inf), initial=0.0),
    }


def ppo_clip_loss(
    logprobs: chex.Array,
    old_logprobs: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    *,
    clip_low: float = 0.2,
    clip_high: Optional[float] = None,
    clip_c: Optional[float] = None,
    log_ratio_clamp: Optional[float] = 20.0,
    loss_agg_mode: str = "token-mean",
    norm_constant: Optional[float] = None,
    denominator: Optional[chex.Array] = None,
) -> Tuple[chex.Array, Metrics]:
    """PPO clipped surrogate with asymmetric (DAPO clip-higher) and dual clipping.

    r_t = exp(clamp(log pi - log pi_old, -20, 20))
    l_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))
    with dual clip (A_t < 0 only): l_t = min(l_t, -A_t c)

    Sources: Schulman et al. 2017 (PPO); Yu et al. 2025 (DAPO, eps_high = 0.28);
    Ye et al. 2020 (dual clip, c = 3); verl `compute_policy_loss` for the clamp
    and metric definitions.

    Args:
      logprobs, old_logprobs, advantages, mask: `[B, T]`, see the module doc.
      clip_low: eps_low.
      clip_high: eps_high; defaults to `clip_low` (symmetric PPO).
      clip_c: dual-clip constant c > 1, or None to disable.
      log_ratio_clamp: bound on |log r| before `exp`, or None.
      loss_agg_mode, norm_constant, denominator: see `aggregate.aggregate_loss`.

    Returns:
      (loss, metrics) with `clip_fraction` (clipped branch active),
      `clip_fraction_high` (r > 1 + eps_high, A > 0), `clip_fraction_low`
      (r < 1 - eps_low, A < 0), `dual_clip_fraction`, `approx_kl`, `ratio_mean`,
      `ratio_max`.
    """
    _check_token_arrays(logprobs, old_logprobs, advantages, mask)
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip_args(clip_low, clip_high, clip_c)
    logprobs, old_logprobs, advantages, mask = _as_f32(logprobs, old_logprobs, advantages, mask)
    advantages = jax.lax.stop_gradient(advantages)

    log_ratio = clamped_log_ratio(logprobs, old_logprobs, log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    loss_mat, indicators = _clipped_surrogate(ratio, advantages, clip_low, clip_high, clip_c)
    loss = aggregate_loss(loss_mat, mask, loss_agg_mode, norm_constant, denominator)

    metrics = {name: masked_mean(v, mask) for name, v in indicators.items()}
    metrics.update(_ratio_metrics(log_ratio, ratio, mask))
    metrics["policy_loss"] = loss
    return loss, metrics


def action_ppo_loss(
    logprobs: chex.Array,
    old_logprobs: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    *,
    action_index: chex.Array,
    clip_low: float = 0.2,
    clip_high: Optional[float] = None,
    log_ratio_clamp: Optional[float] = 20.0,
    denominator: Optional[chex.Array] = None,
) -> Tuple[chex.Array, Metrics]:
    """APPO's policy loss: one importance ratio per action (reasoning step), as OpenR.

      log r_a = sum_{t in a} (log pi_t - log pi_old_t)       (the action's joint log-ratio)
      l_a     = max(-A_a r_a, -A_a clip(r_a, 1 - eps_low, 1 + eps_high))
      loss    = mean over actions of l_a

    Source: OpenR `llm_trainer_appo.py` `cal_policy_loss` on the joint action
    log-probs of `qwen_lora_agent.get_joint_action_log_probs`. Unlike OpenR the
    joint log-ratio is clamped to +-`log_ratio_clamp` before `exp` (OpenR: none),
    which changes nothing below e^20.

    Args:
      logprobs, old_logprobs, mask: `[B, T]` token arrays (module doc).
      advantages: `[B, T]`, each action's advantage on its tokens (read at its first token).
      action_index: `[B, T]` int, the action of each counted token.
      denominator: the number of actions the loss is averaged over (default: those here;
        pass a minibatch's count for exact micro-batch accumulation).

    Returns:
      (loss, metrics) with the action-level `clip_fraction`, `approx_kl` (OpenR's
      mean of (r - 1) - log r over actions), `ratio_mean`, `ratio_max` and `num_actions`.
    """
    _check_token_arrays(logprobs, old_logprobs, advantages, mask, action_index)
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip_args(clip_low, clip_high, None)
    logprobs, old_logprobs, advantages, mask = _as_f32(logprobs, old_logprobs, advantages, mask)
    advantages = jax.lax.stop_gradient(advantages)
    starts = action_starts_from_index(action_index, mask)
    token_log_ratio = jnp.where(mask > 0, logprobs - jax.lax.stop_gradient(old_logprobs), 0.0)
    log_ratio = action_sums(token_log_ratio, action_index, mask)
    if log_ratio_clamp is not None:
        log_ratio = jnp.clip(log_ratio, -log_ratio_clamp, log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    loss_mat, indicators = _clipped_surrogate(ratio, advantages, clip_low, clip_high, None)
    denominator = jnp.sum(starts) if denominator is None else denominator
    loss = jnp.sum(loss_mat * starts) / jnp.maximum(denominator, 1e-8)
    metrics = {name: masked_mean(v, starts) for name, v in indicators.items() if name != "dual_clip_fraction"}
    metrics.update(
        approx_kl=masked_mean((ratio - 1.0) - log_ratio, starts),
        ratio_mean=masked_mean(ratio, starts),
        ratio_max=jnp.max(jnp.where(starts > 0, ratio, -jnp.inf), initial=0.0),
        num_actions=jnp.sum(starts),
        policy_loss=loss,
    )
    return loss, metrics


def decoupled_ppo_loss(
    logprobs: chex.Array,
    old_logprobs: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    *,
    proximal_logprobs: chex.Array,
    clip_low: float = 0.2,
    clip_high: Optional[float] = None,
    clip_c: Optional[float] = None,
    behaviour_weight_cap: Optional[float] = None,
    log_ratio_clamp: Optional[float] = 20.0,
    loss_agg_mode: str = "token-mean",
    norm_constant: Optional[float] = None,
    denominator: Optional[chex.Array] = None,
) -> Tuple[chex.Array, Metrics]:
    """AReaL's decoupled PPO loss for off-policy (asynchronous) rollouts.

    The trust region is taken around a *proximal* policy pi_prox (the learner's
    weights before this update, log-probs recomputed) rather than the behaviour
    policy pi_behav that generated the tokens, and the off-policyness is
    corrected by an importance weight:

      r_t = pi / pi_prox,    w_t = pi_prox / pi_behav
      l_t = w_t * max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))   (+ dual clip)

    Tokens whose behaviour weight exceeds `behaviour_weight_cap` get w_t = 0
    (they are dropped but still counted in the denominator, as AReaL does).

    Source: Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement
    Learning System for Language Reasoning", eq. 5; AReaL `ppo_actor_loss_fn`.

    Args:
      logprobs, advantages, mask: `[B, T]`, see the module doc.
      old_logprobs: `[B, T]` behaviour log-probs (from the sampler).
      proximal_logprobs: `[B, T]` log-probs under the proximal policy.
      behaviour_weight_cap: drop tokens with w_t above it; None keeps all.
      clip_low, clip_high, clip_c, log_ratio_clamp: as `ppo_clip_loss`.

    Returns:
      (loss, metrics): the `ppo_clip_loss` metrics (w.r.t. the proximal policy)
      plus `behaviour_weight_mean`, `behaviour_kl` (mean of log pi_prox - log
      pi_behav) and `behaviour_capped_fraction`.
    """
    _check_token_arrays(logprobs, old_logprobs, proximal_logprobs, advantages, mask)
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip_args(clip_low, clip_high, clip_c)
    logprobs, old_logprobs, proximal_logprobs, advantages, mask = _as_f32(
        logprobs, old_logprobs, proximal_logprobs, advantages, mask
    )
    advantages = jax.lax.stop_gradient(advantages)
    proximal_logprobs = jax.lax.stop_gradient(proximal_logprobs)

    log_ratio = clamped_log_ratio(logprobs, proximal_logprobs, log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    loss_mat, indicators = _clipped_surrogate(ratio, advantages, clip_low, clip_high, clip_c)

    behaviour_log_weight = clamped_log_ratio(proximal_logprobs, old_logprobs, log_ratio_clamp)
    behaviour_weight = jnp.exp(behaviour_log_weight)
    if behaviour_weight_cap is not None:
        kept = behaviour_weight <= behaviour_weight_cap
    else:
        kept = jnp.ones_like(behaviour_weight, dtype=bool)
    behaviour_weight = jnp.where(kept, behaviour_weight, 0.0)
    loss_mat = loss_mat * behaviour_weight
    loss = aggregate_loss(loss_mat, mask, loss_agg_mode, norm_constant, denominator)

    metrics = {name: masked_mean(v, mask) for name, v in indicators.items()}
    metrics.update(_ratio_metrics(log_ratio, ratio, mask))
    kept_mask = mask * kept
    metrics["behaviour_weight_mean"] = masked_mean(behaviour_weight, kept_mask)
    metrics["behaviour_kl"] = masked_mean(behaviour_log_weight, kept_mask)
    metrics["behaviour_capped_fraction"] = masked_mean(1.0 - kept.astype(jnp.float32), mask)
    metrics["policy_loss"] = loss
    return loss, metrics


def gspo_loss(
    logprobs: chex.Array,
    old_logprobs: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    log_ratio_max: float = 10.0,
    loss_agg_mode: str = "seq-mean-token-mean",
    norm_constant: Optional[float] = None,
    denominator: Optional[chex.Array] = None,
) -> Tuple[chex.Array, Metrics]:
    """GSPO: PPO clipping on the length-normalised sequence likelihood ratio.

      log s_i = (1 / |y_i|) sum_t m_t (log pi - log pi_old)
      s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]        (value s_i, token gradient)
      l_{i,t} = max(-A_i s_{i,t}, -A_i clip(s_{i,t}, 1 - eps_low, 1 + eps_high))

    The log of s_{i,t} is clamped from above at `log_ratio_max` (verl: 10).

    Source: Zheng et al. 2025, "Group Sequence Policy Optimization" (eps = 3e-4 /
    4e-4, seq-mean-token-mean); verl `compute_policy_loss_gspo`.

    Args:
      advantages: `[B, T]` (a sequence-level advantage broadcast over tokens).

    Returns:
      (loss, metrics) with clip fractions measured on the sequence ratio;
      `ratio_mean` is the token-mean of s_i.
    """
    _check_token_arrays(logprobs, old_logprobs, advantages, mask)
    _check_clip_args(clip_low, clip_high, None)
    logprobs, old_logprobs, advantages, mask = _as_f32(logprobs, old_logprobs, advantages, mask)
    advantages = jax.lax.stop_gradient(advantages)

    token_log_ratio = jnp.where(mask > 0, logprobs - jax.lax.stop_gradient(old_logprobs), 0.0)
    lengths = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
    seq_log_ratio = jnp.sum(token_log_ratio * mask, axis=-1, keepdims=True) / lengths
    log_ratio = logprobs - jax.lax.stop_gradient(logprobs) + jax.lax.stop_gradient(seq_log_ratio)
    log_ratio = jnp.minimum(log_ratio, log_ratio_max)
    ratio = jnp.exp(log_ratio)
    loss_mat, indicators = _clipped_surrogate(ratio, advantages, clip_low, clip_high, None)
    loss = aggregate_loss(loss_mat, mask, loss_agg_mode, norm_constant, denominator)

    metrics = {name: masked_mean(v, mask) for name, v in indicators.items()}
    metrics.update(_ratio_metrics(token_log_ratio, ratio, mask))
    metrics["policy_loss"] = loss
    return loss, metrics


def reinforce_loss(
    logprobs: chex.Array,
    old_logprobs: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    *,
    loss_agg_mode: str = "token-mean",
    norm_constant: Optional[float] = None,
    denominator: Optional[chex.Array] = None,
) -> Tuple[chex.Array, Metrics]:
    """Plain REINFORCE: l_t = -A_t log pi(y_t).

    Source: Williams 1992. The loss uses no importance ratio, so it is unbiased
    only on-policy; `old_logprobs` is used for the metrics (ratio, approx KL) that
    show how far the data is from on-policy. The clip metrics are zero.
    """
    _check_token_arrays(logprobs, old_logprobs, advantages, mask)
    logprobs, old_logprobs, advantages, mask = _as_f32(logprobs, old_logprobs, advantages, mask)
    advantages = jax.lax.stop_gradient(advantages)

    loss_mat = -advantages * logprobs
    loss = aggregate_loss(loss_mat, mask, loss_agg_mode, norm_constant, denominator)

    log_ratio = clamped_log_ratio(jax.lax.stop_gradient(logprobs), old_logprobs)
    metrics = _ratio_metrics(log_ratio, jnp.exp(log_ratio), mask)
    zero = jnp.zeros((), jnp.float32)
    metrics.update(clip_fraction=zero, clip_fraction_high=zero, clip_fraction_low=zero, dual_clip_fraction=zero)
    metrics["policy_loss"] = loss
    return loss, metrics
