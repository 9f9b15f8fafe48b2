"""A resumed run trains what the saved run did: the config keys it may change, and the check of the others
against the saved `config.json` (before anything is written)."""

from __future__ import annotations

import json
import os
from typing import Any, Tuple

from mathrl_jax import options
from mathrl_jax.configs import default
from mathrl_jax.errors import fail
from mathrl_jax.train import run_directory
from mathrl_jax.train.setup._validation import flat_items


def resume_may_change() -> Tuple[str, ...]:
    """The keys a resumed run may change (`configs/default.py` marks them `resume=MAY_CHANGE`): how long it runs,
    what it logs and evaluates, where and how it computes (mesh, engine, memory settings, remat, layer scan,
    packing, skipping rows that train nothing: the same updates, tested as invariances). Every other key changes
    what is trained and must equal the saved run's, unless `resume_allow_changes` names it."""
    return options.resume_may_change(default.OPTIONS)


def resume_never_changes() -> Tuple[str, ...]:
    """Keys that decide what the checkpoint holds (which weights train, the critic's tree; `resume=NEVER`): no
    resume changes them, even named in `resume_allow_changes` (the restore could only fail on the other tree)."""
    return options.resume_never_changes(default.OPTIONS)


def _may_change(key: str, allowed: Tuple[str, ...]) -> bool:
    return key in resume_may_change() + allowed


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
    fixed = [n for n in names if n in resume_never_changes()]
    if fixed:
        fail(
            f"resume_allow_changes={config.resume_allow_changes!r}: {fixed} decide what the checkpoint holds; a "
            "resume cannot change them (use another --config.run_dir)"
        )
    return names


def check_resumed_config(config, run_dir: str) -> None:
    """A run that resumes a checkpoint in `run_dir` trains what the saved `config.json` says: each other key that
    differs is refused, naming it and both values, before anything is written."""
    path = run_directory.path(run_dir, run_directory.CONFIG)
    checkpoints = run_directory.path(run_dir, run_directory.CHECKPOINTS)
    if not config.resume or not os.path.isfile(path) or not os.path.isdir(checkpoints):
        return
    if not any(name.isdigit() for name in os.listdir(checkpoints)):
        return  # nothing trained yet
    with open(path) as f:
        saved = dict(flat_items(json.load(f)))
    # A key the saved run's version did not have yet ran at its default, which keeps the older behaviour (a run
    # saved before `lora` existed trained every weight: lora.rank 0).
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
