"""The jitted PPO-style update: `ppo_epoch` x `num_mini_batch` optimizer steps on one batch of rollouts.

    update = make_update_fn(graphdef, optimizer, UpdateConfig(ppo_epoch=1, num_mini_batch=4))
    state, metrics = update(state, batch)           # a LoRA run: update(state, batch, frozen_base)

Batch (all `[N, L]`, row layout of `Rollouts.to_batch`: column c holds token c,
whose log-prob comes from the logits at column c - 1):
  input_ids, attention_mask, response_mask, old_logprobs, advantages;
  ref_logprobs (with `kl_coef > 0`); proximal_logprobs (decoupled loss);
  returns, old_values, value_mask (with a critic: the entries the critic is
  trained on, e.g. each action's first token for APPO); action_index (the
  action-level loss and whitening). Optional, from the host (`minibatches`):
  `minibatch_order` (`[epochs x minibatches, rows / minibatches]`, the order the
  update would draw from the state's key: `host_minibatch_order`) and `packed`
  (a packing plan, `with_packing`).

Per minibatch: the loss denominator is computed on the whole minibatch, each
micro-batch contributes numerator / denominator (so accumulation is exact,
not an average of averages); the gradient norm is taken before clipping; a
step whose loss or gradient is not finite is skipped, params and optimizer
state untouched, and counted. With `target_kl`, a minibatch whose approx-KL
(the mean of (r - 1) - log r, over tokens, or over actions for the action-level
loss) exceeds it does not step the policy; the critic steps regardless, and
later minibatches are unaffected (OpenR `ppo_update`: `if total_approx_kl >
0.02: zero_grad; return`, after the critic's step). With `minibatch_whitening`,
advantages are standardised within each minibatch as OpenR does.

With `skip_zero_advantage` (where `zero_advantage_rows_are_inert`), a row whose every advantage is 0 is no
term of the loss: its PPO / REINFORCE terms are 0 with zero gradient, so the loss, the gradient and the step
are those of the whole minibatch, whose denominator still counts the row's tokens (or its sequence). A packing
plan made `with_packing(..., skip_zero_advantage=True)` leaves such rows out of the forward and backward passes
(a GRPO group whose samples all earned the same reward trains nothing); the per-token metrics (entropy, ratios,
clip fractions, approx-KL) are then over the rows that train, in the padded layout too. (Equal steps need finite
inputs: a NaN in a row left out of a packed update never reaches the loss, where training every row would skip
the step as non-finite.)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import mathrl_jax.train.update._metrics as update_metrics
from mathrl_jax import losses
from mathrl_jax.models import value_head
from mathrl_jax.train.state import TrainState, model_params
from mathrl_jax.train.update._config import UpdateConfig, policy_loss_use
from mathrl_jax.train.update._minibatches import ORDER, PACKED, minibatch_order
from mathrl_jax.train.update._passes import critic_values, packed_inputs, policy_logprobs, unpack


def _forward(fn: Callable, mb: Dict[str, jax.Array], *args):
    """`fn(input_ids, attention_mask, *args, packing)` on a micro-batch's padded rows, or on its packed rows
    with each result brought back to the padded layout."""
    packing = mb.get(PACKED)
    if packing is None:
        return fn(mb["input_ids"], mb["attention_mask"], *args, None)
    return jax.tree.map(lambda x: unpack(x, packing), fn(packing["input_ids"], None, *args, packing))


def _policy_objective(cfg: UpdateConfig, graphdef, params, mb: Dict[str, jax.Array], denominator, frozen=None):
    dropout = (cfg.lora_dropout, mb[DROPOUT_KEY]) if DROPOUT_KEY in mb else None  # the micro-batch's own key
    model = functools.partial(policy_logprobs, graphdef, model_params(params, frozen), dropout=dropout)
    logp, entropy = _forward(model, mb, cfg.temperature)
    mask = mb["response_mask"]
    loss_fn, use = losses.get_policy_loss(cfg.policy_loss), policy_loss_use(cfg.policy_loss)
    loss, metrics = loss_fn(logp, mb["old_logprobs"], mb["advantages"], mask, **use.args(cfg, mb, denominator))
    metrics = {"policy_loss": loss, **metrics}
    if use.per_action:  # OpenR: each action's mean token entropy, averaged over actions
        starts = losses.action_starts_from_index(mb["action_index"], mask)
        action_entropy = losses.action_means(entropy, mb["action_index"], mask)
        entropy_term = jnp.sum(action_entropy * starts) / jnp.maximum(denominator, 1e-8)
        metrics["entropy"] = losses.masked_mean(action_entropy, starts)
    else:
        entropy_term = losses.aggregate_loss(entropy, mask, cfg.loss_agg_mode, cfg.norm_constant, denominator)
        metrics["entropy"] = losses.masked_mean(entropy, mask)
    total = loss - cfg.entropy_coef * entropy_term
    if cfg.kl_coef:
        agg = dict(loss_agg_mode=cfg.loss_agg_mode, norm_constant=cfg.norm_constant, denominator=denominator)
        kl, _ = losses.kl_loss(logp, mb["ref_logprobs"], mask, kind=cfg.kl_kind, **agg)
        metrics["kl"] = kl
        total = total + cfg.kl_coef * kl
    # The names logged (`metric_names`, under "train/"): approx_kl is (r - 1) - log r, ppo_kl the k1 estimate.
    if use.per_action:  # the loss's approx_kl is over actions: (r_a - 1) - log r_a
        metrics.pop("num_actions")
    else:  # (r - 1) - log r over tokens, r = pi / pi_old
        if "approx_kl" in metrics:
            metrics["ppo_kl"] = metrics.pop("approx_kl")
        metrics["approx_kl"] = losses.masked_mean(losses.kl_k3(mb["old_logprobs"], logp), mask)
    for loss_name, name in (("ratio_mean", "importance_weight"), ("ratio_max", "importance_weight_max")):
        if loss_name in metrics:  # the losses' names of the ratio pi / pi_old
            metrics[name] = metrics.pop(loss_name)
    return total, metrics


def _policy_units(cfg: UpdateConfig, mb) -> jax.Array:
    """`[..., L]` 1 on what the policy loss averages over: tokens, or each action's first token (action-level)."""
    if not policy_loss_use(cfg.policy_loss).per_action:
        return mb["response_mask"]
    index, mask = mb["action_index"], mb["response_mask"]
    flat = lambda x: x.reshape(-1, x.shape[-1])  # noqa: E731
    return losses.action_starts_from_index(flat(index), flat(mask)).reshape(mask.shape)


