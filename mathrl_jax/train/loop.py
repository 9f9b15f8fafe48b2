"""The training loop: one iteration, and a run from its first iteration to its last.

One iteration (`train_iteration`: state and host state in, the next ones out):

    a rollout source (rollouts/: problems ─► prompts ─► Sampler.generate ─► rewards; or the asynchronous
      generator thread, or multi-turn episodes)
      ─► batch/: padded arrays, old / reference log-probs, critic values, advantages
      ─► update/: the jitted update ─► the source hears of the new weights ─► metrics

`train(config)` builds the run (setup/: every input checked before anything is written), evaluates, iterates,
checkpoints and exports. Bad input raises `mathrl_jax.errors.TrainingError` naming it; so does a run that trains
nothing (`reporting.TrainingWatch`: every update step skipped for a non-finite loss or gradient, or no reward function
scoring any response), which stops rather than ending with a summary of success.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from mathrl_jax import files
from mathrl_jax.errors import TrainingError
from mathrl_jax.evaluation import completion_samples, held_out_accuracy
from mathrl_jax.sharding import distributed
from mathrl_jax.train import batch as batch_lib
from mathrl_jax.train import reporting, run_directory
from mathrl_jax.train.batch import BatchMaker, BatchSettings, control_rewards, mesh_context, prepare_batch
from mathrl_jax.train.checkpoint import LORA_BASE_KEY
from mathrl_jax.train.export import export_final_model
from mathrl_jax.train.rollouts import (
    AsyncRollouts,
    Collected,
    EnvRollouts,
    SyncRollouts,
    evaluate_games,
    pending_to_checkpoint,
)
from mathrl_jax.train.setup import (
    PENDING_KEY,
    SETTINGS_KEY,
    SHAPES_KEY,
    RewardFn,
    Run,
    RunSettings,
    build_run,
    release_run_dir,
)
from mathrl_jax.train.state import HostState, TrainState, model_params


@contextlib.contextmanager
def out_of_memory_hint(settings: RunSettings, batch: BatchSettings, rows: int):
    """Turns a device out-of-memory error of the trainer's passes into a `TrainingError` naming the options that
    size them (the raw XLA message names only a byte count): the batch's (`batch`: its rows' length, the update's
    micro-batches) and the rollouts' (`settings`)."""
    try:
        yield
    except Exception as error:  # jax raises its runtime errors under several class names across versions
        text = str(error)
        if "RESOURCE_EXHAUSTED" not in text and "Out of memory" not in text:
            raise
        update = batch.update
        micro = update.micro_batch_size or f"0 (the whole minibatch, {rows // update.num_mini_batch} rows)"
        raise TrainingError(
            f"out of device memory in the trainer's passes over {rows} rows of up to {batch.max_length} tokens: "
            f"lower --config.micro_batch_size (now {micro}; rows per forward and backward), "
            f"--config.max_new_tokens ({settings.max_new_tokens}) or --config.n_rollout_threads "
            f"({settings.prompts_per_iteration}), or set --config.remat=True. "
            f"XLA said: {text.splitlines()[0][:300]}"
        ) from error


def _sync_rollouts(run: Run) -> SyncRollouts:
    return SyncRollouts(run.rollouts)


def _async_rollouts(run: Run) -> AsyncRollouts:
    """The generator thread, resuming the batches the run's checkpoint saved."""
    return AsyncRollouts(
        run.rollouts,
        max_head_offpolicyness=run.settings.max_staleness,
        start_iteration=run.start_iteration,
        total_iterations=run.settings.total_iterations,
        params=model_params(run.state.params, run.batches.frozen),
        policy_version=int(run.state.policy_version),
        pending_rollouts=run.pending_rollouts,
    )


def _env_rollouts(run: Run) -> EnvRollouts:
    return EnvRollouts(run.rollouts, run.game)


ROLLOUT_SOURCES = {"sync": _sync_rollouts, "async": _async_rollouts, "env": _env_rollouts}
"""Where an iteration's rollouts come from (`Run.source_kind`; the protocol: `rollouts.SyncRollouts`): made when
asked with the current weights; by a generator thread running ahead (`async_ppo`); or by multi-turn episodes
(`env_name`)."""


def rollout_source(run: Run):
    return ROLLOUT_SOURCES[run.source_kind](run)


GRADER_RATES = ("reward/accuracy", "reward/no_answer_rate")  # logged as rollout/accuracy, rollout/no_answer_rate


