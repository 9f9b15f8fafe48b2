"""From graded rollouts to the update's batch: padded arrays, recomputed log-probs and values, advantages.

    batches = BatchMaker(BatchSettings(...), codec, mesh, logprobs, values, ref_params)
    batch, metrics, shape_floors = prepare_batch(batches, state, rollouts, scores, rng=..., shape_floors=...)

The batch crosses to the device once with the passes' packing plan (and advantages made from the scores alone,
which the host makes: `_advantages.host_score_advantages`), the few arrays the host plans with come back once (none
at all in the default GRPO run: `tests/train/batch/test_batch.py`), and the update's minibatch order and packing
plan, both drawn on the host, cross once more with the batch's device arrays (`update.with_packing`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

import mathrl_jax.train.batch._advantages as advantages_lib
from mathrl_jax import losses
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.sampling.jax_sampler import bucket
from mathrl_jax.sharding import distributed
from mathrl_jax.train import update
from mathrl_jax.train.batch._settings import BatchSettings, DapoSettings
from mathrl_jax.train.state import model_params


@dataclasses.dataclass
class BatchMaker:
    """What `prepare_batch` works with, set once by the build: its settings, the tokenizer, the trainer's mesh and
    jitted passes, the reference params (with a KL to the reference). The shapes the batches have grown to are
    the loop's (`state.HostState.shape_floors`): passed in, the next ones returned."""

    settings: BatchSettings
    codec: TextCodec
    mesh: Any
    logprobs: Callable
    values: Optional[Callable] = None
    ref_params: Any = None  # the whole reference model (`state_lib.model_params`)
    frozen: Any = None  # a LoRA run's base weights, which `state.params` (the adapters) are joined with
    critic_frozen: Any = None  # a critic's untrained part (`value_head.frozen_trunk`), joined with its head


def action_indices(codec: TextCodec, rollouts, separator: str) -> List[np.ndarray]:
    """Per completion, `[len]` int32: the reasoning step (action) of each token, split at `separator` in the
    tokens' text (`advantages.action_index_from_text`): the actions APPO / TPPO train on and the steps the PRM
    scores. Without a separator each completion is one action."""
    if not separator:
        return [np.zeros(len(ids), np.int32) for ids in rollouts.completion_ids]
    return [
        advantages_lib.action_index_from_text([codec.token_text(t) for t in ids], separator)
        for ids in rollouts.completion_ids
    ]


def batch_columns(max_length: int, rollouts) -> int:
    """Columns of the trainer's batch: the longest prompt + completion, rounded up to a power of two (a
    handful of shapes to compile), at most `max_length`. A multi-turn run's rows are far shorter than that
    budget, and every pass costs (and its attention holds) columns squared."""
    needed = max(len(p) for p in rollouts.prompt_ids) + max([len(x) for x in rollouts.completion_ids] + [1])
    return min(bucket(needed, 16), max_length)


def dapo_shaping(dapo: DapoSettings, rollouts, scores: np.ndarray, correct: Optional[np.ndarray] = None):
    """(scores with the overlong penalty, `[N]` row mask of DAPO's group filter, its metrics).

    A group's success rate counts the verifier's verdicts (`correct`, from the grader); where nothing graded (a
    custom `reward_fn`), a score of at least `correct_score` (above 0 with None) counts as a success."""
    if correct is None:
        correct = scores >= dapo.correct_score if dapo.correct_score is not None else scores > 0
    scores = scores + advantages_lib.overlong_penalty(
        rollouts.completion_lengths,
        max_new_tokens=dapo.max_new_tokens,
        buffer_len=dapo.overlong_buffer_len,
        penalty_factor=dapo.overlong_penalty_factor,
    )
    keep = advantages_lib.dapo_group_filter(
        correct.astype(np.float32),
        rollouts.prompt_indices,
        success_rate_lb=dapo.success_rate_lb,
        success_rate_ub=dapo.success_rate_ub,
    )
    return scores, keep.astype(np.float32), {"dapo/kept_fraction": float(keep.mean())}


