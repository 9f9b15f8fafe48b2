"""Countdown: reach a target from given numbers with `+ - *`, each number used once; a procedural search task.

    3,7,5->26:   7*3=21,21+5=26,\\boxed{26}

`rules` (the instance, the derivation format and its check, the exhaustive solver), `problems` (procedural,
deterministic instances, each solvable; train / held-out / harder splits) and `teacher` (the warm-start's
structured teacher: left to right, in the given order, `+` and `*` only). The verifiers that reward it are
`rewards.countdown_grader` (the outcome: a valid derivation of the target) and `rewards.countdown_steps` (each
step, for a process reward).
"""

from mathrl_jax.data.countdown.problems import countdown_problems, countdown_train_eval
from mathrl_jax.data.countdown.rules import (
    MAX_NUMBERS,
    MIN_NUMBERS,
    Instance,
    Verdict,
    check_derivation,
    parse_instance,
    reachable,
    solvable,
    solve,
    step_checks,
)
from mathrl_jax.data.countdown.teacher import teacher_solution, teacher_solutions, teacher_solves

__all__ = [
    "MAX_NUMBERS",
    "MIN_NUMBERS",
    "Instance",
    "Verdict",
    "check_derivation",
    "countdown_problems",
    "countdown_train_eval",
    "parse_instance",
    "reachable",
    "solvable",
    "solve",
    "step_checks",
    "teacher_solution",
    "teacher_solutions",
    "teacher_solves",
]
