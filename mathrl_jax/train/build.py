"""`build_run(config)`: checks every input a config names before writing anything, then builds the run:
models, sampler, data, optimizers, and the state restored from the latest checkpoint."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from mathrl_jax import files, sharding
from mathrl_jax.data import sources
from mathrl_jax.models import hf, hf_config, qwen, tiny, value_head
from mathrl_jax.models.hub import HubModelError, resolve_dataset_path, resolve_model_dir
from mathrl_jax.rewards.functions import RewardFunctionError, RewardFunctions, parse_weights
from mathrl_jax.rewards.math_grader import MathGrader, RewardValues
from mathrl_jax.sampling import JaxSampler
from mathrl_jax.sampling.vllm_sampler import VLLM_MISSING, VllmSampler
from mathrl_jax.sharding import distributed
from mathrl_jax.train import algorithms, passes
from mathrl_jax.train import state as state_lib
from mathrl_jax.train import update as update_lib
from mathrl_jax.train.checkpoint import Checkpointer
from mathrl_jax.train.codec import TextCodec
from mathrl_jax.train.collect import SerialGrader
from mathrl_jax.train.metrics import MetricsLogger, report_sinks
from mathrl_jax.train.problems import check_prompts, check_warmstart_data, encode_prompts, load_data
from mathrl_jax.train.run import RewardFn, Run
from mathrl_jax.train.run_lock import acquire_run_dir, release_run_dir
from mathrl_jax.train.validation import TrainingError, fail, flat_items, num_iterations, validate_config
from mathrl_jax.train.warmstart import warm_start


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
        if given:
            return RewardFunctions(list(given), parse_weights(config.reward.weights, len(given)))
        return RewardFunctions.from_config(config.reward.functions, config.reward.weights)
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


def load_prm(config):
    """The process reward model of `prm_model_name_or_path`, loaded before the run directory is written, so a
    PRM that cannot serve (architecture, tokenizer, a step tag or label that is not one token) stops the run
    with the option to change and leaves the run directory as it was."""
    from mathrl_jax.rewards.prm import PRMConfig, ProcessRewardModel

    path = config.prm_model_name_or_path
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


def update_config(config) -> update_lib.UpdateConfig:
    """The update's static settings for a run's config."""
    alg = config.algorithm_name
    policy_loss = algorithms.ALGORITHMS[alg].policy_loss
    if policy_loss == "action_ppo" and not config.appo_action_ratio:
        policy_loss = "ppo"  # APPO with token-level ratios and the step's advantage on each token
    whitening = None
    if config.advantage_whitening == "openr" and alg in ("appo", "tppo"):
        whitening = "actions" if alg == "appo" else "nonzero"
    settings = dict(
        ppo_epochs=config.ppo_epoch,
        num_mini_batches=config.num_mini_batch,
        micro_batch_size=config.micro_batch_size or None,
        policy_loss=policy_loss,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        clip_c=config.clip_c,
        behaviour_weight_cap=config.behaviour_weight_cap,
        loss_agg_mode=config.loss_agg_mode,
        norm_constant=float(config.max_new_tokens) if config.loss_agg_mode == "seq-mean-token-sum-norm" else None,
        entropy_coef=config.entropy_coef,
        kl_coef=config.kl_coef,
        kl_kind=config.kl_kind,
        target_kl=config.target_kl,
        temperature=config.temperature,
        value_clip=config.value_clip,
        value_loss_type=config.value_loss_type,
        huber_delta=config.huber_delta,
        minibatch_whitening=whitening,
    )
    cfg = update_lib.UpdateConfig(**settings)
    # `skip_zero_advantage` where it changes no gradient (the config's comment).
    skip = config.skip_zero_advantage and update_lib.zero_advantage_rows_are_inert(
        cfg, has_critic=algorithms.ALGORITHMS[alg].critic
    )
    return dataclasses.replace(cfg, skip_zero_advantage=bool(skip))


def optimizer_settings_of(config) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The `state.make_optimizer` arguments of the policy and of the critic: `config.optimizer` over the params, in
    their dtype (`param_dtype`, the master precision), with the run's schedule counted in optimizer steps."""
    policy = dict(
        learning_rate=config.lr,
        name=config.optimizer,
        schedule=config.lr_schedule,
        warmup_steps=config.warmup_steps,
        total_steps=max(1, num_iterations(config) * config.ppo_epoch * config.num_mini_batch),
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        eps=config.adam_eps,
    )
    critic = dict(
        learning_rate=config.critic_lr, name=config.optimizer, max_grad_norm=config.max_grad_norm, eps=config.adam_eps
    )
    return policy, critic


