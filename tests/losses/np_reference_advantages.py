"""Plain-NumPy reference implementations of the advantage estimators.

Written from the formulas (see the docstrings of `mathrl_jax.losses.advantages`
and `mathrl_jax.losses.action_decomposition`, and the papers / systems they
cite), with explicit Python loops over the batch and time axes and float64
arithmetic. Nothing here imports or calls the code under test.

Conventions: `mask` entries > 0 are counted; every output is 0 outside the mask.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _counted_positions(mask_row) -> List[int]:
    return [t for t in range(len(mask_row)) if mask_row[t] > 0]


# ---------------------------------------------------------------------------
# Token-level recursions
# ---------------------------------------------------------------------------


def gae(
    rewards,
    values,
    mask,
    *,
    gamma: float,
    lam: float,
    bootstrap_value=None,
    discounts=None,
) -> Tuple[np.ndarray, np.ndarray]:
    """GAE with masked-token skipping (verl `compute_gae_advantage_return`).

    Iterates t = T-1 .. 0 carrying (next_value, next_adv) = (bootstrap or 0, 0).
    On a counted token: delta = r + g V_next - V, A = delta + g lam A_next, then
    the carry becomes (V, A). On an uncounted token the output is 0 and the carry
    is left unchanged. `discounts` (optional `[B, T]`) replaces the constant
    gamma by a per-token g. Returns (advantages, returns = A + V on the mask).
    """
    rewards, values, mask = _f64(rewards), _f64(values), _f64(mask)
    batch, length = rewards.shape
    adv = np.zeros((batch, length))
    ret = np.zeros((batch, length))
    for b in range(batch):
        next_value = 0.0 if bootstrap_value is None else float(bootstrap_value[b])
        next_adv = 0.0
        for t in range(length - 1, -1, -1):
            if not mask[b, t] > 0:
                continue
            g = gamma if discounts is None else float(discounts[b, t])
            delta = rewards[b, t] + g * next_value - values[b, t]
            a = delta + g * lam * next_adv
            adv[b, t] = a
            ret[b, t] = a + values[b, t]
            next_value = values[b, t]
            next_adv = a
    return adv, ret


def discounted_returns(rewards, mask, *, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma G_next, where "next" is the next counted token."""
    rewards, mask = _f64(rewards), _f64(mask)
    batch, length = rewards.shape
    out = np.zeros((batch, length))
    for b in range(batch):
        running = 0.0
        for t in range(length - 1, -1, -1):
            if mask[b, t] > 0:
                running = rewards[b, t] + gamma * running
                out[b, t] = running
    return out


def reward_to_go(rewards, mask) -> np.ndarray:
    """Undiscounted sum of the rewards of this and all later counted tokens."""
    rewards, mask = _f64(rewards), _f64(mask)
    batch, length = rewards.shape
    out = np.zeros((batch, length))
    for b in range(batch):
        for t in range(length):
            if mask[b, t] > 0:
                out[b, t] = sum(rewards[b, u] for u in range(t, length) if mask[b, u] > 0)
    return out


def one_step_td(rewards, values, mask, *, gamma: float, bootstrap_value=None) -> np.ndarray:
    """delta_t = r_t + gamma V(next counted token, or bootstrap / 0) - V_t."""
    rewards, values, mask = _f64(rewards), _f64(values), _f64(mask)
    batch, length = rewards.shape
    out = np.zeros((batch, length))
    for b in range(batch):
        positions = _counted_positions(mask[b])
        for i, t in enumerate(positions):
            if i + 1 < len(positions):
                v_next = values[b, positions[i + 1]]
            else:
                v_next = 0.0 if bootstrap_value is None else float(bootstrap_value[b])
            out[b, t] = rewards[b, t] + gamma * v_next - values[b, t]
    return out


