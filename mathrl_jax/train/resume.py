"""A resumed run trains what the saved run did: the config keys it may change, and the check of the others
against the saved `config.json` (before anything is written)."""

from __future__ import annotations

import json
import os
from typing import Any, Tuple

from mathrl_jax.train.validation import fail, flat_items

RESUME_MAY_CHANGE = (
    "num_iterations",
    "num_env_steps",
    "resume",
    "run_dir",
    "resume_allow_changes",
    "resume_allow_unverified",
    "eval_interval",
    "eval_n_samples",
    "num_eval_problems",
    "eval_dataset_path",
    "eval_dataset_split",
    "arithmetic.eval_digits",
    "countdown.eval_count",
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
    "reward.function_timeout_s",
    "mesh.",
    "sampler_mesh.",
    "sampler",
    "jax_sampler.kv_cache_gib",
    "jax_sampler.compact_interval",
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


STATE_KEYS = ("lora.rank", "lora.targets", "lora.share_critic_base")
"""Keys that decide what the checkpoint holds (which weights train, the critic's tree): no resume changes them,
even named in `resume_allow_changes` (the restore could only fail on the other tree)."""


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
    fixed = [n for n in names if n in STATE_KEYS]
    if fixed:
        fail(
            f"resume_allow_changes={config.resume_allow_changes!r}: {fixed} decide what the checkpoint holds; a "
            "resume cannot change them (use another --config.run_dir)"
        )
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
    # A key the saved run's version did not have yet ran at its default, which keeps the older behaviour (a run
    # saved before `lora` existed trained every weight: lora.rank 0).
    from mathrl_jax.configs import default

    defaults = dict(flat_items(json.loads(json.dumps(default.get_config().to_dict(), default=str))))
    saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
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
