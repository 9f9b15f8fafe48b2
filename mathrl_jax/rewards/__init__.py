"""Rewards: rule-based math answer grading and process-reward-model step scores.

    from mathrl_jax.rewards import MathGrader, RewardValues
    with MathGrader(RewardValues(correct=1.0, incorrect=0.0), num_workers=4) as grader:
        rewards, metrics = grader.rewards(responses, golds)

The grader needs no JAX; the PRM names (`ProcessRewardModel`, `PRMConfig`) are
imported on first use, so grading processes do not load JAX.
"""

import inspect as _inspect

from mathrl_jax.rewards.extraction import extract_answer, extract_boxed
from mathrl_jax.rewards.math_grader import (
    STATUSES,
    GradeResult,
    MathGrader,
    RewardValues,
    grade,
    grade_metrics,
    reward_value,
    shutdown_workers,
)

_PRM_NAMES = ("PRMConfig", "ProcessRewardModel", "REWARD_MODES")


def __getattr__(name):
    if name in _PRM_NAMES:
        from mathrl_jax.rewards import prm

        return getattr(prm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_PRM_NAMES))


# The names imported above (not the submodules), and the PRM's.
__all__ = sorted(
    [
        *_PRM_NAMES,
        *(name for name, value in dict(globals()).items() if not name.startswith("_") and not _inspect.ismodule(value)),
    ]
)