def train_iteration(
    state: TrainState,
    host: HostState,
    iteration: int,
    source,
    batches: BatchMaker,
    update: Callable,
    settings: RunSettings,
    completions: Optional[Callable[[List[Dict[str, Any]]], None]] = None,
) -> Tuple[TrainState, HostState, Dict[str, float]]:
    """One iteration (see the module docstring): state and host state in, the next ones out, with the iteration's
    metrics: the new `TrainState`, and the `HostState` after it (the data position of the batch it trained on,
    the batch shapes grown to it). `source` hears of the new weights (the synchronous loop's gives them to the
    sampler).

    The update's minibatch order is drawn on the host from the state's key (read with its step and version in one
    transfer), as the update would draw it, and passed with the batch. `completions` (log_completions) gets the
    batch's completion table (`reporting.completion_table`)."""
    start = time.perf_counter()
    updates, version, rng = jax.device_get((state.step, state.policy_version, state.rng))
    updates, version = int(updates), int(version)
    got = source.get(iteration)
    rollouts, scores, reward_metrics = got.rollouts, got.scores, got.reward_metrics
    waited = time.perf_counter() - start
    staleness = version - rollouts.policy_version
    if staleness > settings.max_staleness:
        raise RuntimeError(
            f"iteration {iteration}: rollouts of version {rollouts.policy_version} are {staleness} versions old, over "
            f"max_head_offpolicyness={settings.max_staleness}"
        )
    if settings.step_rewards_only:
        scores = np.zeros_like(scores)  # step rewards only
    correct, step_rewards = got.correct, got.action_rewards
    if settings.shuffle_rewards and got.row_advantages is None:  # a multi-turn source shuffled its turns' rewards
        scores, correct, step_rewards = control_rewards(scores, correct, settings.seed, iteration, step_rewards)
    with out_of_memory_hint(settings, batches.settings, len(rollouts)):
        passes_start = time.perf_counter()
        batch, batch_metrics, shape_floors = prepare_batch(
            batches,
            state,
            rollouts,
            scores,
            rng=rng,
            action_rewards=step_rewards,
            row_advantages=got.row_advantages,
            row_mask=got.row_mask,
            correct=correct,
            shape_floors=host.shape_floors,
        )
        jax.block_until_ready(batch)
        update_start = time.perf_counter()
        with mesh_context(batches.mesh):
            state, update_metrics = update(state, batch, batches.frozen)
        update_metrics = reporting.measured_update_metrics(jax.device_get(update_metrics))  # over no token: none
    batch_metrics = batch_lib.batch_metrics_on_host(batch_metrics)
    sync_start = time.perf_counter()
    source.updated(iteration, model_params(state.params, batches.frozen), version + 1)  # each update: a version
    done = time.perf_counter()
    lengths = rollouts.completion_lengths
    tokens = int(lengths.sum())
    real = np.ones(len(rollouts), bool)
    if got.row_mask is not None and (got.row_mask > 0).any():  # padded rows (multi-turn) are not responses
        real = got.row_mask > 0
    # What a response earned: the verifier's score plus, with a PRM, its step scores (the undiscounted return).
    earned = scores if step_rewards is None else scores + step_rewards.sum(axis=1)
    metrics = {
        "rollout/rewards": float(np.mean(earned[real])),
        **reporting.reward_metrics(earned[real], rollouts.prompt_indices[real]),
        **reporting.length_metrics(lengths[real], np.asarray(rollouts.finish_reasons)[real]),
        **reporting.memory_metrics(),
        "rollout/grader_timeouts": reward_metrics.get("reward/timeout_count", 0.0),
        "perf/step_time": done - start,
        "perf/generate_time": got.generate_seconds,
        "perf/wait_time": waited,
        "perf/logprob_time": update_start - passes_start,
        "perf/update_time": sync_start - update_start,
        "perf/sync_time": done - sync_start,
        "perf/tokens_per_second": tokens / max(done - start, 1e-9),
        "async/staleness": float(staleness),
        "async/policy_version": float(rollouts.policy_version),
        "train/update_step": float(updates + 1),
        **({"rollout/prm_reward": float(step_rewards.sum(axis=1).mean())} if step_rewards is not None else {}),
        **batch_metrics,
        **{k: v for k, v in reward_metrics.items() if k.startswith(("rollout/", "perf/"))},
        # The grader's verdicts, where one graded (not for reward functions alone, nor a custom reward_fn's
        # rewards without them): absent rather than NaN.
        **{f"rollout/{k[len('reward/') :]}": v for k, v in reward_metrics.items() if k in GRADER_RATES},
        **{f"train/{k}": float(v) for k, v in update_metrics.items()},  # the update's names (`metric_names`)
    }
    if completions is not None:  # TRL's log_completions: the batch's first responses, as the update saw them
        rows, count = np.flatnonzero(real), settings.num_completions_to_print
        completions(reporting.completion_table(iteration, batches.codec.decode, rollouts, earned, batch, rows, count))
    return state, HostState(data_state=got.data_state, shape_floors=shape_floors), metrics


