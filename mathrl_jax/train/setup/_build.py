"""`build_run(config)`: checks every input a config names before writing anything, then builds the run:
models, sampler, data, optimizers, and the state restored from the latest checkpoint."""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

import mathrl_jax.train.setup._sections as sections
from mathrl_jax import files, sharding
from mathrl_jax.data import sources
from mathrl_jax.errors import TrainingError, fail
from mathrl_jax.evaluation import held_out_accuracy
from mathrl_jax.models import hf, hf_config, qwen, tiny, value_head
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.models.hub import HubModelError, resolve_dataset_path, resolve_model_dir
from mathrl_jax.rewards.arithmetic_steps import NAME as ARITHMETIC_STEPS
from mathrl_jax.rewards.countdown_grader import CountdownGrader
from mathrl_jax.rewards.countdown_steps import NAME as COUNTDOWN_STEPS
from mathrl_jax.rewards.functions import RewardFunctionError, RewardFunctions, parse_weights
from mathrl_jax.rewards.math_grader import MathGrader, RewardValues
from mathrl_jax.rewards.serial_grader import SerialGrader
from mathrl_jax.sampling import JaxSampler
from mathrl_jax.sampling.process_split import ProcessSplitSampler
from mathrl_jax.sampling.vllm import VLLM_MISSING, ServerError, VllmSampler, VllmServerSampler, describe_server
from mathrl_jax.sharding import distributed
from mathrl_jax.train import rollouts
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
    check_warmstart_data,
    encode_prompts,
    load_data,
    load_hard_eval,
    pending_from_checkpoint,
    prompt_settings,
)
from mathrl_jax.train.setup._resume import check_resumed_config
from mathrl_jax.train.setup._run import RewardFn, Run
from mathrl_jax.train.setup._run_lock import acquire_run_dir, release_run_dir
from mathrl_jax.train.setup._validation import validate_config
from mathrl_jax.train.state import place_state
from mathrl_jax.train.warmstart import warm_start, warmstart_examples


def _model_dir(config, run_dir: str) -> str:
    if config.model_name_or_path:
        return config.model_name_or_path
    directory = os.path.join(run_dir, "initial_model")

    def write():
        if not os.path.isdir(directory):
            files.write_directory(directory, lambda d: tiny.write_tiny_checkpoint(d, seed=config.seed))

    distributed.on_main_process("initial_model", write)
    return directory


def _reward_functions(config, given):
    """The run's `RewardFunctions`: `given` (Python callables) or those `reward.functions` names; None without."""
    if "functions" not in config.reward_source:
        return None
    try:
        timeout_s = config.reward.function_timeout_s
        if given:
            return RewardFunctions(list(given), parse_weights(config.reward.weights, len(given)), timeout_s=timeout_s)
        return RewardFunctions.from_config(config.reward.functions, config.reward.weights, timeout_s)
    except RewardFunctionError as error:
        fail(str(error))


def _check_model_path(config):
    """The model directory's config (None for the offline tiny model), checked against the run's lengths."""
    path = config.model_name_or_path
    model_config = None
    if path:
        if not os.path.isdir(path):
            fail(f"model_name_or_path {path!r} is not a local directory (no downloads: give a local checkpoint)")
        try:
            model_config = hf_config.load_config(path)
        except (qwen.ConfigError, OSError, ValueError) as error:
            fail(f"model_name_or_path {path!r}: {error}")
        longest = config.max_prompt_length + config.max_new_tokens
        if not config.env_name and longest > model_config.max_position_embeddings:
            fail(
                f"max_prompt_length + max_new_tokens = {longest} is over the checkpoint's "
                f"max_position_embeddings={model_config.max_position_embeddings} ({path!r}): positions the model was "
                "not trained for (vLLM refuses them); lower max_prompt_length or max_new_tokens"
            )
    return model_config


RULE_BASED_VERIFIERS = (ARITHMETIC_STEPS, COUNTDOWN_STEPS)
"""The `prm_model_name_or_path` values that name a built-in rule-based process verifier, not a checkpoint."""


