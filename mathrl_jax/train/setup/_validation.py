"""Checks of a run's config that need no file: names, ranges, divisibility."""

from __future__ import annotations

import math
import os

import jax

from mathrl_jax import options, sharding
from mathrl_jax.configs import default
from mathrl_jax.data import sources
from mathrl_jax.errors import fail
from mathrl_jax.sampling.vllm.sampler import ENGINE_DTYPES
from mathrl_jax.sampling.vllm.server import is_server_url
from mathrl_jax.train import algorithms
from mathrl_jax.train import update as update_lib
from mathrl_jax.train.reporting import REPORT_TO, report_sinks
from mathrl_jax.train.setup._help import flat_items
from mathrl_jax.train.setup._task_checks import check_column_chain, check_countdown, check_env, check_held_out_pool

BUILT_IN_TASKS = ("arithmetic", "countdown")
"""The dataset_names of the procedural tasks, which read no file."""
DATASET_LAYOUTS = ("auto", "math500", "math", "gsm8k", "areal_boba", "verl", "trl", "custom")
"""The dataset_names of a file's layout (`data.sources.LAYOUTS`); "custom" is the one `data.fields` maps."""


MAX_ROWS_PER_ITERATION = 2**24
"""The most completions one iteration may sample (n_rollout_threads x group_size): 16 Mi, a thousand times a large
verl batch (1024 prompts x 16); past it a run would not hold its rollouts, only hang or run out of memory."""


ALGORITHM_SPELLINGS = {"dr_grpo": "drgrpo", "dr-grpo": "drgrpo", "reinforce_plus_plus_baseline": "reinforce_pp"}
"""Other systems' names of the algorithms here: TRL's `dr_grpo` (its `loss_type`), verl's adv_estimator
`reinforce_plus_plus_baseline`."""


def normalize_config(config) -> None:
    """Spellings other systems use, in place: names in any case (the options `case_free` in the table), other
    systems' algorithm names (`ALGORITHM_SPELLINGS`), TRL's loss_type names of loss_agg_mode's values."""
    for option in options.options_of(default.OPTIONS):
        if option.case_free and isinstance(config[option.key], str):
            config[option.key] = config[option.key].lower()
    config.algorithm_name = ALGORITHM_SPELLINGS.get(config.algorithm_name, config.algorithm_name)
    from mathrl_jax.losses import aggregate

    if config.loss_agg_mode in aggregate.TRL_LOSS_TYPES:  # one spelling of a mode: a resume compares it as text
        config.loss_agg_mode = aggregate.canonical_loss_agg_mode(config.loss_agg_mode)
    from mathrl_jax.models import lora

    try:  # one spelling of a target list ("v_proj, q_proj" is "q_proj,v_proj"): a resume compares it as text
        config.lora.targets = ",".join(lora.resolve_targets(config.lora.targets))
    except (ValueError, TypeError):
        pass  # refused by validate_values, naming it