def _whiten_minibatch(cfg: UpdateConfig, mb) -> jax.Array:
    """The minibatch's advantages standardised as OpenR's `ppo_update` does (`minibatch_whitening`)."""
    advantages, mask = mb["advantages"], mb["response_mask"]
    if cfg.minibatch_whitening == "actions":  # APPO: one entry per action, torch's unbiased std
        flat = lambda x: x.reshape(-1, x.shape[-1])  # noqa: E731
        units = losses.action_starts_from_index(flat(mb["action_index"]), flat(mask)).reshape(mask.shape)
        whitened = losses.masked_standardize(advantages, units, unbiased=True)
    else:  # TPPO: the non-zero entries, np.nanstd (biased)
        whitened = losses.masked_standardize(advantages, mask * (advantages != 0), unbiased=False)
    return jnp.where(mask > 0, whitened, 0.0)


def _rows_with_advantage(mb) -> jax.Array:
    """The response mask of the rows that hold a non-zero advantage on a response token (the others: 0)."""
    mask = mb["response_mask"]
    has_advantage = jnp.any((mb["advantages"] != 0) & (mask > 0), axis=-1, keepdims=True)
    return mask * has_advantage.astype(mask.dtype)


def _critic_objective(cfg: UpdateConfig, graphdef, params, mb, denominator, frozen=None):
    values = _forward(functools.partial(critic_values, graphdef, model_params(params, frozen)), mb)
    loss, metrics = losses.clipped_value_loss(
        values,
        mb["old_values"],
        mb["returns"],
        mb["value_mask"],
        clip_range=cfg.value_clip,
        loss_type=cfg.value_loss_type,
        huber_delta=cfg.huber_delta,
        loss_agg_mode=cfg.loss_agg_mode,
        norm_constant=cfg.norm_constant,
        denominator=denominator,
    )
    metrics.pop("explained_variance")  # a ratio of variances: from sums over the minibatch (update_metrics)
    mask = mb["value_mask"].astype(jnp.float32)
    returns = mb["returns"].astype(jnp.float32)
    error = returns - jax.lax.stop_gradient(values)
    sums = {"count": mask, "returns": returns, "returns_sq": returns**2, "error": error, "error_sq": error**2}
    metrics.update({f"value_sum_{k}": jnp.sum(x * mask) for k, x in sums.items()})
    return loss, metrics  # value_loss, value_clip_fraction, value_mean, the value_sum_* of explained variance