def prepare_batch(
    maker: BatchMaker,
    state,
    rollouts,
    scores: np.ndarray,
    *,
    rng=None,
    action_rewards=None,
    row_advantages=None,
    row_mask=None,
    correct=None,
    shape_floors: Mapping[str, Any] = MappingProxyType({}),
) -> Tuple[Dict[str, Any], Dict[str, float], Dict[str, Any]]:
    """The update's batch for `state`: padded arrays, recomputed old / reference log-probs, values, advantages,
    the minibatch order and, with packing, the update's plan; the batch's metrics; and the shape floors after it
    (`shape_floors`, the loop's `HostState`, grown to this batch's shapes where it is larger).

    `correct`: the verifier's `[N]` verdicts (DAPO's success rates), None where nothing graded.
    `rng`: the raw key data `state.rng` holds, on the host (None reads `state.rng`, a transfer from the device),
    from which the host draws the update's minibatch order."""
    s = maker.settings
    row_mask = np.ones(len(rollouts), np.float32) if row_mask is None else np.asarray(row_mask, np.float32)
    metrics: Dict[str, float] = {}
    if s.dapo is not None:
        scores, row_mask, dapo_metrics = dapo_shaping(s.dapo, rollouts, scores, correct)
        metrics.update(dapo_metrics)
    trains = rows_that_train(s, rollouts)  # mask_truncated_completions: applied after the advantages
    # The widest batch so far at least: the passes and the update compile once per growth, not per batch.
    floors = dict(shape_floors)
    width = max(batch_columns(s.max_length, rollouts), floors.get("width", 0))
    floors["width"] = width
    arrays = rollouts.to_batch(maker.codec.pad_token_id, max_length=width)
    arrays.pop("prompt_length")
    sampler_logprobs = arrays.pop("sampler_logprobs")
    shape = pack_shape(s, maker.mesh, width)
    passes_plan = _passes_plan(maker, arrays, shape, floors)
    host_advantages = None
    if row_advantages is None and advantages_lib.from_scores(s.algorithm):
        # From the scores alone: made on the host, they cross once with the batch (and the plan reads them here).
        host_advantages = advantages_lib.host_score_advantages(
            s.algorithm,
            arrays["response_mask"],
            scores,
            group_ids=rollouts.prompt_indices,
            num_groups=int(rollouts.prompt_indices.max()) + 1,
            row_mask=row_mask,
            gamma=s.gamma,
        )
        host_advantages = without_truncated(host_advantages, trains)
    batch, old, ref, values = _with_passes(maker, state, arrays, passes_plan, host_advantages)
    # What the update's plan reads, from the host's own copies (row_mask applied as the device's advantages do).
    response_mask = arrays["response_mask"] * (row_mask * trains)[:, None]
    host_masks = dict(attention_mask=arrays["attention_mask"], response_mask=response_mask)
    if row_advantages is not None:  # the source made them (multi-turn ReBN)
        response_mask = batch["response_mask"] * jnp.asarray(row_mask * trains)[:, None]
        advantages = losses.broadcast_to_tokens(jnp.asarray(row_advantages), response_mask)
        batch.update(response_mask=response_mask, advantages=advantages)
        metrics.update(advantage_statistics(advantages, response_mask))
        batch, floors = with_update_plan(maker, batch, host_masks, shape, rng, state, floors)
        return batch, metrics, floors
    if host_advantages is not None:
        if s.tis_cap is None:  # else the correction below scales them on the device, and the plan reads those
            host_masks["advantages"] = host_advantages["advantages"]
    else:
        device_advantages = _device_advantages(
            maker, rollouts, arrays, batch, scores, row_mask, values, ref, action_rewards
        )
        batch.update(without_truncated(device_advantages, trains))
    metrics.update(advantage_statistics(batch["advantages"], batch["response_mask"] * jnp.asarray(row_mask)[:, None]))
    if not s.old_logprobs_from_sampler:
        batch, mismatch = sampler_correction(s, batch, distributed.fetch(old), sampler_logprobs)
        metrics.update(mismatch)
    batch, floors = with_update_plan(maker, batch, host_masks, shape, rng, state, floors)
    return batch, metrics, floors