def validate_values(config) -> None:
    """Every number finite (`lr=nan` would train a NaN model), every option in its bounds and among its choices
    (as `configs/default.py` defines them), the arithmetic levels known; each refusal names the key and value."""
    from mathrl_jax.data import arithmetic  # the task's own level table

    c = config
    for key, value in flat_items(c):
        numbers = value if isinstance(value, (tuple, list)) else (value,)
        for number in numbers:
            if isinstance(number, float) and not math.isfinite(number):
                fail(f"{key}={value}: must be a finite number")
    values = dict(flat_items(c))
    for option in options.options_of(default.OPTIONS):
        value = values.get(option.key)
        error = options.range_error(option, value) or options.choice_error(option, value)
        if error:
            fail(error)
    if c.dapo.success_rate_lb > c.dapo.success_rate_ub:  # the two bounds of one filter
        fail(f"dapo.success_rate_lb={c.dapo.success_rate_lb} exceeds dapo.success_rate_ub={c.dapo.success_rate_ub}")
    levels = c.arithmetic.levels
    levels = tuple(levels) if isinstance(levels, (tuple, list)) else (levels,)
    unknown = [level for level in levels if isinstance(level, bool) or level not in arithmetic.LEVELS]
    if not levels or unknown:
        fail(f"arithmetic.levels={c.arithmetic.levels!r}: expected levels among {sorted(arithmetic.LEVELS)}")
    check_column_chain(c, levels)
    check_countdown(c)
    check_held_out_pool(c)
    if isinstance(c.lora.rank, bool) or not isinstance(c.lora.rank, int):
        fail(f"lora.rank={c.lora.rank!r}: must be a whole number (0: no adapters)")
    if c.sampler == "vllm" and c.vllm.lora_sync == "adapter" and isinstance(c.lora.rank, int) and c.lora.rank > 512:
        fail(f"lora.rank={c.lora.rank} with vllm.lora_sync='adapter': vLLM's LoRA takes ranks up to 512")
    if c.lora.dropout and not c.lora.rank:
        fail(f"lora.dropout={c.lora.dropout} drops the input of LoRA adapters: it needs lora.rank > 0 (got 0)")
    if c.lora.rank:
        from mathrl_jax.models import lora

        try:
            lora.resolve_targets(c.lora.targets)
        except ValueError as e:
            fail(f"lora.targets: {e}")
    sinks = report_sinks(c.report_to)
    if not sinks or [n for n in sinks if n not in REPORT_TO] or ("none" in sinks and len(sinks) > 1):
        fail(f"report_to={c.report_to!r}: expected 'none' or a comma-separated list of {', '.join(REPORT_TO[1:])}")
    if "wandb" in sinks:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            fail(f"report_to={c.report_to!r} includes wandb, which is not installed: pip install -e '.[wandb]'")
    if c.dataset_path and c.dataset_name in BUILT_IN_TASKS:
        fail(
            f"dataset_path={c.dataset_path!r} is set but dataset_name={c.dataset_name!r} (a built-in task, which "
            "reads no file): start from the own-data recipe, which reads it (any layout, an instruct model, its "
            f"chat template): --config=mathrl_jax/configs/own_data.py --config.dataset_path={c.dataset_path} "
            "(or keep this config with --config.dataset_name=auto --config.warmstart.steps=0 and a "
            "max_prompt_length that holds your prompts)"
        )
    if c.run_dir and os.path.exists(c.run_dir) and not os.path.isdir(c.run_dir):
        fail(f"run_dir={c.run_dir!r} exists and is not a directory")


def validate_config(config) -> None:
    """Every check that needs no file: names, ranges, divisibility, and the processes and devices the run has."""
    validate_settings(config)
    validate_placement(config)


def validate_settings(config) -> None:
    """The checks that need neither a file nor JAX's backend: names, ranges, divisibility.

    `scripts/train.py` runs these before `jax.distributed` joins the processes: every process refuses the same
    bad config alone, and none is aborted by a coordination service that a peer's exit took down. Each option's
    own bounds and choices are the table's (`validate_values`); the rules here span several options.
    """
    c = config
    normalize_config(c)
    validate_values(c)
    algorithm = algorithms.ALGORITHMS[c.algorithm_name]
    check_data_source(c)
    check_batch_shape(c)
    check_algorithm_fits(c, algorithm)
    check_rewards(c)
    check_old_logprobs(c, algorithm)
    check_stress_knobs(c, algorithm)
    if c.sampler == "vllm":
        check_vllm(c, algorithm)
    if c.tis_cap is not None:
        check_tis(c, algorithm)
    if c.env_name not in ("", "guess_number"):
        fail(f"unknown env_name {c.env_name!r}; expected '' (single-turn problems) or 'guess_number'")


def check_data_source(c) -> None:
    """A dataset_name the run knows, with the file a layout needs."""
    if c.dataset_name not in BUILT_IN_TASKS + DATASET_LAYOUTS + sources.MATH_SUBJECTS:
        fail(
            f"unknown dataset_name {c.dataset_name!r}; expected a built-in task {BUILT_IN_TASKS}, a layout "
            f"{DATASET_LAYOUTS} or a MATH "
            f"subject (OpenR's --dataset_name, which keeps that subject's problems) {sources.MATH_SUBJECTS}"
        )
    if c.dataset_name not in BUILT_IN_TASKS and not c.dataset_path:
        fail(f"dataset_name={c.dataset_name!r} needs --config.dataset_path (a local file or directory)")
    check_data_fields(c)
    check_eval_holdout(c)


