"""The training loop: one iteration, and a run from its first iteration to its last.

One iteration (`train_iteration`):

    a rollout source (collect.py: problems ─► prompts ─► Sampler.generate ─► rewards; or async_loop.py's
      generator thread, or multiturn.py's episodes)
      ─► batch.py: padded arrays, old / reference log-probs, critic values, advantages (rollout.py)
      ─► update.py: the jitted update ─► the source hears of the new weights ─► metrics

`train(config)` builds the run (build.py: every input checked before anything is written), evaluates, iterates,
checkpoints and exports. Bad input raises `validation.TrainingError`, with a message naming the bad value.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import numpy as np
from flax import nnx

from mathrl_jax import files
from mathrl_jax.models import hf
from mathrl_jax.sampling.base import SamplingParams
from mathrl_jax.sharding import distributed
from mathrl_jax.train.async_loop import AsyncRollouts
from mathrl_jax.train.batch import mesh_context, prepare_batch, shuffled_rewards
from mathrl_jax.train.build import PENDING_KEY, SHAPES_KEY, build_run
from mathrl_jax.train.collect import SyncRollouts
from mathrl_jax.train.evaluation import completion_samples
from mathrl_jax.train.multiturn import EnvRollouts
from mathrl_jax.train.progress import Progress
from mathrl_jax.train.run import RewardFn, Run
from mathrl_jax.train.run_lock import release_run_dir
from mathrl_jax.train.validation import TrainingError
from mathrl_jax.train.warmstart import held_out_accuracy

RENAMES = {
    "policy_loss": "train/policy_loss",
    "entropy": "train/entropy_loss",
    "kl": "train/kl",
    "approx_kl_k3": "train/approx_kl",
    "approx_kl": "train/ppo_kl",  # the k1 estimate; as "train/approx_kl" it collided with the k3 one above
    "clip_fraction": "train/clip_fraction",
    "ratio_mean": "train/importance_weight",
    "ratio_max": "train/importance_weight_max",
    "grad_norm": "train/grad_norm",
    "value_loss": "train/value_loss",
    "value_grad_norm": "train/value_grad_norm",
    "value_value_clip_fraction": "train/value_clip_fraction",
    "value_value_mean": "train/value_mean",
    "kl_skipped": "train/kl_skipped_fraction",
    "skipped_updates": "train/skipped_updates",
    "applied": "train/applied_fraction",
    "loss": "train/loss",
}


@contextlib.contextmanager
def out_of_memory_hint(config, rows: int):
    """Turns a device out-of-memory error of the trainer's passes into a `TrainingError` naming the options that
    size them (the raw XLA message names only a byte count)."""
    try:
        yield
    except Exception as error:  # jax raises its runtime errors under several class names across versions
        text = str(error)
        if "RESOURCE_EXHAUSTED" not in text and "Out of memory" not in text:
            raise
        micro = config.micro_batch_size or f"0 (the whole minibatch, {rows // config.num_mini_batch} rows)"
        raise TrainingError(
            f"out of device memory in the trainer's passes over {rows} rows of up to "
            f"{config.max_prompt_length + config.max_new_tokens} tokens: lower --config.micro_batch_size (now "
            f"{micro}; rows per forward and backward), --config.max_new_tokens ({config.max_new_tokens}) or "
            f"--config.n_rollout_threads ({config.n_rollout_threads}), or set --config.remat=True. "
            f"XLA said: {text.splitlines()[0][:300]}"
        ) from error


ROLLOUT_SOURCES = {"sync": SyncRollouts, "async": AsyncRollouts, "env": EnvRollouts}
"""Where an iteration's rollouts come from (the protocol: `collect.SyncRollouts`): made when asked with the current
weights; by a generator thread running ahead (`async_ppo`); or by multi-turn episodes (`env_name`)."""


def rollout_source(run: Run):
    c = run.config
    kind = "env" if c.env_name else "async" if c.algorithm_name == "async_ppo" else "sync"
    return ROLLOUT_SOURCES[kind](run)


GRADER_RATES = ("reward/accuracy", "reward/no_answer_rate")  # logged as rollout/accuracy, rollout/no_answer_rate


def train_iteration(run: Run, iteration: int, source=None) -> Dict[str, float]:
    """One iteration (see the module docstring); updates `run.state` and tells `source` (default: the synchronous
    loop's, which gives the sampler the new weights)."""
    start = time.perf_counter()
    source = source or SyncRollouts(run)
    got = source.get(iteration)
    rollouts, scores, reward_metrics = got.rollouts, got.scores, got.reward_metrics
    run.data_state = got.data_state
    waited = time.perf_counter() - start
    staleness = int(run.state.policy_version) - rollouts.policy_version
    if staleness > run.config.max_head_offpolicyness:
        raise RuntimeError(
            f"iteration {iteration}: rollouts of version {rollouts.policy_version} are {staleness} versions old, over "
            f"max_head_offpolicyness={run.config.max_head_offpolicyness}"
        )
    if run.config.reward_source == "prm":
        scores = np.zeros_like(scores)  # step rewards only
    if run.config.shuffle_rewards:
        scores = shuffled_rewards(scores, run.config.seed, iteration)
    with out_of_memory_hint(run.config, len(rollouts)):
        passes_start = time.perf_counter()
        batch, batch_metrics = prepare_batch(
            run,
            rollouts,
            scores,
            action_rewards=got.action_rewards,
            row_advantages=got.row_advantages,
            row_mask=got.row_mask,
        )
        jax.block_until_ready(batch)
        update_start = time.perf_counter()
        with mesh_context(run):
            run.state, update_metrics = run.update(run.state, batch)
        update_metrics = jax.device_get(update_metrics)
    sync_start = time.perf_counter()
    source.updated(iteration, run.state.params, int(run.state.policy_version))
    done = time.perf_counter()
    lengths = rollouts.completion_lengths
    tokens = int(lengths.sum())
    real = np.ones(len(rollouts), bool)
    if got.row_mask is not None and (got.row_mask > 0).any():  # padded rows (multi-turn) are not responses
        real = got.row_mask > 0
    # What a response earned: the verifier's score plus, with a PRM, its step scores (the undiscounted return).
    earned = scores if got.action_rewards is None else scores + got.action_rewards.sum(axis=1)
    metrics = {
        "rollout/rewards": float(np.mean(earned[real])),
        "rollout/response_length": float(lengths[real].mean()),
        "rollout/truncated_fraction": float(np.mean(np.asarray(rollouts.finish_reasons)[real] == "length")),
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
        "train/update_step": float(run.state.step),
        **(
            {"rollout/prm_reward": float(got.action_rewards.sum(axis=1).mean())}
            if got.action_rewards is not None
            else {}
        ),
        **batch_metrics,
        **{k: v for k, v in reward_metrics.items() if k.startswith(("rollout/", "perf/"))},
        # The grader's verdicts, where one graded (not for reward functions alone, nor a custom reward_fn's
        # rewards without them): absent rather than NaN.
        **{f"rollout/{k[len('reward/') :]}": v for k, v in reward_metrics.items() if k in GRADER_RATES},
    }
    for key, value in update_metrics.items():
        metrics[RENAMES.get(key, f"train/{key}")] = float(value)
    return metrics


def save(run: Run, iteration: int, *, force: bool = False, pending: Optional[List[Dict[str, Any]]] = None) -> bool:
    """Checkpoints the state after `iteration`, with the data position and the batches a generator `pending`
    had made ahead (`SyncRollouts.pending`)."""
    metadata = {
        "data": run.data_state or run.loader.state(),
        "iteration": iteration,
        PENDING_KEY: pending or [],
        SHAPES_KEY: dict(run.shape_floors),
    }
    return run.checkpointer.save(iteration, run.state, metadata, force=force)


def run_eval(run: Run, iteration: int, *, sampled: bool = False) -> Dict[str, float]:
    """Greedy held-out accuracy; with `sampled`, also pass@k from `eval_n_samples` samples at the RL
    temperature (pass@1 is the sampled accuracy). Writes `run_dir/samples/` (`write_samples`)."""
    c = run.config
    n_samples = c.eval_n_samples if sampled else 0
    metrics = held_out_accuracy(c, run.sampler, run.codec, run.grader, run.eval_prompts, run.eval_golds, n_samples)
    write_samples(run, iteration)
    return metrics


def write_samples(run: Run, iteration: int) -> Optional[str]:
    """Writes `run_dir/samples/iteration_<k>.jsonl` (process 0): the first `num_logged_samples` held-out prompts,
    each with its greedy completion and 4 samples at the RL temperature, graded by the verifier
    (`completion_samples`; a run trained on PRM or custom rewards still logs the verifier's)."""
    c = run.config
    count = min(c.num_logged_samples, len(run.eval_prompts))
    if count == 0:
        return None
    sampled = SamplingParams(
        n=4,
        temperature=c.temperature,
        top_p=c.top_p,
        max_new_tokens=c.max_new_tokens,
        seed=zlib.crc32(f"samples:{c.seed}:{iteration}".encode()) & 0x7FFFFFFF,  # not the training rollouts' seed
    )
    greedy = SamplingParams(temperature=0.0, max_new_tokens=c.max_new_tokens)
    records = completion_samples(
        run.sampler,
        run.eval_prompts[:count],
        run.eval_golds[:count],
        run.grader,
        run.codec.decode,
        [greedy, sampled],
        values=run.grader.grader.values,
    )  # sampled and graded by every process (collectives); written by process 0
    if not distributed.is_main_process():
        return None
    directory = os.path.join(run.run_dir, "samples")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"iteration_{iteration:06d}.jsonl")
    with files.atomic_write(path) as f:
        for record in records:
            f.write(json.dumps(dict(record, iteration=iteration)) + "\n")
    return path


