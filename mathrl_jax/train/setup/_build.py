"""`build_run(config)`: checks every input a config names before writing anything, then builds the run:
models, sampler, data, optimizers, and the state restored from the latest checkpoint."""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

import mathrl_jax.train.setup._sections as sections
from mathrl_jax import files
from mathrl_jax.compile_options import trainer_pass_options
from mathrl_jax.data import sources
from mathrl_jax.errors import TrainingError, fail
from mathrl_jax.evaluation import held_out_accuracy
from mathrl_jax.models import tiny
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.rewards.countdown_grader import CountdownGrader
from mathrl_jax.rewards.math_grader import MathGrader, RewardValues
from mathrl_jax.rewards.serial_grader import SerialGrader
from mathrl_jax.sharding import distributed
from mathrl_jax.sharding.rules import path_string
from mathrl_jax.train import rollouts, run_directory
from mathrl_jax.train import state as state_lib
from mathrl_jax.train import update as update_lib
from mathrl_jax.train.batch import BatchMaker
from mathrl_jax.train.checkpoint import (
    LORA_BASE_KEY,
    Checkpointer,
    UnverifiedCheckpointError,
    check_lora_base,
    lora_base_record,
)
from mathrl_jax.train.reporting import MetricsLogger, report_sinks
from mathrl_jax.train.rollouts import (
    RolloutMaker,
    check_prompts,
    encode_prompts,
    pending_from_checkpoint,
)
from mathrl_jax.train.setup._inputs import CheckedInputs, check_inputs
from mathrl_jax.train.setup._resume import (
    SETTINGS_KEY,
    check_recorded_settings,
    check_recorded_step,
    recorded_settings,
)
from mathrl_jax.train.setup._run import RewardFn, Run
from mathrl_jax.train.setup._run_lock import acquire_run_dir, release_run_dir
from mathrl_jax.train.setup._samplers import make_sampler
from mathrl_jax.train.setup._trainer import Trainer, build_trainer
from mathrl_jax.train.warmstart import warm_start, warmstart_examples


def _model_dir(config, run_dir: str) -> str:
    if config.model_name_or_path:
        return config.model_name_or_path
    directory = run_directory.path(run_dir, run_directory.INITIAL_MODEL)

    def write():
        if not os.path.isdir(directory):
            files.write_directory(directory, lambda d: tiny.write_tiny_checkpoint(d, seed=config.seed))

    distributed.on_main_process(run_directory.INITIAL_MODEL, write)
    return directory


def report_to(config) -> Tuple[str, ...]:
    """The metric sinks `config.report_to` names ("none": the JSONL file alone), checked by `_validation`."""
    names = report_sinks(config.report_to)
    return () if names == ("none",) else names


def wandb_settings(config) -> Dict[str, Any]:
    """`reporting._wandb.WandbWriter`'s settings: the project, the mode and the run's whole config."""
    return dict(project=config.wandb_project, mode=config.wandb_mode, recorded=config.to_dict())


def build_run(config, reward_fn: Optional[RewardFn] = None, reward_functions=None) -> Run:
    """Checks everything, then builds the models, sampler, data, optimizers and restores a checkpoint if any.

    `reward_functions`: callables in TRL's reward-function convention (`rewards.functions`), in place of the ones
    `reward.functions` names (reward_source "functions" / "verifier+functions")."""
    inputs = check_inputs(config, reward_functions)  # nothing is written before this returns
    run_dir = config.run_dir
    model_dir, codec = _open_run_dir(config, inputs)
    eval_prompts = encode_prompts(inputs.prompts, codec, inputs.eval_problems)
    eval_golds = [p.answer for p in inputs.eval_problems]
    hard_eval = (encode_prompts(inputs.prompts, codec, inputs.hard_problems), [p.answer for p in inputs.hard_problems])
    grader = SerialGrader(_grader(config))
    sampler_args = _sampler_args(config, codec)
    evaluation = sections.eval_settings(config)
    game = sections.game_settings(config)
    held_out = (evaluation, grader, eval_prompts, eval_golds)
    start_dir, warm_metrics = warm_start(
        sections.warmstart_settings(config),
        run_dir,
        model_dir,
        sampler_args,
        *_warmstart_task(config, game, codec, inputs.train_problems, *held_out),
    )
    trainer = build_trainer(config, start_dir)
    loader = sources.ProblemLoader(inputs.train_problems, seed=config.seed)
    checkpointer = Checkpointer(
        run_directory.path(run_dir, run_directory.CHECKPOINTS),
        save_interval=config.save_interval,
        max_to_keep=config.max_to_keep,
        allow_unverified=config.resume_allow_unverified,
    )
    base_record = lora_base_record(start_dir) if trainer.frozen is not None else None
    state, start_iteration, pending, host = _restored(config, trainer.state, checkpointer, loader, base_record)
    distributed.on_main_process(run_directory.CONFIG, lambda: _write_config(config, run_dir))
    sampler = make_sampler(config, start_dir, trainer.model, codec, sampler_args)
    sampler.update_weights(state_lib.model_params(state.params, trainer.frozen), int(state.policy_version))
    sinks = report_to(config)
    settings = sections.run_settings(config)
    if not eval_prompts and game is None:  # no held-out problems (eval_holdout=0, num_eval_problems=0): no evaluations
        settings = dataclasses.replace(settings, eval_interval=0)
    return Run(
        settings=settings,
        graphdef=trainer.graphdef,
        state=state,
        rollouts=RolloutMaker(
            sections.rollout_settings(config), sampler, codec, loader, grader, reward_fn, inputs.functions, inputs.prm
        ),
        batches=_batch_maker(config, trainer, codec),
        update=trainer.update,
        evaluation=evaluation,
        eval_prompts=eval_prompts,
        eval_golds=eval_golds,
        hard_eval_prompts=hard_eval[0],
        hard_eval_golds=hard_eval[1],
        checkpointer=checkpointer,
        logger=MetricsLogger(
            run_dir,
            tensorboard="tensorboard" in sinks,
            wandb=wandb_settings(config) if "wandb" in sinks else None,
            resumed_from=start_iteration,
        ),
        start_iteration=start_iteration,
        warmstart_metrics=warm_metrics,
        source_kind="env" if config.env_name else "async" if sections.runs_ahead(config) else "sync",
        game=game,
        model_dir=start_dir,
        pending_rollouts=pending,
        host=host,
        lora_base=base_record,
        recorded_settings=recorded_settings(config),
    )