def check_data_fields(c) -> None:
    """`data.fields` parses (`sources.parse_fields`) and is the layout of a file (dataset_name "auto" or "custom");
    "custom" needs it. Whether the file has those fields is checked where it loads."""
    if not c.data.fields:
        if c.dataset_name == "custom":
            fail("dataset_name='custom' needs --config.data.fields (e.g. question:problem,answer:gold)")
        return
    if c.dataset_name not in ("auto", "custom"):
        fail(
            f"data.fields={c.data.fields!r} defines the layout, but dataset_name={c.dataset_name!r} names another: "
            "use --config.dataset_name=auto (or custom) with data.fields, or drop data.fields"
        )
    try:
        sources.parse_fields(c.data.fields)
    except ValueError as error:
        fail(str(error))


def check_eval_holdout(c) -> None:
    """`eval_holdout` holds problems of a data file out for evaluation: it reaches nothing with an evaluation file
    or split of its own, or with a built-in task (which draws its held-out problems apart)."""
    if c.eval_holdout == -1:
        return
    if c.dataset_name in BUILT_IN_TASKS:
        fail(
            f"eval_holdout={c.eval_holdout} holds problems of a data file out, but dataset_name={c.dataset_name!r} "
            f"draws its held-out problems apart ({c.dataset_name}.num_eval); --config.num_eval_problems=0 evaluates "
            "none"
        )
    if c.eval_holdout > 0 and (c.eval_dataset_path or c.eval_dataset_split):
        fail(
            f"eval_holdout={c.eval_holdout} holds problems of the training file out, but the run evaluates on "
            f"eval_dataset_path={c.eval_dataset_path!r}, eval_dataset_split={c.eval_dataset_split!r}: drop one"
        )
    if c.eval_holdout > c.num_eval_problems:  # the problems past it would be neither trained on nor evaluated
        fail(
            f"eval_holdout={c.eval_holdout} holds out more problems than num_eval_problems={c.num_eval_problems} "
            f"evaluates: raise num_eval_problems to {c.eval_holdout}, or hold out fewer"
        )


def check_batch_shape(c) -> None:
    """An iteration's rows split into the minibatches, and a minibatch into the micro-batches."""
    rows = c.n_rollout_threads * (c.episode_length if c.env_name else c.group_size)
    if rows > MAX_ROWS_PER_ITERATION:
        fail(
            f"{rows} rows per iteration (n_rollout_threads={c.n_rollout_threads} x "
            + (f"episode_length={c.episode_length}" if c.env_name else f"group_size={c.group_size}")
            + f") is over the limit of {MAX_ROWS_PER_ITERATION} (MAX_ROWS_PER_ITERATION, "
            "mathrl_jax/train/setup/_validation.py)"
        )
    if rows % c.num_mini_batch:
        fail(
            f"{rows} rows per iteration (n_rollout_threads x group_size, or x episode_length for envs) do not split "
            f"into num_mini_batch={c.num_mini_batch}"
        )
    mini = rows // c.num_mini_batch
    if c.micro_batch_size and c.micro_batch_size < mini and mini % c.micro_batch_size:
        fail(f"a minibatch of {mini} rows does not split into micro_batch_size={c.micro_batch_size}")


def check_algorithm_fits(c, algorithm) -> None:
    """The algorithm fits the run: groups for group baselines, a multi-turn algorithm for an environment, a LoRA
    base and a critic for a shared critic base, and a multi-turn warm-start that imitates the game's teacher."""
    if c.env_name:
        check_env(c)
    if c.env_name and c.group_size != 1:
        fail(f"env_name={c.env_name!r}: one episode per environment, so group_size must be 1 (got {c.group_size})")
    if algorithm.groups and c.group_size < 2:
        fail(f"{c.algorithm_name} compares samples of one prompt: group_size={c.group_size} must be >= 2")
    if c.lora.share_critic_base and not (algorithm.critic and c.lora.rank):
        fail(
            f"lora.share_critic_base=True: the critic shares a LoRA run's frozen base; {c.algorithm_name!r} with "
            f"lora.rank={c.lora.rank} has " + ("no frozen base (rank 0)" if algorithm.critic else "no critic")
        )
    if c.env_name and not algorithm.multi_turn:
        multi_turn = [name for name, a in algorithms.ALGORITHMS.items() if a.multi_turn]
        fail(
            f"env_name={c.env_name!r} (multi-turn) trains with algorithm_name in {multi_turn}, not {c.algorithm_name!r}"
        )
    sequence_or_action = algorithm.policy_loss == "gspo" or (algorithm.actions and c.appo_action_ratio)
    if c.clip_c is not None and sequence_or_action and algorithm.policy_loss != "ppo":
        fail(
            f"clip_c={c.clip_c} (the dual clip of token-level PPO) is not part of {c.algorithm_name}'s loss "
            f"({algorithm.policy_loss!r}); drop it"
        )
    if c.env_name and c.warmstart.steps > 0 and c.warmstart.targets != "teacher":
        fail(
            f"warmstart.targets={c.warmstart.targets!r} with env_name={c.env_name!r}: a multi-turn warm-start "
            "imitates the game's teacher (warmstart.targets='teacher'), or use --config.warmstart.steps=0"
        )


