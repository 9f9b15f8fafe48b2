"""The settings sections: below the build no module reads the config or the `Run`, none compares an algorithm's or
a loss's name (the algorithm record and the loss's use do the dispatch), and each section checks itself."""

import ast
import pathlib

import pytest

import mathrl_jax
from mathrl_jax.configs import default
from mathrl_jax.train import algorithms
from mathrl_jax.train.batch._prepare import BatchSettings, DapoSettings
from mathrl_jax.train.rollouts._problems import PromptSettings
from mathrl_jax.train.setup import _sections as sections
from mathrl_jax.train.update import _config as update_lib

PACKAGE = pathlib.Path(mathrl_jax.__file__).parent
THE_BUILD = {
    "train/setup",  # the build: the config checked, turned into sections, resumed, the run built from it
    "train/rollouts/_problems.py",  # the config's data, loaded by the build
    "train/loop.py",  # train(config): the build, then the loop (its iteration takes sections)
    "train/algorithms.py",  # the names and their records
}
NAMES = set(algorithms.ALGORITHMS) | set(update_lib.POLICY_LOSS_USES)


def below_the_build():
    def in_the_build(path):
        return any(str(path.relative_to(PACKAGE)).startswith(part) for part in THE_BUILD)

    return sorted(p for p in (PACKAGE / "train").rglob("*.py") if not in_the_build(p))


def name_comparisons(tree):
    """(line, name) of each `x == "name"`, `x != "name"`, `x in ("name", ...)` of an algorithm or loss name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                constants = [right] if isinstance(right, ast.Constant) else getattr(right, "elts", [])
                for c in constants:
                    if (
                        isinstance(c, ast.Constant)
                        and c.value in NAMES
                        and isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                    ):
                        found.append((node.lineno, c.value))
    return found


@pytest.mark.parametrize("path", below_the_build(), ids=lambda p: p.name)
def test_no_module_below_the_build_takes_the_config_or_the_run(path):
    tree = ast.parse(path.read_text())
    arguments = [
        (node.name, arg.arg)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for arg in node.args.args + node.args.kwonlyargs
        if arg.arg in ("config", "run")
    ]
    assert not arguments, f"{path.name}: functions taking the config or the Run: {arguments}"
    imports = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mathrl_jax.train.setup")
        for alias in node.names
    ]
    assert set(imports) <= {"RunSettings"}, f"{path.name} imports {imports} of the build"
    assert ".config." not in path.read_text().replace("configs.", ""), f"{path.name} reads a config's field"
    assert not name_comparisons(tree), f"{path.name} compares names: {name_comparisons(tree)}"


def test_the_name_check_would_see_a_comparison():
    assert name_comparisons(ast.parse('if cfg.policy_loss == "action_ppo": pass')) == [(1, "action_ppo")]
    assert name_comparisons(ast.parse('x = alg in ("appo", "tppo")')) == [(1, "appo"), (1, "tppo")]


@pytest.mark.parametrize("name", algorithms.NAMES)
def test_every_algorithms_sections_are_built_from_the_default_config(name):
    config = default.get_config()
    config.algorithm_name = name
    update = sections.update_config(config)
    batch = sections.batch_settings(config, update)
    record = algorithms.ALGORITHMS[name]
    assert batch.algorithm == record and (batch.dapo is not None) == record.dynamic_sampling
    assert update.policy_loss == record.policy_loss
    assert batch.update is update and update.ppo_epoch == config.ppo_epoch  # shared with the update, not copied
    rollouts = sections.rollout_settings(config)
    assert rollouts.sampling.n == config.group_size and rollouts.sampling_at(3).seed != rollouts.sampling_at(4).seed
    assert sections.run_settings(config).total_iterations == config.num_iterations


def test_the_openr_whitening_and_the_token_ratio_come_from_the_record():
    config = default.get_config()
    config.algorithm_name, config.advantage_whitening = "appo", "openr"
    assert sections.update_config(config).minibatch_whitening == "actions"
    config.appo_action_ratio = False
    assert sections.update_config(config).policy_loss == "ppo"
    config.algorithm_name = "grpo"  # no OpenR whitening of its own
    assert sections.update_config(config).minibatch_whitening is None


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: PromptSettings("no_such_template", 16), "no_such_template"),
        (lambda: PromptSettings("plain", 0), "max_prompt_length=0"),
        (lambda: DapoSettings(16, success_rate_lb=0.9, success_rate_ub=0.1), "success_rate_lb=0.9"),
        (lambda: BatchSettings(algorithms.ALGORITHMS["dapo"], 32), "dynamic sampling"),
        (lambda: BatchSettings(algorithms.ALGORITHMS["grpo"], 32, tis_cap=-1.0), "tis_cap=-1.0"),
    ],
)
def test_a_section_refuses_bad_settings_naming_them(make, match):
    with pytest.raises(ValueError, match=match):
        make()
