"""A run from its config: `build_run` (the config checked, read into one settings section per component, then
built in phases), `validate_settings` (every check that needs no file), `format_help` (train.py --help).

Behind the door: `_build` (the phases in order), `_inputs` (every input checked before anything is written),
`_trainer` (policy, critic, state, update), `_samplers`, `_sections` (config -> sections), `_validation` (rules
across options) and `_task_checks` (the built-in tasks'), `_resume` (a resumed run's config), `_run` (Run,
RunSettings), `_run_lock` (one process per run directory), `_help` (--help, from the options' table).
"""

from mathrl_jax.train.setup._build import PENDING_KEY, SHAPES_KEY, build_run
from mathrl_jax.train.setup._help import format_help
from mathrl_jax.train.setup._resume import SETTINGS_KEY
from mathrl_jax.train.setup._run import RewardFn, Run, RunSettings
from mathrl_jax.train.setup._run_lock import release_run_dir
from mathrl_jax.train.setup._validation import validate_config, validate_settings

__all__ = [
    "PENDING_KEY",
    "RewardFn",
    "Run",
    "RunSettings",
    "SETTINGS_KEY",
    "SHAPES_KEY",
    "build_run",
    "format_help",
    "release_run_dir",
    "validate_config",
    "validate_settings",
]