def check_rewards(c) -> None:
    """The reward source has what it reads: reward functions named, single-turn for them, a PRM, and the
    rule-based process verifiers on their own task."""
    if ("functions" in c.reward_source) != bool(str(c.reward.functions).strip()):
        fail(
            f"reward_source={c.reward_source!r} with reward.functions={c.reward.functions!r}: functions are used with "
            "reward_source 'functions' or 'verifier+functions', and those need reward.functions ('module:function')"
        )
    if "functions" in c.reward_source and c.env_name:
        fail(f"reward.functions score single-turn completions; env_name={c.env_name!r} is multi-turn")
    if "prm" in c.reward_source and c.prm_model_name_or_path == "arithmetic_steps":
        levels = (
            tuple(c.arithmetic.levels) if isinstance(c.arithmetic.levels, (tuple, list)) else (c.arithmetic.levels,)
        )
        if c.dataset_name != "arithmetic" or levels != (2,) or c.step_separator != ",":
            fail(
                "prm_model_name_or_path='arithmetic_steps' (the offline task's process verifier) scores the column "
                "steps of a+b / a-b (level 2, any arithmetic.digits): it needs dataset_name='arithmetic', "
                "arithmetic.levels=2 and "
                f"step_separator=',' (got {c.dataset_name!r}, {levels}, {c.step_separator!r})"
            )
    if "prm" in c.reward_source and c.prm_model_name_or_path == "countdown_steps":
        if c.dataset_name != "countdown" or c.step_separator != ",":
            fail(
                "prm_model_name_or_path='countdown_steps' (countdown's process verifier) scores the steps of a "
                "countdown derivation: it needs dataset_name='countdown' and step_separator=',' (got "
                f"{c.dataset_name!r}, {c.step_separator!r})"
            )
    if "prm" in c.reward_source and not c.prm_model_name_or_path:
        fail(f"reward_source={c.reward_source!r} needs --config.prm_model_name_or_path (a local PRM checkpoint)")


def check_old_logprobs(c, algorithm) -> None:
    """The sampler's log-probs as PPO's old ones only where they are the policy's (temperature 1, single turn,
    not the decoupled loss)."""
    if c.old_logprobs == "sampler" and (c.temperature != 1.0 or algorithm.decoupled or c.env_name):
        fail(
            "old_logprobs='sampler' needs temperature=1.0 (the sampler reports the untempered policy's log-probs), "
            f"a single-turn run and not async_ppo (whose decoupled loss recomputes them); got temperature="
            f"{c.temperature}, algorithm_name={c.algorithm_name!r}, env_name={c.env_name!r}"
        )


def check_vllm(c, algorithm) -> None:
    """vLLM's settings agree: its dtype, a server's address and its own tensor parallelism, LoRA adapters on one
    in-process worker, and its log-probs where the algorithm reads them."""
    if c.vllm.dtype not in ("", *ENGINE_DTYPES):
        fail(f"unknown vllm.dtype {c.vllm.dtype!r}; expected '' (= dtype) or one of {ENGINE_DTYPES}")
    tp = c.vllm.tensor_parallel_size
    if c.vllm.server_url and not is_server_url(c.vllm.server_url):
        fail(f"vllm.server_url={c.vllm.server_url!r}: expected '' (the engine in this process) or http://host:port")
    if c.vllm.server_url and tp > 1:
        fail(
            f"vllm.tensor_parallel_size={tp} with vllm.server_url: a server's tensor parallelism is its own "
            "(scripts/vllm_server.py --tensor-parallel-size)"
        )
    if c.vllm.lora_sync == "adapter" and c.lora.rank and (c.vllm.server_url or tp > 1):
        fail(
            "vllm.lora_sync='adapter' runs on one in-process worker: use vllm.lora_sync='merged' with "
            f"vllm.server_url={c.vllm.server_url!r}, vllm.tensor_parallel_size={tp}"
        )
    filtered = c.top_p < 1.0 or c.top_k > 0 or c.min_p > 0.0 or c.repetition_penalty != 1.0
    if (c.old_logprobs == "sampler" or algorithm.decoupled) and (filtered or c.temperature != 1.0):
        fail(
            "sampler='vllm' reports the policy's own log-probs only at temperature 1 without top_p / top_k / "
            "min_p / repetition_penalty (it reports those of the distribution it sampled from); "
            "old_logprobs='sampler' and async_ppo's behaviour log-probs need them: got "
            f"temperature={c.temperature}, top_p={c.top_p}, top_k={c.top_k}, min_p={c.min_p}, "
            f"repetition_penalty={c.repetition_penalty}"
        )


