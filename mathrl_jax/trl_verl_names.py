"""Other systems' option names: TRL's (`GRPOConfig`, its `ModelConfig` / `ScriptArguments`) and verl's (its
hydra keys), each either taken as another name of one of our options or refused with the option to use.

`ALIASES` holds the names whose meaning is ours: `--config.num_generations=4` is `--config.group_size=4`
(`resolve_names` rewrites the command line before ml_collections reads it, and says so on stderr). `REFUSED`
holds the names whose meaning differs (TRL's `max_steps` counts optimizer steps, ours `num_iterations` counts
rollout batches, each of several optimizer steps): naming one stops the run, naming our key and the difference.
`suggestions` is the "did you mean" of an unknown key, through these tables first. `--help` shows each key's
other names, and docs/trl_verl_names.md shows both tables (tests/test_trl_verl_names.py keeps them equal).

Written here rather than borrowed: ml_collections and absl know one name per flag; the tables are facts about
TRL and verl (TRL's GRPOConfig docs, verl's ppo_trainer.yaml), so they are data, checked against the options
table (every key named here is an option).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from typing import Iterable, Sequence

from mathrl_jax.errors import MathRLError

TRL = "TRL"
VERL = "verl"


@dataclasses.dataclass(frozen=True)
class Alias:
    """`name` (of `system`) means our option `key`; `note` says what to know (values it takes, a nuance)."""

    name: str
    key: str
    system: str
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Refused:
    """`name` (of `system`) means something else than any one of our options: `use` says what to set instead,
    starting with the option's key."""

    name: str
    system: str
    use: str

    @property
    def key(self) -> str:
        """The option to set instead (the first word of `use`)."""
        return re.match(r"[\w.]+", self.use).group(0)


