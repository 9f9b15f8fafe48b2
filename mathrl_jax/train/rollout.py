"""From rollouts and rewards to a training batch: per-algorithm advantages, DAPO's filters, actions.

Everything here is a function of arrays (the batch layout of `Rollouts.to_batch`,
`[N, L]`, column c holding token c), so each algorithm's credit assignment can
be read, tested and reused on its own:

| algorithm        | advantages                                              | source                  |
|------------------|---------------------------------------------------------|-------------------------|
| `grpo`           | (s - mean_g) / (std_g + eps) per prompt group, all tokens | DeepSeekMath; verl      |
| `drgrpo`         | s - mean_g (no std), loss seq-mean-token-sum-norm        | Liu et al. 2025         |
| `dapo`           | as grpo, after dynamic group filtering + overlong shaping | Yu et al. 2025; verl    |
| `ppo`            | token-level GAE with a critic, reward on the last token  | Ouyang et al.; verl     |
| `appo`           | action-level GAE over reasoning steps, one ratio per step, critic | OpenR `batch_process_appo` |
| `tppo`           | POAD action-decomposed token backup, critic              | Wen et al. 2024; OpenR  |
| `reinforce_rebn` | per-turn discounted returns, batch-normalised            | GEM (Liu et al. 2025)   |
| `async_ppo`      | as grpo (AReaL's default estimator), decoupled loss     | AReaL                   |
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mathrl_jax import losses

GROUP_ALGORITHMS = ("grpo", "drgrpo", "dapo", "async_ppo")
CRITIC_ALGORITHMS = ("ppo", "appo", "tppo")
ALGORITHMS = GROUP_ALGORITHMS + CRITIC_ALGORITHMS + ("reinforce_rebn",)


def last_token_rewards(scores: jax.Array, response_mask: jax.Array) -> jax.Array:
    """`[N, L]` with each sequence's score on its last response token (outcome reward)."""
    mask = response_mask > 0
    length = mask.shape[1]
    last = length - 1 - jnp.argmax(jnp.flip(mask, axis=1), axis=1)
    has_tokens = jnp.any(mask, axis=1)
    rewards = jax.nn.one_hot(last, length, dtype=jnp.float32) * scores.astype(jnp.float32)[:, None]
    return jnp.where(has_tokens[:, None], rewards, 0.0)


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


def action_index_from_text(token_texts: Sequence[str], separator: str) -> np.ndarray:
    """`[T]` int32: the reasoning step of each token of one completion, split where its *text* has `separator`.

    A token ends its step when the step's text so far (the text after the previous
    separator, carried over from the token that held it) contains `separator` and
    something besides whitespace before it. So a tokenizer that merges the separator
    with what precedes it (Qwen2's `.\n\n`, ` \n\n`, `:\n\n` tokens) or splits it
    over several tokens ends the step at the token that completes it, and a
    separator with nothing before it (a leading or doubled one) starts no empty
    step; trailing text with nothing but whitespace joins the last step. The steps
    are then those of `rewards.prm.ProcessRewardModel.split_steps` on the decoded
    text (split at `separator`, blank parts dropped), the PRM's view of the answer.

    Args:
      token_texts: the text of each token (e.g. `tokenizer.decode([id])`).
      separator: the step separator, e.g. "\n\n".
    """
    index = np.zeros(len(token_texts), np.int32)
    step, pending = 0, ""  # pending: the current step's text so far
    for t, text in enumerate(token_texts):
        index[t] = step
        pending += text
        if separator in pending:
            *before, pending = pending.split(separator)
            if any(part.strip() for part in before):
                step += 1
    if step > 0 and not pending.strip():  # the tokens after the last separator are blank: they join the last step
        index[index == step] = step - 1
    return index