def report_to(config) -> Tuple[str, ...]:
    """The metric sinks `config.report_to` names ("none": the JSONL file alone), checked by `validation`."""
    names = report_sinks(config.report_to)
    return () if names == ("none",) else names


def wandb_settings(config) -> Dict[str, Any]:
    """`wandb_writer.WandbWriter`'s settings: the project, the mode and the run's whole config."""
    return dict(project=config.wandb_project, mode=config.wandb_mode, config=config.to_dict())


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
        try:
            config[key] = resolve(config[key], key)
        except HubModelError as error:
            fail(str(error))
    functions = _reward_functions(config, reward_functions)
    train_problems, eval_problems = load_data(config)
    check_warmstart_data(config)
    model_config = _check_model_path(config)
    if config.prm_model_name_or_path and not os.path.isdir(config.prm_model_name_or_path):
        fail(f"prm_model_name_or_path {config.prm_model_name_or_path!r} is not a local directory")
    if config.sampler == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            fail(f"sampler='vllm': {VLLM_MISSING}; or use sampler='jax'")
    if config.model_name_or_path:  # a missing tokenizer or a too-long prompt fails before anything is written
        user_codec = TextCodec(config.model_name_or_path)
        user_codec.check_vocabulary(model_config.vocab_size, config.model_name_or_path)
        check_prompts(config, user_codec, train_problems, eval_problems)
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
    codec = TextCodec(model_dir)
    try:  # the tiny offline model's tokenizer exists only once written: undo that if the prompts do not fit
        check_prompts(config, codec, train_problems, eval_problems)
    except TrainingError:  # every process fails here alike (same files); process 0 undoes what it wrote
        if distributed.is_main_process():
            release_run_dir(run_dir)
        if distributed.is_main_process() and not existed:
            shutil.rmtree(run_dir, ignore_errors=True)
        elif distributed.is_main_process() and not had_initial:
            shutil.rmtree(initial, ignore_errors=True)
        raise
    eval_prompts = encode_prompts(config, codec, eval_problems)
    eval_golds = [p.answer for p in eval_problems]
    grader = SerialGrader(
        MathGrader(
            RewardValues(
                config.reward.correct, config.reward.incorrect, config.reward.no_answer, config.reward.format_reward
            ),
            timeout_s=config.reward.timeout_s,
            num_workers=config.reward.num_workers,
        )
    )
    sampler_args = dict(
        eos_token_ids=[codec.eos_token_id],
        pad_token_id=codec.pad_token_id,
        tokenizer=codec,
        kv_cache_gib=config.jax_sampler.kv_cache_gib,
        compact_interval=config.jax_sampler.compact_interval or None,
    )
    start_dir, warm_metrics = warm_start(
        config, run_dir, model_dir, codec, train_problems, sampler_args, grader, eval_prompts, eval_golds
    )

    mesh = sharding.make_mesh(config.mesh.to_dict())
    numerics = dict(
        param_dtype=config.param_dtype, dtype=config.dtype, attention=config.attention, scan_layers=config.scan_layers
    )
    model = hf.load_model(start_dir, remat=config.remat, **numerics)
    rules = sharding.qwen_rules(model.config.num_key_value_heads, mesh.shape["tp"])
    graphdef, params = nnx.split(model)
    params = sharding.shard_tree(params, mesh, rules)
    total = num_iterations(config)
    alg = config.algorithm_name
    needs_critic = algorithms.ALGORITHMS[alg].critic
    optimizer_settings, critic_optimizer_settings = optimizer_settings_of(config)
    optimizer = state_lib.make_optimizer(**optimizer_settings)
    critic_graphdef = critic_params = critic_optimizer = None
    if needs_critic:
        critic = value_head.load_critic(start_dir, seed=config.seed, **numerics)
        critic_graphdef, critic_params = nnx.split(critic)
        critic_params = sharding.shard_tree(critic_params, mesh, rules)
        critic_optimizer = state_lib.make_optimizer(**critic_optimizer_settings)
    else:
        critic_optimizer_settings = None
    state = state_lib.create_train_state(
        params, optimizer, seed=config.seed, critic_params=critic_params, critic_optimizer=critic_optimizer
    )
    state = place_state(state, mesh, rules)
    needs_ref = config.kl_coef > 0 or config.kl_reward_coef > 0
    ref_params = jax.tree.map(jnp.copy, params) if needs_ref else None
    update_cfg = update_config(config)
    # The asynchronous generator samples with the params the learner is updating: donating them to the update
    # would free buffers another thread is reading.
    update_settings = dict(
        critic_graphdef=critic_graphdef,
        donate=alg != "async_ppo",
        state_shardings=jax.tree.map(lambda leaf: leaf.sharding, state),  # the rules', call after call
    )
    update = update_lib.make_update_fn(
        graphdef, optimizer, update_cfg, critic_optimizer=critic_optimizer, **update_settings
    )
    loader = sources.ProblemLoader(train_problems, seed=config.seed)
    checkpointer = Checkpointer(
        os.path.join(run_dir, "checkpoints"), save_interval=config.save_interval, max_to_keep=config.max_to_keep
    )
    start_iteration = 0
    pending: List[Dict[str, Any]] = []
    shape_floors: Dict[str, Any] = {}
    if config.resume and checkpointer.latest_step() is not None:
        state, metadata = checkpointer.restore(state)
        loader.restore(metadata["data"])
        start_iteration = int(metadata["iteration"])
        pending = metadata.get(PENDING_KEY) or []
        # The batch shapes the run had grown to: a resumed run pads and packs as the uninterrupted one.
        shape_floors = dict(metadata.get(SHAPES_KEY) or {})
    distributed.on_main_process("config.json", lambda: _write_config(config, run_dir))
    sampler = _make_sampler(config, start_dir, model, codec, sampler_args)
    sampler.update_weights(state.params, int(state.policy_version))
    sinks = report_to(config)
    return Run(
        reward_fn=reward_fn,
        reward_functions=functions,
        config=config,
        run_dir=run_dir,
        codec=codec,
        graphdef=graphdef,
        state=state,
        ref_params=ref_params,
        critic_graphdef=critic_graphdef,
        sampler=sampler,
        grader=grader,
        loader=loader,
        eval_prompts=eval_prompts,
        eval_golds=eval_golds,
        update=update,
        skip_zero_advantage=update_cfg.skip_zero_advantage,
        logprobs=passes.compute_logprobs_fn(graphdef, config.temperature, config.micro_batch_size or None),
        values=passes.compute_values_fn(critic_graphdef, config.micro_batch_size or None) if needs_critic else None,
        checkpointer=checkpointer,
        logger=MetricsLogger(
            run_dir,
            tensorboard="tensorboard" in sinks,
            wandb=wandb_settings(config) if "wandb" in sinks else None,
            resumed_from=start_iteration,
        ),
        mesh=mesh,
        total_iterations=total,
        start_iteration=start_iteration,
        warmstart_metrics=warm_metrics,
        prm=prm,
        model_dir=start_dir,
        pending_rollouts=pending,
        shape_floors=shape_floors,
    )