ALIASES = (
    Alias("num_generations", "group_size", TRL),
    Alias("beta", "kl_coef", TRL, "the KL term's coefficient in the loss; kl_kind='k3' is TRL's estimator"),
    Alias("epsilon", "clip_low", TRL),
    Alias("epsilon_high", "clip_high", TRL),
    Alias("learning_rate", "lr", TRL),
    Alias("max_completion_length", "max_new_tokens", TRL),
    Alias("loss_type", "loss_agg_mode", TRL, "TRL's values grpo, dr_grpo, dapo, bnpo are taken too"),
    Alias("lr_scheduler_type", "lr_schedule", TRL, "constant, linear or cosine, each after warmup_steps"),
    Alias("adam_epsilon", "adam_eps", TRL),
    Alias("output_dir", "run_dir", TRL),
    Alias("save_total_limit", "max_to_keep", TRL),
    Alias("gradient_checkpointing", "remat", TRL),
    Alias("reward_funcs", "reward.functions", TRL, "'file.py:function' or 'module:function', comma-separated"),
    Alias("reward_weights", "reward.weights", TRL, "comma-separated, one per reward function"),
    Alias("lora_r", "lora.rank", TRL),
    Alias("lora_alpha", "lora.alpha", TRL),
    Alias("lora_dropout", "lora.dropout", TRL),
    Alias("lora_target_modules", "lora.targets", TRL, "comma-separated projection names, or all-linear"),
    Alias("vllm_tensor_parallel_size", "vllm.tensor_parallel_size", TRL),
    Alias("dataset_train_split", "dataset_split", TRL),
    Alias("dataset_test_split", "eval_dataset_split", TRL),
    Alias("data.train_files", "dataset_path", VERL, "one file"),
    Alias("data.val_files", "eval_dataset_path", VERL, "one file"),
    Alias("data.train_batch_size", "n_rollout_threads", VERL),
    Alias("data.max_prompt_length", "max_prompt_length", VERL),
    Alias("data.max_response_length", "max_new_tokens", VERL),
    Alias("actor_rollout_ref.rollout.n", "group_size", VERL),
    Alias("actor_rollout_ref.rollout.temperature", "temperature", VERL),
    Alias("actor_rollout_ref.rollout.top_p", "top_p", VERL),
    Alias("actor_rollout_ref.rollout.top_k", "top_k", VERL, "verl's -1 = off; 0 is off too here"),
    Alias("actor_rollout_ref.rollout.tensor_model_parallel_size", "vllm.tensor_parallel_size", VERL),
    Alias("actor_rollout_ref.actor.optim.lr", "lr", VERL),
    Alias("actor_rollout_ref.actor.optim.weight_decay", "weight_decay", VERL),
    Alias("actor_rollout_ref.actor.optim.lr_warmup_steps", "warmup_steps", VERL),
    Alias("actor_rollout_ref.actor.grad_clip", "max_grad_norm", VERL),
    Alias("actor_rollout_ref.actor.ppo_epochs", "ppo_epoch", VERL),
    Alias("actor_rollout_ref.actor.clip_ratio", "clip_low", VERL, "clip_high defaults to it"),
    Alias("actor_rollout_ref.actor.clip_ratio_low", "clip_low", VERL),
    Alias("actor_rollout_ref.actor.clip_ratio_high", "clip_high", VERL),
    Alias("actor_rollout_ref.actor.clip_ratio_c", "clip_c", VERL),
    Alias("actor_rollout_ref.actor.loss_agg_mode", "loss_agg_mode", VERL),
    Alias("actor_rollout_ref.actor.entropy_coeff", "entropy_coef", VERL),
    Alias("actor_rollout_ref.actor.kl_loss_coef", "kl_coef", VERL, "verl's use_kl_loss=True is kl_coef > 0 here"),
    Alias("actor_rollout_ref.actor.kl_loss_type", "kl_kind", VERL, "low_var_kl is k3"),
    Alias("actor_rollout_ref.model.path", "model_name_or_path", VERL),
    Alias("actor_rollout_ref.model.enable_gradient_checkpointing", "remat", VERL),
    Alias("actor_rollout_ref.model.lora_rank", "lora.rank", VERL),
    Alias("actor_rollout_ref.model.lora_alpha", "lora.alpha", VERL),
    Alias("actor_rollout_ref.model.target_modules", "lora.targets", VERL),
    Alias("critic.optim.lr", "critic_lr", VERL),
    Alias("critic.cliprange_value", "value_clip", VERL),
    Alias("algorithm.gamma", "gamma", VERL),
    Alias("algorithm.lam", "lam", VERL),
    Alias("algorithm.kl_ctrl.kl_coef", "kl_reward_coef", VERL, "the KL penalty in the reward (use_kl_in_reward)"),
    Alias("trainer.total_training_steps", "num_iterations", VERL),
    Alias("trainer.save_freq", "save_interval", VERL),
    Alias("trainer.test_freq", "eval_interval", VERL),
    Alias("trainer.default_local_dir", "run_dir", VERL),
    Alias("trainer.seed", "seed", VERL),
)
"""Other systems' names of our options (docs/trl_verl_names.md)."""

REFUSED = (
    Refused(
        "per_device_train_batch_size",
        TRL,
        "n_rollout_threads (prompts per iteration) and group_size (samples per prompt); TRL's counts completions"
        " per device per optimizer step",
    ),
    Refused(
        "gradient_accumulation_steps",
        TRL,
        "num_mini_batch (optimizer steps per batch) and micro_batch_size (rows per forward pass, summed into one step)",
    ),
    Refused("steps_per_generation", TRL, "num_mini_batch: the optimizer steps each generated batch makes"),
    Refused("generation_batch_size", TRL, "n_rollout_threads x group_size: the completions each iteration samples"),
    Refused(
        "max_steps",
        TRL,
        "num_iterations: rollout batches, each of num_mini_batch x ppo_epoch optimizer steps (TRL's max_steps "
        "counts optimizer steps)",
    ),
    Refused("num_train_epochs", TRL, "num_iterations (rollout batches; the data loops over epochs by itself)"),
    Refused("logging_steps", TRL, "log_interval (in iterations, not optimizer steps)"),
    Refused("save_steps", TRL, "save_interval (in iterations, not optimizer steps)"),
    Refused("eval_steps", TRL, "eval_interval (in iterations, not optimizer steps)"),
    Refused(
        "scale_rewards",
        TRL,
        "algorithm_name: grpo divides by the group's std (TRL's 'group'), drgrpo does not (TRL's 'none' / False)",
    ),
    Refused("importance_sampling_level", TRL, "algorithm_name=gspo for TRL's 'sequence' (GSPO)"),
    Refused("use_vllm", TRL, "sampler='vllm' (docs/vllm.md)"),
    Refused("vllm_mode", TRL, "vllm.server_url: '' runs vLLM in-process (TRL's colocate), a URL drives a server"),
    Refused(
        "vllm_gpu_memory_utilization",
        TRL,
        "vllm.kv_cache_gib: the KV cache in GiB (vLLM's kv_cache_memory_bytes), not a fraction of the device",
    ),
    Refused("vllm_server_base_url", TRL, "vllm.server_url, a server of scripts/vllm_server.py (not trl vllm-serve)"),
    Refused("use_peft", TRL, "lora.rank > 0"),
    Refused("bf16", TRL, "dtype='bfloat16' (compute) with param_dtype='float32' (master weights)"),
    Refused(
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        VERL,
        "num_mini_batch = data.train_batch_size / ppo_mini_batch_size (minibatches per batch, not their size)",
    ),
    Refused("actor_rollout_ref.actor.use_kl_loss", VERL, "kl_coef > 0 (the KL loss is on when its coefficient is)"),
    Refused(
        "algorithm.adv_estimator",
        VERL,
        "algorithm_name: grpo, rloo, reinforce_pp (reinforce_plus_plus_baseline), ppo (gae)",
    ),
    Refused("trainer.total_epochs", VERL, "num_iterations (rollout batches)"),
    Refused(
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        VERL,
        "vllm.kv_cache_gib: the KV cache in GiB, not a fraction of the device",
    ),
)
"""Other systems' names whose meaning differs from every one of ours."""