def _accumulate(objective: Callable, params, micro_batches, denominator, units, frozen=None):
    """Sum over micro-batches of (loss, grads); metrics combined by `_metrics.over_micro_batches` (the means
    over each micro-batch's `units`, `[A, micro, L]`: tokens, actions or value entries, weighted by its unit count,
    so a micro-batch of padding rows (multi-turn, DAPO-filtered) does not dilute them). The gradient is taken
    with respect to `params` alone; `frozen` (a LoRA run's base) enters the objective as its last argument.

    A micro-batch with no unit is skipped (`lax.cond`): it would add a zero loss, zero gradients and metrics of
    weight 0 (a packing plan's spare micro-batches, `packing.plan_update`), so skipping it changes no value."""

    def accumulate(acc, mb):
        (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params, mb, denominator, frozen)
        acc_loss, acc_grads = acc
        return (acc_loss + loss, jax.tree.map(jnp.add, acc_grads, grads)), metrics

    num_micro = units.shape[0]
    if num_micro > 1:
        # Everything the objective sees enters as an abstract argument, none as a closed-over tracer of the
        # enclosing scan: NNX refuses to touch, at eval_shape's trace level, a Param built from another level's
        # tracer, which the remat'd model does ("Cannot mutate Param from a different trace level").
        abstract = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)  # noqa: E731
        first = jax.tree.map(lambda x: x[0], micro_batches)
        metric_shapes = jax.eval_shape(
            lambda p, mb, d, f: objective(p, mb, d, f)[1],
            abstract(params),
            abstract(first),
            abstract(denominator),
            abstract(frozen),
        )
        no_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
        skip = lambda acc, mb: (acc, no_metrics)  # noqa: E731

    def body(acc, xs):
        mb, mb_units = xs
        if num_micro == 1:
            return accumulate(acc, mb)
        return jax.lax.cond(jnp.any(mb_units > 0), accumulate, skip, acc, mb)

    # Per-micro-batch metrics leave the scan as its outputs and are combined after it, so the carry needs no
    # metric shapes up front.
    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    (loss, grads), per_micro = jax.lax.scan(body, zeros, (micro_batches, units))
    weights = jnp.sum(units.reshape(units.shape[0], -1), axis=1).astype(jnp.float32)
    return loss, grads, update_metrics.over_micro_batches(per_micro, weights)


def _packed_micro_batches(extended: Dict[str, jax.Array], step: Dict[str, jax.Array]) -> Dict[str, jax.Array]:
    """One minibatch step of a packing plan: each micro-batch's loss-side rows `[A, K, ...]` of the batch
    `extended` by a row of zeros (row N, for empty slots) and, under `PACKED`, its packed model inputs
    `[A, R, T]` and `unpack` map."""
    micro_batches = {k: x[step["rows"]] for k, x in extended.items()}
    micro_batches[PACKED] = dict(
        input_ids=packed_inputs(extended["input_ids"], step["source"]),
        segment_ids=step["segment_ids"],
        positions=step["positions"],
        unpack=step["unpack"],
    )
    return micro_batches


DROPOUT_KEY = "lora_dropout_key"
"""A micro-batch's key data for the LoRA dropout of its policy pass (`UpdateConfig.lora_dropout` > 0)."""
DROPOUT_STREAM = 0x4C6F5241
"""What the update's dropout keys fold into the state's key: a stream apart from the minibatch order's."""


def _dropout_keys(base: jax.Array, step: jax.Array, count: int) -> jax.Array:
    """`[count, ...]` key data, one per micro-batch of minibatch step `step` of an update whose base key is
    `base`: fold_in(base, step), split `count` ways. `base` comes from the state's key, which the checkpoint
    holds, so a resumed run draws the masks an uninterrupted one does."""
    return jax.random.key_data(jax.random.split(jax.random.fold_in(base, step), count))


