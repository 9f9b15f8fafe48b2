"""Masked reductions and loss aggregation over `[B, T]` token arrays.

A per-token loss matrix is reduced to a scalar in one of four ways (the names
are verl's `loss_agg_mode`):

| mode                        | formula                                                    | used by |
|-----------------------------|------------------------------------------------------------|---------|
| `token-mean`                | sum_{b,t} m l / sum_{b,t} m                                | DAPO, verl default |
| `seq-mean-token-mean`       | mean_b [ sum_t m l / sum_t m ]                             | GRPO paper, GSPO |
| `seq-mean-token-sum`        | mean_b [ sum_t m l ]                                       | |
| `seq-mean-token-sum-norm`   | mean_b [ sum_t m l / C ], C a constant (default T)         | Dr. GRPO, TRL |

"mean_b" runs over sequences with at least one counted token, so padding rows
(all-zero mask) never change a result.

`seq-mean-token-sum-norm` follows the Dr. GRPO paper and TRL (`loss_type="dr_grpo"`):
the mean over sequences of each token sum divided by a constant. verl's
`agg_loss` of the same name sums over the sequences instead of averaging them,
i.e. it is B times this loss for a batch of B sequences (the gradient direction
is the same; its scale grows with the batch).

TRL's `loss_type` names are accepted too (`TRL_LOSS_TYPES`, `canonical_loss_agg_mode`), each meaning the mode
above that computes TRL's `GRPOTrainer._compute_loss` formula (l the per-token loss, m the completion mask, B
the rows, L_max = `max_completion_length`):

| TRL `loss_type` | TRL's formula                                  | mode here                                      |
|-----------------|------------------------------------------------|------------------------------------------------|
| `grpo`          | mean_b [ sum_t m l / max(sum_t m, 1) ]         | `seq-mean-token-mean`                          |
| `dr_grpo`       | sum_{b,t} m l / (B L_max)                      | `seq-mean-token-sum-norm`, C = L_max           |
| `dapo`          | sum_{b,t} m l / (tokens of the whole batch)    | `token-mean` (over the optimizer step's batch) |
| `bnpo`          | sum_{b,t} m l / max(sum_{b,t} m, 1), per       | `token-mean`                                   |
|                 | local micro-batch, averaged over accumulation  |                                                |

Two differences. TRL's `bnpo` divides each local micro-batch by its own token count and averages those over
gradient accumulation; `token-mean` here divides the whole minibatch's sum by the minibatch's token count (exact
over micro-batches: see below), which is TRL's `dapo`. And TRL's sequence means count every row, one whose mask is
all zero (e.g. `mask_truncated_completions`) included, where "mean_b" here skips such rows: with every row
counted, the two agree.

Every mode is `numerator / denominator` where the denominator depends only on
the mask. `loss_denominator` computes it for a whole minibatch; passing that
value as `denominator=` to a loss evaluated on each micro-batch makes the sum of
micro-batch gradients equal the full-minibatch gradient exactly.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax.numpy as jnp

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)

TRL_LOSS_TYPES = {
    "grpo": "seq-mean-token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",
    "bnpo": "token-mean",
}
"""TRL's `GRPOConfig.loss_type` names, each mapped to the mode here that computes its formula (module table)."""

LOSS_AGG_MODE_NAMES = LOSS_AGG_MODES + tuple(TRL_LOSS_TYPES)
"""Every accepted spelling of a `loss_agg_mode`: the modes and TRL's `loss_type` names."""


def canonical_loss_agg_mode(name: str) -> str:
    """The mode `name` means: itself for one of `LOSS_AGG_MODES`, the mode of a TRL `loss_type`
    (`TRL_LOSS_TYPES`); a ValueError naming the accepted ones otherwise."""
    if name in LOSS_AGG_MODES:
        return name
    if name in TRL_LOSS_TYPES:
        return TRL_LOSS_TYPES[name]
    raise ValueError(f"unknown loss_agg_mode {name!r}; expected one of {', '.join(LOSS_AGG_MODE_NAMES)}")


def masked_sum(x: chex.Array, mask: chex.Array, axis=None) -> chex.Array:
    """sum(x * mask) over `axis`; masked entries never contribute (even if NaN-free inf)."""
    chex.assert_equal_shape([x, mask])
    return jnp.sum(jnp.where(mask > 0, x, 0.0) * mask, axis=axis)


