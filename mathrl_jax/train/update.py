"""The jitted PPO-style update: `ppo_epochs` x `num_mini_batches` optimizer steps on one batch of rollouts.

    update = make_update_fn(graphdef, optimizer, UpdateConfig(ppo_epochs=1, num_mini_batches=4))
    state, metrics = update(state, batch)

Batch (all `[N, L]`, row layout of `Rollouts.to_batch`: column c holds token c,
whose log-prob comes from the logits at column c - 1):
  input_ids, attention_mask, response_mask, old_logprobs, advantages;
  ref_logprobs (with `kl_coef > 0`); proximal_logprobs (decoupled loss);
  returns, old_values, value_mask (with a critic: the entries the critic is
  trained on, e.g. each action's first token for APPO); action_index (the
  action-level loss and whitening).

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

import dataclasses
import functools
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mathrl_jax import losses
from mathrl_jax.train import packing, update_metrics
from mathrl_jax.train.passes import critic_values, packed_inputs, policy_logprobs, unpack
from mathrl_jax.train.state import TrainState

WHITENING = (None, "actions", "nonzero")
PACKED = "packed"  # the batch key of a packing plan (`packing.plan_update`); micro-batches hold packed inputs


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    """Static settings of the update (one compiled program per config)."""

    ppo_epochs: int = 1
    num_mini_batches: int = 1
    micro_batch_size: Optional[int] = None  # rows per gradient-accumulation chunk; None (or >= the minibatch): all
    policy_loss: str = "ppo"
    clip_low: float = 0.2
    clip_high: Optional[float] = None  # DAPO clip-higher: 0.28
    clip_c: Optional[float] = None  # dual clip
    behaviour_weight_cap: Optional[float] = None  # decoupled loss
    loss_agg_mode: str = "token-mean"
    norm_constant: Optional[float] = None
    entropy_coef: float = 0.0
    kl_coef: float = 0.0  # KL to the reference in the loss (GRPO); 0 disables
    kl_kind: str = "k3"
    value_clip: Optional[float] = 0.2
    value_loss_type: str = "mse"  # or "huber", "huber_one_sided" (OpenR's)
    huber_delta: float = 10.0
    target_kl: Optional[float] = None  # OpenR: a minibatch over it does not step the policy
    # Standardise advantages per minibatch, as OpenR: over its actions (APPO, unbiased std) or over its non-zero
    # token advantages (TPPO, biased std); None leaves them as given.
    minibatch_whitening: Optional[str] = None
    temperature: float = 1.0  # log-probs at the sampler's temperature
    # Rows whose every advantage is 0 are no term of the loss and no metric's (the denominator still counts them);
    # only where that changes no gradient (`zero_advantage_rows_are_inert`).
    skip_zero_advantage: bool = False

    def __post_init__(self):
        if self.policy_loss not in losses.POLICY_LOSSES:
            raise ValueError(f"policy_loss={self.policy_loss!r}: expected one of {tuple(losses.POLICY_LOSSES)}")
        if self.ppo_epochs < 1 or self.num_mini_batches < 1:
            raise ValueError(f"ppo_epochs={self.ppo_epochs}, num_mini_batches={self.num_mini_batches}: must be >= 1")
        if self.loss_agg_mode not in losses.LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode={self.loss_agg_mode!r}: expected one of {losses.LOSS_AGG_MODES}")
        if self.minibatch_whitening not in WHITENING:
            raise ValueError(f"minibatch_whitening={self.minibatch_whitening!r}: expected one of {WHITENING}")
        if self.value_loss_type not in losses.value.VALUE_LOSS_TYPES:
            raise ValueError(
                f"value_loss_type={self.value_loss_type!r}: expected one of {losses.value.VALUE_LOSS_TYPES}"
            )
        if self.skip_zero_advantage and not zero_advantage_rows_are_inert(self):
            raise ValueError(
                f"skip_zero_advantage=True needs a loss that a zero-advantage row adds nothing to: policy_loss in "
                f"{INERT_AT_ZERO_ADVANTAGE} (got {self.policy_loss!r}), kl_coef=0 (got {self.kl_coef}), "
                f"entropy_coef=0 (got {self.entropy_coef}), minibatch_whitening=None (got "
                f"{self.minibatch_whitening!r}), target_kl=None (got {self.target_kl})"
            )


# The library's policy losses that are 0, with zero gradient, on a token whose advantage is 0.
INERT_AT_ZERO_ADVANTAGE = ("ppo", "action_ppo", "decoupled_ppo", "gspo", "reinforce")


def zero_advantage_rows_are_inert(cfg: UpdateConfig, has_critic: bool = False) -> bool:
    """Whether a row whose every advantage is 0 adds nothing to the update's gradient: the policy loss is one of
    `INERT_AT_ZERO_ADVANTAGE`, and no other term reads the row (a KL or entropy term in the loss, a critic,
    per-minibatch whitening, which moves its zeros, or `target_kl`, whose approx-KL averages its ratios)."""
    return (
        cfg.policy_loss in INERT_AT_ZERO_ADVANTAGE
        and not cfg.kl_coef
        and not cfg.entropy_coef
        and cfg.minibatch_whitening is None
        and cfg.target_kl is None
        and not has_critic
    )


def _policy_loss_args(cfg: UpdateConfig, mb: Dict[str, jax.Array], denominator) -> Dict[str, Any]:
    """The keyword arguments of `cfg.policy_loss` (a `losses.registry` name) beyond (logp, old, adv, mask)."""
    agg = dict(loss_agg_mode=cfg.loss_agg_mode, norm_constant=cfg.norm_constant, denominator=denominator)
    clip = dict(clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_c=cfg.clip_c)
    if cfg.policy_loss == "ppo":
        return {**clip, **agg}
    if cfg.policy_loss == "action_ppo":  # APPO as OpenR: one ratio per action, averaged over the actions
        return dict(
            action_index=mb["action_index"], clip_low=cfg.clip_low, clip_high=cfg.clip_high, denominator=denominator
        )
    if cfg.policy_loss == "decoupled_ppo":
        return dict(
            proximal_logprobs=mb["proximal_logprobs"], behaviour_weight_cap=cfg.behaviour_weight_cap, **clip, **agg
        )
    return agg  # gspo, reinforce, or a loss of the user's with the aggregation arguments


def _forward(fn: Callable, mb: Dict[str, jax.Array], *args):
    """`fn(input_ids, attention_mask, *args, packing)` on a micro-batch's padded rows, or on its packed rows
    with each result brought back to the padded layout."""
    packing = mb.get(PACKED)
    if packing is None:
        return fn(mb["input_ids"], mb["attention_mask"], *args, None)
    return jax.tree.map(lambda x: unpack(x, packing), fn(packing["input_ids"], None, *args, packing))


def _policy_objective(cfg: UpdateConfig, graphdef, params, mb: Dict[str, jax.Array], denominator):
    logp, entropy = _forward(functools.partial(policy_logprobs, graphdef, params), mb, cfg.temperature)
    mask = mb["response_mask"]
    loss_fn = losses.get_policy_loss(cfg.policy_loss)
    loss, metrics = loss_fn(logp, mb["old_logprobs"], mb["advantages"], mask, **_policy_loss_args(cfg, mb, denominator))
    metrics = {"policy_loss": loss, **metrics}
    if cfg.policy_loss == "action_ppo":  # OpenR: each action's mean token entropy, averaged over actions
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
    if cfg.policy_loss == "action_ppo":
        metrics["approx_kl_k3"] = metrics.pop("approx_kl")  # over actions: (r_a - 1) - log r_a
        metrics.pop("num_actions")
    else:  # (r - 1) - log r over tokens, r = pi / pi_old
        metrics["approx_kl_k3"] = losses.masked_mean(losses.kl_k3(mb["old_logprobs"], logp), mask)
    return total, metrics


def _policy_units(cfg: UpdateConfig, mb) -> jax.Array:
    """`[..., L]` 1 on what the policy loss averages over: tokens, or each action's first token (action-level)."""
    if cfg.policy_loss != "action_ppo":
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


