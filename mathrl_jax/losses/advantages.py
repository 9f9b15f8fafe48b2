"""Advantage estimators.

Token-level estimators take `[B, T]` arrays and a mask; tokens with mask 0
(prompt, padding, tool output) are skipped by the backward recursions: they
neither receive nor break the flow of value from the tokens after them, so the
result on counted tokens does not depend on padding. Outputs are float32 and 0
outside the mask.

Outcome (sequence-level) estimators take `scores [B]` and a `group_ids [B]`
int array in [0, num_groups) naming each sample's prompt (for the `[G, n]`
layout, `group_ids = jnp.repeat(jnp.arange(G), n)`), plus an optional
`seq_mask [B]` that drops padding rows from the statistics. Use
`broadcast_to_tokens` to spread a `[B]` advantage over the response tokens.
"""

from __future__ import annotations

from typing import Optional, Tuple

import chex
import jax
import jax.numpy as jnp

from mathrl_jax.losses.aggregate import masked_mean, masked_var

# ---------------------------------------------------------------------------
# Token-level recursions
# ---------------------------------------------------------------------------


def masked_gae_scan(
    rewards: chex.Array,
    values: chex.Array,
    mask: chex.Array,
    discounts: chex.Array,
    lam: float,
    bootstrap_value: Optional[chex.Array] = None,
) -> Tuple[chex.Array, chex.Array]:
    """Backward GAE recursion with a per-token discount, skipping masked tokens.

      delta_t = r_t + gamma_t V_next - V_t
      A_t     = delta_t + gamma_t lam A_next

    where "next" is the next token with mask 1 (or the bootstrap value / 0 after
    the last one). `gae_advantages` uses gamma_t = gamma everywhere;
    `action_decomposed_gae` uses gamma_t = 1 inside an action.

    Args:
      rewards, values, mask, discounts: `[B, T]`.
      lam: GAE lambda.
      bootstrap_value: `[B]` value after the last token (0 = terminal).

    Returns:
      (advantages, returns) `[B, T]` float32, returns = advantages + values,
      both 0 outside the mask.
    """
    chex.assert_rank([rewards, values, mask, discounts], 2)
    chex.assert_equal_shape([rewards, values, mask, discounts])
    rewards, values, mask, discounts = (jnp.asarray(x, jnp.float32) for x in (rewards, values, mask, discounts))
    batch = rewards.shape[0]
    if bootstrap_value is None:
        bootstrap_value = jnp.zeros((batch,), jnp.float32)
    chex.assert_shape(bootstrap_value, (batch,))

    def step(carry, inputs):
        next_value, next_adv = carry
        r, v, m, g = inputs
        delta = r + g * next_value - v
        adv = delta + g * lam * next_adv
        counted = m > 0
        carry = (jnp.where(counted, v, next_value), jnp.where(counted, adv, next_adv))
        return carry, jnp.where(counted, adv, 0.0)

    init = (jnp.asarray(bootstrap_value, jnp.float32), jnp.zeros((batch,), jnp.float32))
    time_major = tuple(x.T for x in (rewards, values, mask, discounts))
    _, advantages = jax.lax.scan(step, init, time_major, reverse=True)
    advantages = advantages.T
    returns = jnp.where(mask > 0, advantages + values, 0.0)
    return advantages, returns


def gae_advantages(
    token_rewards: chex.Array,
    values: chex.Array,
    mask: chex.Array,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    bootstrap_value: Optional[chex.Array] = None,
) -> Tuple[chex.Array, chex.Array]:
    """Generalised advantage estimation over a masked token sequence.

      delta_t = r_t + gamma V_{t+1} - V_t,   A_t = sum_l (gamma lam)^l delta_{t+l},   R_t = A_t + V_t

    Source: Schulman et al. 2016, "High-Dimensional Continuous Control Using
    GAE"; masked-token skipping as verl `compute_gae_advantage_return`.

    Args:
      token_rewards: `[B, T]` reward after each token (the score on the last one,
        optionally minus a KL penalty on each).
      values: `[B, T]` critic values V_t.
      mask: `[B, T]`.
      gamma, lam: discount and GAE lambda.
      bootstrap_value: optional `[B]` value after the last counted token.

    Returns:
      (advantages, returns), `[B, T]` float32.
    """
    discounts = jnp.full(jnp.shape(token_rewards), gamma, jnp.float32)
    return masked_gae_scan(token_rewards, values, mask, discounts, lam, bootstrap_value)


