"""From graded rollouts to the update's batch: padded arrays, recomputed log-probs and values, advantages.

    batches = BatchMaker(BatchSettings(...), codec, mesh, logprobs, values, ref_params)
    batch, metrics = prepare_batch(batches, state, rollouts, scores, rng=...)

The batch crosses to the device once with the passes' packing plan, the few arrays the host plans with come back
once (none at all in the default GRPO run), and the update's minibatch order and packing plan, both drawn on the
host, cross once more with the batch's device arrays (`update.with_packing`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

import mathrl_jax.train.batch._advantages as advantages_lib
from mathrl_jax import losses
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.sampling.jax_sampler import bucket
from mathrl_jax.sharding import distributed
from mathrl_jax.train import algorithms, update
from mathrl_jax.train.state import model_params


@dataclasses.dataclass(frozen=True)
class DapoSettings:
    """DAPO's reward shaping (Yu et al. 2025): the group filter on success rates strictly inside (lb, ub), a
    response counted a success when its score is at least `correct_score` (above 0 with None), and the soft
    overlong penalty of a response within `overlong_buffer_len` tokens of `max_new_tokens`."""

    max_new_tokens: int
    success_rate_lb: float = 0.0
    success_rate_ub: float = 1.0
    overlong_buffer_len: int = 0
    overlong_penalty_factor: float = 1.0
    correct_score: Optional[float] = None

    def __post_init__(self):
        if not 0.0 <= self.success_rate_lb <= self.success_rate_ub <= 1.0:
            raise ValueError(
                f"dapo.success_rate_lb={self.success_rate_lb}, dapo.success_rate_ub={self.success_rate_ub}: expected "
                "0 <= lb <= ub <= 1"
            )
        if self.overlong_buffer_len < 0 or self.overlong_penalty_factor < 0:
            raise ValueError(
                f"dapo.overlong_buffer_len={self.overlong_buffer_len}, dapo.overlong_penalty_factor="
                f"{self.overlong_penalty_factor}: must be >= 0"
            )


@dataclasses.dataclass(frozen=True)
class BatchSettings:
    """How rollouts become the update's batch (one section of the run's settings, made by the build).

    algorithm: the record whose estimator makes the advantages (`algorithms.ALGORITHMS`).
    max_length: the widest row, `max_prompt_length + max_new_tokens`.
    whiten: standardise a critic's advantages over the batch's tokens (`advantage_whitening="batch"`).
    old_logprobs_from_sampler: PPO's old log-probs are the sampler's (`sections.old_logprobs_from_sampler`), not
      recomputed.
    step_separator: where a completion's reasoning steps end (the actions of `Algorithm.actions`, the PRM's steps).
    pack_length: tokens per packed row of the passes and the update; None trains on padded rows.
    ppo_epoch, num_mini_batch, micro_batch_size, skip_zero_advantage: the update's (`UpdateConfig`), for its plan.
    tis_cap: truncated importance weights min(pi_trainer / pi_sampler, C) on the advantages; None: off.
    sampler_filters: the sampler filters tokens (top_p < 1 or top_k > 0): its log-probs are not the policy's.
    dapo: DAPO's shaping, with an algorithm of `dynamic_sampling`.
    """

    algorithm: algorithms.Algorithm
    max_length: int
    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True
    kl_reward_coef: float = 0.0
    old_logprobs_from_sampler: bool = False
    step_separator: str = "\n"
    pack_length: Optional[int] = None
    ppo_epoch: int = 1
    num_mini_batch: int = 1
    micro_batch_size: Optional[int] = None
    skip_zero_advantage: bool = False
    tis_cap: Optional[float] = None
    sampler_filters: bool = False
    dapo: Optional[DapoSettings] = None

    def __post_init__(self):
        if self.algorithm.dynamic_sampling != (self.dapo is not None):
            raise ValueError(f"dapo settings are for an algorithm of dynamic sampling (got {self.algorithm})")
        if self.max_length < 2 or self.ppo_epoch < 1 or self.num_mini_batch < 1:
            raise ValueError(
                f"max_length={self.max_length}, ppo_epoch={self.ppo_epoch}, num_mini_batch={self.num_mini_batch}"
            )
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ValueError(f"tis_cap={self.tis_cap} must be > 0, or None")


@dataclasses.dataclass
class BatchMaker:
    """What `prepare_batch` works with: its settings, the tokenizer, the trainer's mesh and jitted passes, the
    reference params (with a KL to the reference), and the shapes the batches have grown to.

    `shape_floors`: high-water marks of the batch's shapes (its width, the packing plans' dimensions): a batch is
    planned at least as large as any before it, so the update and the passes compile once per growth, not per
    batch. Saved with each checkpoint, so a resumed run pads and packs as the uninterrupted one.
    """

    settings: BatchSettings
    codec: TextCodec
    mesh: Any
    logprobs: Callable
    values: Optional[Callable] = None
    ref_params: Any = None  # the whole reference model (`state_lib.model_params`)
    frozen: Any = None  # a LoRA run's base weights, which `state.params` (the adapters) are joined with
    critic_frozen: Any = None  # a critic's untrained part (`value_head.frozen_trunk`), joined with its head
    shape_floors: Dict[str, Any] = dataclasses.field(default_factory=dict)


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
) -> Dict[str, Any]:
    """The update's batch for `state`: padded arrays, recomputed old / reference log-probs, values, advantages,
    the minibatch order and, with packing, the update's plan; and the batch's metrics.

    `correct`: the verifier's `[N]` verdicts (DAPO's success rates), None where nothing graded.
    `rng`: the raw key data `state.rng` holds, on the host (None reads `state.rng`, a transfer from the device),
    from which the host draws the update's minibatch order."""
    s = maker.settings
    row_mask = np.ones(len(rollouts), np.float32) if row_mask is None else np.asarray(row_mask, np.float32)
    metrics: Dict[str, float] = {}
    if s.dapo is not None:
        scores, row_mask, dapo_metrics = dapo_shaping(s.dapo, rollouts, scores, correct)
        metrics.update(dapo_metrics)
    # The widest batch so far at least: the passes and the update compile once per growth, not per batch.
    width = max(batch_columns(s.max_length, rollouts), maker.shape_floors.get("width", 0))
    maker.shape_floors["width"] = width
    arrays = rollouts.to_batch(maker.codec.pad_token_id, max_length=width)
    arrays.pop("prompt_length")
    sampler_logprobs = arrays.pop("sampler_logprobs")
    shape = pack_shape(s, maker.mesh, width)
    passes_run = not s.old_logprobs_from_sampler or maker.ref_params is not None or maker.values is not None
    plan = None
    if shape is not None and passes_run:  # no pass to pack when the old log-probs are the sampler's alone
        floor = f"passes/{shape['row_tokens']}/{shape['max_rows_per_micro']}"
        plan = update.plan_passes(
            arrays["attention_mask"],
            shape["row_tokens"],
            max_rows_per_chunk=shape["max_rows_per_micro"],
            rows_multiple=shape["rows_multiple"],
            min_shape=maker.shape_floors.get(floor),
        )
        maker.shape_floors[floor] = list(update.plan_shape(plan))  # JSON, in the checkpoint's metadata
    to_device = {k: v for k, v in arrays.items() if k != "old_logprobs" or s.old_logprobs_from_sampler}
    batch, plan = jax.device_put((to_device, plan))  # int32 / float32 already
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
    # What the update's plan reads, from the host's own copies (row_mask applied as the device's advantages do).
    response_mask = arrays["response_mask"] * row_mask[:, None]
    host_masks = dict(attention_mask=arrays["attention_mask"], response_mask=response_mask)
    if row_advantages is not None:  # the source made them (multi-turn ReBN)
        response_mask = batch["response_mask"] * jnp.asarray(row_mask)[:, None]
        advantages = losses.broadcast_to_tokens(jnp.asarray(row_advantages), response_mask)
        batch.update(response_mask=response_mask, advantages=advantages)
        return with_update_plan(maker, batch, host_masks, shape, rng, state), metrics
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
    advantages = advantages_lib.compute_advantages(
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
    batch.update(advantages)
    if not s.old_logprobs_from_sampler:
        batch, mismatch = sampler_correction(s, batch, distributed.fetch(old), sampler_logprobs)
        metrics.update(mismatch)
    return with_update_plan(maker, batch, host_masks, shape, rng, state), metrics


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
    if settings.micro_batch_size:
        max_rows_per_micro = max(1, settings.micro_batch_size * width // row_tokens)
    return dict(row_tokens=row_tokens, max_rows_per_micro=max_rows_per_micro, rows_multiple=shards)


def with_update_plan(
    maker: BatchMaker, batch: Dict[str, Any], host_masks: Dict[str, np.ndarray], shape, rng, state
) -> Dict[str, Any]:
    """The batch with the update's minibatch order, drawn on the host from `rng` (or `state.rng`), and with
    packing its plan (`update.with_packing`); what the plan reads of the device's arrays comes back at once."""
    s = maker.settings
    rng = state.rng if rng is None else rng
    rows = host_masks["attention_mask"].shape[0]
    order = update.host_minibatch_order(rng, rows, s.ppo_epoch, s.num_mini_batch)
    if shape is None:
        return {**batch, update.ORDER: jax.device_put(order)}
    wanted = [k for k in ("value_mask",) if k in batch] + ["advantages"] * s.skip_zero_advantage
    host = {**host_masks, **distributed.fetch({k: batch[k] for k in wanted})}
    floor = f"update/{shape['row_tokens']}/{shape['max_rows_per_micro']}"
    planned = update.with_packing(
        host,
        None,
        ppo_epoch=s.ppo_epoch,
        num_mini_batch=s.num_mini_batch,
        skip_zero_advantage=s.skip_zero_advantage,
        min_shape=maker.shape_floors.get(floor),
        order=order,
        **shape,
    )
    plan = planned[update.PACKED]
    maker.shape_floors[floor] = list(update.plan_shape(plan))
    order, plan = jax.device_put((order, plan))
    return {**batch, update.ORDER: order, update.PACKED: plan}


@contextlib.contextmanager
def mesh_context(mesh):
    if mesh is not None and mesh.size > 1:
        with jax.set_mesh(mesh):
            yield
    else:
        yield


def shuffled_rewards(scores: np.ndarray, seed: int, iteration: int) -> np.ndarray:
    """The control run's rewards: the batch's own `[N]` scores in a random order (a function of seed and
    iteration, so a resumed control shuffles as an uninterrupted one).

    Same reward distribution, no information about which response earned which:
    whatever a policy learns from these, it does not learn from the verifier.
    """
    order = np.random.default_rng([seed, iteration, 0x5EED]).permutation(len(scores))
    return np.asarray(scores)[order]


def control_rewards(
    scores: np.ndarray,
    correct: Optional[np.ndarray],
    seed: int,
    iteration: int,
    step_rewards: Optional[np.ndarray] = None,
):
    """The control run's (scores, verdicts, step rewards): each response's, given to another response of the
    batch, all by one random permutation (`shuffled_rewards`): DAPO's successes and a process reward model's step
    scores (`[N, A]` rows) tell no more than the scores do. A row's step scores past its own steps are ignored."""

    def shuffled(values):
        return None if values is None else shuffled_rewards(values, seed, iteration)

    return shuffled_rewards(scores, seed, iteration), shuffled(correct), shuffled(step_rewards)