def save(
    run: Run,
    iteration: int,
    state: TrainState,
    host: HostState,
    *,
    force: bool = False,
    pending: Optional[List[Collected]] = None,
) -> bool:
    """Checkpoints `state` after `iteration`, with `host` (the data position, the batch shapes) and the batches a
    generator `pending` had made ahead (`SyncRollouts.pending`: their arrays an item of the checkpoint, the rest
    in its metadata)."""
    arrays, records = pending_to_checkpoint(pending or [])
    metadata = {
        "data": host.data_state or run.rollouts.loader.state(),
        "iteration": iteration,
        PENDING_KEY: records,
        SHAPES_KEY: dict(host.shape_floors),
    }
    if run.lora_base is not None:
        metadata[LORA_BASE_KEY] = run.lora_base
    if run.recorded_settings:  # what a resume checks this step against (`setup.SETTINGS_KEY`)
        metadata[SETTINGS_KEY] = run.recorded_settings
    return run.checkpointer.save(iteration, state, metadata, force=force, arrays=arrays or None)


HARD_EVAL_PREFIX = "eval_hard/"


def run_eval(run: Run, iteration: int, *, sampled: bool = False) -> Dict[str, float]:
    """Greedy held-out accuracy; with `sampled`, also pass@k from `eval_n_samples` samples at the RL
    temperature (pass@1 is the sampled accuracy); the same on the harder split (`arithmetic.eval_digits`,
    `countdown.eval_count`) as `eval_hard/*`, if the run has one. Writes `run_dir/samples/` (`write_samples`: the
    first held-out set's). A multi-turn run plays its held-out games greedily instead (`rollouts.evaluate_games`:
    the success rate as `eval/accuracy`)."""
    r = run.rollouts
    if run.game is not None:
        return evaluate_games(r, run.game, run.evaluation.max_new_tokens)
    n_samples = run.evaluation.n_samples if sampled else 0
    metrics = held_out_accuracy(
        run.evaluation, r.sampler, r.codec, r.grader, run.eval_prompts, run.eval_golds, n_samples
    )
    if run.hard_eval_prompts:  # the harder split (eval_digits, eval_count): the same metrics, as eval_hard/*
        hard = held_out_accuracy(
            run.evaluation, r.sampler, r.codec, r.grader, run.hard_eval_prompts, run.hard_eval_golds, n_samples
        )
        metrics.update({HARD_EVAL_PREFIX + name.split("/", 1)[1]: value for name, value in hard.items()})
    write_samples(run, iteration)
    return metrics


def write_samples(run: Run, iteration: int) -> Optional[str]:
    """Writes `run_dir/samples/iteration_<k>.jsonl` (process 0): the first `num_logged_samples` held-out prompts,
    each with its greedy completion and 4 samples at the RL temperature, graded by the verifier
    (`completion_samples`; a run trained on PRM or custom rewards still logs the verifier's)."""
    count = min(run.evaluation.num_logged_samples, len(run.eval_prompts))
    if count == 0:
        return None
    r = run.rollouts
    records = completion_samples(
        r.sampler,
        run.eval_prompts[:count],
        run.eval_golds[:count],
        r.grader,
        r.codec.decode,
        run.evaluation.logged_sampling(iteration),
        values=r.grader.grader.values,
    )  # sampled and graded by every process (collectives); written by process 0
    if not distributed.is_main_process():
        return None
    directory = run_directory.path(run.settings.run_dir, run_directory.SAMPLES)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"iteration_{iteration:06d}.jsonl")
    with files.atomic_write(path) as f:
        for record in records:
            f.write(json.dumps(dict(record, iteration=iteration)) + "\n")
    return path


def watch_of(run: Run, say: Callable[[str], None]) -> reporting.TrainingWatch:
    """The `reporting.TrainingWatch` of `run`: its update steps per iteration and its reward functions."""
    update = run.batches.settings.update
    functions = run.rollouts.reward_functions
    graded = run.rollouts.settings.grade or run.rollouts.reward_fn is not None or run.rollouts.prm is not None
    names = tuple(functions.names) if functions is not None else ()
    return reporting.TrainingWatch(update.ppo_epoch * update.num_mini_batch, names, graded, say)