def rows_that_train(settings: BatchSettings, rollouts) -> np.ndarray:
    """`[N]` float32: 0 on a completion cut at `max_new_tokens` (finish reason "length": no EOS) with
    `mask_truncated_completions`, 1 elsewhere.

    TRL's `mask_truncated_completions` (the overlong filtering of DAPO, Yu et al. 2025): `completion_mask *=
    ~is_truncated` after the rewards and advantages are made, so a cut completion still counts in its group's
    mean and std but none of its tokens is a term of the loss (nor of its denominator)."""
    if not settings.mask_truncated_completions:
        return np.ones(len(rollouts), np.float32)
    return np.asarray([reason != "length" for reason in rollouts.finish_reasons], np.float32)


def without_truncated(out: Dict[str, Any], trains: np.ndarray) -> Dict[str, Any]:
    """`out` (advantages, response mask, a critic's value mask) zeroed on the rows `trains` leaves out."""
    if trains.all():
        return out
    keys = ("response_mask", "advantages", "value_mask")
    return {k: x * trains[:, None].astype(x.dtype) if k in keys else x for k, x in out.items()}


def _passes_plan(maker: BatchMaker, arrays, shape, floors: Dict[str, Any]):
    """The packing plan of the trainer's passes (None: padded rows, or no pass runs), `floors` grown to it."""
    s = maker.settings
    passes_run = not s.old_logprobs_from_sampler or maker.ref_params is not None or maker.values is not None
    if shape is None or not passes_run:  # no pass to pack when the old log-probs are the sampler's alone
        return None
    floor = f"passes/{shape['row_tokens']}/{shape['max_rows_per_micro']}"
    plan = update.plan_passes(
        arrays["attention_mask"],
        shape["row_tokens"],
        max_rows_per_chunk=shape["max_rows_per_micro"],
        rows_multiple=shape["rows_multiple"],
        min_shape=floors.get(floor),
    )
    floors[floor] = list(update.plan_shape(plan))  # JSON, in the checkpoint's metadata
    return plan


def _with_passes(maker: BatchMaker, state, arrays, plan, host_advantages):
    """(the batch on the device, old log-probs, reference log-probs, values): the arrays (and advantages the host
    made) cross once with the passes' plan, then the trainer's passes run where they are needed."""
    s = maker.settings
    to_device = {k: v for k, v in arrays.items() if k != "old_logprobs" or s.old_logprobs_from_sampler}
    if host_advantages is not None:
        to_device[ADVANTAGES_IN_TRANSIT] = host_advantages
    batch, plan = jax.device_put((to_device, plan))  # int32 / float32 already
    in_transit = batch.pop(ADVANTAGES_IN_TRANSIT, None)
    inputs = (batch["input_ids"], batch["attention_mask"], plan)
    with mesh_context(maker.mesh):
        if s.old_logprobs_from_sampler:
            old = batch.pop("old_logprobs")  # 0 off the completions, as the recomputed ones are masked
        else:
            old = maker.logprobs(model_params(state.params, maker.frozen), *inputs) * batch["response_mask"]
        ref = None
        if maker.ref_params is not None:
            ref = maker.logprobs(maker.ref_params, *inputs) * batch["response_mask"]
        values = None
        if maker.values is not None:
            values = maker.values(model_params(state.critic_params, maker.critic_frozen), *inputs)
    if s.algorithm.decoupled:  # behaviour = the sampler's, proximal = the learner's now
        batch["old_logprobs"] = jnp.asarray(arrays["old_logprobs"])
        batch["proximal_logprobs"] = old
    else:
        batch["old_logprobs"] = old
    if ref is not None:
        batch["ref_logprobs"] = ref
    if in_transit is not None:
        batch.update(in_transit)  # the row-masked response mask and the advantages, after the passes' masking
    return batch, old, ref, values