def masked_whiten(x, mask, *, shift_mean: bool = True, eps: float = 1e-8) -> np.ndarray:
    """(x - mean) / sqrt(var_unbiased + eps) over the counted entries; 0 elsewhere.

    With a single counted entry the unbiased variance is taken as 0.
    """
    x, mask = _f64(x), _f64(mask)
    selected = [x[idx] for idx in np.ndindex(x.shape) if mask[idx] > 0]
    out = np.zeros(x.shape)
    if not selected:
        return out
    n = len(selected)
    mean = sum(selected) / n
    var = sum((v - mean) ** 2 for v in selected) / (n - 1) if n > 1 else 0.0
    scale = 1.0 / np.sqrt(var + eps)
    for idx in np.ndindex(x.shape):
        if mask[idx] > 0:
            out[idx] = (x[idx] - mean) * scale + (0.0 if shift_mean else mean)
    return out


def reinforce_plus_plus(rewards, mask, *, gamma: float, eps: float = 1e-8) -> np.ndarray:
    return masked_whiten(discounted_returns(rewards, mask, gamma=gamma), mask, eps=eps)


# ---------------------------------------------------------------------------
# Outcome estimators
# ---------------------------------------------------------------------------


def _groups(group_ids, seq_mask) -> Dict[int, List[int]]:
    members: Dict[int, List[int]] = {}
    for i, g in enumerate(np.asarray(group_ids).tolist()):
        if seq_mask is None or seq_mask[i] > 0:
            members.setdefault(int(g), []).append(i)
    return members


def group_statistics(scores, group_ids, seq_mask=None):
    """Per-sample (count, mean, unbiased std) of its group; std 0 for a singleton.

    Padding rows (seq_mask 0) do not enter the statistics; their own entries are
    returned as NaN (undefined) so a test can skip them.
    """
    scores = _f64(scores)
    batch = scores.shape[0]
    counts, means, stds = (np.full(batch, np.nan) for _ in range(3))
    for members in _groups(group_ids, seq_mask).values():
        vals = [scores[i] for i in members]
        n = len(vals)
        mean = sum(vals) / n
        std = np.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
        for i in members:
            counts[i], means[i], stds[i] = n, mean, std
    return counts, means, stds


def grpo(scores, group_ids, seq_mask=None, *, normalize_by_std: bool = True, eps: float = 1e-6) -> np.ndarray:
    """(s - mean_g) / (std_g + eps), std unbiased; singleton: mean 0, std 1.

    normalize_by_std=False: s - mean_g (Dr. GRPO; singleton keeps s).
    Padding rows get 0.
    """
    scores = _f64(scores)
    out = np.zeros(scores.shape[0])
    for members in _groups(group_ids, seq_mask).values():
        vals = [scores[i] for i in members]
        n = len(vals)
        if n == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(vals) / n
            std = float(np.std(vals, ddof=1))
        for i in members:
            out[i] = (scores[i] - mean) / (std + eps) if normalize_by_std else scores[i] - mean
    return out


def rloo(scores, group_ids, seq_mask=None) -> np.ndarray:
    """Leave-one-out baseline: s_i - mean of the *other* members; singleton keeps s_i."""
    scores = _f64(scores)
    out = np.zeros(scores.shape[0])
    for members in _groups(group_ids, seq_mask).values():
        for i in members:
            others = [scores[j] for j in members if j != i]
            out[i] = scores[i] - (sum(others) / len(others) if others else 0.0)
    return out


def reinforce_plus_plus_baseline(scores, group_ids, mask, seq_mask=None, *, eps: float = 1e-8) -> np.ndarray:
    """(s - group mean; singleton mean 0) on each counted token, whitened over them."""
    scores, mask = _f64(scores), _f64(mask)
    centred = grpo(scores, group_ids, seq_mask, normalize_by_std=False)
    token_mask = mask.copy()
    batch, length = mask.shape
    tokens = np.zeros((batch, length))
    for b in range(batch):
        if seq_mask is not None and not seq_mask[b] > 0:
            token_mask[b, :] = 0.0
        for t in range(length):
            if token_mask[b, t] > 0:
                tokens[b, t] = centred[b]
    return masked_whiten(tokens, token_mask, eps=eps)