def _apply_if(ok, new, old):
    return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def make_update_fn(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    cfg: UpdateConfig,
    *,
    critic_graphdef: Optional[nnx.GraphDef] = None,
    critic_optimizer: Optional[optax.GradientTransformation] = None,
    donate: bool = True,
    state_shardings: Any = None,
    critic_shares_base: bool = False,
    learning_rate: Optional[optax.Schedule] = None,
    critic_learning_rate: Optional[optax.Schedule] = None,
    compiler_options: Optional[dict] = None,
) -> Callable[..., Tuple[TrainState, Dict[str, jax.Array]]]:
    """The jitted `update(state, batch, frozen=None) -> (state, metrics)` (see the module docstring). `frozen`:
    the weights a LoRA run does not train (`state.params` holds its adapters; `state.model_params`), never
    donated; the optimizer then sees the adapters alone. `critic_shares_base`: the critic is a
    `value_head.FrozenBaseCritic` whose trunk is `frozen`'s (`state.critic_params` its head alone).

    `state_shardings`, a TrainState of shardings (e.g. `jax.tree.map(lambda x: x.sharding, placed_state)`), pins
    the returned state to them. Without it XLA picks the output shardings, and under fsdp it returns small
    leaves (norm weights, their Adam moments) sharded where their rule replicates them, so the next call sees
    other input shardings and compiles the whole update again.

    `learning_rate` / `critic_learning_rate`: the optimizers' schedules (`state.make_optimizer(...,
    return_schedule=True)`), for the metrics `lr` / `value_lr`: the mean over the minibatch steps of each step's
    rate, `schedule(count)` at the optimizer's count (`_metrics.scheduled_learning_rate`).
    """
    has_critic = critic_graphdef is not None
    if cfg.skip_zero_advantage and has_critic:
        raise ValueError("skip_zero_advantage=True with a critic: the critic trains on every row")
    policy_objective = functools.partial(_policy_objective, cfg, graphdef)
    critic_objective = functools.partial(_critic_objective, cfg, critic_graphdef) if has_critic else None

    def update(state: TrainState, batch: Dict[str, jax.Array], frozen: Any = None):
        batch = dict(batch)
        plan = batch.pop(PACKED, None)
        given_order = batch.pop(ORDER, None)
        rows = batch["input_ids"].shape[0]
        if rows % cfg.num_mini_batch:
            raise ValueError(f"batch of {rows} rows does not split into num_mini_batch={cfg.num_mini_batch}")
        mini = rows // cfg.num_mini_batch
        if given_order is None:
            key, order = minibatch_order(state.rng, rows, cfg.ppo_epoch, cfg.num_mini_batch)
        else:  # the host drew it from this state's key (`_minibatches.host_minibatch_order`); the key moves on alike
            key, order = jax.random.split(jax.random.wrap_key_data(state.rng))[0], given_order
            if order.shape != (cfg.ppo_epoch * cfg.num_mini_batch, mini):
                raise ValueError(
                    f"the batch's minibatch order has shape {order.shape}, expected "
                    f"{(cfg.ppo_epoch * cfg.num_mini_batch, mini)} (ppo_epoch x num_mini_batch, rows per minibatch)"
                )
        # The denominators count the whole minibatch: a packing plan may leave rows out (no token, or with
        # `skip_zero_advantage` no non-zero advantage) that a loss's denominator counts.
        denominator_keys = [k for k in ("response_mask", "action_index", "value_mask") if k in batch]
        if plan is None:
            micro = min(cfg.micro_batch_size or mini, mini)  # a micro-batch larger than the minibatch is all of it
            if mini % micro:
                raise ValueError(f"minibatch of {mini} rows does not split into micro_batch_size={micro}")
            steps = order.reshape(cfg.ppo_epoch * cfg.num_mini_batch, mini // micro, micro)
            gather = lambda index: jax.tree.map(lambda x: x[index], batch)  # noqa: E731  [A, micro, ...]
        else:  # the plan's minibatches are `order`'s (packing.plan_update): its rows, packed into micro-batches
            steps = plan
            extended = {k: jnp.concatenate([x, jnp.zeros((1,) + x.shape[1:], x.dtype)]) for k, x in batch.items()}
            gather = functools.partial(_packed_micro_batches, extended)

        def minibatch_step(carry, xs):
            # `frozen` rides in the carry as `params` do: the model is built from values of one trace level (NNX)
            params, opt_state, critic_params, critic_opt_state, kl_skipped, skipped, frozen = carry
            step, minibatch_rows = xs[:2]
            micro_batches = gather(step)
            if cfg.lora_dropout:  # xs[2]: the step's index, whose keys the micro-batches carry
                count = micro_batches["response_mask"].shape[0]
                micro_batches = dict(micro_batches, **{DROPOUT_KEY: _dropout_keys(dropout_base, xs[2], count)})
            whole = {k: batch[k][minibatch_rows] for k in denominator_keys}  # [mini, L]
            if cfg.minibatch_whitening:
                micro_batches = dict(micro_batches, advantages=_whiten_minibatch(cfg, micro_batches))
            if policy_loss_use(cfg.policy_loss).per_action:
                denominator = jnp.sum(_policy_units(cfg, whole))  # the minibatch's actions
            else:
                denominator = losses.loss_denominator(whole["response_mask"], cfg.loss_agg_mode)
            if cfg.skip_zero_advantage:
                micro_batches = dict(micro_batches, response_mask=_rows_with_advantage(micro_batches))
            units = _policy_units(cfg, micro_batches)
            rates = {"lr": update_metrics.scheduled_learning_rate(learning_rate, opt_state)}
            if has_critic:
                rates["value_lr"] = update_metrics.scheduled_learning_rate(critic_learning_rate, critic_opt_state)
            loss, grads, metrics = _accumulate(policy_objective, params, micro_batches, denominator, units, frozen)
            grad_norm = optax.tree.norm(grads)
            finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
            kl_skip = jnp.zeros((), bool)
            if cfg.target_kl is not None:
                kl_skip = metrics["approx_kl"] > cfg.target_kl
            apply = finite & ~kl_skip
            updates, new_opt_state = optimizer.update(grads, opt_state, params)
            params = _apply_if(apply, optax.apply_updates(params, updates), params)
            opt_state = _apply_if(apply, new_opt_state, opt_state)
            metrics = dict(metrics, loss=loss, grad_norm=grad_norm)
            if has_critic:
                value_mask = micro_batches["value_mask"]
                v_denominator = losses.loss_denominator(whole["value_mask"], cfg.loss_agg_mode)
                critic_frozen = value_head.frozen_trunk(frozen) if critic_shares_base else None
                v_loss, v_grads, v_metrics = _accumulate(
                    critic_objective, critic_params, micro_batches, v_denominator, value_mask, critic_frozen
                )
                v_norm = optax.tree.norm(v_grads)
                v_apply = jnp.isfinite(v_loss) & jnp.isfinite(v_norm)
                v_updates, new_v_opt = critic_optimizer.update(v_grads, critic_opt_state, critic_params)
                critic_params = _apply_if(v_apply, optax.apply_updates(critic_params, v_updates), critic_params)
                critic_opt_state = _apply_if(v_apply, new_v_opt, critic_opt_state)
                metrics.update(update_metrics.explained_variance(v_metrics), value_grad_norm=v_norm)
                finite = finite & jnp.isfinite(v_loss) & jnp.isfinite(v_norm)
            skipped = skipped + (~finite).astype(jnp.int32)
            kl_skipped = kl_skipped + kl_skip.astype(jnp.int32)
            metrics["applied_fraction"] = apply.astype(jnp.float32)
            metrics["tokens"] = jnp.sum(micro_batches["response_mask"]).astype(jnp.float32)
            metrics["all_tokens"] = jnp.sum(whole["response_mask"]).astype(jnp.float32)
            metrics.update({k: rate for k, rate in rates.items() if rate is not None})
            return (params, opt_state, critic_params, critic_opt_state, kl_skipped, skipped, frozen), metrics

        init = (
            state.params,
            state.opt_state,
            state.critic_params,
            state.critic_opt_state,
            jnp.zeros((), jnp.int32),
            jnp.zeros((), jnp.int32),
            frozen,
        )
        xs = (steps, order)
        if cfg.lora_dropout:  # a key per minibatch step, from the state's key (resumes draw the same masks)
            dropout_base = jax.random.fold_in(jax.random.wrap_key_data(state.rng), DROPOUT_STREAM)
            xs = xs + (jnp.arange(order.shape[0]),)
        (params, opt_state, critic_params, critic_opt_state, kl_skipped, skipped, _), per_step = jax.lax.scan(
            minibatch_step, init, xs
        )
        metrics = update_metrics.over_steps(per_step)
        metrics["kl_skipped_fraction"] = kl_skipped.astype(jnp.float32) / order.shape[0]  # of policy steps
        metrics["skipped_updates"] = skipped.astype(jnp.float32)
        new_state = state.replace(
            params=params,
            opt_state=opt_state,
            critic_params=critic_params,
            critic_opt_state=critic_opt_state,
            step=state.step + 1,
            rng=jax.random.key_data(key),
            policy_version=state.policy_version + 1,
            skipped_updates=state.skipped_updates + skipped,
        )
        return new_state, metrics

    out_shardings = None if state_shardings is None else (state_shardings, None)
    donated = (0,) if donate else ()
    return jax.jit(update, donate_argnums=donated, out_shardings=out_shardings, compiler_options=compiler_options)