def _device_advantages(maker: BatchMaker, rollouts, arrays, batch, scores, row_mask, values, ref, action_rewards):
    """The advantages of an estimator that reads the device's values (a critic's, the reference's KL), with the
    reasoning steps' index where the algorithm trains on actions."""
    s = maker.settings
    action_index = None
    if s.algorithm.actions:
        rows = action_indices(maker.codec, rollouts, s.step_separator)
        prompt_length = max(len(p) for p in rollouts.prompt_ids)
        action_index = np.zeros(arrays["input_ids"].shape, np.int32)
        for row, index in enumerate(rows):
            action_index[row, prompt_length : prompt_length + len(index)] = index
        action_index = jnp.asarray(action_index)
        if action_rewards is not None:
            action_rewards = jnp.asarray(action_rewards)
    return advantages_lib.compute_advantages(
        s.algorithm,
        batch,
        jnp.asarray(scores),
        group_ids=jnp.asarray(rollouts.prompt_indices),
        num_groups=int(rollouts.prompt_indices.max()) + 1,
        row_mask=jnp.asarray(row_mask),
        values=values,
        ref_logprobs=ref,
        kl_reward_coef=s.kl_reward_coef,
        gamma=s.gamma,
        lam=s.lam,
        action_index=action_index,
        action_rewards=action_rewards,
        whiten=s.whiten,
    )


ADVANTAGE_STATISTICS = ("mean", "std", "min", "max")


@jax.jit
def advantage_statistics(advantages: jax.Array, mask: jax.Array) -> Dict[str, jax.Array]:
    """`rollout/advantages_{mean,std,min,max}` of the estimator's advantages `[N, L]` over the response tokens that
    count (`mask [N, L]` > 0, DAPO's filtered rows and multi-turn padding out), as verl's
    `critic/advantages/{mean,max,min}` (`masked_select(advantages, response_mask)`), the std biased (over every
    token: sum (A - mean)^2 / count). Before `tis_cap`'s weights. Device scalars, NaN where no token counts:
    `batch_metrics_on_host` fetches them with the rest and drops those."""
    counts = mask > 0
    count = jnp.sum(counts)
    a = advantages.astype(jnp.float32)
    mean = jnp.sum(jnp.where(counts, a, 0.0)) / jnp.maximum(count, 1)
    var = jnp.sum(jnp.where(counts, (a - mean) ** 2, 0.0)) / jnp.maximum(count, 1)
    values = dict(
        mean=mean,
        std=jnp.sqrt(var),
        min=jnp.min(jnp.where(counts, a, jnp.inf)),
        max=jnp.max(jnp.where(counts, a, -jnp.inf)),
    )
    return {f"rollout/advantages_{k}": jnp.where(count > 0, v, jnp.nan) for k, v in values.items()}


def batch_metrics_on_host(metrics: Mapping[str, Any]) -> Dict[str, float]:
    """`prepare_batch`'s metrics as Python floats (its device scalars fetched in one transfer, after the update
    has them computed), without the advantage statistics of a batch where no token counts (absent, not NaN)."""
    fetched = distributed.fetch(dict(metrics))
    values = {k: float(np.asarray(v)) for k, v in fetched.items()}
    return {k: v for k, v in values.items() if not (k.startswith("rollout/advantages_") and np.isnan(v))}


ADVANTAGES_IN_TRANSIT = "advantages_made_on_the_host"
"""The key the host's advantages cross to the device under, beside the batch's arrays (`prepare_batch`)."""