def batch_normalized(scores, mask=None, *, unbiased: bool = False, eps: float = 1e-8) -> np.ndarray:
    """(s - mean) / (std + eps) over the counted entries (biased std unless unbiased)."""
    scores = _f64(scores)
    mask = np.ones(scores.shape) if mask is None else _f64(mask)
    selected = [scores[idx] for idx in np.ndindex(scores.shape) if mask[idx] > 0]
    out = np.zeros(scores.shape)
    if not selected:
        return out
    n = len(selected)
    mean = sum(selected) / n
    if unbiased:
        var = sum((v - mean) ** 2 for v in selected) / (n - 1) if n > 1 else 0.0
    else:
        var = sum((v - mean) ** 2 for v in selected) / n
    std = np.sqrt(var)
    for idx in np.ndindex(scores.shape):
        if mask[idx] > 0:
            out[idx] = (scores[idx] - mean) / (std + eps)
    return out


def rebn(turn_rewards, turn_mask, *, gamma: float, eps: float = 1e-9) -> np.ndarray:
    """GEM ReBN: per-episode discounted returns over present turns, then
    (G - mean) / (population std + eps) over all present turns of the batch."""
    turn_rewards, turn_mask = _f64(turn_rewards), _f64(turn_mask)
    batch, turns = turn_rewards.shape
    returns: Dict[Tuple[int, int], float] = {}
    for b in range(batch):
        present = _counted_positions(turn_mask[b])
        running = 0.0
        for k in reversed(present):
            running = turn_rewards[b, k] + gamma * running
            returns[(b, k)] = running
    out = np.zeros((batch, turns))
    if not returns:
        return out
    all_returns = np.array(list(returns.values()))
    mean = all_returns.mean()
    std = np.sqrt(((all_returns - mean) ** 2).mean())
    for (b, k), g in returns.items():
        out[b, k] = (g - mean) / (std + eps)
    return out


# ---------------------------------------------------------------------------
# Action decomposition (POAD / TPPO, OpenR)
# ---------------------------------------------------------------------------


def action_ends(action_index, mask) -> np.ndarray:
    """1 on a counted token whose next counted token has another action index, or
    that is the last counted token of its row."""
    action_index, mask = np.asarray(action_index), _f64(mask)
    out = np.zeros(mask.shape)
    for b in range(mask.shape[0]):
        positions = _counted_positions(mask[b])
        for i, t in enumerate(positions):
            last = i + 1 == len(positions)
            if last or action_index[b, positions[i + 1]] != action_index[b, t]:
                out[b, t] = 1.0
    return out


def scatter_action_rewards(action_rewards, action_index, ends) -> np.ndarray:
    action_rewards, action_index, ends = _f64(action_rewards), np.asarray(action_index), _f64(ends)
    out = np.zeros(ends.shape)
    for b in range(ends.shape[0]):
        for t in range(ends.shape[1]):
            if ends[b, t] > 0:
                out[b, t] = action_rewards[b, int(action_index[b, t])]
    return out


def split_actions(action_index, mask) -> List[List[List[int]]]:
    """Per row, the list of actions, each the list of its counted token positions
    in order (an action is a maximal run of counted tokens with one index)."""
    action_index, mask = np.asarray(action_index), _f64(mask)
    rows = []
    for b in range(mask.shape[0]):
        actions: List[List[int]] = []
        for t in _counted_positions(mask[b]):
            if actions and action_index[b, actions[-1][-1]] == action_index[b, t]:
                actions[-1].append(t)
            else:
                actions.append([t])
        rows.append(actions)
    return rows