def _critic_objective(cfg: UpdateConfig, graphdef, params, mb, denominator):
    values = _forward(functools.partial(critic_values, graphdef, params), mb)
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
    metrics.update({f"sum_{k}": jnp.sum(x * mask) for k, x in sums.items()})
    return loss, {"value_loss": loss, **{f"value_{k}": v for k, v in metrics.items() if k != "value_loss"}}


def _accumulate(objective: Callable, params, micro_batches, denominator, units):
    """Sum over micro-batches of (loss, grads); metrics combined by `update_metrics.over_micro_batches` (the means
    over each micro-batch's `units`, `[A, micro, L]`: tokens, actions or value entries, weighted by its unit count,
    so a micro-batch of padding rows (multi-turn, DAPO-filtered) does not dilute them).

    A micro-batch with no unit is skipped (`lax.cond`): it would add a zero loss, zero gradients and metrics of
    weight 0 (a packing plan's spare micro-batches, `packing.plan_update`), so skipping it changes no value."""

    def accumulate(acc, mb):
        (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params, mb, denominator)
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
            lambda p, mb, d: objective(p, mb, d)[1], abstract(params), abstract(first), abstract(denominator)
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


def _apply_if(ok, new, old):
    return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def minibatch_order(rng: jax.Array, rows: int, epochs: int, num_mini_batches: int) -> Tuple[jax.Array, jax.Array]:
    """(the next RNG key, `[epochs * num_mini_batches, rows / num_mini_batches]` row indices): each epoch a fresh
    permutation of the rows, cut into minibatches in order. `rng` is the TrainState's raw key data."""
    key, perm_key = jax.random.split(jax.random.wrap_key_data(rng))
    perms = jnp.stack([jax.random.permutation(k, rows) for k in jax.random.split(perm_key, epochs)])
    return key, perms.reshape(epochs * num_mini_batches, rows // num_mini_batches)


_minibatch_order = jax.jit(minibatch_order, static_argnums=(1, 2, 3))  # one program on the host's side


def with_packing(
    batch: Dict[str, Any],
    rng: jax.Array,
    *,
    epochs: int,
    num_mini_batches: int,
    row_tokens: int,
    max_rows_per_micro: Optional[int] = None,
    rows_multiple: int = 1,
    skip_zero_advantage: bool = False,
    min_shape: Optional[Tuple[int, int, int]] = None,
) -> Dict[str, Any]:
    """`batch` with a packing plan (`packing.plan_update`) under `PACKED`: the update then runs each
    minibatch of `minibatch_order(rng, rows, epochs, num_mini_batches)` (`rng`: the TrainState's, the one
    the update is given; `epochs` and `num_mini_batches` its `UpdateConfig`'s) on packed micro-batches of
    at most `max_rows_per_micro` rows of `row_tokens` tokens (None: one micro-batch per minibatch).

    `skip_zero_advantage` leaves out of the plan the rows whose every advantage is 0 (pass the update's
    `UpdateConfig.skip_zero_advantage`: an update without it would give those rows' metrics no value).
    `min_shape`: the plan's dimensions at least (`packing.plan_update`)."""
    keys = ("attention_mask", "response_mask") + (("value_mask",) * ("value_mask" in batch))
    host = {k: np.asarray(batch[k]) for k in keys + (("advantages",) * skip_zero_advantage)}
    with_response = (host["response_mask"] > 0).any(axis=1)
    if "value_mask" in host:
        with_response |= host["value_mask"].sum(axis=1) > 0
    trained, shape_rows = with_response, None
    if skip_zero_advantage:  # the plan keeps the shape of training every row: no program per trained-row count
        trained = with_response & ((host["response_mask"] > 0) & (host["advantages"] != 0)).any(axis=1)
        shape_rows = with_response
    rows = host["attention_mask"].shape[0]
    _, order = _minibatch_order(rng, rows, epochs, num_mini_batches)
    plan = packing.plan_update(
        host["attention_mask"],
        trained,
        np.asarray(order),
        row_tokens,
        max_rows_per_micro=max_rows_per_micro,
        rows_multiple=rows_multiple,
        response_mask=host["response_mask"],
        shape_rows=shape_rows,
        min_shape=min_shape,
    )
    return {**batch, PACKED: jax.device_put(plan)}


def make_update_fn(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    cfg: UpdateConfig,
    *,
    critic_graphdef: Optional[nnx.GraphDef] = None,
    critic_optimizer: Optional[optax.GradientTransformation] = None,
    donate: bool = True,
    state_shardings: Any = None,
) -> Callable[[TrainState, Dict[str, jax.Array]], Tuple[TrainState, Dict[str, jax.Array]]]:
    """The jitted `update(state, batch) -> (state, metrics)` (see the module docstring).

    `state_shardings`, a TrainState of shardings (e.g. `jax.tree.map(lambda x: x.sharding, placed_state)`), pins
    the returned state to them. Without it XLA picks the output shardings, and under fsdp it returns small
    leaves (norm weights, their Adam moments) sharded where their rule replicates them, so the next call sees
    other input shardings and compiles the whole update again.
    """
    has_critic = critic_graphdef is not None
    if cfg.skip_zero_advantage and has_critic:
        raise ValueError("skip_zero_advantage=True with a critic: the critic trains on every row")
    policy_objective = functools.partial(_policy_objective, cfg, graphdef)
    critic_objective = functools.partial(_critic_objective, cfg, critic_graphdef) if has_critic else None

    def update(state: TrainState, batch: Dict[str, jax.Array]):
        batch = dict(batch)
        plan = batch.pop(PACKED, None)
        rows = batch["input_ids"].shape[0]
        if rows % cfg.num_mini_batches:
            raise ValueError(f"batch of {rows} rows does not split into num_mini_batches={cfg.num_mini_batches}")
        mini = rows // cfg.num_mini_batches
        key, order = minibatch_order(state.rng, rows, cfg.ppo_epochs, cfg.num_mini_batches)
        # The denominators count the whole minibatch: a packing plan may leave rows out (no token, or with
        # `skip_zero_advantage` no non-zero advantage) that a loss's denominator counts.
        denominator_keys = [k for k in ("response_mask", "action_index", "value_mask") if k in batch]
        if plan is None:
            micro = min(cfg.micro_batch_size or mini, mini)  # a micro-batch larger than the minibatch is all of it
            if mini % micro:
                raise ValueError(f"minibatch of {mini} rows does not split into micro_batch_size={micro}")
            steps = order.reshape(cfg.ppo_epochs * cfg.num_mini_batches, mini // micro, micro)
            gather = lambda index: jax.tree.map(lambda x: x[index], batch)  # noqa: E731  [A, micro, ...]
        else:  # the plan's minibatches are `order`'s (packing.plan_update): its rows, packed into micro-batches
            steps = plan
            extended = {k: jnp.concatenate([x, jnp.zeros((1,) + x.shape[1:], x.dtype)]) for k, x in batch.items()}
            gather = functools.partial(_packed_micro_batches, extended)

        def minibatch_step(carry, xs):
            params, opt_state, critic_params, critic_opt_state, kl_skipped, skipped = carry
            step, minibatch_rows = xs
            micro_batches = gather(step)
            whole = {k: batch[k][minibatch_rows] for k in denominator_keys}  # [mini, L]
            if cfg.minibatch_whitening:
                micro_batches = dict(micro_batches, advantages=_whiten_minibatch(cfg, micro_batches))
            if cfg.policy_loss == "action_ppo":
                denominator = jnp.sum(_policy_units(cfg, whole))  # the minibatch's actions
            else:
                denominator = losses.loss_denominator(whole["response_mask"], cfg.loss_agg_mode)
            if cfg.skip_zero_advantage:
                micro_batches = dict(micro_batches, response_mask=_rows_with_advantage(micro_batches))
            units = _policy_units(cfg, micro_batches)
            loss, grads, metrics = _accumulate(policy_objective, params, micro_batches, denominator, units)
            grad_norm = optax.tree.norm(grads)
            finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
            kl_skip = jnp.zeros((), bool)
            if cfg.target_kl is not None:
                kl_skip = metrics["approx_kl_k3"] > cfg.target_kl
            apply = finite & ~kl_skip
            updates, new_opt_state = optimizer.update(grads, opt_state, params)
            params = _apply_if(apply, optax.apply_updates(params, updates), params)
            opt_state = _apply_if(apply, new_opt_state, opt_state)
            metrics = dict(metrics, loss=loss, grad_norm=grad_norm)
            if has_critic:
                value_mask = micro_batches["value_mask"]
                v_denominator = losses.loss_denominator(whole["value_mask"], cfg.loss_agg_mode)
                v_loss, v_grads, v_metrics = _accumulate(
                    critic_objective, critic_params, micro_batches, v_denominator, value_mask
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
            metrics["applied"] = apply.astype(jnp.float32)
            metrics["tokens"] = jnp.sum(micro_batches["response_mask"]).astype(jnp.float32)
            metrics["all_tokens"] = jnp.sum(whole["response_mask"]).astype(jnp.float32)
            return (params, opt_state, critic_params, critic_opt_state, kl_skipped, skipped), metrics

        init = (
            state.params,
            state.opt_state,
            state.critic_params,
            state.critic_opt_state,
            jnp.zeros((), jnp.int32),
            jnp.zeros((), jnp.int32),
        )
        (params, opt_state, critic_params, critic_opt_state, kl_skipped, skipped), per_step = jax.lax.scan(
            minibatch_step, init, (steps, order)
        )
        metrics = update_metrics.over_steps(per_step)
        metrics["kl_skipped"] = kl_skipped.astype(jnp.float32) / order.shape[0]  # fraction of policy steps
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
    return jax.jit(update, donate_argnums=(0,) if donate else (), out_shardings=out_shardings)