def train(
    config,
    *,
    on_metrics: Optional[Callable[[int, Dict[str, float]], None]] = None,
    reward_fn: Optional[RewardFn] = None,
    reward_functions: Optional[Sequence[Callable]] = None,
) -> Dict[str, Any]:
    """Runs (or resumes) a training run; returns a summary with the eval curve and the final state.

    `reward_functions`: your reward functions in TRL's convention (`fn(prompts, completions, answer, ...) ->
    [float]`, `rewards.functions`), summed with `reward.weights`, alone or (reward_source "verifier+functions")
    added to the verifier's score. `reward_fn(texts, golds) -> (scores, metrics)` replaces the math grader's
    rewards (e.g. a custom verifier); `on_metrics(iteration, metrics)` sees every iteration's metrics.
    """
    run = build_run(config, reward_fn, reward_functions)
    c = config
    source = rollout_source(run)
    summary: Dict[str, Any] = {
        "warmstart": run.warmstart_metrics,
        "eval": [],
        "num_eval_problems": len(run.eval_prompts),
    }
    progress = Progress(
        run.total_iterations,
        initial_step=run.start_iteration,
        keys=("rollout/accuracy", "eval/accuracy", "rollout/rewards", "train/policy_loss"),
        disable=not c.progress,
        desc="RL",
    )
    try:
        if run.start_iteration:
            progress.write(
                f"resuming {run.run_dir} from its checkpoint of iteration {run.start_iteration} "
                f"({run.total_iterations - run.start_iteration} of {run.total_iterations} iterations to go)"
            )
        if run.warmstart_metrics:
            run.logger.log(0, run.warmstart_metrics)
            progress.write(
                "warm-start: greedy eval accuracy {:.3f} -> {:.3f} in {:.0f} s".format(
                    run.warmstart_metrics["warmstart/eval_accuracy_before"],
                    run.warmstart_metrics["warmstart/eval_accuracy_after"],
                    run.warmstart_metrics["warmstart/seconds"],
                )
            )
        if run.start_iteration == 0 and c.eval_interval:
            with source.current_weights():
                metrics = run_eval(run, 0, sampled=True)
            run.logger.log(0, metrics)
            summary["eval"].append((0, metrics["eval/accuracy"]))
            summary["eval_start"] = metrics
            progress.update(0, metrics)
        for iteration in range(run.start_iteration + 1, run.total_iterations + 1):
            metrics = train_iteration(run, iteration, source)
            last = iteration == run.total_iterations
            if c.eval_interval and (iteration % c.eval_interval == 0 or last):
                with source.current_weights():
                    metrics.update(run_eval(run, iteration, sampled=last))
                summary["eval"].append((iteration, metrics["eval/accuracy"]))
                if last:
                    summary["eval_end"] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
            if iteration % c.log_interval == 0 or "eval/accuracy" in metrics:
                run.logger.log(iteration, metrics)
            progress.update(iteration, metrics)
            if on_metrics is not None:
                on_metrics(iteration, metrics)
            if run.checkpointer.should_save(iteration) or last:
                save(run, iteration, force=last, pending=source.pending(iteration))
        summary["state"] = run.state
        summary["final_iteration"] = run.total_iterations
        final = os.path.join(run.run_dir, "final_model")
        # Also when a finished run is rerun without its final_model (killed after the last checkpoint).
        if c.export_final and (run.total_iterations > run.start_iteration or not os.path.isdir(final)):
            model_config = nnx.merge(run.graphdef, run.state.params).config
            params = distributed.fetch(run.state.params)  # every process takes part in gathering the shards
            distributed.on_main_process(
                "final_model",
                lambda: files.write_directory(
                    final, lambda d: hf.export_checkpoint(params, model_config, d, tokenizer_dir=run.model_dir)
                ),
            )
    finally:
        source.close()
        progress.close()
        run.checkpointer.close()
        release_run_dir(run.run_dir)  # the directory is free for the next run of this process or another
        run.logger.close()
        run.grader.close()
    return summary
