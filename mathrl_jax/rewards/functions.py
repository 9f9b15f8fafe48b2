"""Reward functions of the user's own, named in the config (`reward.functions`, as verl's `custom_reward_function`
names a file and a function) or passed in Python (`loop.train(config, reward_functions=[...])`, as TRL's
`reward_funcs`).

Each is called as TRL calls its reward functions:

    fn(prompts=[str], completions=[str], question=[...], answer=[...], solution=[...], level=[...],
       subject=[...], uid=[...]) -> list of floats

one entry per completion (a prompt repeated once per sample of its group), the problem's fields as keyword lists
(`PROBLEM_COLUMNS`); a function takes the ones it needs and `**kwargs` for the rest. A `None` entry means "not
scored by this function" (TRL's convention): it adds 0 and is left out of the function's logged mean. The reward
of a completion is the weighted sum over the functions (`reward.weights`, TRL's `reward_weights`; default 1
each), plus the math verifier's score where `reward_source` is "verifier+functions".
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from mathrl_jax.errors import MathRLError

PROBLEM_COLUMNS = ("question", "answer", "solution", "level", "subject", "uid")
"""The fields of `data.layouts.Problem` each function receives, as lists aligned with the completions."""


class RewardFunctionError(MathRLError, ValueError):
    """A reward function that cannot be loaded, or that returned something other than one finite number per
    completion; names the function."""


def load_reward_function(spec: str) -> Callable[..., Sequence[float]]:
    """`module:function` (an importable module) or `path/to/file.py:function` (a file, loaded by path)."""
    module_name, sep, function_name = spec.strip().rpartition(":")
    if not sep or not module_name or not function_name:
        raise RewardFunctionError(f"reward function {spec!r}: expected 'module:function' or 'path/file.py:function'")
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise RewardFunctionError(f"reward function {spec!r}: no file {module_name!r}")
            name = f"mathrl_jax_reward_{abs(hash(os.path.abspath(module_name)))}"
            loader_spec = importlib.util.spec_from_file_location(name, module_name)
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except RewardFunctionError:
        raise
    except Exception as error:  # the user's module failing to import: name it and say how
        raise RewardFunctionError(f"reward function {spec!r}: cannot load {module_name!r}: {error}") from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise RewardFunctionError(f"reward function {spec!r}: {module_name!r} has no function {function_name!r}")
    return function


def parse_weights(text: str, count: int) -> Tuple[float, ...]:
    """`reward.weights` ("1.0,0.5"; "" = 1 each) for `count` functions."""
    if not str(text).strip():
        return (1.0,) * count
    try:
        weights = tuple(float(w) for w in str(text).split(","))
    except ValueError:
        raise RewardFunctionError(f"reward.weights={text!r}: expected comma-separated numbers") from None
    if len(weights) != count or not all(math.isfinite(w) for w in weights):
        raise RewardFunctionError(f"reward.weights={text!r}: expected {count} finite numbers, one per function")
    return weights


class RewardFunctions:
    """The weighted sum of reward functions: `(prompts, completions, problems) -> (scores [N], metrics)`, with each
    function's mean in the metrics (`rollout/function/<name>`)."""

    def __init__(self, functions: Sequence[Callable], weights: Sequence[float], names: Sequence[str] = ()):
        if not functions:
            raise RewardFunctionError("no reward functions")
        if len(weights) != len(functions):
            raise RewardFunctionError(f"{len(weights)} weights for {len(functions)} reward functions")
        self.functions = list(functions)
        self.weights = tuple(float(w) for w in weights)
        names = list(names) or [getattr(f, "__name__", f"function_{i}") for i, f in enumerate(functions)]
        # Unique names for the metrics: a.py:score and b.py:score log as score and score_2.
        self.names = [n if names[:i].count(n) == 0 else f"{n}_{names[:i].count(n) + 1}" for i, n in enumerate(names)]

    @classmethod
    def from_config(cls, specs: str, weights: str) -> "RewardFunctions":
        names = [s.strip() for s in str(specs).split(",") if s.strip()]
        functions = [load_reward_function(s) for s in names]
        return cls(functions, parse_weights(weights, len(functions)), [s.rpartition(":")[2] for s in names])

    def __call__(self, prompts: List[str], completions: List[str], problems: Sequence[Any]):
        columns = {field: [getattr(p, field) for p in problems] for field in PROBLEM_COLUMNS}
        total = np.zeros(len(completions), np.float64)
        metrics: Dict[str, float] = {}
        for function, weight, name in zip(self.functions, self.weights, self.names):
            values = function(prompts=list(prompts), completions=list(completions), **columns)
            try:
                scored = np.array([v is not None for v in values], bool)
                values = np.asarray([0.0 if v is None else v for v in values], np.float64).reshape(-1)
            except (TypeError, ValueError):
                raise RewardFunctionError(
                    f"reward function {name!r} returned {type(values).__name__}, not a list of numbers"
                ) from None
            if values.shape != (len(completions),):
                raise RewardFunctionError(
                    f"reward function {name!r} returned {values.size} values for {len(completions)} completions"
                )
            if not np.all(np.isfinite(values)):
                raise RewardFunctionError(f"reward function {name!r} returned a non-finite value")
            total += weight * values
            if scored.any():
                metrics[f"rollout/function/{name}"] = float(values[scored].mean())
        return total.astype(np.float32), metrics
