"""From rollouts and rewards to a training batch: each algorithm's advantages (`algorithms.ALGORITHMS` names
the estimator), DAPO's filter and overlong shaping, and the reasoning steps of a completion's text.

The formulas themselves are in `mathrl_jax.losses` (group-relative, GAE, POAD, action-level GAE, ReBN); this
module chooses and composes them on the batch layout of `Rollouts.to_batch` (`[N, L]`, column c holding token c).
"""

from __future__ import annotations

import functools
from typing import Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mathrl_jax import losses
from mathrl_jax.train import algorithms


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


def _one_per_sequence(fn, scores, group_ids, row_mask, response_mask, *, num_groups, gamma):
    """`fn(scores, group_ids, seq_mask, num_groups) -> [N]` (GRPO, Dr. GRPO, RLOO) on each response token."""
    return losses.broadcast_to_tokens(fn(scores, group_ids, seq_mask=row_mask, num_groups=num_groups), response_mask)


def _per_token_in_groups(fn, scores, group_ids, row_mask, response_mask, *, num_groups, gamma):
    """REINFORCE++-baseline: per token, as the batch's whitening weighs long responses more."""
    return fn(scores, group_ids, response_mask, seq_mask=row_mask, num_groups=num_groups)


def _one_turn_per_row(fn, scores, group_ids, row_mask, response_mask, *, num_groups, gamma):
    """ReBN on single-turn rows: one turn per row."""
    return losses.broadcast_to_tokens(fn(scores[:, None], row_mask[:, None], gamma=gamma)[:, 0], response_mask)


FROM_SCORES = {
    "grpo": _one_per_sequence,
    "drgrpo": _one_per_sequence,
    "rloo": _one_per_sequence,
    "reinforce_plus_plus_baseline": _per_token_in_groups,
    "rebn": _one_turn_per_row,
}
"""The estimators (`losses.registry` names) that make advantages from the scores alone, each with how the batch
calls it; the others (`FROM_VALUES`) need a critic."""


@functools.partial(jax.jit, static_argnames=("estimator", "num_groups", "gamma"))
def _score_advantages(scores, group_ids, row_mask, response_mask, *, estimator: str, num_groups, gamma: float):
    """`[N, L]` advantages of a `FROM_SCORES` estimator; one program rather than a chain of eager ones, each a
    dispatch."""
    fn = losses.get_advantage_estimator(estimator)
    return FROM_SCORES[estimator](fn, scores, group_ids, row_mask, response_mask, num_groups=num_groups, gamma=gamma)


def _token_gae(fn, token_rewards, values, index, response_mask, *, gamma, lam, slots):
    adv, ret = fn(token_rewards, values, response_mask, gamma=gamma, lam=lam)
    return adv, ret, response_mask


def _action_decomposed(fn, token_rewards, values, index, response_mask, *, gamma, lam, slots):
    ends = losses.action_ends_from_index(index, response_mask)
    adv, ret = fn(token_rewards, values, ends, response_mask, gamma=gamma, lam=lam)
    return adv, ret, response_mask


def _action_level(fn, token_rewards, values, index, response_mask, *, gamma, lam, slots):
    return fn(token_rewards, values, index, response_mask, max_actions=slots, gamma=gamma, lam=lam)


FROM_VALUES = {
    "gae": _token_gae,
    "action_decomposed_gae": _action_decomposed,
    "action_level_gae": _action_level,
}
"""The critic's estimators (`losses.registry` names): (advantages, returns, the value mask) from token rewards,
values and the actions' index."""


def from_scores(algorithm: "str | algorithms.Algorithm") -> bool:
    """Whether `algorithm`'s advantages come from the scores alone (its estimator is one of `FROM_SCORES`)."""
    record = algorithm if isinstance(algorithm, algorithms.Algorithm) else algorithms.algorithm(algorithm)
    return record.advantages in FROM_SCORES


def host_score_advantages(
    algorithm: "str | algorithms.Algorithm",
    response_mask: np.ndarray,
    scores: np.ndarray,
    *,
    group_ids: np.ndarray,
    num_groups: int,
    row_mask: np.ndarray,
    gamma: float = 1.0,
) -> Dict[str, np.ndarray]:
    """`compute_advantages` of an algorithm whose advantages come from the scores alone, on the host: the same
    program on JAX's CPU backend, from host arrays, returned as NumPy arrays. The batch then carries them to the
    device with its other arrays, and the host plans the update from them where they are (no round trip). On a
    CPU the result is the device's bit for bit (the same program on the same backend); on an accelerator it is
    XLA:CPU's float32 arithmetic. Where JAX runs without its CPU backend (`JAX_PLATFORMS=cuda`), the default
    device computes them and they are fetched (the round trip this saves elsewhere)."""
    if not from_scores(algorithm):
        raise ValueError(f"algorithm {algorithm!r} needs critic values, which are the device's")
    try:
        host = jax.local_devices(backend="cpu")[0]
    except RuntimeError:  # the CPU backend is not initialized (JAX_PLATFORMS names others only)
        host = jax.local_devices()[0]
    with jax.default_device(host):
        out = compute_advantages(
            algorithm,
            {"response_mask": response_mask},
            scores,
            group_ids=group_ids,
            num_groups=num_groups,
            row_mask=row_mask,
            gamma=gamma,
        )
    return jax.device_get(out)


def compute_advantages(
    algorithm: "str | algorithms.Algorithm",
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
    """Advantages (and, with a critic, returns and the value mask) for `algorithm` (a name, or its record), by its
    estimator (`Algorithm.advantages`, a `losses.registry` name: `FROM_SCORES` or `FROM_VALUES`).

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
    record = algorithm if isinstance(algorithm, algorithms.Algorithm) else algorithms.algorithm(algorithm)
    estimator = record.advantages
    response_mask = jnp.asarray(batch["response_mask"], jnp.float32)
    n = response_mask.shape[0]
    row_mask = jnp.ones((n,), jnp.float32) if row_mask is None else jnp.asarray(row_mask, jnp.float32)
    response_mask = response_mask * row_mask[:, None]
    scores = jnp.asarray(scores, jnp.float32)
    out = {"response_mask": response_mask}
    if estimator in FROM_SCORES:  # no critic: from the scores
        group_ids = jnp.zeros((n,), jnp.int32) if group_ids is None else jnp.asarray(group_ids)
        out["advantages"] = _score_advantages(
            scores, group_ids, row_mask, response_mask, estimator=estimator, num_groups=num_groups, gamma=gamma
        )
        return out
    if values is None:
        raise ValueError(f"algorithm {algorithm!r} needs critic values")
    token_rewards = losses.last_token_rewards(scores, response_mask)
    if action_index is None:
        index = losses.action_index_from_separators(jnp.asarray(batch["input_ids"]), response_mask, separator_ids)
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
    slots = max_actions or 1 << max(3, (num_actions - 1).bit_length())  # a few shapes: 8, 16, 32, ...
    adv, ret, value_mask = FROM_VALUES[estimator](
        losses.get_advantage_estimator(estimator),
        token_rewards,
        values,
        index,
        response_mask,
        gamma=gamma,
        lam=lam,
        slots=slots,
    )
    if whiten:
        adv = losses.masked_whiten(adv, response_mask)
    out.update(advantages=adv, returns=ret, old_values=values, value_mask=value_mask, action_index=index)
    return out
