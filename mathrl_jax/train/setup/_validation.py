"""Checks of a run's config that need no file: names, ranges, divisibility."""

from __future__ import annotations

import math
import os

import jax

from mathrl_jax import losses, sharding
from mathrl_jax.configs import default, options
from mathrl_jax.data import prompts, sources
from mathrl_jax.envs import MULTI_TURN_ENVS
from mathrl_jax.errors import fail
from mathrl_jax.models import qwen
from mathrl_jax.sampling.base import LORA_SYNCS
from mathrl_jax.sampling.vllm.plugin import TRANSFERS
from mathrl_jax.sampling.vllm.sampler import ENGINE_DTYPES
from mathrl_jax.sampling.vllm.server import is_server_url
from mathrl_jax.train import algorithms
from mathrl_jax.train import state as state_lib
from mathrl_jax.train import update as update_lib
from mathrl_jax.train.reporting import REPORT_TO, report_sinks
from mathrl_jax.train.setup._help import flat_items

REWARD_SOURCES = ("verifier", "prm", "prm+verifier", "functions", "verifier+functions")
BUILT_IN_TASKS = ("arithmetic", "countdown")
"""The dataset_names of the procedural tasks, which read no file."""
DATASET_LAYOUTS = ("auto", "math500", "math", "gsm8k", "areal_boba", "verl")


CASE_FREE_KEYS = ("algorithm_name", "sampler", "kl_kind", "optimizer")
"""Names taken in any case (OpenR writes `APPO`): lower-cased before they are checked."""


ALGORITHM_SPELLINGS = {"dr_grpo": "drgrpo", "dr-grpo": "drgrpo"}
"""Other systems' names of the algorithms here: TRL's `dr_grpo` (its `loss_type`)."""


def normalize_config(config) -> None:
    """Spellings other systems use, in place: names in any case (`CASE_FREE_KEYS`), other systems' algorithm names
    (`ALGORITHM_SPELLINGS`)."""
    for key in CASE_FREE_KEYS:
        if isinstance(config[key], str):
            config[key] = config[key].lower()
    config.algorithm_name = ALGORITHM_SPELLINGS.get(config.algorithm_name, config.algorithm_name)
    from mathrl_jax.models import lora

    try:  # one spelling of a target list ("v_proj, q_proj" is "q_proj,v_proj"): a resume compares it as text
        config.lora.targets = ",".join(lora.resolve_targets(config.lora.targets))
    except (ValueError, TypeError):
        pass  # refused by validate_values, naming it


# (dotted key, lowest, highest, whether the lowest is allowed): a value outside is refused, naming both.
def validate_values(config) -> None:
    """Every number finite (`lr=nan` would train a NaN model), every option in its bounds (as `configs/default.py`
    defines them), the arithmetic levels known; each refusal names the key and the value."""
    from mathrl_jax.data import arithmetic  # the task's own level table

    c = config
    for key, value in flat_items(c):
        numbers = value if isinstance(value, (tuple, list)) else (value,)
        for number in numbers:
            if isinstance(number, float) and not math.isfinite(number):
                fail(f"{key}={value}: must be a finite number")
    values = dict(flat_items(c))
    for option in options.options_of(default.OPTIONS):
        error = options.range_error(option, values.get(option.key))
        if error:
            fail(error)
    if c.dapo.success_rate_lb > c.dapo.success_rate_ub:
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
    for section in ("vllm", "jax_sampler"):
        if c[section].lora_sync not in LORA_SYNCS:
            fail(f"{section}.lora_sync={c[section].lora_sync!r}: expected 'merged' or 'adapter'")
    if c.sampler == "vllm" and c.vllm.lora_sync == "adapter" and isinstance(c.lora.rank, int) and c.lora.rank > 512:
        fail(f"lora.rank={c.lora.rank} with vllm.lora_sync='adapter': vLLM's LoRA takes ranks up to 512")
    if c.lora.rank:
        from mathrl_jax.models import lora

        try:
            lora.resolve_targets(c.lora.targets)
        except ValueError as e:
            fail(f"lora.targets: {e}")
    if c.optimizer not in state_lib.OPTIMIZERS:
        fail(f"unknown optimizer {c.optimizer!r}; expected one of {', '.join(state_lib.OPTIMIZERS)}")
    sinks = report_sinks(c.report_to)
    if not sinks or [n for n in sinks if n not in REPORT_TO] or ("none" in sinks and len(sinks) > 1):
        fail(f"report_to={c.report_to!r}: expected 'none' or a comma-separated list of {', '.join(REPORT_TO[1:])}")
    if "wandb" in sinks:
        import importlib.util

        if c.wandb_mode not in ("offline", "online"):
            fail(f"wandb_mode={c.wandb_mode!r}: expected 'offline' or 'online'")
        if importlib.util.find_spec("wandb") is None:
            fail(f"report_to={c.report_to!r} includes wandb, which is not installed: pip install -e '.[wandb]'")
    if c.kl_kind not in losses.KL_KINDS:
        fail(f"unknown kl_kind {c.kl_kind!r}; expected one of {', '.join(losses.KL_KINDS)}")
    if c.dataset_path and c.dataset_name in BUILT_IN_TASKS:
        fail(
            f"dataset_path={c.dataset_path!r} is set but dataset_name={c.dataset_name!r} (a built-in task, which "
            "reads no file): name the file's layout, e.g. --config.dataset_name=auto"
        )
    if c.run_dir and os.path.exists(c.run_dir) and not os.path.isdir(c.run_dir):
        fail(f"run_dir={c.run_dir!r} exists and is not a directory")


