"""Sequence packing: the trainer's passes run on rows filled with real tokens instead of padding.

The update's batch keeps the padded row layout of `Rollouts.to_batch` (`[N, L]`, every row padded to the
longest); a math batch's rows are mostly padding when response lengths spread. Packing plans, on the host,
where each sequence's tokens go in rows of `row_tokens` columns (first-fit decreasing of whole sequences, as
Tunix / AReaL pack), and gives the device three things per packed row: the flat index of each token in the
padded batch (`source`), its sequence within the row (`segment_ids`, 0 = empty) and its position from 0
(`positions`). The model sees only its own sequence (segment ids) at the same positions as in the padded row,
so every logit is the padded row's logit. An `unpack` map brings the per-token results (log-probs,
entropies, values) back to the padded layout, where the losses run unchanged: packed and padded batches give
the same loss, metrics and gradients (up to float rounding), for every aggregation mode.

Two plans:
  * `plan_passes`: all N rows, for the old / reference / proximal log-probs and the critic values.
  * `plan_update`: per minibatch of `minibatches.minibatch_order`, micro-batches formed by tokens: the
    minibatch's sequences packed into rows, at most `max_rows_per_micro` rows per micro-batch (the token
    budget), plus the padded rows (`rows`) whose loss-side arrays each micro-batch gathers.

Micro-batches (and chunks of the passes) hold as many rows as computes the fewest rows in all
(`rows_per_micro_batch`): the update and the passes skip a micro-batch that holds no token, so only a
micro-batch's empty rows cost, not its count. Shapes are bucketed (`bucket_count`: four sizes per power of
two) so that a run compiles a handful of programs, not one per batch.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


def bucket_count(n: int, multiple: int = 1) -> int:
    """The smallest of 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, ... (four steps per power of two) that is
    >= n, rounded up to a multiple of `multiple`: at most 25% waste above 8 and a few sizes per octave."""
    n = max(int(n), 1)
    if n > 8:
        step = 1 << (n.bit_length() - 3)  # a quarter of the power of two below n
        n = -(-n // step) * step
    return -(-n // multiple) * multiple


def first_fit(lengths: Sequence[int], capacity: int) -> List[List[int]]:
    """Bins of item indices, each holding at most `capacity` in total: first-fit decreasing (longest first,
    ties by index, so the result depends only on the lengths). An item longer than `capacity` is an error."""
    lengths = [int(n) for n in lengths]
    if lengths and max(lengths) > capacity:
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit in rows of {capacity}")
    bins: List[List[int]] = []
    room: List[int] = []
    for item in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b, free in enumerate(room):
            if lengths[item] <= free:
                bins[b].append(item)
                room[b] -= lengths[item]
                break
        else:
            bins.append([item])
            room.append(capacity - lengths[item])
    return bins


# With `plan_update(shape_rows=...)` and no token budget: the micro-batches a full minibatch is cut into, so that a
# step with a quarter of its rows to train computes a quarter of them.
SHAPED_MICRO_BATCHES = 4

# A micro-batch's fixed cost in tokens' worth of work (the scan step, the gradient sum, smaller matmuls): what
# makes `rows_per_micro_batch` prefer fewer, larger micro-batches when they compute about as many rows.
MICRO_BATCH_OVERHEAD_TOKENS = 256


def rows_per_micro_batch(needed: Sequence[int], max_rows: int, row_tokens: int, multiple: int = 1) -> int:
    """Packed rows per micro-batch, R, for steps that need `needed[s]` packed rows each: a multiple of
    `multiple` (the data-parallel shards) and at most `max_rows` (the token budget; at least `multiple`).

    Empty micro-batches are skipped, so step s computes ceil(n_s / R) micro-batches of R rows. R is the one
    with the least cost sum_s ceil(n_s / R) * (R + overhead), the overhead being `MICRO_BATCH_OVERHEAD_TOKENS`
    in rows; ties go to the larger R. E.g. 3 rows under a budget of 2: one row per micro-batch (3 rows
    computed) rather than two (4)."""
    top = max(int(max_rows) // multiple, 1) * multiple
    overhead = MICRO_BATCH_OVERHEAD_TOKENS / row_tokens
    costs = {r: sum(-(-int(n) // r) * (r + overhead) for n in needed) for r in range(multiple, top + 1, multiple)}
    return min(costs, key=lambda r: (costs[r], -r))


def token_extents(attention_mask: np.ndarray, response_mask: Optional[np.ndarray] = None) -> Tuple[np.ndarray, ...]:
    """(first column, token count) of each row's real tokens, which must be contiguous (the padded layout:
    `[pad ... prompt | completion ... pad]`). With `response_mask`, a counted token must not open its row:
    its log-prob comes from the token before it, which packing keeps only within the sequence."""
    real = np.asarray(attention_mask) > 0
    counts = real.sum(axis=1)
    first = np.where(counts > 0, real.argmax(axis=1), 0)
    columns = np.arange(real.shape[1])
    span = (columns >= first[:, None]) & (columns < (first + counts)[:, None])
    bad = np.flatnonzero((span != real).any(axis=1))
    if len(bad):
        raise ValueError(f"row {int(bad[0])}'s tokens are not contiguous: packing needs the padded row layout")
    if response_mask is not None:
        opens = np.asarray(response_mask)[np.arange(len(first)), first] > 0
        bad = np.flatnonzero(opens & (counts > 0))
        if len(bad):
            raise ValueError(f"row {int(bad[0])} starts with a response token: it has no token to be scored from")
    return first, counts


def plan_shape(plan: Dict[str, np.ndarray]) -> Tuple[int, ...]:
    """The dimensions a plan was made with, to pass as the next plan's `min_shape`: (A, R, K) of `plan_update`'s,
    (C, R) of `plan_passes`' chunked plans, (P,) of its unchunked ones."""
    source = plan["source"]
    if "rows" in plan:
        return (source.shape[1], source.shape[2], plan["rows"].shape[2])
    if source.ndim == 3:
        return (source.shape[0], source.shape[1])
    return (source.shape[0], 1)