COLLISIONS = (
    Refused("num_iterations", TRL, "ppo_epoch for TRL's num_iterations (passes over each batch)"),
    Refused("dataset_name", TRL, "dataset_path for TRL's dataset_name (a Hub id or a local path)"),
)
"""Names that are ours and another system's with another meaning: ours is taken; --help and the docs table warn."""

_ALIAS_OF = {alias.name: alias for alias in ALIASES}
_REFUSED = {refused.name: refused for refused in REFUSED}


class RefusedName(MathRLError, ValueError):
    """A refused name, or an option given under two names with different values (one line)."""


def aliases_of(key: str) -> tuple[Alias, ...]:
    """The other names of `key`, in the table's order (TRL's first)."""
    return tuple(a for a in ALIASES if a.key == key)


def collisions_of(key: str) -> tuple[Refused, ...]:
    """The other systems' meanings of our name `key`."""
    return tuple(c for c in COLLISIONS if c.name == key)


def _split(arg: str) -> tuple[str, str | None] | None:
    """`--config.KEY=VALUE` -> (KEY, VALUE); `--config.KEY` -> (KEY, None); anything else -> None."""
    if not arg.startswith("--config."):
        return None
    body = arg[len("--config.") :]
    key, sep, value = body.partition("=")
    return key, (value if sep else None)


def _boolean_keys() -> frozenset:
    """Our options that take no separate value (`--config.resume` alone is True): the bools of the table."""
    from mathrl_jax.configs import default
    from mathrl_jax.options import options_of

    return frozenset(o.key for o in options_of(default.OPTIONS) if isinstance(o.default, bool) or o.value_type is bool)