def check_column_chain(c, levels: tuple) -> None:
    """`arithmetic.digits` and `arithmetic.eval_digits` (the column chain, `data/arithmetic.py`): whole numbers in
    range, on level 2 alone, and, with the tiny model warm-started on the teacher (one token per character), a
    `max_new_tokens` that holds the longest worked solution at those lengths."""
    from mathrl_jax.data import arithmetic, teacher

    a = c.arithmetic
    low, high = arithmetic.MIN_DIGITS, arithmetic.MAX_DIGITS
    for key, value, off in (("digits", a.digits, None), ("eval_digits", a.eval_digits, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not (low <= value <= high or value == off):
            allowed = f"{low} to {high}" if off is None else f"0 (none) or {low} to {high}"
            fail(f"arithmetic.{key}={value!r}: expected a whole number, {allowed}")
    if a.digits != 2 and levels != (2,):
        fail(
            f"arithmetic.digits={a.digits} sets the operands of level 2 (a+b, a-b): use --config.arithmetic.levels=2, "
            f"got arithmetic.levels={c.arithmetic.levels!r}"
        )
    if a.eval_digits:
        if c.dataset_name != "arithmetic" or c.env_name or levels != (2,):
            fail(
                f"arithmetic.eval_digits={a.eval_digits} draws a held-out set of level 2 of the arithmetic task: it "
                f"needs dataset_name='arithmetic', arithmetic.levels=2 and no env_name (got {c.dataset_name!r}, "
                f"{levels}, {c.env_name!r})"
            )
        if not c.num_eval_problems:
            fail(f"arithmetic.eval_digits={a.eval_digits} evaluates num_eval_problems problems: got 0")
    # Only where the policy writes the teacher's solutions (the tiny model warm-started on them; its tokenizer
    # takes a token per character), and only longer ones: two digits fit every budget the tests and recipes use.
    lengths = [(key, a[key]) for key in ("digits", "eval_digits") if a[key] > 2]
    teacher_warmstart = c.warmstart.steps > 0 and c.warmstart.targets == "teacher"
    if c.dataset_name == "arithmetic" and not c.env_name and not c.model_name_or_path and teacher_warmstart:
        for key, digits in lengths:
            needed = teacher.longest_solution(digits) + 1  # + EOS
            if c.max_new_tokens < needed:
                fail(
                    f"max_new_tokens={c.max_new_tokens} is under the {needed} tokens (with EOS) of the longest worked "
                    f"solution at arithmetic.{key}={digits}: raise max_new_tokens to {needed}"
                )


def check_held_out_pool(c) -> None:
    """A generated task draws its held-out set once (`arithmetic.num_eval`, `countdown.num_eval`, which also keeps
    those problems out of training); `num_eval_problems` evaluates that many of them, so more than the pool holds
    would be cut to the pool without a word."""
    pools = {"arithmetic": "arithmetic.num_eval", "countdown": "countdown.num_eval"}
    if c.env_name or c.dataset_name not in pools:
        return
    pool = pools[c.dataset_name]
    size = c[c.dataset_name].num_eval
    if c.num_eval_problems > size:
        fail(
            f"num_eval_problems={c.num_eval_problems} is more than the {size} held-out problems {pool} draws: "
            f"raise --config.{pool} to {c.num_eval_problems}, or lower num_eval_problems"
        )


def check_countdown(c) -> None:
    """`config.countdown` (`data/countdown/`): the instance settings in range, `eval_count` 0 or a count, and, with
    the tiny model warm-started on the teacher (one token per character), a `max_new_tokens` that holds the
    teacher's longest solution at either count."""
    from mathrl_jax.data.countdown import problems, rules, teacher

    s = c.countdown
    try:
        problems.check_settings(s.count, s.min_number, s.max_number, s.max_target)
    except ValueError as error:
        fail(f"countdown.{error}")
    low, high = rules.MIN_NUMBERS, rules.MAX_NUMBERS
    if (
        isinstance(s.eval_count, bool)
        or not isinstance(s.eval_count, int)
        or not (s.eval_count == 0 or low <= s.eval_count <= high)
    ):
        fail(f"countdown.eval_count={s.eval_count!r}: expected 0 (none) or a whole number from {low} to {high}")
    if s.eval_count and c.dataset_name != "countdown":
        fail(
            f"countdown.eval_count={s.eval_count} draws a held-out set of countdown: it needs dataset_name='countdown'"
        )
    if s.eval_count and not c.num_eval_problems:
        fail(f"countdown.eval_count={s.eval_count} evaluates num_eval_problems problems: got 0")
    if c.dataset_name == "countdown" and c.env_name:
        fail(f"dataset_name='countdown' is a single-turn task; env_name={c.env_name!r} plays a game instead")
    teacher_warmstart = c.warmstart.steps > 0 and c.warmstart.targets == "teacher"
    if c.dataset_name == "countdown" and not c.model_name_or_path and teacher_warmstart:
        for key in ("count", "eval_count"):
            if s[key]:
                needed = teacher.longest_solution(s[key], s.max_number) + 1  # + EOS
                if c.max_new_tokens < needed:
                    fail(
                        f"max_new_tokens={c.max_new_tokens} is under the {needed} tokens (with EOS) of the countdown "
                        f"teacher's longest solution at countdown.{key}={s[key]}: raise max_new_tokens to {needed}"
                    )


def validate_config(config) -> None:
    """Every check that needs no file: names, ranges, divisibility, and the processes and devices the run has."""
    validate_settings(config)
    validate_placement(config)


def validate_settings(config) -> None:
    """The checks that need neither a file nor JAX's backend: names, ranges, divisibility.

    `scripts/train.py` runs these before `jax.distributed` joins the processes: every process refuses the same
    bad config alone, and none is aborted by a coordination service that a peer's exit took down.
    """
    c = config
    normalize_config(c)
    validate_values(c)
    if c.algorithm_name not in algorithms.ALGORITHMS:
        fail(f"unknown algorithm_name {c.algorithm_name!r}; expected one of {', '.join(algorithms.NAMES)}")
    if c.sampler not in ("jax", "vllm"):
        fail(f"unknown sampler {c.sampler!r}; expected 'jax' or 'vllm'")
    if c.dataset_name not in BUILT_IN_TASKS + DATASET_LAYOUTS + sources.MATH_SUBJECTS:
        fail(
            f"unknown dataset_name {c.dataset_name!r}; expected a built-in task {BUILT_IN_TASKS}, a layout "
            f"{DATASET_LAYOUTS} or a MATH "
            f"subject (OpenR's --dataset_name, which keeps that subject's problems) {sources.MATH_SUBJECTS}"
        )
    if c.advantage_whitening not in ("batch", "openr"):
        fail(f"unknown advantage_whitening {c.advantage_whitening!r}; expected 'batch' or 'openr'")
    if c.value_loss_type not in losses.value.VALUE_LOSS_TYPES:
        fail(f"unknown value_loss_type {c.value_loss_type!r}; expected one of {losses.value.VALUE_LOSS_TYPES}")
    if c.dataset_name not in BUILT_IN_TASKS and not c.dataset_path:
        fail(f"dataset_name={c.dataset_name!r} needs --config.dataset_path (a local file or directory)")
    if c.prompt_template not in prompts.TEMPLATE_NAMES:
        fail(f"unknown prompt_template {c.prompt_template!r}; expected one of {prompts.TEMPLATE_NAMES}")
    positive = (
        "n_rollout_threads",
        "group_size",
        "episode_length",
        "max_new_tokens",
        "ppo_epoch",
        "num_mini_batch",
        "max_prompt_length",
        "log_interval",
    )
    for name in positive:
        if int(c[name]) < 1:
            fail(f"{name}={c[name]} must be >= 1")
    for name in (
        "num_iterations",
        "num_env_steps",
        "eval_interval",
        "save_interval",
        "micro_batch_size",
        "pack_length",
        "max_head_offpolicyness",
        "eval_n_samples",
        "num_logged_samples",
    ):
        if int(c[name]) < 0:
            fail(f"{name}={c[name]} must be >= 0")
    rows = c.n_rollout_threads * (c.episode_length if c.env_name else c.group_size)
    if rows % c.num_mini_batch:
        fail(
            f"{rows} rows per iteration (n_rollout_threads x group_size, or x episode_length for envs) do not split "
            f"into num_mini_batch={c.num_mini_batch}"
        )
    mini = rows // c.num_mini_batch
    if c.micro_batch_size and c.micro_batch_size < mini and mini % c.micro_batch_size:
        fail(f"a minibatch of {mini} rows does not split into micro_batch_size={c.micro_batch_size}")
    if not (c.lr > 0 and c.critic_lr > 0):
        fail(f"lr={c.lr} and critic_lr={c.critic_lr} must be > 0")
    if not 0.0 < c.temperature or not 0.0 < c.top_p <= 1.0:
        fail(f"temperature={c.temperature} must be > 0 and top_p={c.top_p} in (0, 1] for RL sampling")
    if c.env_name:
        check_env(c)
    if c.env_name and c.group_size != 1:
        fail(f"env_name={c.env_name!r}: one episode per environment, so group_size must be 1 (got {c.group_size})")
    algorithm = algorithms.ALGORITHMS[c.algorithm_name]
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
    if c.reward_source not in REWARD_SOURCES:
        fail(f"unknown reward_source {c.reward_source!r}; expected one of {REWARD_SOURCES}")
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
    if c.env_name and c.warmstart.steps > 0 and c.warmstart.targets != "teacher":
        fail(
            f"warmstart.targets={c.warmstart.targets!r} with env_name={c.env_name!r}: a multi-turn warm-start "
            "imitates the game's teacher (warmstart.targets='teacher'), or use --config.warmstart.steps=0"
        )
    if c.old_logprobs not in ("auto", "sampler", "trainer"):
        fail(f"unknown old_logprobs {c.old_logprobs!r}; expected 'auto', 'sampler' or 'trainer'")
    if c.old_logprobs == "sampler" and (c.temperature != 1.0 or algorithm.decoupled or c.env_name):
        fail(
            "old_logprobs='sampler' needs temperature=1.0 (the sampler reports the untempered policy's log-probs), "
            f"a single-turn run and not async_ppo (whose decoupled loss recomputes them); got temperature="
            f"{c.temperature}, algorithm_name={c.algorithm_name!r}, env_name={c.env_name!r}"
        )
    check_stress_knobs(c, algorithm)
    if c.attention not in qwen.ATTENTION_IMPLEMENTATIONS:
        fail(f"unknown attention {c.attention!r}; expected one of {qwen.ATTENTION_IMPLEMENTATIONS}")
    if not c.jax_sampler.kv_cache_gib > 0:
        fail(f"jax_sampler.kv_cache_gib={c.jax_sampler.kv_cache_gib} must be > 0 (GiB of KV cache)")
    if c.jax_sampler.compact_interval < 0:
        fail(f"jax_sampler.compact_interval={c.jax_sampler.compact_interval} must be >= 0 (decode steps; 0 = never)")
    if c.sampler == "vllm":
        if not c.vllm.kv_cache_gib > 0:
            fail(f"vllm.kv_cache_gib={c.vllm.kv_cache_gib} must be > 0 (GiB of KV cache)")
        if c.vllm.dtype not in ("", *ENGINE_DTYPES):
            fail(f"unknown vllm.dtype {c.vllm.dtype!r}; expected '' (= dtype) or one of {ENGINE_DTYPES}")
        tp = c.vllm.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            fail(f"vllm.tensor_parallel_size={tp!r}: expected a whole number >= 1 (the engine's workers)")
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
        if not c.vllm.timeout_s > 0:
            fail(f"vllm.timeout_s={c.vllm.timeout_s} must be > 0 (seconds)")
        if not c.vllm.transfer_chunk_gib > 0:
            fail(f"vllm.transfer_chunk_gib={c.vllm.transfer_chunk_gib} must be > 0 (GiB a transfer step holds)")
        if c.vllm.transfer not in TRANSFERS:
            fail(f"vllm.transfer={c.vllm.transfer!r}: expected one of {TRANSFERS}")
        filtered = c.top_p < 1.0 or c.top_k > 0
        if (c.old_logprobs == "sampler" or algorithm.decoupled) and (filtered or c.temperature != 1.0):
            fail(
                "sampler='vllm' reports the policy's own log-probs only at temperature 1 without top_p / top_k (it "
                "reports those of the distribution it sampled from); old_logprobs='sampler' and async_ppo's "
                f"behaviour log-probs need them: got temperature={c.temperature}, top_p={c.top_p}, top_k={c.top_k}"
            )
    if c.tis_cap is not None:
        loss = algorithm.policy_loss
        if not c.tis_cap > 0:
            fail(f"tis_cap={c.tis_cap} must be > 0 (the truncation C of min(pi_trainer / pi_sampler, C)), or None")
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
    if c.env_name not in ("", "guess_number"):
        fail(f"unknown env_name {c.env_name!r}; expected '' (single-turn problems) or 'guess_number'")
    if c.loss_agg_mode not in losses.LOSS_AGG_MODES:
        fail(f"unknown loss_agg_mode {c.loss_agg_mode!r}; expected one of {losses.LOSS_AGG_MODES}")
    if c.lr_schedule not in state_lib.SCHEDULES:
        fail(f"unknown lr_schedule {c.lr_schedule!r}; expected one of {state_lib.SCHEDULES}")
    if c.warmstart.targets not in ("teacher", "answer"):
        fail(f"unknown warmstart.targets {c.warmstart.targets!r}; expected 'teacher' or 'answer'")
    if not 0.0 <= c.warmstart.slip_rate <= 1.0:
        fail(f"warmstart.slip_rate={c.warmstart.slip_rate} must be a probability in [0, 1]")
    for name in ("heartbeat_timeout_s", "join_timeout_s"):
        if c[name] < 1:
            fail(f"{name}={c[name]} must be >= 1 (seconds)")


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


def check_env(c) -> None:
    """A multi-turn run's environment exists and its options (`config.<env_name>`) make one."""
    if c.env_name not in MULTI_TURN_ENVS:
        fail(f"unknown env_name {c.env_name!r}; expected '' (single-turn) or one of {', '.join(MULTI_TURN_ENVS)}")
    if c.eval_interval and c.num_eval_problems < 1:
        fail(f"eval_interval={c.eval_interval} plays num_eval_problems held-out games: got {c.num_eval_problems}")
    options = c.get(c.env_name)
    try:
        MULTI_TURN_ENVS[c.env_name](**(options.to_dict() if options is not None else {}))
    except (TypeError, ValueError) as error:
        fail(f"{c.env_name}: {error} (--config.{c.env_name}.*)")
