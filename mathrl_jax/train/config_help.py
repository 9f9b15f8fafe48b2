"""`scripts/train.py --help`: every option of a config with its value and a one-line meaning, grouped as
`default.py` groups them.

The meanings are `default.py`'s own comments (the trailing comment of an option's line, else the comment block
just above it), read with `ast` and `tokenize`, so each option is described once, where it is defined. A key
of a section (`arithmetic.levels`) takes its section's comment. Options a config adds beyond `default.py`
are listed under "other" with no meaning.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from typing import Dict, List, Tuple

DEFAULT_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "default.py")
_SECTION = re.compile(r"^# -+ (\w[\w ]*?) -+$")
_MEANING_WIDTH = 110


def _comments(source: str) -> Dict[int, str]:
    """Line number -> the text of the comment on that line."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


def _config_key(target: ast.expr) -> str | None:
    """`config.a.b = ...` -> "a.b"."""
    parts = []
    while isinstance(target, ast.Attribute):
        parts.append(target.attr)
        target = target.value
    if isinstance(target, ast.Name) and target.id == "config" and parts:
        return ".".join(reversed(parts))
    return None


def _dict_keys(value: ast.expr) -> List[str]:
    """The keys of `ml_collections.ConfigDict({...})` or of a `mesh_config(...)`-like call's dict, if literal."""
    if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Dict):
        value = value.args[0]
    if isinstance(value, ast.Dict):
        return [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return []


def option_meanings(source_path: str = DEFAULT_SOURCE) -> Tuple[Dict[str, str], Dict[str, Tuple[int, str]]]:
    """({dotted key: meaning}, {dotted key: (line, section)}) from a config file's comments."""
    with open(source_path, encoding="utf-8") as f:
        source = f.read()
    comments = _comments(source)
    lines = source.splitlines()
    sections = sorted((n, m.group(1)) for n, text in comments.items() if (m := _SECTION.match("# " + text)))
    meanings: Dict[str, str] = {}
    section_of: Dict[str, Tuple[int, str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        key = _config_key(node.targets[0])
        if key is None:
            continue
        text = " ".join(comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments)
        if not text:  # the comment block just above, up to a blank line or a section header
            above, n = [], node.lineno - 1
            while n in comments and lines[n - 1].lstrip().startswith("#") and not _SECTION.match(lines[n - 1].strip()):
                above.insert(0, comments[n])
                n -= 1
            text = " ".join(above)
        section = next((name for line, name in reversed(sections) if line < node.lineno), "run")
        for full in [key] + [f"{key}.{sub}" for sub in _dict_keys(node.value)]:
            meanings[full] = text
            section_of[full] = (node.lineno, section)
    return meanings, section_of


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
    """The `--help` text of `config` (loaded from `config_path`): its options by section, each with its value."""
    meanings, section_of = option_meanings()
    unknown = (10**9, "other")  # options default.py does not define: last

    def defined(key: str) -> str | None:
        """`key`, or the nearest section default.py assigns (`mesh.dp` -> `mesh`: `config.mesh = mesh_config()`)."""
        parts = key.split(".")
        return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in section_of), None)

    options = [(section_of.get(defined(key), unknown), key, value) for key, value in flat_items(config)]
    groups: Dict[str, List[str]] = {}
    for (_, section), key, value in sorted(options, key=lambda option: (option[0][0], option[1])):
        meaning = _one_line(meanings.get(defined(key), ""))
        line = f"  --config.{key}={value!r}" + (f"\n      {meaning}" if meaning else "")
        groups.setdefault(section, []).append(line)
    head = (
        "usage: python scripts/train.py [--config=CONFIG_FILE] [--config.KEY=VALUE ...]\n\n"
        "Trains a policy with RL (mathrl_jax). Every option below can be set on the command line; the values shown "
        f"are those of {config_path}.\nRecipes: mathrl_jax/configs/*.py (--config=mathrl_jax/configs/NAME.py).\n"
    )
    return head + "".join(f"\n{name}:\n" + "\n".join(lines) + "\n" for name, lines in groups.items())
