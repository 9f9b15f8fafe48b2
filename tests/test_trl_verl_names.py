"""TRL's and verl's option names (configs/names.py): each alias means one of our options, each refused name points
at one, the docs page is the tables, and scripts/train.py rewrites, refuses and suggests through them (issue 48:
`--config.num_generations=4` got `Did you mean "num_iterations"`, TRL's `beta` no hint at all)."""

import os
import pathlib
import subprocess
import sys

import pytest

from mathrl_jax import trl_verl_names as names
from mathrl_jax.configs import default
from mathrl_jax.options import options_of

ROOT = pathlib.Path(__file__).resolve().parents[1]
KEYS = [option.key for option in options_of(default.OPTIONS)]
ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def train(*flags):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *flags],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_name_points_at_an_option_and_none_is_ours():
    assert {a.key for a in names.ALIASES} <= set(KEYS)
    assert {r.key for r in (*names.REFUSED, *names.COLLISIONS)} <= set(KEYS)
    others = [a.name for a in names.ALIASES] + [r.name for r in names.REFUSED]
    assert len(others) == len(set(others)), "a name is listed twice"
    assert not set(others) & set(KEYS), "an alias or refused name is one of our keys"
    assert {c.name for c in names.COLLISIONS} <= set(KEYS), "a collision is a name of ours"


def test_the_docs_page_is_the_tables():
    page = (ROOT / "docs" / "trl_verl_names.md").read_text()
    for system in (names.TRL, names.VERL):
        assert names.markdown_table(system) in page, f"docs/trl_verl_names.md's {system} table is stale"


def test_resolve_names_rewrites_aliases_and_says_so():
    argv, notes = names.resolve_names(
        ["train.py", "--config.num_generations=4", "--config.actor_rollout_ref.rollout.n=4", "--config.lr=1e-6"]
    )
    assert argv == ["train.py", "--config.group_size=4", "--config.group_size=4", "--config.lr=1e-6"]
    assert notes == [
        "--config.num_generations is TRL's name of --config.group_size",
        "--config.actor_rollout_ref.rollout.n is verl's name of --config.group_size",
    ]


def test_resolve_names_refuses_other_meanings_and_two_values_of_one_key():
    with pytest.raises(names.RefusedName, match=r"max_steps is TRL's, with another meaning here: use num_iterations"):
        names.resolve_names(["train.py", "--config.max_steps=100"])
    with pytest.raises(names.RefusedName, match=r"kl_coef is given twice, as --config.beta=0.1 and --config.kl_coef"):
        names.resolve_names(["train.py", "--config.beta=0.1", "--config.kl_coef=0.2"])
    same = names.resolve_names(["t", "--config.beta=0.1", "--config.kl_coef=0.1"])[0]
    assert same[1:] == ["--config.kl_coef=0.1"] * 2


@pytest.mark.parametrize(
    "typed, first",
    [
        ("num_generation", "group_size (TRL's num_generations)"),
        ("max_completion_len", "max_new_tokens (TRL's max_completion_length)"),
        ("max_step", "num_iterations (not TRL's max_steps, which differs)"),
        ("lora.dropot", "lora.dropout"),
        ("rollout.n", "group_size (verl's actor_rollout_ref.rollout.n)"),
    ],
)
def test_suggestions_go_through_the_tables_first(typed, first):
    found = names.suggestions(typed, KEYS)
    assert found[0] == first
    assert len({shown.split(" ", 1)[0] for shown in found}) == len(found), f"a key suggested twice: {found}"


def test_train_py_refuses_and_suggests_in_one_line():
    """Before issue 48: `Did you mean "num_iterations"` for num_generations, no hint for beta."""
    done = train("--config.num_generation=4")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "did you mean group_size (TRL's num_generations)" in done.stderr
    done = train("--config.per_device_train_batch_size=4")
    assert done.returncode == 2 and "use n_rollout_threads" in done.stderr, done.stderr
    done = train("--config.beta=0.1", "--config.kl_coef=0.2")
    assert done.returncode == 2 and "given twice" in done.stderr, done.stderr


def test_help_describes_every_option_in_full_with_its_other_names():
    """Before issue 48: 40 options without a description, 45 cut off with `...`, reward.correct showing
    reward.functions' text."""
    done = train("--help")
    assert done.returncode == 0, done.stderr
    entries, key = {}, None
    for line in done.stdout.splitlines():
        if line.startswith("  --config."):
            key = line[len("  --config.") :].split("=", 1)[0]
            entries[key] = ""
        elif line.startswith("      ") and key:
            entries[key] += line + "\n"
    assert set(entries) == set(KEYS), set(KEYS) ^ set(entries)
    for option in options_of(default.OPTIONS):
        assert option.meaning.strip(), f"{option.key} has no meaning of its own"
        shown = " ".join(entries[option.key].split())
        assert " ".join(option.meaning.split()) in shown, option.key
        for alias in names.aliases_of(option.key):
            assert f"{alias.system}: {alias.name}" in shown, (option.key, alias.name)
    assert "correct final answer" in entries["reward.correct"] and "functions" not in entries["reward.correct"]
    assert "ppo_epoch for TRL's num_iterations" in " ".join(entries["num_iterations"].split())