def _write_config(config, run_dir: str) -> None:
    files.write_json(os.path.join(run_dir, "config.json"), config.to_dict(), indent=2, default=str)


PENDING_KEY = "pending_rollouts"
SHAPES_KEY = "shape_floors"
"""Checkpoint metadata: the batches an asynchronous generator had made ahead of the learner (`async_loop`)."""


RESUME_MAY_CHANGE = (
    "num_iterations",
    "num_env_steps",
    "resume",
    "run_dir",
    "resume_allow_changes",
    "eval_interval",
    "eval_n_samples",
    "num_eval_problems",
    "eval_dataset_path",
    "eval_dataset_split",
    "log_interval",
    "num_logged_samples",
    "save_interval",
    "max_to_keep",
    "progress",
    "report_to",
    "wandb_project",
    "wandb_mode",
    "export_final",
    "compilation_cache_dir",
    "heartbeat_timeout_s",
    "join_timeout_s",
    "reward.num_workers",
    "mesh.",
    "sampler_mesh.",
    "sampler",
    "jax_sampler.",
    "vllm.",
    "micro_batch_size",
    "remat",
    "scan_layers",
    "attention",
    "packing",
    "pack_length",
    "skip_zero_advantage",
)
"""Config keys (a trailing "." names a section) a resumed run may change: how long it runs, what it logs and
evaluates, where and how it computes (mesh, engine, memory settings, remat, layer scan, packing, skipping rows that
train nothing: the same updates, tested as invariances). Every other key changes what is trained and must equal the
saved run's, unless `resume_allow_changes` names it."""