def action_decomposed_gae_nested(
    action_rewards,
    values,
    action_index,
    mask,
    *,
    gamma: float,
    lam: float,
    bootstrap_value=None,
) -> Tuple[np.ndarray, np.ndarray]:
    """POAD's Bellman backup with action decomposition in OpenR's nested form.

    Loops over the actions of a row backwards and, inside each action, over its
    tokens backwards. For action t with tokens 0..K:
      token K:  delta = r_t + gamma V_{t+1,0} - V_{t,K};  A = delta + gamma lam A_{t+1,0}
      token k:  delta = V_{t,k+1} - V_{t,k};              A = delta + lam A_{t,k+1}
    with (V_{t+1,0}, A_{t+1,0}) = (bootstrap or 0, 0) after the last action.
    `action_rewards[b, a]` is the reward of the action with index a.
    """
    action_rewards, values = _f64(action_rewards), _f64(values)
    batch, length = values.shape
    adv = np.zeros((batch, length))
    ret = np.zeros((batch, length))
    for b, actions in enumerate(split_actions(action_index, mask)):
        next_first_value = 0.0 if bootstrap_value is None else float(bootstrap_value[b])
        next_first_adv = 0.0
        for tokens in reversed(actions):
            reward = action_rewards[b, int(np.asarray(action_index)[b, tokens[-1]])]
            last = tokens[-1]
            delta = reward + gamma * next_first_value - values[b, last]
            adv[b, last] = delta + gamma * lam * next_first_adv
            for k in range(len(tokens) - 2, -1, -1):
                here, after = tokens[k], tokens[k + 1]
                delta = values[b, after] - values[b, here]
                adv[b, here] = delta + lam * adv[b, after]
            next_first_value = values[b, tokens[0]]
            next_first_adv = adv[b, tokens[0]]
        for tokens in actions:
            for t in tokens:
                ret[b, t] = adv[b, t] + values[b, t]
    return adv, ret


def action_decomposed_gae_flat(
    token_rewards, values, ends, mask, *, gamma: float, lam: float, bootstrap_value=None
) -> Tuple[np.ndarray, np.ndarray]:
    """Per-token form: gamma_t = gamma on action ends, 1 elsewhere, in masked GAE."""
    discounts = np.where(_f64(ends) > 0, gamma, 1.0)
    return gae(
        token_rewards,
        values,
        mask,
        gamma=gamma,
        lam=lam,
        bootstrap_value=bootstrap_value,
        discounts=discounts,
    )


# ---------------------------------------------------------------------------
# Random test data (shared by the test modules; NumPy only)
# ---------------------------------------------------------------------------

MASK_KINDS = ("right", "left", "holes", "random", "full")


def random_mask(rng: np.random.RandomState, batch: int, length: int, kind: str) -> np.ndarray:
    """A `[B, T]` float32 mask of one of the layouts a rollout produces.

    right:  response then right padding (1..1 0..0)
    left:   left padding / prompt then response (0..0 1..1)
    holes:  prompt, a response with masked tool-output spans inside, padding
    random: independent Bernoulli(0.6) entries
    full:   every token counted
    Rows may be empty (all 0) except for `full`.
    """
    mask = np.zeros((batch, length), np.float32)
    for b in range(batch):
        n = rng.randint(0, length + 1)
        if kind == "right":
            mask[b, :n] = 1.0
        elif kind == "left":
            mask[b, length - n :] = 1.0
        elif kind == "holes":
            start = rng.randint(0, length)
            stop = rng.randint(start, length + 1)
            mask[b, start:stop] = 1.0
            for _ in range(rng.randint(1, 3)):  # tool-output spans
                hole = rng.randint(start, max(stop, start + 1))
                mask[b, hole : hole + rng.randint(1, 3)] = 0.0
        elif kind == "random":
            mask[b] = (rng.rand(length) < 0.6).astype(np.float32)
        elif kind == "full":
            mask[b] = 1.0
        else:
            raise ValueError(kind)
    return mask


def garbage_like(rng: np.random.RandomState, shape, nonfinite: bool = True) -> np.ndarray:
    """Values for uncounted positions: huge, and optionally NaN / +-inf."""
    out = (rng.randn(*shape) * 1e6).astype(np.float32)
    if nonfinite:
        choice = rng.randint(0, 4, size=shape)
        out = np.where(choice == 1, np.nan, out)
        out = np.where(choice == 2, np.inf, out)
        out = np.where(choice == 3, -np.inf, out)
    return out.astype(np.float32)


def pad_columns(rng, x: np.ndarray, left: int, right: int, fill=None) -> np.ndarray:
    """Adds `left` / `right` columns to a `[B, T]` array: garbage, or `fill`."""
    batch = x.shape[0]
    if fill is None:
        lpad = garbage_like(rng, (batch, left)).astype(x.dtype)
        rpad = garbage_like(rng, (batch, right)).astype(x.dtype)
    else:
        lpad = np.full((batch, left), fill, x.dtype)
        rpad = np.full((batch, right), fill, x.dtype)
    return np.concatenate([lpad, x, rpad], axis=1)
