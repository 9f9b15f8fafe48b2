"""One exception base: every error class the package defines derives from `MathRLError`, which `scripts/train.py`
turns into exit status 2 with its message; no two of them share a name."""

import importlib
import inspect
import pkgutil

import mathrl_jax
from mathrl_jax.errors import MathRLError

# Raised inside the sandboxed interpreter against the model's code and reported to the trainer as an outcome,
# never raised in the trainer; the child imports as little of the package as it can.
SANDBOX_CHILD = "mathrl_jax.envs.sandbox.child"


def defined_errors():
    """The public exception classes of every module (private ones are control flow inside a module)."""
    found = []
    for info in pkgutil.walk_packages(mathrl_jax.__path__, "mathrl_jax."):
        if ".configs." in info.name:
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            public = not cls.__name__.startswith("_") and info.name != SANDBOX_CHILD
            if public and issubclass(cls, BaseException) and cls.__module__ == info.name:
                found.append(cls)
    return found


def test_every_error_the_package_defines_derives_from_the_base():
    errors = defined_errors()
    assert len(errors) >= 10
    outside = [f"{cls.__module__}.{cls.__name__}" for cls in errors if not issubclass(cls, MathRLError)]
    assert not outside, outside


def test_no_two_errors_share_a_name():
    names = [cls.__name__ for cls in defined_errors() if cls is not MathRLError]
    assert len(names) == len(set(names)), sorted(names)
