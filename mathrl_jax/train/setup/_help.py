"""`scripts/train.py --help`: every option of a config with its value and a one-line meaning, grouped as
`configs/default.py`'s table groups them.

The meanings are the table's own (`options.py`: an option's `meaning`, else its section's), so each
option is described once, where it is defined. Options a config adds beyond the table are listed under "other"
with no meaning.
"""

from __future__ import annotations

from typing import Dict, List

from mathrl_jax import options
from mathrl_jax.configs import default

_MEANING_WIDTH = 110


def flat_items(tree, prefix: str = ""):
    """(dotted key, value) of every leaf of a config or its dict (`arithmetic.levels`, `lr`, ...)."""
    for key, value in tree.items():
        if hasattr(value, "items"):
            yield from flat_items(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MEANING_WIDTH else text[: _MEANING_WIDTH - 3].rstrip() + "..."


def format_help(config, config_path: str) -> str:
    """The `--help` text of `config` (loaded from `config_path`): its options by group, each with its value."""
    meanings = options.meanings(default.OPTIONS)
    order = {key: n for n, key in enumerate(meanings)}
    groups: Dict[str, List[str]] = {group: [] for group, _ in meanings.values()}
    for key, value in sorted(flat_items(config), key=lambda item: order.get(item[0], len(order))):
        group, meaning = meanings.get(key, ("other", ""))
        meaning = _one_line(meaning)
        groups.setdefault(group, []).append(f"  --config.{key}={value!r}" + (f"\n      {meaning}" if meaning else ""))
    head = (
        "usage: python scripts/train.py [--config=CONFIG_FILE] [--config.KEY=VALUE ...]\n\n"
        "Trains a policy with RL (mathrl_jax). Every option below can be set on the command line; the values shown "
        f"are those of {config_path}.\nRecipes: mathrl_jax/configs/*.py (--config=mathrl_jax/configs/NAME.py).\n"
    )
    return head + "".join(f"\n{name}:\n" + "\n".join(lines) + "\n" for name, lines in groups.items() if lines)
