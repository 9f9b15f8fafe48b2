"""One definition per option: its key, default, type, bounds, meaning and resume policy, in one record.

`configs/default.py` lists every option as an `Option` (grouped as `--help` shows them); from that one table come
the config itself (`config_from`), `scripts/train.py --help` (train/setup's help), the range checks (`range_error`,
called by train/setup's validation for every option with bounds) and the resume rule (`resume_may_change`,
`resume_never_changes`). Adding an option is one line in the table. Rules that span several options (e.g.
`dapo.success_rate_lb <= dapo.success_rate_ub`) stay in the validation, which is the one place for them.

Typed fields as MaxText's `configs/types.py` and Tunix's configs define them; the command line stays
ml_collections' (`--config.key=value`), which already refuses a value of another type than the default's.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Iterable, Optional, Sequence, Tuple, Union

import ml_collections

FIXED = "fixed"
"""A resumed run keeps the saved run's value (it changes what is trained), unless resume_allow_changes names it."""
MAY_CHANGE = "may_change"
"""A resumed run may change it: how long it runs, what it logs and evaluates, where and how it computes."""
NEVER = "never"
"""No resume changes it, even named in resume_allow_changes: it decides what the checkpoint holds."""
RESUME_POLICIES = (FIXED, MAY_CHANGE, NEVER)


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: `key` (dotted for a section's: "lora.rank"), its default, and what is known of it.

    `meaning` is its --help line ("" = its section's); `value_type` is needed where the default is None (the
    value ml_collections then accepts); `low` / `high` bound a number, `low_open` excludes `low` itself;
    `choices` are the values it takes: a tuple, or "module:NAME" for a tuple the library defines (read when
    checked, so the table imports nothing); `case_free`: any case is taken, and lower-cased (OpenR writes `APPO`);
    `resume` is one of RESUME_POLICIES; `group` is the --help heading (set by `group`)."""

    key: str
    default: Any
    meaning: str = ""
    value_type: Optional[type] = None
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    choices: Union[Tuple[Any, ...], str, None] = None
    case_free: bool = False
    resume: str = FIXED
    group: str = ""

    def __post_init__(self):
        if self.resume not in RESUME_POLICIES:
            raise ValueError(f"option {self.key}: resume={self.resume!r}, expected one of {RESUME_POLICIES}")
        if self.default is None and self.value_type is None:
            raise ValueError(f"option {self.key}: a None default needs its value_type")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"option {self.key}: low={self.low} > high={self.high}")
        if isinstance(self.choices, str) and ":" not in self.choices:
            raise ValueError(f"option {self.key}: choices={self.choices!r}, expected a tuple or 'module:NAME'")


@dataclasses.dataclass(frozen=True)
class Section:
    """A section of options (`lora`, `vllm`): a nested ConfigDict; `meaning` is its keys' --help line where they
    have none of their own."""

    key: str
    meaning: str = ""
    group: str = ""


def group(name: str, *entries) -> tuple:
    """`entries` under the --help heading `name`."""
    return tuple(dataclasses.replace(entry, group=name) for entry in entries)


def options_of(table: Iterable) -> list[Option]:
    return [entry for entry in table if isinstance(entry, Option)]


def config_from(table: Sequence) -> ml_collections.ConfigDict:
    """The ConfigDict the table defines: each option at its default (a None default as a typed placeholder)."""
    config = ml_collections.ConfigDict()
    for entry in table:
        *path, name = entry.key.split(".")
        parent = config
        for part in path:
            parent = parent[part]
        if isinstance(entry, Section):
            parent[name] = ml_collections.ConfigDict()
        elif entry.default is None:
            parent[name] = ml_collections.config_dict.placeholder(entry.value_type)
        else:
            parent[name] = entry.default
    return config


MAX_WHOLE = 2**31 - 1
"""The largest value of a whole-number option without a `high` of its own (JAX's default integer is 32 bits): a
count past it is no setting, only a hang, an OverflowError or a MemoryError later."""


def is_whole_option(option: Option) -> bool:
    """Whether `option` takes whole numbers (an int default, or value_type int; bools are not)."""
    kind = option.value_type if option.default is None else type(option.default)
    return kind is int


def range_error(option: Option, value: Any) -> Optional[str]:
    """Why `value` is out of `option`'s bounds (one line naming the key), or None. None values are unset options.
    A whole-number option takes an int (not 1e12) up to its `high`, else up to `MAX_WHOLE`."""
    if value is None:
        return None
    whole = is_whole_option(option)
    if whole and isinstance(value, float) and math.isfinite(value):  # non-finite: refused as such by validation
        return f"{option.key}={value!r}: must be a whole number"
    if option.low is None and option.high is None and not (whole and isinstance(value, int)):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{option.key}={value!r}: must be a number"
    low = -math.inf if option.low is None else option.low
    high = option.high if option.high is not None else (MAX_WHOLE if whole else math.inf)
    if whole and isinstance(value, int) and option.low is None and value < -MAX_WHOLE - 1:
        return f"{option.key}={value} is out of range: must be in [{-MAX_WHOLE - 1}, {high}]"
    if value > high or value < low or (value == low and option.low_open):
        return f"{option.key}={value} is out of range: must be in {'(' if option.low_open else '['}{low}, {high}]"
    return None


def choices_of(option: Option) -> Optional[Tuple[Any, ...]]:
    """The values `option` takes (its "module:NAME" read now), or None for any value of its type."""
    if not isinstance(option.choices, str):
        return option.choices
    module, name = option.choices.split(":")
    return tuple(getattr(importlib.import_module(module), name))


def choice_error(option: Option, value: Any) -> Optional[str]:
    """Why `value` is not one of `option`'s choices (one line naming the key), or None."""
    choices = choices_of(option)
    if choices is None or value in choices:
        return None
    return f"unknown {option.key} {value!r}; expected one of {', '.join(repr(c) for c in choices)}"


def resume_may_change(table: Sequence) -> tuple[str, ...]:
    """The keys a resumed run may change."""
    return tuple(o.key for o in options_of(table) if o.resume == MAY_CHANGE)


def resume_never_changes(table: Sequence) -> tuple[str, ...]:
    """The keys no resume changes, even named in resume_allow_changes."""
    return tuple(o.key for o in options_of(table) if o.resume == NEVER)


def meanings(table: Sequence) -> dict[str, tuple[str, str]]:
    """{key: (group, meaning)} of each option: its own meaning, else its section's."""
    sections = {entry.key: entry.meaning for entry in table if isinstance(entry, Section)}
    found = {}
    for option in options_of(table):
        section = option.key.rsplit(".", 1)[0] if "." in option.key else None
        found[option.key] = (option.group, option.meaning or sections.get(section, ""))
    return found
