"""From graded rollouts to the update's batch: padded arrays, recomputed log-probs and values, advantages."""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from mathrl_jax.sampling.jax_sampler import bucket
from mathrl_jax.sharding import distributed
from mathrl_jax.train import packing
from mathrl_jax.train import rollout as rollout_lib
from mathrl_jax.train import update as update_lib
from mathrl_jax.train.run import Run


def action_indices(run: Run, rollouts) -> List[np.ndarray]:
    """Per completion, `[len]` int32: the reasoning step (action) of each token, split at `step_separator` in
    the tokens' text (`rollout.action_index_from_text`): the actions APPO / TPPO train on and the steps the
    PRM scores. Without a separator each completion is one action."""
    separator = run.config.step_separator
    if not separator:
        return [np.zeros(len(ids), np.int32) for ids in rollouts.completion_ids]
    return [
        rollout_lib.action_index_from_text([run.codec.token_text(t) for t in ids], separator)
        for ids in rollouts.completion_ids
    ]


def batch_columns(config, rollouts) -> int:
    """Columns of the trainer's batch: the longest prompt + completion, rounded up to a power of two (a
    handful of shapes to compile), at most `max_prompt_length + max_new_tokens`. A multi-turn run's rows
    are far shorter than that budget, and every pass costs (and its attention holds) columns squared."""
    needed = max(len(p) for p in rollouts.prompt_ids) + max([len(x) for x in rollouts.completion_ids] + [1])
    return min(bucket(needed, 16), config.max_prompt_length + config.max_new_tokens)


def prepare_batch(
    run: Run, rollouts, scores: np.ndarray, *, params=None, action_rewards=None, row_advantages=None, row_mask=None
) -> Dict[str, Any]:
    """The update's batch: padded arrays, recomputed old / reference log-probs, values, advantages."""
    c = run.config
    params = run.state.params if params is None else params
    correct = scores >= c.reward.correct if c.reward.correct > c.reward.incorrect else scores > 0
    lengths = rollouts.completion_lengths
    row_mask = np.ones(len(rollouts), np.float32) if row_mask is None else np.asarray(row_mask, np.float32)
    metrics: Dict[str, float] = {}
    if c.algorithm_name == "dapo":
        scores = scores + rollout_lib.overlong_penalty(
            lengths,
            max_new_tokens=c.max_new_tokens,
            buffer_len=c.dapo.overlong_buffer_len,
            penalty_factor=c.dapo.overlong_penalty_factor,
        )
        keep = rollout_lib.dapo_group_filter(
            correct.astype(np.float32),
            rollouts.prompt_indices,
            success_rate_lb=c.dapo.success_rate_lb,
            success_rate_ub=c.dapo.success_rate_ub,
        )
        row_mask = keep.astype(np.float32)
        metrics["dapo/kept_fraction"] = float(keep.mean())
    # The widest batch so far at least: the passes and the update compile once per growth, not per batch.
    width = max(batch_columns(c, rollouts), run.shape_floors.get("width", 0))
    run.shape_floors["width"] = width
    arrays = rollouts.to_batch(run.codec.pad_token_id, max_length=width)
    arrays.pop("prompt_length")
    sampler_logprobs = arrays.pop("sampler_logprobs")
    batch = jax.device_put({k: v for k, v in arrays.items() if k != "old_logprobs"})  # int32 / float32 already
    shape = pack_shape(run, arrays["attention_mask"].shape[1])
    from_sampler = old_logprobs_from_sampler(c)
    passes_run = not from_sampler or run.ref_params is not None or run.values is not None
    plan = None
    if shape is not None and passes_run:  # no pass to pack when the old log-probs are the sampler's alone
        floor = f"passes/{shape['row_tokens']}/{shape['max_rows_per_micro']}"
        plan = packing.plan_passes(
            arrays["attention_mask"],
            shape["row_tokens"],
            max_rows_per_chunk=shape["max_rows_per_micro"],
            rows_multiple=shape["rows_multiple"],
            min_shape=run.shape_floors.get(floor),
        )
        run.shape_floors[floor] = list(packing.plan_shape(plan))  # JSON, in the checkpoint's metadata
        plan = jax.device_put(plan)
    inputs = (batch["input_ids"], batch["attention_mask"], plan)
    with mesh_context(run):
        if from_sampler:
            old = jnp.asarray(arrays["old_logprobs"])  # 0 off the completions, as the recomputed ones are masked
        else:
            old = run.logprobs(params, *inputs) * batch["response_mask"]
        ref = None
        if run.ref_params is not None:
            ref = run.logprobs(run.ref_params, *inputs) * batch["response_mask"]
        values = None
        if run.values is not None:
            values = run.values(run.state.critic_params, *inputs)
    if c.algorithm_name == "async_ppo":  # decoupled: behaviour = the sampler's, proximal = the learner's now
        batch["old_logprobs"] = jnp.asarray(arrays["old_logprobs"])
        batch["proximal_logprobs"] = old
    else:
        batch["old_logprobs"] = old
    if ref is not None:
        batch["ref_logprobs"] = ref
    if row_advantages is not None:  # the source made them (multi-turn ReBN)
        response_mask = batch["response_mask"] * jnp.asarray(row_mask)[:, None]
        batch.update(
            response_mask=response_mask,
            advantages=update_lib.losses.broadcast_to_tokens(jnp.asarray(row_advantages), response_mask),
        )
        return with_update_plan(run, batch, shape), metrics
    action_index = None
    if c.algorithm_name in ("appo", "tppo"):
        rows = action_indices(run, rollouts)
        prompt_length = max(len(p) for p in rollouts.prompt_ids)
        action_index = np.zeros(batch["input_ids"].shape, np.int32)
        for row, index in enumerate(rows):
            action_index[row, prompt_length : prompt_length + len(index)] = index
        action_index = jnp.asarray(action_index)
        if action_rewards is not None:
            action_rewards = jnp.asarray(action_rewards)
    advantages = rollout_lib.compute_advantages(
        c.algorithm_name,
        batch,
        jnp.asarray(scores),
        group_ids=jnp.asarray(rollouts.prompt_indices),
        num_groups=int(rollouts.prompt_indices.max()) + 1,
        row_mask=jnp.asarray(row_mask),
        values=values,
        ref_logprobs=ref,
        kl_reward_coef=c.kl_reward_coef,
        gamma=c.gamma,
        lam=c.lam,
        action_index=action_index,
        action_rewards=action_rewards,
        whiten=c.advantage_whitening == "batch",
    )
    batch.update(advantages)
    if not from_sampler:
        batch, mismatch = sampler_correction(c, batch, distributed.fetch(old), sampler_logprobs)
        metrics.update(mismatch)
    return with_update_plan(run, batch, shape), metrics