def _layout(
    groups: Sequence[Sequence[int]],
    slots: Sequence[int],
    first: np.ndarray,
    counts: np.ndarray,
    width: int,
    num_rows: int,
    row_tokens: int,
) -> Dict[str, np.ndarray]:
    """`groups[r]` (padded row indices) laid out in packed row r; `unpack[k]` maps slot k's padded row
    (`slots[k]`, -1 for none) to packed flat indices, `num_rows * row_tokens` (a zero) where it has no token."""
    source = np.full((num_rows, row_tokens), -1, np.int32)
    segment_ids = np.zeros((num_rows, row_tokens), np.int32)
    positions = np.zeros((num_rows, row_tokens), np.int32)
    unpack = np.full((len(slots), width), num_rows * row_tokens, np.int32)
    slot_of = {int(row): k for k, row in enumerate(slots) if row >= 0}
    for r, group in enumerate(groups):
        offset = 0
        for segment, row in enumerate(group, start=1):
            n, start = int(counts[row]), int(first[row])
            steps = np.arange(n, dtype=np.int32)
            source[r, offset : offset + n] = row * width + start + steps
            segment_ids[r, offset : offset + n] = segment
            positions[r, offset : offset + n] = steps
            unpack[slot_of[int(row)], start : start + n] = r * row_tokens + offset + steps
            offset += n
    return dict(source=source, segment_ids=segment_ids, positions=positions, unpack=unpack)


