"""rewards.functions: TRL's reward-function convention, weighted; bad functions named."""

import types

import numpy as np
import pytest

from mathrl_jax.rewards.functions import RewardFunctionError, RewardFunctions, load_reward_function, parse_weights

PROBLEMS = [
    types.SimpleNamespace(question="1+1=", answer="2", solution=None, level=None, subject=None, uid=str(i))
    for i in range(3)
]


def lengths(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def only_the_first(prompts, completions, uid, **columns):
    return [1.0 if u == "0" else None for u in uid]  # None: not scored by this function (TRL)


def test_the_weighted_sum_and_each_functions_mean_over_what_it_scored():
    functions = RewardFunctions([lengths, only_the_first], [0.5, 2.0])
    scores, metrics = functions(["p"] * 3, ["a", "bb", "ccc"], PROBLEMS)
    np.testing.assert_allclose(scores, [0.5 * 1 + 2.0, 0.5 * 2, 0.5 * 3])
    assert metrics == {"rollout/function/lengths": 2.0, "rollout/function/only_the_first": 1.0}


def test_functions_of_the_same_name_log_apart():
    assert RewardFunctions([lengths, lengths], [1.0, 1.0]).names == ["lengths", "lengths_2"]


@pytest.mark.parametrize(
    "returned, message",
    [([1.0], "returned 1 values for 3 completions"), ([1.0, float("nan"), 0.0], "non-finite"), ("abc", "not a list")],
)
def test_a_bad_return_is_named(returned, message):
    def bad(prompts, completions, **columns):
        return returned

    with pytest.raises(RewardFunctionError, match=message):
        RewardFunctions([bad], [1.0])(["p"] * 3, ["a", "b", "c"], PROBLEMS)


def test_loading_by_module_and_by_file(tmp_path):
    assert load_reward_function("os.path:basename")("/a/b") == "b"
    path = tmp_path / "mine.py"
    path.write_text("def score(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    assert load_reward_function(f"{path}:score")(prompts=[], completions=["x"]) == [1.0]
    for spec, message in [
        ("no_colon", "expected 'module:function'"),
        (f"{tmp_path}/missing.py:score", "no file"),
        (f"{path}:nope", "has no function 'nope'"),
        ("no_such_module_xyz:f", "cannot load 'no_such_module_xyz'"),
    ]:
        with pytest.raises(RewardFunctionError, match=message):
            load_reward_function(spec)
    assert parse_weights("", 2) == (1.0, 1.0) and parse_weights("0.5, 2", 2) == (0.5, 2.0)
    with pytest.raises(RewardFunctionError, match="expected 2 finite numbers"):
        parse_weights("1", 2)