def sampler_correction(config, batch: Dict[str, Any], trainer_logprobs: np.ndarray, sampler_logprobs: np.ndarray):
    """How far the sampler's log-probs are from the trainer's recomputed ones (`rollout/sampler_*` metrics), and
    with `tis_cap` the truncated importance weights min(pi_trainer / pi_sampler, C) on the policy loss.

    The weights scale each token's advantage: for the token-level losses TIS is allowed with (`ppo`,
    `reinforce`), w >= 0 times the advantage is w times the token's loss (max(-wA r, -wA clip(r)) =
    w max(-A r, -A clip(r)), dual clip included), which is verl's `pg_losses * tis_weights`.

    Both sides are log-probs of the tempered distribution; top-k / top-p filtering changes the sampler's alone,
    so the metrics are left out then (the weights are not: they correct for the filter too, as verl's do)."""
    mask = np.asarray(batch["response_mask"], np.float32)
    metrics: Dict[str, float] = {}
    if not mask.any():
        return batch, metrics
    if config.top_p == 1.0 and config.top_k <= 0:
        mismatch = update_lib.losses.sampler_mismatch_metrics(trainer_logprobs, sampler_logprobs, mask)
        metrics.update({f"rollout/sampler_{k}": float(v) for k, v in mismatch.items()})
    if config.tis_cap is not None:
        weights, tis = update_lib.losses.truncated_importance_weights(
            trainer_logprobs, sampler_logprobs, mask, cap=config.tis_cap
        )
        batch = dict(batch, advantages=batch["advantages"] * weights)
        metrics.update({f"rollout/tis_{k}": float(v) for k, v in tis.items()})
    return batch, metrics


def old_logprobs_from_sampler(config) -> bool:
    """Whether PPO's old log-probs are the sampler's (`config.old_logprobs`), not recomputed by the trainer.

    "auto" takes them from the JAX sampler, which decodes with the trainer's params and reports the untempered
    policy's log-prob of each sampled token (`Rollouts.policy_logprobs`): at temperature 1 the trainer's
    recomputation gives the same numbers up to float rounding (`rollout/sampler_logprob_diff`, ~1e-7 in float32),
    and skipping it saves a forward pass over the batch. The decoupled loss (async_ppo) needs both, multi-turn
    rows hold the environment's tokens, and another engine (vLLM) computes them with its own kernels: those
    recompute.
    """
    if config.old_logprobs != "auto":
        return config.old_logprobs == "sampler"
    return (
        config.sampler == "jax"
        and config.tis_cap is None  # TIS compares the trainer's log-probs with the sampler's
        and config.temperature == 1.0
        and config.algorithm_name != "async_ppo"
        and not config.env_name
    )


def pack_shape(run: Run, width: int) -> Optional[Dict[str, Any]]:
    """The packed rows of a batch `width` columns wide (`config.packing`), or None to train on padded rows.

    A packed row holds `max(pack_length, width)` tokens, so any row of the batch fits. A micro-batch keeps the
    padded one's token budget: `micro_batch_size` x `width` tokens, in whole packed rows. Row counts are
    multiples of the mesh's data shards, so the rows split over dp x fsdp as the padded rows do."""
    c = run.config
    if not c.packing:
        return None
    row_tokens = max(int(c.pack_length), width)
    shards = 1 if run.mesh is None else int(run.mesh.shape.get("dp", 1) * run.mesh.shape.get("fsdp", 1))
    max_rows_per_micro = None
    if c.micro_batch_size:
        max_rows_per_micro = max(1, c.micro_batch_size * width // row_tokens)
    return dict(row_tokens=row_tokens, max_rows_per_micro=max_rows_per_micro, rows_multiple=shards)


def with_update_plan(run: Run, batch: Dict[str, Any], shape: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The batch with the update's packing plan (`update.with_packing`), drawn from the state's RNG as the
    update draws its minibatches."""
    if shape is None:
        return batch
    c = run.config
    floor = f"update/{shape['row_tokens']}/{shape['max_rows_per_micro']}"
    batch = update_lib.with_packing(
        batch,
        run.state.rng,
        epochs=c.ppo_epoch,
        num_mini_batches=c.num_mini_batch,
        skip_zero_advantage=run.skip_zero_advantage,
        min_shape=run.shape_floors.get(floor),
        **shape,
    )
    run.shape_floors[floor] = list(packing.plan_shape(batch[update_lib.PACKED]))
    return batch


@contextlib.contextmanager
def mesh_context(run: Run):
    if run.mesh is not None and run.mesh.size > 1:
        with jax.set_mesh(run.mesh):
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