def plan_passes(
    attention_mask: np.ndarray,
    row_tokens: int,
    *,
    max_rows_per_chunk: Optional[int] = None,
    rows_multiple: int = 1,
    min_shape: Optional[Tuple[int, int]] = None,
) -> Dict[str, np.ndarray]:
    """Every row of an `[N, L]` batch packed into `[P, row_tokens]` rows (P a `bucket_count`, a multiple of
    `rows_multiple`, the data-parallel shards), with `unpack [N, L]`. With `max_rows_per_chunk` (the update's
    micro-batch budget), the rows are `[C, R, T]`: the passes run a chunk of R rows at a time
    (`rows_per_micro_batch`), C a `bucket_count`, skipping the empty chunks.

    `min_shape`: (C, R) at least (P, 1 without chunks), e.g. `plan_shape` of the run's previous plans (R within
    the same budget), so a run's plans only grow: one compiled pass per growth, not per batch."""
    first, counts = token_extents(attention_mask)
    rows = [int(r) for r in np.flatnonzero(counts > 0)]
    groups = [[rows[i] for i in group] for group in first_fit(counts[rows], row_tokens)]
    min_chunks, min_rows = min_shape or (1, 1)
    if max_rows_per_chunk:
        rows_per_chunk = rows_per_micro_batch([len(groups)], max_rows_per_chunk, row_tokens, rows_multiple)
        rows_per_chunk = max(rows_per_chunk, min_rows)
        num_rows = max(bucket_count(-(-len(groups) // rows_per_chunk)), min_chunks) * rows_per_chunk
    else:
        num_rows = max(bucket_count(len(groups), rows_multiple), min_chunks)
    width = attention_mask.shape[1]
    plan = _layout(groups, list(range(len(counts))), first, counts, width, num_rows, row_tokens)
    if max_rows_per_chunk:
        for key in ("source", "segment_ids", "positions"):
            plan[key] = plan[key].reshape(-1, rows_per_chunk, row_tokens)
    return plan


def plan_update(
    attention_mask: np.ndarray,
    trained: np.ndarray,
    order: np.ndarray,
    row_tokens: int,
    *,
    max_rows_per_micro: Optional[int] = None,
    rows_multiple: int = 1,
    response_mask: Optional[np.ndarray] = None,
    shape_rows: Optional[np.ndarray] = None,
    min_shape: Optional[Tuple[int, int, int]] = None,
) -> Dict[str, np.ndarray]:
    """The update's packed micro-batches.

    Args:
      attention_mask: `[N, L]`, the padded batch's.
      trained: `[N]` bool, the rows with a token any loss counts (response or value mask); the others add
        nothing to a loss or a metric and are left out.
      order: `[S, mini]` the padded rows of each minibatch step (`minibatches.minibatch_order`).
      row_tokens: columns of a packed row.
      max_rows_per_micro: the most packed rows in a micro-batch (the token budget / `row_tokens`); the rows
        per micro-batch are `rows_per_micro_batch`'s. None: one micro-batch per minibatch.
      rows_multiple: packed rows per micro-batch are a multiple of it (data-parallel shards).
      response_mask: checked as `token_extents` says.
      shape_rows: `[N]` bool, a superset of `trained` (e.g. every row with a response when `trained` leaves out
        those with no non-zero advantage): the plan then has the shape packing `shape_rows` would have, whatever
        `trained` holds, so a run whose trained rows vary from batch to batch compiles as few update programs as
        one that trains them all. Without a token budget, a full step's rows are cut into `SHAPED_MICRO_BATCHES`
        micro-batches: a step with fewer rows to train computes fewer of them (the others are empty, and
        skipped).
      min_shape: (A, R, K) at least, e.g. `plan_shape` of the run's previous plans with the same budget: a
        run's plans then only grow, and the update compiles once per growth, not per batch (an empty
        micro-batch is skipped, so a larger A costs little; R stays within the budget it came from).

    Returns:
      `source`, `segment_ids`, `positions` `[S, A, R, T]`; `rows` `[S, A, K]` (padded row of each loss-side
      slot, N for an empty slot); `unpack` `[S, A, K, L]` into the micro-batch's `[R * T]` packed tokens.
      A, R and K are the same for every step (the largest needed, bucketed); a step with fewer micro-batches
      or sequences has empty ones (the update skips a micro-batch with no token).
    """
    first, counts = token_extents(attention_mask, response_mask)
    width, total = attention_mask.shape[1], attention_mask.shape[0]
    order = np.asarray(order)
    step_groups = []  # per step, its sequences first-fit into packed rows
    for step_rows in order:
        rows = [int(r) for r in step_rows if trained[r] and counts[r] > 0]
        step_groups.append([[rows[i] for i in group] for group in first_fit(counts[rows], row_tokens)])
    # Packed rows per step of the rows that decide the shape (`full`), and of those that train (`needed`).
    needed = [len(g) for g in step_groups]
    full = needed
    if shape_rows is not None:  # each step's `shape_rows` lengths
        shape_lengths = [counts[[int(r) for r in step_rows if shape_rows[r] and counts[r] > 0]] for step_rows in order]
        full = [len(first_fit(lengths, row_tokens)) for lengths in shape_lengths]
    if shape_rows is not None and max_rows_per_micro is None:
        # A full step's rows, as the plan of every row would have them, cut into `SHAPED_MICRO_BATCHES`; every
        # step has the full step's shape.
        whole = bucket_count(max(max(full), 1), rows_multiple)
        num_rows = -(-whole // (SHAPED_MICRO_BATCHES * rows_multiple)) * rows_multiple
        full = [whole] * len(full)
    elif max_rows_per_micro is None:
        num_rows = bucket_count(max(max(n, 1) for n in full), rows_multiple)
    else:
        num_rows = rows_per_micro_batch(full, max_rows_per_micro, row_tokens, rows_multiple)
    min_micro, min_rows, min_slots = min_shape or (1, 1, 1)
    num_rows = max(num_rows, min_rows)
    steps: List[List[Tuple[List[List[int]], List[int]]]] = []  # per step, per micro-batch: (groups, sequences)
    for groups in step_groups:
        micro = [groups[i : i + num_rows] for i in range(0, len(groups), num_rows)] or [[]]
        steps.append([(g, [row for group in g for row in group]) for g in micro])
    # (First-fit of a subset can, rarely, take one row more than of the whole: hence the max with `needed`.)
    num_micro = max(bucket_count(max(-(-max(n, m, 1) // num_rows) for n, m in zip(full, needed))), min_micro)
    # Loss-side slots per micro-batch: the whole minibatch without a token budget (one shape whatever the lengths:
    # the loss-side arrays are cheap, a recompile is not); with one and `shape_rows`, the most of a step's
    # `shape_rows` sequences that fit in a micro-batch's tokens (the shortest ones: a bound whichever of them
    # train, so the many micro-batches of a budget do not each hold the whole minibatch); else the most any
    # micro-batch holds.
    if max_rows_per_micro is None:
        slots = order.shape[1]
    elif shape_rows is not None:
        capacity = num_rows * row_tokens
        fit = max(int(np.searchsorted(np.cumsum(np.sort(n)), capacity, side="right")) for n in shape_lengths)
        slots = min(bucket_count(fit), order.shape[1])
    else:
        slots = bucket_count(max(len(q) for s in steps for _, q in s))
    slots = max(slots, min_slots)
    out = {
        "source": np.full((len(steps), num_micro, num_rows, row_tokens), -1, np.int32),
        "segment_ids": np.zeros((len(steps), num_micro, num_rows, row_tokens), np.int32),
        "positions": np.zeros((len(steps), num_micro, num_rows, row_tokens), np.int32),
        "rows": np.full((len(steps), num_micro, slots), total, np.int32),
        "unpack": np.full((len(steps), num_micro, slots, width), num_rows * row_tokens, np.int32),
    }
    for s, micro in enumerate(steps):
        for a, (groups, seqs) in enumerate(micro):
            padded_slots = seqs + [-1] * (slots - len(seqs))
            layout = _layout(groups, padded_slots, first, counts, width, num_rows, row_tokens)
            for key, value in layout.items():
                out[key][s, a] = value
            out["rows"][s, a, : len(seqs)] = seqs
    return out
