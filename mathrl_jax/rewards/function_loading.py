"""Loading a reward function named by its spec: `module:function` (an importable module) or
`path/to/file.py:function` (a file, loaded by path), as verl's `custom_reward_function` names one. Shared by the
training process (`functions`) and the function's own process (`function_process`)."""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Callable, Sequence, Tuple

from mathrl_jax.errors import MathRLError


class RewardFunctionError(MathRLError, ValueError):
    """A reward function that cannot be loaded, or that returned something other than one finite number per
    completion; names the function."""


def split_spec(spec: str) -> Tuple[str, str]:
    """(module or file, function) of `module:function` or `path/to/file.py:function`."""
    module_name, sep, function_name = spec.strip().rpartition(":")
    if not sep or not module_name or not function_name:
        raise RewardFunctionError(f"reward function {spec!r}: expected 'module:function' or 'path/file.py:function'")
    return module_name, function_name


def load_reward_function(spec: str) -> Callable[..., Sequence[float]]:
    """`module:function` (an importable module) or `path/to/file.py:function` (a file, loaded by path)."""
    module_name, function_name = split_spec(spec)
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