def masked_mean(x: chex.Array, mask: chex.Array, axis=None, eps: float = 1e-8) -> chex.Array:
    """sum(x * mask) / (sum(mask) + eps), as verl's `masked_mean`."""
    chex.assert_equal_shape([x, mask])
    return masked_sum(x, mask, axis) / (jnp.sum(mask, axis=axis) + eps)


def masked_var(x: chex.Array, mask: chex.Array, unbiased: bool = True, eps: float = 1e-8) -> chex.Array:
    """Variance of the masked entries of `x` (all axes).

    var = sum(m (x - mean)^2) / sum(m), times n / (n - 1) when `unbiased`
    (Bessel's correction, as verl's `masked_var`). With a single counted entry the
    unbiased variance is undefined and 0 is returned instead of inf.
    """
    chex.assert_equal_shape([x, mask])
    mean = masked_mean(x, mask, eps=eps)
    var = masked_mean(jnp.square(x - mean), mask, eps=eps)
    if unbiased:
        n = jnp.sum(mask)
        var = jnp.where(n > 1, var * n / jnp.maximum(n - 1, 1.0), 0.0)
    return var


def _check_mode(mode: str) -> None:
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")


def loss_denominator(mask: chex.Array, mode: str = "token-mean") -> chex.Array:
    """The denominator of aggregation `mode` for a `[B, T]` mask.

    `token-mean`: number of counted tokens; every `seq-mean-*` mode: number of
    sequences with at least one counted token. Clamped to >= 1 so an all-masked
    batch gives a zero loss instead of NaN.
    """
    chex.assert_rank(mask, 2)
    _check_mode(mode)
    mask = mask.astype(jnp.float32)
    if mode == "token-mean":
        count = jnp.sum(mask)
    else:
        count = jnp.sum(jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)
    return jnp.maximum(count, 1.0)


def loss_numerator(
    loss_mat: chex.Array,
    mask: chex.Array,
    mode: str = "token-mean",
    norm_constant: Optional[float] = None,
) -> chex.Array:
    """The un-normalised sum of aggregation `mode` (see the module table).

    Args:
      loss_mat: `[B, T]` per-token losses.
      mask: `[B, T]` 1.0 on counted tokens.
      mode: one of `LOSS_AGG_MODES`.
      norm_constant: the constant C of `seq-mean-token-sum-norm`; defaults to T
        (the padded response length, as verl). Pass the generation budget to make
        the loss independent of how much padding a batch has.
    """
    chex.assert_rank([loss_mat, mask], 2)
    chex.assert_equal_shape([loss_mat, mask])
    _check_mode(mode)
    loss_mat = loss_mat.astype(jnp.float32)
    mask = mask.astype(jnp.float32)
    token_sums = masked_sum(loss_mat, mask, axis=-1)  # [B]
    if mode in ("token-mean", "seq-mean-token-sum"):
        return jnp.sum(token_sums)
    if mode == "seq-mean-token-mean":
        lengths = jnp.sum(mask, axis=-1)
        return jnp.sum(token_sums / jnp.maximum(lengths, 1.0))
    constant = loss_mat.shape[-1] if norm_constant is None else norm_constant
    if constant <= 0:
        raise ValueError(f"norm_constant must be positive, got {constant}")
    return jnp.sum(token_sums) / constant


def aggregate_loss(
    loss_mat: chex.Array,
    mask: chex.Array,
    mode: str = "token-mean",
    norm_constant: Optional[float] = None,
    denominator: Optional[chex.Array] = None,
) -> chex.Array:
    """Reduces a `[B, T]` per-token loss to a scalar: numerator / denominator.

    Args:
      loss_mat, mask, mode, norm_constant: as `loss_numerator`.
      denominator: the denominator to divide by. Defaults to
        `loss_denominator(mask, mode)`; pass the whole minibatch's value when
        accumulating gradients over micro-batches so that the accumulated
        gradient is exact.

    Returns:
      float32 scalar.
    """
    numerator = loss_numerator(loss_mat, mask, mode, norm_constant)
    if denominator is None:
        denominator = loss_denominator(mask, mode)
    return numerator / denominator