def dapo_group_filter(
    scores: np.ndarray,
    group_ids: np.ndarray,
    *,
    success_rate_lb: float = 0.0,
    success_rate_ub: float = 1.0,
    correct_threshold: float = 0.5,
) -> np.ndarray:
    """DAPO dynamic sampling: keep groups whose success rate is strictly inside (lb, ub).

    With the defaults (0, 1), groups that are all correct or all wrong (zero
    advantage everywhere, no gradient) are dropped. Success = score above
    `correct_threshold`. Returns a `[N]` bool keep mask. Source: Yu et al. 2025
    (DAPO, "dynamic sampling"); AReaL / RLinf `success_rate_lb/ub`.
    """
    success = (np.asarray(scores) > correct_threshold).astype(np.float64)
    keep = np.zeros(len(success), bool)
    for g in np.unique(group_ids):
        rows = group_ids == g
        rate = success[rows].mean()
        keep[rows] = success_rate_lb < rate < success_rate_ub
    return keep


def overlong_penalty(
    lengths: np.ndarray, *, max_new_tokens: int, buffer_len: int, penalty_factor: float = 1.0
) -> np.ndarray:
    """DAPO soft overlong punishment, added to the reward.

      L <= L_max - B:          0
      L_max - B < L <= L_max:  ((L_max - B) - L) / B * factor
    Source: Yu et al. 2025 (DAPO, eq. 13); verl `overlong_buffer`.
    """
    if buffer_len <= 0:
        return np.zeros(len(lengths), np.float32)
    expected = max_new_tokens - buffer_len
    excess = np.asarray(lengths, np.float64) - expected
    return (np.minimum(-excess / buffer_len, 0.0) * penalty_factor).astype(np.float32)


def group_advantages(
    algorithm: str, scores: jax.Array, group_ids: jax.Array, row_mask: jax.Array, num_groups: int
) -> jax.Array:
    """`[N]` sequence advantages of the group-based algorithms."""
    if algorithm == "drgrpo":
        return losses.dr_grpo_advantages(scores, group_ids, seq_mask=row_mask, num_groups=num_groups)
    return losses.group_relative_advantages(scores, group_ids, seq_mask=row_mask, num_groups=num_groups)


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
    adv, ret = losses.gae_advantages(action_rewards, action_values, action_mask, gamma=gamma, lam=lam)
    gather = lambda x: jnp.take_along_axis(x, jnp.clip(a_idx, 0, max_actions - 1), axis=1)  # noqa: E731
    token_adv = jnp.where(mask, gather(adv), 0.0)
    token_ret = jnp.where(mask, gather(ret), 0.0)
    return token_adv, token_ret, starts.astype(jnp.float32)