def check_tis(c, algorithm) -> None:
    """Truncated importance sampling on a token-level loss, batch whitening, one turn, recomputed old log-probs."""
    loss = algorithm.policy_loss
    if not update_lib.policy_loss_use(loss).token_weighted:
        weighted = [name for name, use in update_lib.POLICY_LOSS_USES.items() if use.token_weighted]
        fail(
            f"tis_cap={c.tis_cap} weights a token-level policy loss {weighted}; algorithm_name="
            f"{c.algorithm_name!r} trains {loss!r}"
            + (" whose behaviour weight already corrects for the sampler" if algorithm.decoupled else "")
        )
    if c.advantage_whitening != "batch":
        fail(
            f"tis_cap={c.tis_cap} with advantage_whitening={c.advantage_whitening!r}: the weights scale the "
            "advantages, which per-minibatch whitening would undo; use advantage_whitening='batch'"
        )
    if c.env_name:
        fail(f"tis_cap={c.tis_cap} is for single-turn runs; env_name={c.env_name!r} is multi-turn")
    if c.old_logprobs == "sampler":
        fail(
            f"tis_cap={c.tis_cap} with old_logprobs='sampler': the weight pi_trainer / pi_sampler needs the "
            "trainer's recomputed log-probs (old_logprobs='auto' or 'trainer')"
        )


def check_stress_knobs(c, algorithm) -> None:
    """The testbed's staleness and log-prob noise act on single-turn rollouts, and the noise only where
    something reads the sampler's log-probs."""
    for name in ("max_head_offpolicyness", "sampler_logprob_noise"):
        if c[name] and c.env_name:
            fail(f"{name}={c[name]} acts on single-turn rollouts; env_name={c.env_name!r} plays multi-turn episodes")
    # With noise, old_logprobs="auto" recomputes (sections.old_logprobs_from_sampler): only "sampler" reads them.
    if c.sampler_logprob_noise and not (algorithm.decoupled or c.tis_cap is not None or c.old_logprobs == "sampler"):
        fail(
            f"sampler_logprob_noise={c.sampler_logprob_noise} reaches nothing: algorithm_name={c.algorithm_name!r} "
            f"recomputes the old log-probs (old_logprobs={c.old_logprobs!r}); use --config.old_logprobs=sampler, "
            "--config.tis_cap, or async_ppo"
        )


def validate_placement(config) -> None:
    """The checks against the processes and devices this run has (these start JAX's backend)."""
    c = config
    stale = c.max_head_offpolicyness > 0
    if jax.process_count() > 1 and (algorithms.ALGORITHMS[c.algorithm_name].decoupled or c.env_name or stale):
        fail(
            f"algorithm_name={c.algorithm_name!r} with env_name={c.env_name!r}, max_head_offpolicyness="
            f"{c.max_head_offpolicyness} runs in one process only: across "
            f"{jax.process_count()} processes every process must issue the same device programs in the same order, "
            "which the generator thread (async_ppo, or any run with max_head_offpolicyness > 0) and the multi-turn "
            "episodes do not guarantee yet"
        )
    try:
        sharding.resolve_mesh_shape(c.mesh.to_dict(), jax.device_count())
    except (sharding.MeshError, ValueError) as error:
        fail(f"bad mesh {c.mesh.to_dict()}: {error}")


def num_iterations(config) -> int:
    """`num_iterations`, or `num_env_steps` over the samples one iteration takes."""
    if config.num_env_steps:
        per_iteration = config.n_rollout_threads * config.group_size * config.episode_length
        return max(1, math.ceil(config.num_env_steps / per_iteration))
    return int(config.num_iterations)