def _may_change(key: str, allowed: Tuple[str, ...]) -> bool:
    return any(key == a or (a.endswith(".") and key.startswith(a)) for a in RESUME_MAY_CHANGE + allowed)


def _same_setting(saved: Any, value: Any) -> bool:
    """Equal values, or two spellings of one existing file or directory (relative and absolute paths)."""
    if saved == value:
        return True
    paths = isinstance(saved, str) and isinstance(value, str) and saved and value
    return bool(paths) and os.path.exists(saved) and os.path.exists(value) and os.path.samefile(saved, value)


def allowed_resume_changes(config) -> Tuple[str, ...]:
    """`resume_allow_changes` ("lr,warmup_steps"), each name a config key."""
    names = tuple(n.strip() for n in str(config.resume_allow_changes or "").split(",") if n.strip())
    known = {key for key, _ in flat_items(config)}
    unknown = [n for n in names if n not in known]
    if unknown:
        fail(f"resume_allow_changes={config.resume_allow_changes!r}: {unknown} are not config keys")
    return names


def check_resumed_config(config, run_dir: str) -> None:
    """A run that resumes a checkpoint in `run_dir` trains what the saved `config.json` says: each other key that
    differs is refused, naming it and both values, before anything is written."""
    path = os.path.join(run_dir, "config.json")
    checkpoints = os.path.join(run_dir, "checkpoints")
    if not config.resume or not os.path.isfile(path) or not os.path.isdir(checkpoints):
        return
    if not any(name.isdigit() for name in os.listdir(checkpoints)):
        return  # nothing trained yet
    with open(path) as f:
        saved = dict(flat_items(json.load(f)))
    # The config as `_write_config` saved it: tuples as lists, other objects as strings.
    current = dict(flat_items(json.loads(json.dumps(config.to_dict(), default=str))))
    allowed = allowed_resume_changes(config)
    changed = [
        f"{key}: {saved[key]!r} -> {value!r}"
        for key, value in current.items()
        if key in saved and not _same_setting(saved[key], value) and not _may_change(key, allowed)
    ]
    if changed:
        fail(
            f"run_dir {run_dir!r} holds a run with other settings ({'; '.join(changed)}), which this run would "
            "resume: use another --config.run_dir, --config.resume=False to start over, or name the keys meant to "
            "change in --config.resume_allow_changes"
        )


def place_state(state: state_lib.TrainState, mesh, rules) -> state_lib.TrainState:
    """Every leaf on the mesh: params and optimizer states by the partition rules, scalars replicated.

    Done before a restore too, so restored leaves land on the same shardings (the checkpoint takes the
    target's) and the jitted update sees one device set.
    """
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def put(tree):
        return None if tree is None else sharding.shard_tree(tree, mesh, rules)

    def put_optimizer_state(tree):
        return None if tree is None else distributed.put(tree, sharding.optimizer_state_shardings(tree, mesh, rules))

    return state.replace(
        params=put(state.params),
        opt_state=put_optimizer_state(state.opt_state),
        critic_params=put(state.critic_params),
        critic_opt_state=put_optimizer_state(state.critic_opt_state),
        **{
            k: distributed.put(getattr(state, k), replicated)
            for k in ("step", "rng", "policy_version", "skipped_updates")
        },
    )


def _make_sampler(config, model_dir, model, codec, sampler_args):
    if config.sampler == "vllm":
        return VllmSampler(
            model_dir,
            config=model.config,
            eos_token_ids=sampler_args["eos_token_ids"],
            tokenizer=codec,
            kv_cache_gib=config.vllm.kv_cache_gib,
            # Single-turn: what a row can hold; multi-turn prompts grow over the episode: the checkpoint's limit.
            max_model_len=None if config.env_name else config.max_prompt_length + config.max_new_tokens,
            dtype=config.vllm.dtype or config.dtype,
            seed=config.seed,
        )
    sampler_mesh = sharding.follow_mesh(config.sampler_mesh.to_dict(), config.mesh.to_dict())
    mesh = sharding.make_mesh(sampler_mesh) if jax.device_count() > 1 else None
    return JaxSampler(model, mesh=mesh, **sampler_args)
