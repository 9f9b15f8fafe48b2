"""The countdown task's outcome verifier: a response is right when its steps derive the target from the given
numbers, each used once (`data.countdown.rules.check_derivation`), not when it boxes the right number.

The target is in the prompt (`3,7,5->26:`), so the math grader's check of a boxed answer against the gold would
reward copying it. `CountdownGrader` has `MathGrader`'s interface (`values`, `grade_batch(responses, golds)` ->
`GradeResult`s, `rewards`, `close`), with the problem's gold answer the instance itself (`3,7,5->26`,
`Problem.answer` of `data.countdown`): the training build uses it in the math grader's place where
`dataset_name="countdown"`, so the rewards of RL, the held-out accuracy and pass@k, the warm-start's accuracy and
the logged samples all grade the derivation. Verdicts:

    correct     every step valid, every number used once, the last piece \\boxed{target}
    incorrect   a \\boxed{} answer, but a step breaks a rule, a number is left over or used twice, the steps end
                elsewhere, or the boxed value is not the target
    no_answer   no \\boxed{} at all

with `formatted` (for `RewardValues.format_reward`) a non-empty `\\boxed{}`. The check is a few string operations
and a small exhaustive search per response, in this process: no worker processes, no timeout needed.

`countdown_reward` is the same verdict as a reward function in TRL's convention (`rewards.functions`), for a loop
of one's own: `reward_source="functions"` with `reward.functions=mathrl_jax.rewards.countdown_grader:countdown_reward`
rewards training alike, but the held-out evaluation would still use the math grader.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mathrl_jax.data.countdown import rules
from mathrl_jax.rewards.math_grader import GradeResult, RewardValues, batch_rewards

NAME = "countdown"  # the dataset_name whose rewards this grader makes


def grade(response: str, gold: str) -> GradeResult:
    """The verdict on one response to the instance `gold` (`3,7,5->26`; a question `3,7,5->26:` also reads)."""
    if not isinstance(response, str):
        raise TypeError(f"response must be a string, got {type(response).__name__}")
    verdict = rules.check_derivation(rules.parse_instance(gold), response)
    if verdict.boxed is None:
        return GradeResult("no_answer", None, False)
    formatted = bool(verdict.boxed.strip())
    return GradeResult("correct" if verdict.correct else "incorrect", verdict.boxed, formatted)


class CountdownGrader:
    """`MathGrader`'s interface over `grade` (module docstring): `values` prices each verdict."""

    def __init__(self, values: RewardValues = RewardValues()):
        if not isinstance(values, RewardValues):
            raise TypeError(f"values must be a RewardValues, got {type(values).__name__}")
        self.values = values

    def grade_batch(self, responses: Sequence[str], golds: Sequence[str]) -> list[GradeResult]:
        """`grade` of every (response, gold) pair, in order; a gold that is not an instance raises ValueError."""
        if isinstance(responses, str) or isinstance(golds, str):
            raise TypeError("responses and golds must be sequences of strings, not a single string")
        responses, golds = list(responses), list(golds)
        if len(responses) != len(golds):
            raise ValueError(f"got {len(responses)} responses but {len(golds)} gold answers")
        results = []
        for i, (response, gold) in enumerate(zip(responses, golds)):
            try:
                results.append(grade(response, gold))
            except (TypeError, ValueError) as error:
                raise type(error)(f"countdown pair {i}: {error}") from None
        return results

    def rewards(self, responses: Sequence[str], golds: Sequence[str]) -> tuple[np.ndarray, dict[str, float]]:
        """(`[N]` float32 rewards, metrics): as `MathGrader.rewards`."""
        return batch_rewards(self.grade_batch(responses, golds), self.values)

    def close(self) -> None:
        """Nothing to stop (no worker processes)."""

    def __enter__(self) -> CountdownGrader:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def countdown_reward(completions: Sequence[str], answer: Sequence[str], **kwargs) -> list[float]:
    """1.0 for a valid derivation of the target, else 0.0: a reward function in TRL's convention (module docstring),
    given the problems' `answer` column (the instances)."""
    return [float(grade(c, a).correct) for c, a in zip(completions, answer)]