def load_prm(config):
    """The process reward model of `prm_model_name_or_path`, loaded before the run directory is written, so a
    PRM that cannot serve (architecture, tokenizer, a step tag or label that is not one token) stops the run
    with the option to change and leaves the run directory as it was."""
    from mathrl_jax.rewards import arithmetic_steps, countdown_steps
    from mathrl_jax.rewards.prm import PRMConfig, ProcessRewardModel

    path = config.prm_model_name_or_path
    if path == arithmetic_steps.NAME:  # the offline task's rule-based process verifier
        return arithmetic_steps.ArithmeticStepVerifier()
    if path == countdown_steps.NAME:  # countdown's
        return countdown_steps.CountdownStepVerifier()
    prm_config = PRMConfig(
        step_tag=config.prm.step_tag,
        candidate_tokens=tuple(config.prm.candidate_tokens),
        step_separator=config.step_separator,
        reward_mode="steps",
    )
    try:
        return ProcessRewardModel.from_pretrained(path, prm_config)
    except (qwen.ConfigError, hf.ModelCheckpointError) as error:
        fail(
            f"--config.prm_model_name_or_path={path!r} cannot be loaded as a PRM: {error} (the PRM must be a "
            "Qwen2 / Qwen2.5 / Qwen3-architecture checkpoint)"
        )
    except (OSError, ValueError) as error:
        fail(
            f"the PRM at --config.prm_model_name_or_path={path!r} cannot score with --config.prm.step_tag="
            f"{config.prm.step_tag!r} and --config.prm.candidate_tokens={tuple(config.prm.candidate_tokens)}: "
            f"{error}"
        )


def report_to(config) -> Tuple[str, ...]:
    """The metric sinks `config.report_to` names ("none": the JSONL file alone), checked by `validation`."""
    names = report_sinks(config.report_to)
    return () if names == ("none",) else names


def wandb_settings(config) -> Dict[str, Any]:
    """`wandb_writer.WandbWriter`'s settings: the project, the mode and the run's whole config."""
    return dict(project=config.wandb_project, mode=config.wandb_mode, recorded=config.to_dict())


