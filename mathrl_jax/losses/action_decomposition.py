"""Token-level credit assignment for multi-token actions (TPPO / POAD).

In step-wise reasoning an *action* is a whole reasoning step of several tokens.
POAD's Bellman backup with Action Decomposition (BAD) keeps the token-level
MDP but makes it consistent with the action-level one: between the tokens of
one action there is no reward and no discount; the environment reward and the
discount gamma apply only at the action's last token. For token k of action t
(K the action's last token):

  inside the action (k < K): delta = V_{t,k+1} - V_{t,k},
                              A_{t,k} = delta + lam A_{t,k+1}
  at its end (k = K):         delta = r_t + gamma V_{t+1,0} - V_{t,K},
                              A_{t,K} = delta + gamma lam A_{t+1,0}

and R = A + V. Source: Wen et al. 2024, "Reinforcing LLM Agents via Policy
Optimization with Action Decomposition" (POAD); OpenR
`language_buffer.batch_process_tppo` (lam inside the step, gamma lam across).

The naive token-level variant (NTPO) discounts every token: it is plain
`gae_advantages` over tokens with the rewards on the action ends, exported
here as `naive_token_gae` for comparison. Action-level GAE (APPO) is
`gae_advantages` applied to `[B, A]` per-action arrays. When every action is a
single token the three coincide.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import chex
import jax
import jax.numpy as jnp

from mathrl_jax.losses.advantages import gae_advantages, masked_gae_scan


def action_ends_from_index(action_index: chex.Array, mask: chex.Array) -> chex.Array:
    """Marks the last counted token of each action.

    Args:
      action_index: `[B, T]` int, the action (reasoning step) each token belongs
        to; any value on tokens outside the mask.
      mask: `[B, T]`.

    Returns:
      `[B, T]` float32, 1.0 on a counted token whose next counted token belongs to
      another action, or that is the last counted token of its row.
    """
    chex.assert_rank([action_index, mask], 2)
    chex.assert_equal_shape([action_index, mask])
    counted = jnp.asarray(mask) > 0
    batch, length = action_index.shape
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    # Index of the next counted token at or after each position (length if none).
    next_counted = jnp.where(counted, positions, length)
    next_counted = jax.lax.cummin(next_counted, axis=1, reverse=True)
    following = jnp.concatenate([next_counted[:, 1:], jnp.full((batch, 1), length)], axis=-1)
    has_following = following < length
    following_index = jnp.take_along_axis(action_index, jnp.minimum(following, length - 1), axis=-1)
    ends = counted & (~has_following | (following_index != action_index))
    return ends.astype(jnp.float32)


def action_starts_from_index(action_index: chex.Array, mask: chex.Array) -> chex.Array:
    """`[B, T]` float32, 1.0 on the first counted token of each action (the state it is taken from)."""
    chex.assert_rank([action_index, mask], 2)
    chex.assert_equal_shape([action_index, mask])
    counted = jnp.asarray(mask) > 0
    index = jnp.where(counted, action_index, -1)
    # The action of the previous counted token (-1 before the first).
    previous = jax.lax.cummax(jnp.where(counted, jnp.arange(index.shape[1]), -1), axis=1)
    previous = jnp.concatenate([jnp.full((index.shape[0], 1), -1), previous[:, :-1]], axis=1)
    previous_index = jnp.where(previous >= 0, jnp.take_along_axis(index, jnp.maximum(previous, 0), axis=1), -1)
    return (counted & (previous_index != index)).astype(jnp.float32)


def action_sums(x: chex.Array, action_index: chex.Array, mask: chex.Array) -> chex.Array:
    """`[B, T]`: at each counted token, the sum of `x` over the counted tokens of its action (0 elsewhere).

    E.g. an action's log-probability is `action_sums(token_logprobs, ...)` read at any of its tokens.
    """
    chex.assert_equal_shape([x, action_index, mask])
    batch, length = x.shape
    counted = jnp.asarray(mask, jnp.float32)
    local = jnp.clip(action_index, 0, length - 1)
    segment = (jnp.arange(batch)[:, None] * length + local).ravel()
    sums = jax.ops.segment_sum((jnp.asarray(x, jnp.float32) * counted).ravel(), segment, batch * length)
    return jnp.where(counted > 0, jnp.take_along_axis(sums.reshape(batch, length), local, axis=1), 0.0)


def action_means(x: chex.Array, action_index: chex.Array, mask: chex.Array) -> chex.Array:
    """`[B, T]`: at each counted token, the mean of `x` over the counted tokens of its action (0 elsewhere)."""
    counts = action_sums(jnp.ones(jnp.shape(x), jnp.float32), action_index, mask)
    return action_sums(x, action_index, mask) / jnp.maximum(counts, 1.0)


def scatter_action_rewards(action_rewards: chex.Array, action_index: chex.Array, action_ends: chex.Array) -> chex.Array:
    """Places each action's reward on its last token.

    Args:
      action_rewards: `[B, A]` reward of action a (e.g. a PRM step score).
      action_index: `[B, T]` int in [0, A) on counted tokens.
      action_ends: `[B, T]` from `action_ends_from_index`.

    Returns:
      `[B, T]` float32 token rewards: r_{b, action_index} on action ends, else 0.
    """
    chex.assert_rank([action_rewards, action_index, action_ends], 2)
    chex.assert_equal_shape([action_index, action_ends])
    num_actions = action_rewards.shape[1]
    safe_index = jnp.clip(action_index, 0, num_actions - 1)
    gathered = jnp.take_along_axis(jnp.asarray(action_rewards, jnp.float32), safe_index, axis=-1)
    return jnp.where(action_ends > 0, gathered, 0.0)


def action_decomposed_gae(
    token_rewards: chex.Array,
    values: chex.Array,
    action_ends: chex.Array,
    mask: chex.Array,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    bootstrap_value: Optional[chex.Array] = None,
) -> Tuple[chex.Array, chex.Array]:
    """POAD's token-level backup (see the module doc): gamma only at action ends.

    Args:
      token_rewards: `[B, T]` reward after each token; in POAD the action's
        reward sits on its last token (`scatter_action_rewards`) and the other
        entries are 0 (a per-token KL penalty may be added, undiscounted).
      values: `[B, T]` token-level critic values.
      action_ends: `[B, T]` 1.0 on the last token of each action.
      mask: `[B, T]`.
      gamma: discount between actions.
      lam: GAE lambda, applied between tokens and (times gamma) between actions.
      bootstrap_value: optional `[B]` value after the last token (0 = terminal).

    Returns:
      (advantages, returns), `[B, T]` float32, 0 outside the mask.
    """
    chex.assert_equal_shape([token_rewards, values, action_ends, mask])
    discounts = jnp.where(jnp.asarray(action_ends) > 0, gamma, 1.0).astype(jnp.float32)
    return masked_gae_scan(token_rewards, values, mask, discounts, lam, bootstrap_value)


def naive_token_gae(token_rewards: chex.Array, values: chex.Array, mask: chex.Array, **gae_kwargs):
    """NTPO: every token is a step, discounted by gamma (POAD's baseline).

    `gae_advantages` itself (same arguments: gamma, lam, bootstrap_value), named for comparisons with
    `action_decomposed_gae`, which it equals when gamma = 1.
    """
    return gae_advantages(token_rewards, values, mask, **gae_kwargs)


def action_index_from_separators(
    input_ids: jax.Array, response_mask: jax.Array, separator_ids: Sequence[int]
) -> jax.Array:
    """`[N, L]` int: the reasoning step of each response token; a separator token ends its step.

    Step k holds the tokens after the k-th separator up to and including the
    (k+1)-th. With no separator ids each response is one action.
    """
    if not separator_ids:
        return jnp.zeros(input_ids.shape, jnp.int32)
    is_sep = jnp.isin(input_ids, jnp.asarray(separator_ids)) & (response_mask > 0)
    ends_before = jnp.cumsum(is_sep, axis=1) - is_sep  # separators strictly before each token
    return ends_before.astype(jnp.int32)


def action_level_gae(
    token_rewards: jax.Array,
    values: jax.Array,
    action_index: jax.Array,
    response_mask: jax.Array,
    *,
    max_actions: int,
    gamma: float,
    lam: float,
):
    """APPO: GAE over actions (reasoning steps), broadcast back to their tokens.

    An action's value is the critic's value at its first token (the state it was
    taken in); its reward is the sum of its tokens' rewards. Returns
    (token advantages, token returns, value mask): the critic is trained on each
    action's first token only, against that action's return.
    """
    mask = response_mask > 0
    a_idx = jnp.where(mask, jnp.clip(action_index, 0, max_actions - 1), max_actions)  # max_actions = dump slot
    one_hot = jax.nn.one_hot(a_idx, max_actions + 1, dtype=jnp.float32)[..., :max_actions]  # [N, L, A]
    action_rewards = jnp.einsum("nl,nla->na", token_rewards, one_hot)
    starts = mask & (jnp.pad(a_idx[:, :-1], ((0, 0), (1, 0)), constant_values=-1) != a_idx)
    action_values = jnp.einsum("nl,nla->na", jnp.where(starts, values, 0.0), one_hot)
    action_mask = (jnp.sum(one_hot, axis=1) > 0).astype(jnp.float32)
    adv, ret = gae_advantages(action_rewards, action_values, action_mask, gamma=gamma, lam=lam)
    gather = lambda x: jnp.take_along_axis(x, jnp.clip(a_idx, 0, max_actions - 1), axis=1)  # noqa: E731
    token_adv = jnp.where(mask, gather(adv), 0.0)
    token_ret = jnp.where(mask, gather(ret), 0.0)
    return token_adv, token_ret, starts.astype(jnp.float32)