def compute_advantages(
    algorithm: str,
    batch: Dict[str, jax.Array],
    scores: jax.Array,
    *,
    group_ids: Optional[jax.Array] = None,
    num_groups: Optional[int] = None,
    row_mask: Optional[jax.Array] = None,
    values: Optional[jax.Array] = None,
    ref_logprobs: Optional[jax.Array] = None,
    kl_reward_coef: float = 0.0,
    kl_reward_kind: str = "k1",
    gamma: float = 1.0,
    lam: float = 0.95,
    separator_ids: Sequence[int] = (),
    action_index: Optional[jax.Array] = None,
    max_actions: Optional[int] = None,
    action_rewards: Optional[jax.Array] = None,
    whiten: bool = True,
) -> Dict[str, jax.Array]:
    """Advantages (and, with a critic, returns and the value mask) for `algorithm`.

    Args:
      batch: `Rollouts.to_batch` arrays with `old_logprobs` filled by the trainer.
      scores: `[N]` sequence rewards (verifier, with any shaping).
      group_ids, num_groups: prompt groups (group algorithms).
      row_mask: `[N]` 1 on rows that count (DAPO's filter zeroes the others).
      values: `[N, L]` critic values aligned like the log-probs (critic algorithms).
      ref_logprobs: `[N, L]` with `kl_reward_coef > 0`: KL to the reference in the reward.
      separator_ids: tokens that end a reasoning step (APPO / TPPO actions), or
      action_index: `[N, L]` int, the step of each response token (e.g. from
        `action_index_from_text`, which a tokenizer merging the separator into
        other tokens needs); it takes precedence.
      max_actions: APPO's per-row action slots; None: as many as the data has
        (a row with more actions than a given `max_actions` is an error, never a merge).
      action_rewards: optional `[N, A]` per-step rewards (a PRM's step scores, A at
        least the number of steps of every row), placed on each step's last token in
        addition to `scores` on the last response token (pass zero scores for step
        rewards only).
      whiten: standardise the advantages over the batch's response tokens (critic
        algorithms); False leaves them raw (e.g. for per-minibatch whitening).

    Returns:
      dict with advantages `[N, L]` and response_mask `[N, L]` (row_mask applied);
      with a critic also returns, old_values, value_mask and action_index.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r}: expected one of {ALGORITHMS}")
    response_mask = jnp.asarray(batch["response_mask"], jnp.float32)
    n = response_mask.shape[0]
    row_mask = jnp.ones((n,), jnp.float32) if row_mask is None else jnp.asarray(row_mask, jnp.float32)
    response_mask = response_mask * row_mask[:, None]
    scores = jnp.asarray(scores, jnp.float32)
    out = {"response_mask": response_mask}
    if algorithm in GROUP_ALGORITHMS:
        seq_adv = group_advantages(algorithm, scores, jnp.asarray(group_ids), row_mask, num_groups)
        out["advantages"] = losses.broadcast_to_tokens(seq_adv, response_mask)
        return out
    if algorithm == "reinforce_rebn":  # single-turn: one turn per row
        adv = losses.rebn_advantages(scores[:, None], row_mask[:, None], gamma=gamma)[:, 0]
        out["advantages"] = losses.broadcast_to_tokens(adv, response_mask)
        return out
    if values is None:
        raise ValueError(f"algorithm {algorithm!r} needs critic values")
    token_rewards = last_token_rewards(scores, response_mask)
    if action_index is None:
        index = action_index_from_separators(jnp.asarray(batch["input_ids"]), response_mask, separator_ids)
    else:
        index = jnp.asarray(action_index, jnp.int32)
    index = jnp.where(response_mask > 0, index, 0)
    num_actions = int(jnp.max(index)) + 1
    if max_actions is not None and num_actions > max_actions:
        raise ValueError(f"a response has {num_actions} actions, over max_actions={max_actions}")
    if action_rewards is not None and action_rewards.shape[1] < num_actions:
        raise ValueError(
            f"action_rewards has {action_rewards.shape[1]} columns but a response has {num_actions} actions"
        )
    if action_rewards is not None:
        ends = losses.action_ends_from_index(index, response_mask)
        token_rewards = token_rewards + losses.scatter_action_rewards(jnp.asarray(action_rewards), index, ends)
    if kl_reward_coef:
        token_rewards, _ = losses.kl_penalized_rewards(
            token_rewards,
            jnp.asarray(batch["old_logprobs"]),
            ref_logprobs,
            response_mask,
            beta=kl_reward_coef,
            kind=kl_reward_kind,
        )
    values = jnp.where(response_mask > 0, values, 0.0)
    value_mask = response_mask
    if algorithm == "ppo":
        adv, ret = losses.gae_advantages(token_rewards, values, response_mask, gamma=gamma, lam=lam)
    else:
        if algorithm == "tppo":
            ends = losses.action_ends_from_index(index, response_mask)
            adv, ret = losses.action_decomposed_gae(token_rewards, values, ends, response_mask, gamma=gamma, lam=lam)
        else:
            slots = max_actions or 1 << max(3, (num_actions - 1).bit_length())  # a few shapes: 8, 16, 32, ...
            adv, ret, value_mask = action_level_gae(
                token_rewards, values, index, response_mask, max_actions=slots, gamma=gamma, lam=lam
            )
    if whiten:
        adv = losses.masked_whiten(adv, response_mask)
    out.update(advantages=adv, returns=ret, old_values=values, value_mask=value_mask, action_index=index)
    return out
