"""The first phase of a run's build: every input a config names checked, before anything is written.

`check_inputs` resolves Hub ids to their local snapshots, loads the data and the PRM, reads the model's config and
tokenizer, asks a vLLM server what it serves, and checks a resumed run's config against the saved one: anything
wrong stops the run here (exit 2, one line), with the run directory as it was.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, List, Optional

from mathrl_jax.errors import fail
from mathrl_jax.models import hf, hf_config, qwen
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.models.hub import HubModelError, resolve_dataset_path, resolve_model_dir
from mathrl_jax.rewards.arithmetic_steps import NAME as ARITHMETIC_STEPS
from mathrl_jax.rewards.countdown_steps import NAME as COUNTDOWN_STEPS
from mathrl_jax.rewards.functions import RewardFunctionError, RewardFunctions, parse_weights
from mathrl_jax.sampling.vllm import VLLM_MISSING, ServerError, describe_server, is_cpu_build, kv_cache_refusal
from mathrl_jax.sharding import distributed
from mathrl_jax.train.rollouts import check_prompts, check_warmstart_data, load_data, load_hard_eval, prompt_settings
from mathrl_jax.train.setup._resume import check_resumed_config
from mathrl_jax.train.setup._validation import num_iterations, validate_config


@dataclasses.dataclass(frozen=True)
class CheckedInputs:
    """What the checks read, for the phases after them: the problems, the prompts' settings, the reward functions
    and the PRM, and the tokenizer where the model's checkpoint has one already (None: the tiny offline model,
    written into the run directory)."""

    train_problems: List[Any]
    eval_problems: List[Any]
    hard_problems: List[Any]
    prompts: Any
    functions: Optional[RewardFunctions]
    prm: Any
    codec: Optional[TextCodec]


def check_inputs(config, reward_functions=None) -> CheckedInputs:
    """Every input `config` names, checked (and Hub ids resolved in `config`), before anything is written."""
    if reward_functions:  # given in Python: the config says how they combine with the verifier
        _combine_given_functions(config)
        config.reward.functions = ",".join(getattr(f, "__name__", "function") for f in reward_functions)
    validate_config(config)
    _resolve_hub_ids(config)
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
        _check_vllm(config)
    prompts = prompt_settings(config)
    codec = None
    if config.model_name_or_path:  # a missing tokenizer or a too-long prompt fails before anything is written
        codec = TextCodec(config.model_name_or_path)
        codec.check_vocabulary(model_config.vocab_size, config.model_name_or_path)
        check_prompts(prompts, codec, train_problems, eval_problems + hard_problems)
    prm = load_prm(config) if "prm" in config.reward_source else None
    check_resumed_config(config, config.run_dir)
    return CheckedInputs(train_problems, eval_problems, hard_problems, prompts, functions, prm, codec)


def _resolve_hub_ids(config) -> None:
    """Each path option made absolute, or, naming a Hub id, its snapshot in the local cache, downloaded first unless
    HF_HUB_OFFLINE is set (`models.hub`); a missing local path is refused, never looked up on the Hub."""
    resolvers = dict(
        model_name_or_path=resolve_model_dir,
        prm_model_name_or_path=resolve_model_dir,
        dataset_path=resolve_dataset_path,
        eval_dataset_path=resolve_dataset_path,
    )
    for key, resolve in resolvers.items():
        if key == "prm_model_name_or_path" and config[key] in RULE_BASED_VERIFIERS:
            continue  # a built-in process verifier, no checkpoint
        try:
            config[key] = resolve(config[key], key)
        except HubModelError as error:
            fail(str(error))


def _check_vllm(config) -> None:
    """vLLM installed; a CPU engine's KV cache over the host's memory, a server that is not there, or lacks what the
    sampler needs, refused before any write."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        fail(f"sampler='vllm': {VLLM_MISSING}; or use sampler='jax'")
    if not config.vllm.server_url and is_cpu_build():  # a GPU engine checks its own memory, before loading
        refusal = kv_cache_refusal(config.vllm.kv_cache_gib, config.vllm.tensor_parallel_size)
        if refusal:
            fail(refusal)
    if config.vllm.server_url:
        try:
            describe_server(
                config.vllm.server_url,
                timeout_s=config.vllm.timeout_s,
                max_model_len=vllm_max_model_len(config),
                dtype=config.vllm.dtype or None,
                transfer=config.vllm.transfer,
            )
        except ServerError as error:
            fail(str(error))


def vllm_max_model_len(config) -> Optional[int]:
    """Single-turn: what a row can hold; multi-turn prompts grow over the episode: the checkpoint's limit (None)."""
    return None if config.env_name else config.max_prompt_length + config.max_new_tokens


def _combine_given_functions(config) -> None:
    """Reward functions given in Python, with `reward_source` left at "verifier" (the default): added to the
    verifier's score ("verifier+functions", one line says so), never in its place; "functions" and
    "verifier+functions" stand as set; a source they do not combine with (a PRM) is refused."""
    source = str(config.reward_source)
    if source == "verifier":
        config.reward_source = "verifier+functions"
        distributed.note(
            "reward functions given in Python with reward_source='verifier': using reward_source='verifier+functions' "
            "(the verifier's score plus theirs; reward_source='functions' for theirs alone)",
        )
    elif "functions" not in source:
        fail(
            f"reward_source={source!r} with reward functions given in Python: expected 'functions' (theirs alone) or "
            "'verifier+functions' (added to the verifier's score)"
        )


def _reward_functions(config, given):
    """The run's `RewardFunctions`: `given` (Python callables) or those `reward.functions` names; None without."""
    if "functions" not in config.reward_source:
        return None
    try:
        timeout_s = config.reward.function_timeout_s
        max_steps = num_iterations(config)  # the functions' trainer_state.max_steps
        if given:
            weights = parse_weights(config.reward.weights, len(given))
            return RewardFunctions(list(given), weights, timeout_s=timeout_s, max_steps=max_steps)
        return RewardFunctions.from_config(config.reward.functions, config.reward.weights, timeout_s, max_steps)
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
        try:  # a NaN or inf weight would skip every update: refused here, naming the tensor, before any write
            hf.check_finite_checkpoint(path)
        except hf.ModelCheckpointError as error:
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
