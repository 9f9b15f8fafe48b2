"""A rule-based process verifier for the offline arithmetic task: each step of a column-by-column solution scored
right or wrong given the problem, where OpenR's process reward model would score it.

The offline task's solutions (`data/teacher.py`) are written one column at a time, steps separated by ",":

    57+38=       7+8=15,5+3+1=9,\\boxed{95}                      a slip: 7+8=15,5+3+0=8,\\boxed{85}
    4821+3795=   1+5=6,2+9+0=11,8+7+1=16,4+3+1=8,\\boxed{8616}   (the column chain, d digits: d + 1 steps)

A step is right when it is the step the problem's correct solution has at that place: the units column's fact,
each later column with the right carry, the right boxed answer. So "5+3+0=8" is scored wrong for 57+38 although
the sum is true: its column drops the carry the problem needs. A step past the solution's last, or a step of a
problem the verifier cannot parse, is scored wrong.

`ArithmeticStepVerifier` has `ProcessRewardModel.step_scores`'s interface (one float32 `[n_steps]` array of P(good)
per sample, here exactly 0 or 1), so the trainer uses it where it uses a PRM: `--config.prm_model_name_or_path=
arithmetic_steps` with `--config.step_separator=,` and a `reward_source` with "prm". Written by hand because
there is no library verifier of this task's steps; the reference steps come from the task's own teacher.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from mathrl_jax.data import teacher

NAME = "arithmetic_steps"  # the `prm_model_name_or_path` that selects this verifier
STEP_SEPARATOR = ","
_EXPRESSION = re.compile(r"(?<!\d)\d+[+-]\d+(?!\d)")


def reference_steps(question: str) -> list[str] | None:
    """The correct solution's steps for an arithmetic question (`"57+38="`, `"4821-3795="`, in any
    `question_format`), or None when its first `a+b` / `a-b` expression is not one the teacher solves (two operands
    of the same number of digits, 2 to `teacher.MAX_DIGITS`) or it has none."""
    found = _EXPRESSION.search(question)
    if found is None:
        return None
    try:
        return teacher.worked_solution(found.group()).split(STEP_SEPARATOR)
    except ValueError:
        return None


class ArithmeticStepVerifier:
    """Scores each step of an arithmetic solution against the problem's correct steps (see the module docstring)."""

    def step_scores(self, questions: Sequence[str], steps: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """1.0 for each step that is the correct solution's step at its place, else 0.0; one `[len(steps[i])]`
        float32 array per sample."""
        if len(questions) != len(steps):
            raise ValueError(f"{len(questions)} questions but {len(steps)} step lists")
        scores = []
        for question, sample in zip(questions, steps):
            reference = reference_steps(question) or []
            right = [i < len(reference) and step.strip() == reference[i] for i, step in enumerate(sample)]
            scores.append(np.asarray(right, np.float32))
        return scores