def _same_value(a: str, b: str) -> bool:
    """Whether two command-line values are one value: as Python literals of one type (`1e-5` is `0.00001`; `1` is
    not `1.0`, nor `True`), else as text."""
    import ast

    def parsed(text: str):
        try:
            return ast.literal_eval(text.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return text

    left, right = parsed(a), parsed(b)
    return a == b or (type(left) is type(right) and left == right)


def expand_flagfiles(argv: Sequence[str]) -> list[str]:
    """`argv` with each `--flagfile=FILE` (or `--flagfile FILE`) replaced by the flags in FILE, as absl reads them
    (so that the names in a flag file are rewritten and checked as the command line's are). A flag file that is
    not a readable regular file is refused (opening a FIFO would wait for a writer)."""
    import stat

    from absl import flags

    argv = list(argv)
    for i, arg in enumerate(argv[1:], start=1):
        if arg.startswith(("--flagfile=", "-flagfile=")):
            path = arg.split("=", 1)[1]
        elif arg in ("--flagfile", "-flagfile") and i + 1 < len(argv):
            path = argv[i + 1]
        else:
            continue
        try:
            mode = os.stat(os.path.expanduser(path)).st_mode
        except OSError as error:
            raise RefusedName(f"--flagfile {path!r} cannot be read: {error.strerror or error}") from None
        if not stat.S_ISREG(mode):
            raise RefusedName(f"--flagfile {path!r} is not a regular file (a FIFO, device or directory?)")
    if not any(a.startswith(("--flagfile", "-flagfile")) for a in argv[1:]):
        return argv
    try:
        return [argv[0], *flags.FlagValues().read_flags_from_files(argv[1:], force_gnu=True)]
    except flags.Error as error:
        raise RefusedName(" ".join(str(error).replace("ERROR::", "").split())) from None


def resolve_names(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """`argv` (its flag files read in: `expand_flagfiles`) with each `--config.ALIAS` rewritten to its key, and one
    note per rewrite.

    Raises RefusedName for a refused name, and for a key given twice under different names with different values
    (`--config.beta=0.1 --config.kl_coef=0.2`, `--config.beta 0.1 --config.kl_coef=0.2`; values compared as
    literals: `1e-5` is `0.00001`)."""
    argv = expand_flagfiles(argv)
    booleans = None
    out, notes, given = [], [], {}
    for i, arg in enumerate(argv):
        parts = _split(arg)
        if parts is None:
            out.append(arg)
            continue
        name, value = parts
        if name in _REFUSED:
            refused = _REFUSED[name]
            raise RefusedName(f"--config.{name} is {refused.system}'s, with another meaning here: use {refused.use}")
        key = _ALIAS_OF[name].key if name in _ALIAS_OF else name
        shown = None if value is None else f"={value}"
        if value is None and i + 1 < len(argv):  # `--config.KEY VALUE`: absl takes the next word as the value
            booleans = _boolean_keys() if booleans is None else booleans
            if key not in booleans:
                value, shown = argv[i + 1], f" {argv[i + 1]}"
        if key in given and value is not None and not _same_value(given[key][1], value) and given[key][0] != name:
            raise RefusedName(
                f"--config.{key} is given twice, as --config.{given[key][0]}{given[key][2]} and --config.{name}"
                f"{shown}: give it once"
            )
        if value is not None:
            given[key] = (name, value, shown)
        if name in _ALIAS_OF:
            alias = _ALIAS_OF[name]
            notes.append(f"--config.{name} is {alias.system}'s name of --config.{key}")
            arg = f"--config.{key}" + ("" if parts[1] is None else f"={parts[1]}")
        out.append(arg)
    return out, notes


def suggestions(name: str, keys: Iterable[str]) -> list[str]:
    """What an unknown `--config.NAME` may have meant: a refused name's advice, else the closest of our keys and of
    the other systems' names (each shown with the key it means), best first."""
    if name in _REFUSED:
        refused = _REFUSED[name]
        return [f"{refused.use} ({refused.system}'s {name} means something else)"]
    keys = list(keys)
    candidates = {key: (key, key) for key in keys}  # name -> (the key it means, how it is shown)
    candidates.update({a.name: (a.key, f"{a.key} ({a.system}'s {a.name})") for a in ALIASES})
    candidates.update({r.name: (r.key, f"{r.key} (not {r.system}'s {r.name}, which differs)") for r in REFUSED})
    # Match the last dotted part too: a verl key without its section prefix, or a section's key without its section.
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.75)
    tail = name.rsplit(".", 1)[-1]
    close += [c for c in candidates if c.rsplit(".", 1)[-1] == tail and c not in close][:2]
    seen, found = set(), []
    for match in close:  # one suggestion per key, the closest name first
        key, shown = candidates[match]
        if key not in seen:
            seen.add(key)
            found.append(shown)
    return found


def markdown_table(system: str) -> str:
    """The rows of docs/trl_verl_names.md for `system`: each of its names, our key or the key to use instead, and
    the note (tests/test_trl_verl_names.py keeps the page equal to it)."""
    rows = ["| " + system + " | here | |", "|---|---|---|"]
    rows += [f"| `{a.name}` | `{a.key}` | {a.note} |" for a in ALIASES if a.system == system]
    rows += [f"| `{r.name}` | refused: `{r.key}` | {r.use} |" for r in REFUSED if r.system == system]
    rows += [f"| `{c.name}` | ours means another thing | {c.use} |" for c in COLLISIONS if c.system == system]
    return "\n".join(rows)