def discounted_returns(token_rewards: chex.Array, mask: chex.Array, *, gamma: float = 1.0) -> chex.Array:
    """Reward-to-go G_t = sum_l gamma^l r_{t+l} over counted tokens, `[B, T]` float32."""
    zeros = jnp.zeros(jnp.shape(token_rewards), jnp.float32)
    # GAE with V = 0 and lam = 1 is exactly the discounted reward-to-go.
    advantages, _ = gae_advantages(token_rewards, zeros, mask, gamma=gamma, lam=1.0)
    return advantages


def masked_whiten(x: chex.Array, mask: chex.Array, *, shift_mean: bool = True, eps: float = 1e-8) -> chex.Array:
    """(x - mean) / sqrt(var + eps) over the masked entries (verl `masked_whiten`).

    The variance is unbiased. With `shift_mean=False` the mean is added back
    (only the scale is normalised). Entries outside the mask are returned as 0.
    """
    chex.assert_equal_shape([x, mask])
    x = jnp.asarray(x, jnp.float32)
    mask = jnp.asarray(mask, jnp.float32)
    mean = masked_mean(x, mask)
    whitened = (x - mean) * jax.lax.rsqrt(masked_var(x, mask, unbiased=True) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return jnp.where(mask > 0, whitened, 0.0)


def masked_standardize(x: chex.Array, mask: chex.Array, *, unbiased: bool, eps: float = 1e-8) -> chex.Array:
    """(x - mean) / (std + eps), mean and std over the masked entries, applied to every entry.

    OpenR's advantage normalisation: APPO `(A - A.mean()) / (A.std() + 1e-8)` over
    a minibatch's actions (torch's std: unbiased); TPPO the same over the
    minibatch's non-zero token advantages with `np.nanstd` (biased). Source:
    OpenR `llm_trainer_appo.py` / `llm_trainer_tppo.py` `ppo_update`.
    """
    chex.assert_equal_shape([x, mask])
    x = jnp.asarray(x, jnp.float32)
    mask = jnp.asarray(mask, jnp.float32)
    mean = masked_mean(x, mask)
    std = jnp.sqrt(jnp.maximum(masked_var(x, mask, unbiased=unbiased), 0.0))
    return (x - mean) / (std + eps)


def reinforce_plus_plus_advantages(
    token_rewards: chex.Array, mask: chex.Array, *, gamma: float = 1.0, eps: float = 1e-8
) -> chex.Array:
    """REINFORCE++: discounted reward-to-go, whitened over the whole batch.

      A_t = whiten(G_t),   G_t = sum_l gamma^l r_{t+l}

    Source: Hu 2025, "REINFORCE++"; verl `compute_reinforce_plus_plus_outcome_advantage`
    (which resets the return at masked tokens; identical for contiguous masks).
    """
    chex.assert_rank([token_rewards, mask], 2)
    returns = discounted_returns(token_rewards, mask, gamma=gamma)
    return masked_whiten(returns, mask, eps=eps)


# ---------------------------------------------------------------------------
# Outcome (sequence-level) estimators
# ---------------------------------------------------------------------------


def broadcast_to_tokens(seq_values: chex.Array, mask: chex.Array) -> chex.Array:
    """`[B]` -> `[B, T]`: each sequence's value on its counted tokens, 0 elsewhere."""
    chex.assert_rank(seq_values, 1)
    chex.assert_rank(mask, 2)
    chex.assert_equal_shape_prefix([seq_values, mask], 1)
    return jnp.where(mask > 0, jnp.asarray(seq_values, jnp.float32)[:, None], 0.0)


def _prepare_groups(scores, group_ids, seq_mask, num_groups):
    chex.assert_rank([scores, group_ids], 1)
    chex.assert_equal_shape([scores, group_ids])
    chex.assert_type(group_ids, int)
    scores = jnp.asarray(scores, jnp.float32)
    if seq_mask is None:
        seq_mask = jnp.ones_like(scores)
    chex.assert_equal_shape([scores, seq_mask])
    seq_mask = jnp.asarray(seq_mask, jnp.float32)
    # Padding rows may hold anything (NaN included): zero them before any arithmetic.
    scores = jnp.where(seq_mask > 0, scores, 0.0)
    if num_groups is None:
        num_groups = scores.shape[0]
    return scores, seq_mask, num_groups


def group_statistics(
    scores: chex.Array,
    group_ids: chex.Array,
    seq_mask: Optional[chex.Array] = None,
    num_groups: Optional[int] = None,
) -> Tuple[chex.Array, chex.Array, chex.Array]:
    """Per-sample (count, mean, unbiased std) of its group's scores, each `[B]`.

    Only samples with `seq_mask` 1 enter the statistics. The std of a group of
    one sample is reported as 0.
    """
    scores, seq_mask, num_groups = _prepare_groups(scores, group_ids, seq_mask, num_groups)
    segment_sum = lambda x: jax.ops.segment_sum(x, group_ids, num_segments=num_groups)
    counts = segment_sum(seq_mask)
    means = segment_sum(scores * seq_mask) / jnp.maximum(counts, 1.0)
    deviations = (scores - means[group_ids]) * seq_mask
    variances = segment_sum(jnp.square(deviations)) / jnp.maximum(counts - 1.0, 1.0)
    return counts[group_ids], means[group_ids], jnp.sqrt(variances)[group_ids]


def group_relative_advantages(
    scores: chex.Array,
    group_ids: chex.Array,
    *,
    seq_mask: Optional[chex.Array] = None,
    num_groups: Optional[int] = None,
    normalize_by_std: bool = True,
    eps: float = 1e-6,
) -> chex.Array:
    """GRPO's group-relative advantage of each sample, `[B]` float32.

      A_i = (s_i - mean_g(s)) / (std_g(s) + eps)    (std unbiased, eps on the std)

    A group of one sample has no baseline: mean 0 and std 1 are used, as verl
    does, so A_i = s_i / (1 + eps). With `normalize_by_std=False` this is
    Dr. GRPO's A_i = s_i - mean_g(s).

    Sources: Shao et al. 2024 (DeepSeekMath, GRPO); Liu et al. 2025
    ("Understanding R1-Zero-Like Training", Dr. GRPO); verl
    `compute_grpo_outcome_advantage`.

    Args:
      scores: `[B]` sequence rewards.
      group_ids: `[B]` int group (prompt) index of each sample.
      seq_mask: optional `[B]`, 0 for padding rows (excluded, advantage 0).
      num_groups: static bound on the number of groups (default B).
      normalize_by_std: divide by the group std (GRPO) or not (Dr. GRPO).
      eps: added to the std.
    """
    scores, seq_mask, num_groups = _prepare_groups(scores, group_ids, seq_mask, num_groups)
    counts, means, stds = group_statistics(scores, group_ids, seq_mask, num_groups)
    singleton = counts <= 1
    means = jnp.where(singleton, 0.0, means)
    advantages = scores - means
    if normalize_by_std:
        advantages = advantages / (jnp.where(singleton, 1.0, stds) + eps)
    return jnp.where(seq_mask > 0, advantages, 0.0)


def dr_grpo_advantages(
    scores: chex.Array,
    group_ids: chex.Array,
    *,
    seq_mask: Optional[chex.Array] = None,
    num_groups: Optional[int] = None,
) -> chex.Array:
    """Dr. GRPO: A_i = s_i - mean_g(s), no std normalisation (Liu et al. 2025)."""
    return group_relative_advantages(
        scores, group_ids, seq_mask=seq_mask, num_groups=num_groups, normalize_by_std=False
    )


def rloo_advantages(
    scores: chex.Array,
    group_ids: chex.Array,
    *,
    seq_mask: Optional[chex.Array] = None,
    num_groups: Optional[int] = None,
) -> chex.Array:
    """REINFORCE leave-one-out: the baseline is the mean of the *other* samples.

      A_i = s_i - (1 / (n - 1)) sum_{j != i} s_j = n / (n - 1) (s_i - mean_g(s))

    A group of one sample keeps A_i = s_i (verl). Sources: Kool et al. 2019;
    Ahmadian et al. 2024 ("Back to Basics"); verl `compute_rloo_outcome_advantage`.
    """
    scores, seq_mask, num_groups = _prepare_groups(scores, group_ids, seq_mask, num_groups)
    counts, means, _ = group_statistics(scores, group_ids, seq_mask, num_groups)
    scale = counts / jnp.maximum(counts - 1.0, 1.0)
    advantages = jnp.where(counts > 1, scale * (scores - means), scores)
    return jnp.where(seq_mask > 0, advantages, 0.0)


def reinforce_plus_plus_baseline_advantages(
    scores: chex.Array,
    group_ids: chex.Array,
    mask: chex.Array,
    *,
    seq_mask: Optional[chex.Array] = None,
    num_groups: Optional[int] = None,
    eps: float = 1e-8,
) -> chex.Array:
    """REINFORCE++ with a group baseline: whiten_batch(s_i - mean_g(s)) over tokens.

    The group mean is subtracted per prompt, the result broadcast to the response
    tokens and whitened over all counted tokens of the batch (so long responses
    weigh more in the statistics, as verl
    `compute_reinforce_plus_plus_baseline_outcome_advantage`). Returns `[B, T]`.
    """
    centred = dr_grpo_advantages(scores, group_ids, seq_mask=seq_mask, num_groups=num_groups)
    token_mask = jnp.asarray(mask, jnp.float32)
    if seq_mask is not None:
        token_mask = token_mask * jnp.asarray(seq_mask, jnp.float32)[:, None]
    return masked_whiten(broadcast_to_tokens(centred, token_mask), token_mask, eps=eps)


def batch_normalized_advantages(
    scores: chex.Array,
    mask: Optional[chex.Array] = None,
    *,
    unbiased: bool = False,
    eps: float = 1e-8,
) -> chex.Array:
    """OpenR's batch-normalised rewards: A = (s - mean(s)) / (std(s) + eps).

    The statistics run over every counted entry of the batch (any shape), with
    the biased std and eps = 1e-8 of OpenR's `batch_process_grpo`; pass
    `unbiased=True` for its per-chunk re-normalisation (torch's `std`). Entries
    outside `mask` are returned as 0.
    """
    scores = jnp.asarray(scores, jnp.float32)
    mask = jnp.ones_like(scores) if mask is None else jnp.asarray(mask, jnp.float32)
    std = jnp.sqrt(masked_var(scores, mask, unbiased=unbiased))
    return jnp.where(mask > 0, (scores - masked_mean(scores, mask)) / (std + eps), 0.0)


def rebn_advantages(
    turn_rewards: chex.Array,
    turn_mask: chex.Array,
    *,
    gamma: float = 1.0,
    eps: float = 1e-9,
) -> chex.Array:
    """ReBN: per-turn discounted returns, normalised over every turn in the batch.

      G_{b,k} = r_{b,k} + gamma G_{b,k+1}   (within episode b)
      A_{b,k} = (G_{b,k} - mean(G)) / (std(G) + eps)   (population std over all turns)

    Each turn is one transition of a multi-turn episode; its advantage is then
    given to every token of that turn's response.

    Source: Liu et al. 2025, "GEM: A Gym for Agentic LLMs" (REINFORCE with
    Return Batch Normalisation); GEM `examples/train_oat/train_oat.py`.

    Args:
      turn_rewards: `[B, K]` reward of turn k of episode b.
      turn_mask: `[B, K]` 1.0 on turns that happened.
      gamma: discount between turns.
      eps: added to the std (GEM: 1e-9).

    Returns:
      `[B, K]` float32 advantages, 0 on absent turns.
    """
    chex.assert_rank([turn_rewards, turn_mask], 2)
    chex.assert_equal_shape([turn_rewards, turn_mask])
    returns = discounted_returns(turn_rewards, turn_mask, gamma=gamma)
    return batch_normalized_advantages(returns, turn_mask, unbiased=False, eps=eps)


def last_token_rewards(scores: jax.Array, response_mask: jax.Array) -> jax.Array:
    """`[N, L]` with each sequence's score on its last response token (outcome reward)."""
    mask = response_mask > 0
    length = mask.shape[1]
    last = length - 1 - jnp.argmax(jnp.flip(mask, axis=1), axis=1)
    has_tokens = jnp.any(mask, axis=1)
    rewards = jax.nn.one_hot(last, length, dtype=jnp.float32) * scores.astype(jnp.float32)[:, None]
    return jnp.where(has_tokens[:, None], rewards, 0.0)
