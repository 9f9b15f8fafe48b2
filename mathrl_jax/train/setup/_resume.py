"""A resumed run trains what the saved run did: the config keys it may change, and the check of the others
against the saved `config.json` and the settings each checkpoint step records (before anything is written)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from mathrl_jax import options
from mathrl_jax.configs import default
from mathrl_jax.errors import fail
from mathrl_jax.train import run_directory
from mathrl_jax.train.checkpoint import Checkpointer, CheckpointError
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


SETTINGS_KEY = "settings"
"""Checkpoint metadata: the settings of the run that saved the step (`recorded_settings`), each key that decides what
is trained; a resume compares them with its own (`check_recorded_settings`), with or without `config.json`."""


def _as_saved(config) -> Dict[str, Any]:
    """{dotted key: value} of `config` as `_write_config` saves it: tuples as lists, other objects as strings."""
    return dict(flat_items(json.loads(json.dumps(config.to_dict(), default=str))))


def recorded_settings(config) -> Dict[str, Any]:
    """What each checkpoint records of the run that saved it: every key a resume may not change freely (those not
    `resume=MAY_CHANGE`: the seed, the model, the data, the algorithm, lr, ...), as `config.json` holds them."""
    may_change = set(resume_may_change())
    return {key: value for key, value in _as_saved(config).items() if key not in may_change}


def _changes(saved: Dict[str, Any], current: Dict[str, Any], allowed: Tuple[str, ...]) -> List[str]:
    """ "key: saved -> current" for each key of both that differs and may not change."""
    return [
        f"{key}: {saved[key]!r} -> {value!r}"
        for key, value in current.items()
        if key in saved and not _same_setting(saved[key], value) and not _may_change(key, allowed)
    ]


def check_recorded_settings(config, recorded: Optional[Dict[str, Any]], where: str) -> None:
    """Refuses, naming each key and both values, a checkpoint step (`where`) saved by a run whose recorded settings
    (`recorded_settings`) differ from this one's in a key that may not change: a step of another run (another seed,
    other settings) copied into this run's directory, or this run resumed with a changed setting. A step saved
    before checkpoints recorded their settings (None) is not checked here (`config.json` is)."""
    if recorded is None:
        return
    changed = _changes(dict(recorded), _as_saved(config), allowed_resume_changes(config))
    if changed:
        fail(
            f"checkpoint {where} was saved by a run with other settings ({'; '.join(changed)}), which this run "
            "would resume: it is another run's step, or a setting changed; use another --config.run_dir, "
            "--config.resume=False to start over, or name the keys meant to change in --config.resume_allow_changes"
        )


def check_recorded_step(metadata: Dict[str, Any], step: int, where: str) -> None:
    """Refuses a checkpoint whose metadata records another iteration than its directory's name: a step directory
    renamed (4 -> 9) would resume at the wrong iteration, and the saves up to the name would be skipped."""
    recorded = metadata.get("iteration")
    if recorded is not None and recorded != step:
        fail(
            f"checkpoint {where} holds iteration {recorded}, not {step}: its directory was renamed or copied from "
            f"another step; rename it back to {recorded} or move it out of the checkpoints directory"
        )


def _latest_metadata(checkpoints: str):
    """(its directory, step, metadata) of the newest step of `checkpoints` whose metadata reads, without writing
    anything (a read-only `Checkpointer`); Nones when none reads (the restore then says why)."""
    reader = Checkpointer(checkpoints, save_interval=0, read_only=True)
    try:
        for step in reversed(reader.all_steps()):
            try:
                return os.path.join(checkpoints, str(step)), step, reader.read_metadata(step)
            except CheckpointError:  # unreadable: the restore falls back past it, and checks the step it restores
                continue
        return None, None, None
    finally:
        reader.close()


def check_resumed_config(config, run_dir: str) -> None:
    """A run that resumes a checkpoint in `run_dir` trains what the saved run did: each other key that differs
    from the saved `config.json`, or from the settings the latest checkpoint recorded, is refused, naming it and
    both values, before anything is written. Without `config.json`, the checkpoint's record is the reference; with
    neither (a directory of an older version, its config.json deleted), the resume is refused."""
    path = run_directory.path(run_dir, run_directory.CONFIG)
    checkpoints = run_directory.path(run_dir, run_directory.CHECKPOINTS)
    if not config.resume or not os.path.isdir(checkpoints):
        return
    if not any(name.isdigit() for name in os.listdir(checkpoints)):
        return  # nothing trained yet
    allowed = allowed_resume_changes(config)
    if os.path.isfile(path):
        with open(path) as f:
            saved = dict(flat_items(json.load(f)))
        # A key the saved run's version did not have yet ran at its default, which keeps the older behaviour (a
        # run saved before `lora` existed trained every weight: lora.rank 0).
        defaults = dict(flat_items(json.loads(json.dumps(default.get_config().to_dict(), default=str))))
        saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
        changed = _changes(saved, _as_saved(config), allowed)
        if changed:
            fail(
                f"run_dir {run_dir!r} holds a run with other settings ({'; '.join(changed)}), which this run "
                "would resume: use another --config.run_dir, --config.resume=False to start over, or name the keys "
                "meant to change in --config.resume_allow_changes"
            )
    where, step, metadata = _latest_metadata(checkpoints)
    if metadata is None:
        return
    check_recorded_step(metadata, step, where)
    recorded = metadata.get(SETTINGS_KEY)
    if recorded is None and not os.path.isfile(path):
        fail(
            f"run_dir {run_dir!r} has checkpoints but no {run_directory.CONFIG}, and checkpoint {where} records no "
            "settings (saved by an older version): nothing to check this run's settings against; put the run's "
            f"{run_directory.CONFIG} back, or start over with --config.resume=False or another --config.run_dir"
        )
    check_recorded_settings(config, recorded, where)