def _open_run_dir(config, inputs: CheckedInputs) -> Tuple[str, TextCodec]:
    """The run directory, locked (one run per directory) and made, with the tiny offline model written into it
    where the config names no model; (the model's directory, its tokenizer). A tiny model's tokenizer exists only
    once written: prompts it cannot hold undo what this wrote."""
    run_dir = config.run_dir
    existed = os.path.isdir(run_dir)
    initial = run_directory.path(run_dir, run_directory.INITIAL_MODEL)
    had_initial = os.path.isdir(initial)
    if distributed.is_main_process():  # the processes of one run share its directory; one lock per run
        acquire_run_dir(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    model_dir = _model_dir(config, run_dir)
    codec = inputs.codec
    try:
        if codec is None:
            codec = TextCodec(model_dir)
            check_prompts(inputs.prompts, codec, inputs.train_problems, inputs.eval_problems + inputs.hard_problems)
    except TrainingError:  # every process fails here alike (same files); process 0 undoes what it wrote
        if distributed.is_main_process():
            release_run_dir(run_dir)
        if distributed.is_main_process() and not existed:
            shutil.rmtree(run_dir, ignore_errors=True)
        elif distributed.is_main_process() and not had_initial:
            shutil.rmtree(initial, ignore_errors=True)
        raise
    return model_dir, codec


def _sampler_args(config, codec: TextCodec) -> Dict[str, Any]:
    return dict(
        eos_token_ids=[codec.eos_token_id],
        pad_token_id=codec.pad_token_id,
        tokenizer=codec,
        kv_cache_gib=config.jax_sampler.kv_cache_gib,
        compact_interval=config.jax_sampler.compact_interval or None,
        lora_sync=config.jax_sampler.lora_sync,
    )


def _restored(config, state, checkpointer: Checkpointer, loader, base_record):
    """(state, start iteration, pending batches, host state): the latest checkpoint's when the run resumes one (its
    LoRA base checked against this run's), else the fresh state at iteration 0."""
    if not (config.resume and checkpointer.latest_step() is not None):
        return state, 0, [], state_lib.HostState()
    # Before the restore, whose tree check would refuse adapters against full weights with a list of keys
    latest = checkpointer.latest_step()
    check_lora_base(checkpointer.read_metadata(latest).get(LORA_BASE_KEY), base_record, latest)
    try:
        state, metadata = checkpointer.restore(state)
    except UnverifiedCheckpointError as error:
        error.setting = "--config.resume_allow_unverified=True"
        fail(f"{error} (or start over: --config.resume=False, or another --config.run_dir)")
    step = checkpointer.restored_step
    where = os.path.join(checkpointer.directory, str(step))
    check_lora_base(metadata.get(LORA_BASE_KEY), base_record, step)
    # The step restored (an older one when the newer fail verification): this run's, and the iteration it names
    check_recorded_step(metadata, step, where)
    check_recorded_settings(config, metadata.get(SETTINGS_KEY), where)
    check_finite_state(state, where)
    loader.restore(metadata["data"])
    records = metadata.get(PENDING_KEY) or []  # an asynchronous run's batches made ahead, and their arrays
    arrays = checkpointer.restore_arrays(checkpointer.restored_step) if records else {}
    pending = pending_from_checkpoint(arrays, records)
    # The batch shapes the run had grown to: a resumed run pads and packs as the uninterrupted one.
    host = state_lib.HostState(shape_floors=dict(metadata.get(SHAPES_KEY) or {}))
    return state, int(metadata["iteration"]), pending, host


def check_finite_state(state, where: str) -> None:
    """Refuses a restored state whose weights (the policy's, the critic's) hold a NaN or inf, naming the first such
    leaf: every loss would be non-finite and every update skipped. One reduction per leaf, on its device."""
    weights = {"params": state.params, "critic_params": state.critic_params}
    finite = jax.device_get(
        jax.jit(lambda tree: jax.tree.map(lambda x: jnp.isfinite(x).all(), tree))(
            jax.tree.map(lambda x: x if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.zeros(()), weights)
        )
    )
    bad = [path_string(path) for path, ok in jax.tree_util.tree_flatten_with_path(finite)[0] if not bool(ok)]
    if bad:
        fail(
            f"checkpoint {where} holds non-finite weights (NaN or inf) in {bad[0]}"
            + (f" and {len(bad) - 1} more leaves" if len(bad) > 1 else "")
            + ": every update would be skipped; resume from an earlier step (move this one out of the checkpoints "
            "directory) or start over with --config.resume=False"
        )


def _batch_maker(config, trainer: Trainer, codec: TextCodec) -> BatchMaker:
    micro = trainer.update_config.micro_batch_size  # the rows the update runs, chosen or set
    options = trainer_pass_options(trainer.model.config.vocab_size)
    needs_ref = config.kl_coef > 0 or config.kl_reward_coef > 0
    return BatchMaker(
        sections.batch_settings(config, trainer.update_config),
        codec,
        trainer.mesh,
        logprobs=update_lib.compute_logprobs_fn(trainer.graphdef, config.temperature, micro, options),
        values=update_lib.compute_values_fn(trainer.critic_graphdef, micro, options)
        if trainer.algorithm.critic
        else None,
        # The starting policy; a LoRA run's reference shares its base with the policy (its adapters a copy).
        ref_params=state_lib.model_params(jax.tree.map(jnp.copy, trainer.params), trainer.frozen)
        if needs_ref
        else None,
        frozen=trainer.frozen,
        critic_frozen=trainer.critic_frozen,
    )


def _grader(config):
    """The verifier of the run's answers, for its rewards and every evaluation: the math grader (a boxed answer
    against the gold); for countdown, whose target is in the prompt, its own grader of the whole derivation."""
    values = RewardValues(
        config.reward.correct, config.reward.incorrect, config.reward.no_answer, config.reward.format_reward
    )
    if config.dataset_name == "countdown":
        return CountdownGrader(values)
    return MathGrader(values, timeout_s=config.reward.timeout_s, num_workers=config.reward.num_workers)


def _warmstart_task(config, game, codec, train_problems, evaluation, grader, eval_prompts, eval_golds):
    """What the warm-start imitates and how it is scored: (examples(), accuracy(sampler)). The arithmetic or
    countdown teacher's solutions (or the gold answers) and the greedy held-out accuracy (the run's grader); for a
    multi-turn run, the game teacher's turns and the greedy success rate on the held-out games."""
    w = config.warmstart
    if game is None:
        settings = sections.warmstart_settings(config)
        return (
            lambda: warmstart_examples(settings, codec, train_problems),
            lambda sampler: held_out_accuracy(evaluation, sampler, codec, grader, eval_prompts, eval_golds)[
                "eval/accuracy"
            ],
        )
    rollout_settings = sections.rollout_settings(config)
    prompts = rollout_settings.prompts
    return (
        lambda: rollouts.game_warmstart_examples(
            game, codec, prompts, games=rollouts.TEACHER_GAMES, slip_rate=w.slip_rate, seed=config.seed
        ),
        lambda sampler: rollouts.evaluate_games(
            RolloutMaker(rollout_settings, sampler, codec, None, None), game, config.max_new_tokens
        )["eval/accuracy"],
    )


def _write_config(config, run_dir: str) -> None:
    files.write_json(run_directory.path(run_dir, run_directory.CONFIG), config.to_dict(), indent=2, default=str)


PENDING_KEY = "pending_rollouts"
SHAPES_KEY = "shape_floors"
"""Checkpoint metadata: the batches an asynchronous generator made ahead of the learner (`rollouts.AsyncRollouts`),
and the shapes the batches had grown to (`state.HostState.shape_floors`)."""