def train(
    config,
    *,
    on_metrics: Optional[Callable[[int, Dict[str, float]], None]] = None,
    reward_fn: Optional[RewardFn] = None,
    reward_functions: Optional[Sequence[Callable]] = None,
) -> Dict[str, Any]:
    """Runs (or resumes) a training run; returns a summary with the eval curve and the final state.

    `reward_functions`: your reward functions in TRL's convention (`fn(prompts, completions, completion_ids,
    trainer_state, solution, ...) -> [float]`, `rewards.functions`), summed with `reward.weights`, alone
    (reward_source "functions") or added to the verifier's score ("verifier+functions"; the default "verifier"
    becomes it, and a line on stderr says so). `reward_fn(texts, golds) -> (scores, metrics)` replaces the math grader's
    rewards (e.g. a custom verifier); `on_metrics(iteration, metrics)` sees every iteration's metrics.
    """
    run = build_run(config, reward_fn, reward_functions)
    settings = run.settings
    source = rollout_source(run)  # an asynchronous one starts from run.state's params
    state, host = run.state, run.host  # carried by the loop: each iteration returns the next
    run = dataclasses.replace(run, state=None)  # else an update that does not donate (async) keeps it alive too
    summary: Dict[str, Any] = {
        "warmstart": run.warmstart_metrics,
        "eval": [],
        "num_eval_problems": len(run.eval_prompts),
    }
    total = settings.total_iterations
    progress = reporting.Progress(
        total,
        initial_step=run.start_iteration,
        keys=("rollout/accuracy", "eval/accuracy", "rollout/rewards", "train/policy_loss"),
        disable=not settings.progress,
        desc="RL",
    )
    watch = watch_of(run, progress.write if settings.progress else distributed.note)
    try:
        if run.start_iteration:
            progress.write(
                f"resuming {settings.run_dir} from its checkpoint of iteration {run.start_iteration} "
                f"({total - run.start_iteration} of {total} iterations to go)"
            )
        if run.warmstart_metrics:
            run.logger.log(0, run.warmstart_metrics)
        if "warmstart/eval_accuracy_after" in run.warmstart_metrics:  # absent: no held-out problem
            progress.write(
                "warm-start: greedy eval accuracy {:.3f} -> {:.3f} in {:.0f} s".format(
                    run.warmstart_metrics["warmstart/eval_accuracy_before"],
                    run.warmstart_metrics["warmstart/eval_accuracy_after"],
                    run.warmstart_metrics["warmstart/seconds"],
                )
            )
        if run.start_iteration == 0 and settings.eval_interval:
            with source.current_weights():
                metrics = run_eval(run, 0, sampled=True)
            run.logger.log(0, metrics)
            summary["eval"].append((0, metrics["eval/accuracy"]))
            summary["eval_start"] = metrics
            progress.update(0, metrics)
        for iteration in range(run.start_iteration + 1, total + 1):
            tables = settings.log_completions_every and not iteration % settings.log_completions_every
            table = functools.partial(run.logger.log_completions, iteration) if tables else None
            args = (state, host, iteration, source, run.batches, run.update, settings)
            state, host, metrics = train_iteration(*args, completions=table)
            last = iteration == total
            if settings.eval_interval and (iteration % settings.eval_interval == 0 or last):
                with source.current_weights():
                    metrics.update(run_eval(run, iteration, sampled=last))
                summary["eval"].append((iteration, metrics["eval/accuracy"]))
                if last:
                    summary["eval_end"] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
            if iteration % settings.log_interval == 0 or "eval/accuracy" in metrics:
                run.logger.log(iteration, metrics)
            progress.update(iteration, metrics)
            if on_metrics is not None:
                on_metrics(iteration, metrics)
            watch.iteration(iteration, metrics, last)  # a run that trains nothing stops here, before its save
            if run.checkpointer.should_save(iteration) or last:
                save(run, iteration, state, host, force=last, pending=source.pending(iteration))
        watch.finish()
        summary["state"] = state
        summary["final_iteration"] = total
        final = run_directory.path(settings.run_dir, run_directory.FINAL_MODEL)
        # Also when a finished run is rerun without its final_model (killed after the last checkpoint).
        adapter_missing = run.lora_base is not None and not os.path.isdir(
            run_directory.path(settings.run_dir, run_directory.FINAL_ADAPTER)
        )
        if settings.export_final and (total > run.start_iteration or not os.path.isdir(final) or adapter_missing):
            export_final_model(state, run.batches.frozen, run.graphdef, run.model_dir, final)
    finally:
        source.close()
        progress.close()
        try:
            run.checkpointer.close()  # raises a failure of the last save (a full disk), once the rest is closed too
        finally:
            release_run_dir(settings.run_dir)  # the directory is free for the next run of this process or another
            run.logger.close()
            run.rollouts.grader.close()
            with contextlib.suppress(Exception):  # a vLLM engine's workers, a server's transfer: after all that matters
                getattr(run.rollouts.sampler, "close", lambda: None)()
    return summary
