"""How the update's metrics combine: over a minibatch's micro-batches, then over the minibatch steps.

No metric depends on how a minibatch is cut into micro-batches:
  * each micro-batch's loss values (`LOSS_SHARES`) are its share of the minibatch's loss (numerator / the
    minibatch's denominator): summed over micro-batches, as the loss is, and so are sums (`*_sum_*`);
  * maxima (`MAXIMA`) are maxima over the micro-batches and minibatches;
  * every other metric is a mean over a micro-batch's units (tokens, actions or value entries), averaged
    weighted by the unit counts.
Over the minibatch steps: means by the tokens they are over, loss shares by the whole minibatch's tokens, and
per-step quantities (`STEP_METRICS`) over the steps that hold a response token, the learning rates (`SCHEDULED`)
over every step. A step that trains no token (`skip_zero_advantage` with every advantage of its rows 0, DAPO's filter
leaving none) measures nothing and weighs nothing; `minibatches_trained` counts the others (the loop logs none of the
policy's measurements of an update that trained none: `reporting.measured_update_metrics`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import optax

# Per-minibatch quantities, not token averages: averaged over the minibatches that hold a response token.
STEP_METRICS = ("loss", "grad_norm", "value_grad_norm", "applied_fraction")
LOSS_SHARES = ("policy_loss", "kl", "value_loss")
MAXIMA = ("importance_weight_max",)
SCHEDULED = ("lr", "value_lr")  # the optimizers' learning rates: the plain mean over the steps


def _combine(key: str, values: jax.Array, weights: jax.Array) -> jax.Array:
    """One metric's `[A]` per-micro-batch values combined over the minibatch (before the unit scaling)."""
    if key in LOSS_SHARES or "_sum_" in key:
        return jnp.sum(values, axis=0)
    if key in MAXIMA:
        return jnp.max(values, axis=0)
    return jnp.tensordot(weights, values, axes=1)


def over_micro_batches(per_micro: Dict[str, jax.Array], weights: jax.Array) -> Dict[str, jax.Array]:
    """A minibatch's metrics from its `[A]` per-micro-batch ones, `weights [A]` the micro-batches' unit counts.
    All padding (no unit): the means are 0, and the minibatch gets no weight in `over_steps`."""
    units = jnp.sum(weights)
    scale = jnp.where(units > 0, 1.0 / jnp.maximum(units, 1e-30), 0.0)
    metrics = {k: _combine(k, v, weights) for k, v in per_micro.items()}
    return {k: m if k in LOSS_SHARES + MAXIMA or "_sum_" in k else m * scale for k, m in metrics.items()}


def weighted_mean(values: Dict[str, jax.Array], weights: jax.Array) -> Dict[str, jax.Array]:
    """Per-key mean over the leading axis weighted by `weights` (>= 0); the plain mean if all weights are 0."""
    total = jnp.sum(weights)
    w = jnp.where(total > 0, weights / jnp.maximum(total, 1e-30), 1.0 / weights.shape[0])
    return {k: jnp.tensordot(w, v.astype(jnp.float32), axes=1) for k, v in values.items()}


def over_steps(per_step: Dict[str, jax.Array]) -> Dict[str, jax.Array]:
    """The update's metrics from its `[S]` per-minibatch-step ones, which hold `tokens` (the response tokens the
    step trained on) and `all_tokens` (its minibatch's: more with `skip_zero_advantage`)."""
    per_step = dict(per_step)
    tokens, all_tokens = per_step.pop("tokens"), per_step.pop("all_tokens")
    trained = (tokens > 0).astype(jnp.float32)  # the steps that trained a token: the others measured nothing
    scheduled = {k: per_step.pop(k) for k in SCHEDULED if k in per_step}
    shares = {k: v for k, v in per_step.items() if k in LOSS_SHARES}
    token_means = {k: v for k, v in per_step.items() if k not in STEP_METRICS and k not in LOSS_SHARES}
    step_values = {k: v for k, v in per_step.items() if k in STEP_METRICS}
    metrics = weighted_mean(token_means, tokens)  # each minibatch by the tokens its means are over
    metrics.update(weighted_mean(shares, all_tokens * trained))  # a loss is over its whole minibatch
    metrics.update({k: jnp.max(v) for k, v in per_step.items() if k in MAXIMA})
    metrics.update(weighted_mean(step_values, trained))
    metrics.update({k: jnp.mean(v) for k, v in scheduled.items()})
    total = jnp.sum(all_tokens)
    metrics["trained_token_fraction"] = jnp.where(total > 0, jnp.sum(tokens) / jnp.maximum(total, 1.0), 0.0)
    metrics["minibatches_trained"] = jnp.sum(trained)
    return metrics


def scheduled_learning_rate(schedule: Optional[Callable], opt_state: Any) -> Optional[jax.Array]:
    """The learning rate `schedule` gives the optimizer's next step: `schedule(count)`, `count` the steps the
    optimizer took (its `optax.ScaleByScheduleState`, which a skipped step does not advance). None without a
    schedule, or an optimizer state that holds no schedule's count."""
    if schedule is None:
        return None
    is_count = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    counts = [x.count for x in jax.tree_util.tree_leaves(opt_state, is_leaf=is_count) if is_count(x)]
    return None if not counts else jnp.asarray(schedule(counts[0]), jnp.float32)


def explained_variance(metrics: Dict[str, jax.Array]) -> Dict[str, jax.Array]:
    """`metrics` with the critic's `value_sum_*` replaced by 1 - Var[R - V] / Var[R] over the minibatch's value
    entries (`losses.explained_variance`, whatever the micro-batches; 0 when none counts)."""
    sums = {k[len("value_sum_") :]: metrics.pop(k) for k in list(metrics) if k.startswith("value_sum_")}
    count = jnp.maximum(sums["count"], 1.0)
    var_returns = sums["returns_sq"] / count - (sums["returns"] / count) ** 2
    var_error = sums["error_sq"] / count - (sums["error"] / count) ** 2
    explained = 1.0 - jnp.maximum(var_error, 0.0) / (jnp.maximum(var_returns, 0.0) + 1e-8)
    return dict(metrics, value_explained_variance=jnp.where(sums["count"] > 0, explained, 0.0))