def sampler_correction(settings, batch: Dict[str, Any], trainer_logprobs: np.ndarray, sampler_logprobs: np.ndarray):
    """How far the sampler's log-probs are from the trainer's recomputed ones (`rollout/sampler_*` metrics), and
    with `tis_cap` the truncated importance weights min(pi_trainer / pi_sampler, C) on the policy loss.

    `settings`: anything with `tis_cap` and `sampler_filters` (`BatchSettings`).

    The weights scale each token's advantage: for the token-level losses TIS is allowed with (`ppo`,
    `reinforce`), w >= 0 times the advantage is w times the token's loss (max(-wA r, -wA clip(r)) =
    w max(-A r, -A clip(r)), dual clip included), which is verl's `pg_losses * tis_weights`.

    Both sides are log-probs of the tempered distribution; top-k / top-p filtering changes the sampler's alone,
    so the metrics are left out then (the weights are not: they correct for the filter too, as verl's do)."""
    mask = np.asarray(batch["response_mask"], np.float32)
    metrics: Dict[str, float] = {}
    if not mask.any():
        return batch, metrics
    if not settings.sampler_filters:
        mismatch = losses.sampler_mismatch_metrics(trainer_logprobs, sampler_logprobs, mask)
        metrics.update({f"rollout/sampler_{k}": float(v) for k, v in mismatch.items()})
    if settings.tis_cap is not None:
        weights, tis = losses.truncated_importance_weights(
            trainer_logprobs, sampler_logprobs, mask, cap=settings.tis_cap
        )
        batch = dict(batch, advantages=batch["advantages"] * weights)
        metrics.update({f"rollout/tis_{k}": float(v) for k, v in tis.items()})
    return batch, metrics


def pack_shape(settings: BatchSettings, mesh, width: int) -> Optional[Dict[str, Any]]:
    """The packed rows of a batch `width` columns wide (`pack_length`), or None to train on padded rows.

    A packed row holds `max(pack_length, width)` tokens, so any row of the batch fits. A micro-batch keeps the
    padded one's token budget: `micro_batch_size` x `width` tokens, in whole packed rows. Row counts are
    multiples of the mesh's data shards, so the rows split over dp x fsdp as the padded rows do."""
    if settings.pack_length is None:
        return None
    row_tokens = max(int(settings.pack_length), width)
    shards = 1 if mesh is None else int(mesh.shape.get("dp", 1) * mesh.shape.get("fsdp", 1))
    max_rows_per_micro = None
    if settings.update.micro_batch_size:
        max_rows_per_micro = max(1, settings.update.micro_batch_size * width // row_tokens)
    return dict(row_tokens=row_tokens, max_rows_per_micro=max_rows_per_micro, rows_multiple=shards)


def with_update_plan(
    maker: BatchMaker, batch: Dict[str, Any], host_masks: Dict[str, np.ndarray], shape, rng, state, floors
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(the batch with the update's minibatch order, drawn on the host from `rng` (or `state.rng`), and with
    packing its plan (`update.with_packing`); the shape floors after it). What the plan reads of the device's
    arrays comes back at once."""
    s = maker.settings
    rng = state.rng if rng is None else rng
    rows = host_masks["attention_mask"].shape[0]
    order = update.host_minibatch_order(rng, rows, s.update.ppo_epoch, s.update.num_mini_batch)
    if shape is None:
        return {**batch, update.ORDER: jax.device_put(order)}, floors
    wanted = [k for k in ("value_mask",) if k in batch] + ["advantages"] * s.update.skip_zero_advantage
    wanted = [k for k in wanted if k not in host_masks]  # what the host does not hold already
    host = {**host_masks, **(distributed.fetch({k: batch[k] for k in wanted}) if wanted else {})}
    floor = f"update/{shape['row_tokens']}/{shape['max_rows_per_micro']}"
    planned = update.with_packing(
        host,
        None,
        ppo_epoch=s.update.ppo_epoch,
        num_mini_batch=s.update.num_mini_batch,
        skip_zero_advantage=s.update.skip_zero_advantage,
        min_shape=floors.get(floor),
        order=order,
        **shape,
    )
    plan = planned[update.PACKED]
    floors = {**floors, floor: list(update.plan_shape(plan))}
    order, plan = jax.device_put((order, plan))
    return {**batch, update.ORDER: order, update.PACKED: plan}, floors


@contextlib.contextmanager
def mesh_context(mesh):
    if mesh is not None and mesh.size > 1:
        with jax.set_mesh(mesh):
            yield
    else:
        yield
