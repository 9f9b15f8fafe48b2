"""`scripts/train.py --help`: every option of a config with its value and its meaning in full, grouped as
`configs/default.py`'s table groups them, with its TRL and verl names (`mathrl_jax/trl_verl_names.py`).

The meanings are the table's own (`options.py`: an option's `meaning`, else its section's), so each
option is described once, where it is defined. Options a config adds beyond the table are listed under "other"
with no meaning.
"""

from __future__ import annotations

import textwrap
from typing import Dict, List

from mathrl_jax import options
from mathrl_jax import trl_verl_names as names
from mathrl_jax.configs import default

_MEANING_WIDTH = 116


def flat_items(tree, prefix: str = ""):
    """(dotted key, value) of every leaf of a config or its dict (`arithmetic.levels`, `lr`, ...)."""
    for key, value in tree.items():
        if hasattr(value, "items"):
            yield from flat_items(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _described(key: str, meaning: str) -> str:
    """`meaning` in full, wrapped, then the key's other names (TRL's, verl's) and the other meanings of its name."""
    text = " ".join(meaning.split())
    others = [f"{a.system}: {a.name}" + (f" ({a.note})" if a.note else "") for a in names.aliases_of(key)]
    if others:
        text += (" " if text else "") + "[also " + "; ".join(others) + "]"
    for collision in names.collisions_of(key):
        text += f" [{collision.system}'s {key} means something else: use {collision.use}]"
    wrap = dict(initial_indent=" " * 6, subsequent_indent=" " * 6, break_on_hyphens=False, break_long_words=False)
    return textwrap.fill(text, _MEANING_WIDTH, **wrap) if text else ""


def format_help(config, config_path: str) -> str:
    """The `--help` text of `config` (loaded from `config_path`): its options by group, each with its value."""
    meanings = options.meanings(default.OPTIONS)
    order = {key: n for n, key in enumerate(meanings)}
    groups: Dict[str, List[str]] = {group: [] for group, _ in meanings.values()}
    for key, value in sorted(flat_items(config), key=lambda item: order.get(item[0], len(order))):
        group, meaning = meanings.get(key, ("other", ""))
        meaning = _described(key, meaning)
        groups.setdefault(group, []).append(f"  --config.{key}={value!r}" + (f"\n{meaning}" if meaning else ""))
    head = (
        "usage: python scripts/train.py [--config=CONFIG_FILE] [--config.KEY=VALUE ...]\n\n"
        "Trains a policy with RL (mathrl_jax). Every option below can be set on the command line; the values shown "
        f"are those of {config_path}.\nRecipes: mathrl_jax/configs/*.py (--config=mathrl_jax/configs/NAME.py).\n"
    )
    return head + "".join(f"\n{name}:\n" + "\n".join(lines) + "\n" for name, lines in groups.items() if lines)
