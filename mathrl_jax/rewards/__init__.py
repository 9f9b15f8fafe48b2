"""Rewards: rule-based math answer grading and process-reward-model step scores.

    from mathrl_jax.rewards import MathGrader, RewardValues
    with MathGrader(RewardValues(correct=1.0, incorrect=0.0), num_workers=4) as grader:
        rewards, metrics = grader.rewards(responses, golds)

The grader needs no JAX; the PRM names (`ProcessRewardModel`, `PRMConfig`) are
imported on first use, so grading processes do not load JAX.
"""

from mathrl_jax.rewards.math_grader import (
    STATUSES,
    GradeResult,
    MathGrader,
    RewardValues,
    extract_answer,
    extract_boxed,
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


__all__ = [
    "REWARD_MODES",
    "STATUSES",
    "GradeResult",
    "MathGrader",
    "PRMConfig",
    "ProcessRewardModel",
    "RewardValues",
    "extract_answer",
    "extract_boxed",
    "grade",
    "grade_metrics",
    "reward_value",
    "shutdown_workers",
]