def build_run(config, reward_fn: Optional[RewardFn] = None, reward_functions=None) -> Run:
    """Checks everything, then builds the models, sampler, data, optimizers and restores a checkpoint if any.

    `reward_functions`: callables in TRL's reward-function convention (`rewards.functions`), in place of the ones
    `reward.functions` names (reward_source "functions" / "verifier+functions")."""
    if reward_functions:  # given in Python: the config says how they combine with the verifier
        if "functions" not in str(config.reward_source):
            config.reward_source = "functions"
        config.reward.functions = ",".join(getattr(f, "__name__", "function") for f in reward_functions)
    validate_config(config)
    resolvers = dict(
        model_name_or_path=resolve_model_dir,
        prm_model_name_or_path=resolve_model_dir,
        dataset_path=resolve_dataset_path,
        eval_dataset_path=resolve_dataset_path,
    )
    for key, resolve in resolvers.items():  # a Hub id: its snapshot in the local cache
        if key == "prm_model_name_or_path" and config[key] in RULE_BASED_VERIFIERS:
            continue  # a built-in process verifier, no checkpoint
        try:
            config[key] = resolve(config[key], key)
        except HubModelError as error:
            fail(str(error))
    functions = _reward_functions(config, reward_functions)
    train_problems, eval_problems = load_data(config)
    hard_problems = load_hard_eval(config, train_problems, eval_problems)
    check_warmstart_data(config)
    model_config = _check_model_path(config)
    if config.prm_model_name_or_path not in ("", *RULE_BASED_VERIFIERS) and not os.path.isdir(
        config.prm_model_name_or_path
    ):
        fail(f"prm_model_name_or_path {config.prm_model_name_or_path!r} is not a local directory")
    if config.sampler == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            fail(f"sampler='vllm': {VLLM_MISSING}; or use sampler='jax'")
        if config.vllm.server_url:  # a server that is not there, or lacks what the sampler needs: before any write
            try:
                describe_server(
                    config.vllm.server_url,
                    timeout_s=config.vllm.timeout_s,
                    max_model_len=_vllm_max_model_len(config),
                    dtype=config.vllm.dtype or None,
                    transfer=config.vllm.transfer,
                )
            except ServerError as error:
                fail(str(error))
    prompts = prompt_settings(config)
    codec = None
    if config.model_name_or_path:  # a missing tokenizer or a too-long prompt fails before anything is written
        codec = TextCodec(config.model_name_or_path)
        codec.check_vocabulary(model_config.vocab_size, config.model_name_or_path)
        check_prompts(prompts, codec, train_problems, eval_problems + hard_problems)
    prm = load_prm(config) if "prm" in config.reward_source else None
    check_resumed_config(config, config.run_dir)
    # From here on the run directory is written.
    run_dir = config.run_dir
    existed = os.path.isdir(run_dir)
    initial = os.path.join(run_dir, "initial_model")
    had_initial = os.path.isdir(initial)
    if distributed.is_main_process():  # the processes of one run share its directory; one lock per run
        acquire_run_dir(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    model_dir = _model_dir(config, run_dir)
    try:  # the tiny offline model's tokenizer exists only once written: undo that if the prompts do not fit
        if codec is None:
            codec = TextCodec(model_dir)
            check_prompts(prompts, codec, train_problems, eval_problems + hard_problems)
    except TrainingError:  # every process fails here alike (same files); process 0 undoes what it wrote
        if distributed.is_main_process():
            release_run_dir(run_dir)
        if distributed.is_main_process() and not existed:
            shutil.rmtree(run_dir, ignore_errors=True)
        elif distributed.is_main_process() and not had_initial:
            shutil.rmtree(initial, ignore_errors=True)
        raise
    eval_prompts = encode_prompts(prompts, codec, eval_problems)
    eval_golds = [p.answer for p in eval_problems]
    hard_eval = (encode_prompts(prompts, codec, hard_problems), [p.answer for p in hard_problems])
    grader = SerialGrader(_grader(config))
    sampler_args = dict(
        eos_token_ids=[codec.eos_token_id],
        pad_token_id=codec.pad_token_id,
        tokenizer=codec,
        kv_cache_gib=config.jax_sampler.kv_cache_gib,
        compact_interval=config.jax_sampler.compact_interval or None,
        lora_sync=config.jax_sampler.lora_sync,
    )
    evaluation = sections.eval_settings(config)
    game = sections.game_settings(config)
    start_dir, warm_metrics = warm_start(
        sections.warmstart_settings(config),
        run_dir,
        model_dir,
        sampler_args,
        *_warmstart_task(config, game, codec, train_problems, evaluation, grader, eval_prompts, eval_golds),
    )

    mesh = sharding.make_mesh(config.mesh.to_dict())
    numerics = dict(
        param_dtype=config.param_dtype, dtype=config.dtype, attention=config.attention, scan_layers=config.scan_layers
    )
    adapters = sections.lora_settings(config)
    model = hf.load_model(start_dir, remat=config.remat, lora_seed=config.seed, **adapters, **numerics)
    rules = sharding.qwen_rules(model.config.num_key_value_heads, mesh.shape["tp"])
    frozen = None
    if model.config.lora_rank:  # the adapters train (TrainState.params, the optimizer's); the base stays put
        graphdef, params, frozen = nnx.split(model, nnx.LoRAParam, ...)
        frozen = sharding.shard_tree(frozen, mesh, rules)
    else:
        graphdef, params = nnx.split(model)
    params = sharding.shard_tree(params, mesh, rules)
    algorithm = sections.algorithm_of(config)
    optimizer_settings, critic_optimizer_settings = sections.optimizer_settings_of(config)
    optimizer = state_lib.make_optimizer(**optimizer_settings)
    critic_graphdef = critic_params = critic_optimizer = None
    critic_frozen = None
    if algorithm.critic and config.lora.share_critic_base:  # OpenR's: the policy's frozen base under an MLP head
        critic_graphdef, critic_params = value_head.frozen_base_critic(model.config, seed=config.seed)
        critic_params = sharding.shard_tree(critic_params, mesh, rules)
        critic_frozen = value_head.frozen_trunk(frozen)
    elif algorithm.critic:
        critic = value_head.load_critic(start_dir, seed=config.seed, **numerics)
        critic_graphdef, critic_params = nnx.split(critic)
        critic_params = sharding.shard_tree(critic_params, mesh, rules)
    if algorithm.critic:
        critic_optimizer = state_lib.make_optimizer(**critic_optimizer_settings)
    state = state_lib.create_train_state(
        params, optimizer, seed=config.seed, critic_params=critic_params, critic_optimizer=critic_optimizer
    )
    state = place_state(state, mesh, rules)
    needs_ref = config.kl_coef > 0 or config.kl_reward_coef > 0
    update_cfg = sections.update_config(config)
    # The asynchronous generator samples with the params the learner is updating: donating them to the update
    # would free buffers another thread is reading.
    update_settings = dict(
        critic_graphdef=critic_graphdef,
        critic_shares_base=critic_frozen is not None,
        donate=not sections.runs_ahead(config),
        state_shardings=jax.tree.map(lambda leaf: leaf.sharding, state),  # the rules', call after call
    )
    update = update_lib.make_update_fn(
        graphdef, optimizer, update_cfg, critic_optimizer=critic_optimizer, **update_settings
    )
    loader = sources.ProblemLoader(train_problems, seed=config.seed)
    checkpointer = Checkpointer(
        os.path.join(run_dir, "checkpoints"),
        save_interval=config.save_interval,
        max_to_keep=config.max_to_keep,
        allow_unverified=config.resume_allow_unverified,
    )
    start_iteration = 0
    pending: List[Any] = []
    shape_floors: Dict[str, Any] = {}
    base_record = lora_base_record(start_dir) if frozen is not None else None
    if config.resume and checkpointer.latest_step() is not None:
        # Before the restore, whose tree check would refuse adapters against full weights with a list of keys
        latest = checkpointer.latest_step()
        check_lora_base(checkpointer.read_metadata(latest).get(LORA_BASE_KEY), base_record, latest)
        try:
            state, metadata = checkpointer.restore(state)
        except UnverifiedCheckpointError as error:
            error.setting = "--config.resume_allow_unverified=True"
            fail(f"{error} (or start over: --config.resume=False, or another --config.run_dir)")
        check_lora_base(metadata.get(LORA_BASE_KEY), base_record, checkpointer.restored_step)
        loader.restore(metadata["data"])
        start_iteration = int(metadata["iteration"])
        records = metadata.get(PENDING_KEY) or []  # an asynchronous run's batches made ahead, and their arrays
        arrays = checkpointer.restore_arrays(checkpointer.restored_step) if records else {}
        pending = pending_from_checkpoint(arrays, records)
        # The batch shapes the run had grown to: a resumed run pads and packs as the uninterrupted one.
        shape_floors = dict(metadata.get(SHAPES_KEY) or {})
    distributed.on_main_process("config.json", lambda: _write_config(config, run_dir))
    sampler = _make_sampler(config, start_dir, model, codec, sampler_args)
    sampler.update_weights(state_lib.model_params(state.params, frozen), int(state.policy_version))
    sinks = report_to(config)
    micro = config.micro_batch_size or None
    batches = BatchMaker(
        sections.batch_settings(config, update_cfg),
        codec,
        mesh,
        logprobs=update_lib.compute_logprobs_fn(graphdef, config.temperature, micro),
        values=update_lib.compute_values_fn(critic_graphdef, micro) if algorithm.critic else None,
        # The starting policy; a LoRA run's reference shares its base with the policy (its adapters a copy).
        ref_params=state_lib.model_params(jax.tree.map(jnp.copy, params), frozen) if needs_ref else None,
        frozen=frozen,
        critic_frozen=critic_frozen,
        shape_floors=shape_floors,
    )
    rollouts = RolloutMaker(
        sections.rollout_settings(config), sampler, codec, loader, grader, reward_fn, functions, prm
    )
    source_kind = "env" if config.env_name else "async" if sections.runs_ahead(config) else "sync"
    return Run(
        settings=sections.run_settings(config),
        graphdef=graphdef,
        state=state,
        rollouts=rollouts,
        batches=batches,
        update=update,
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
        source_kind=source_kind,
        game=game,
        model_dir=start_dir,
        pending_rollouts=pending,
        lora_base=base_record,
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
    files.write_json(os.path.join(run_dir, "config.json"), config.to_dict(), indent=2, default=str)


PENDING_KEY = "pending_rollouts"
SHAPES_KEY = "shape_floors"
"""Checkpoint metadata: the batches an asynchronous generator had made ahead of the learner (`async_loop`)."""


def _make_sampler(config, model_dir, model, codec, sampler_args):
    if config.sampler == "vllm":
        sampler = _vllm_sampler(config, model_dir, model, codec, sampler_args)
        if jax.process_count() == 1:
            return sampler
        # Each process samples its share of every batch; each syncs its own engine, or process 0 a shared server.
        return ProcessSplitSampler(sampler, sends=not config.vllm.server_url or distributed.is_main_process())
    sampler_mesh = sharding.follow_mesh(config.sampler_mesh.to_dict(), config.mesh.to_dict())
    mesh = sharding.make_mesh(sampler_mesh) if jax.device_count() > 1 else None
    return JaxSampler(model, mesh=mesh, **sampler_args)


def _vllm_max_model_len(config) -> Optional[int]:
    """Single-turn: what a row can hold; multi-turn prompts grow over the episode: the checkpoint's limit (None)."""
    return None if config.env_name else config.max_prompt_length + config.max_new_tokens


def _vllm_sampler(config, model_dir, model, codec, sampler_args):
    """The in-process engine, or the server at `vllm.server_url` (refused with its reason, before training)."""
    v = config.vllm
    max_model_len = _vllm_max_model_len(config)
    if v.server_url:
        try:
            return VllmServerSampler(
                v.server_url,
                config=model.config,
                eos_token_ids=sampler_args["eos_token_ids"],
                tokenizer=codec,
                dtype=v.dtype or None,
                timeout_s=v.timeout_s,
                transfer=v.transfer,
                transfer_chunk_bytes=int(v.transfer_chunk_gib * (1 << 30)),
                max_model_len=max_model_len,
            )
        except ServerError as error:
            fail(str(error))
    return VllmSampler(
        model_dir,
        config=model.config,
        eos_token_ids=sampler_args["eos_token_ids"],
        tokenizer=codec,
        kv_cache_gib=v.kv_cache_gib,
        max_model_len=max_model_len,
        dtype=v.dtype or config.dtype,
        tensor_parallel_size=v.tensor_parallel_size,
        transfer=v.transfer,
        transfer_chunk_bytes=int(v.transfer_chunk_gib * (1 << 30)),
        seed=config.seed,
        lora_sync=v.lora_sync,
    )
