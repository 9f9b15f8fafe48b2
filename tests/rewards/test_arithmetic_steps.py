"""The offline task's process verifier: every step of the teacher's correct solutions scored right, a slip's
dropped carry and everything after it scored wrong, as OpenR's PRM would score them."""

import numpy as np
import pytest

from mathrl_jax.data import arithmetic, teacher
from mathrl_jax.rewards.arithmetic_steps import ArithmeticStepVerifier, reference_steps


def problems(n=300):
    train, _ = arithmetic.arithmetic_train_eval(n, 1, seed=3, levels=(2,), question_format="{expr}=")
    return train


def test_every_step_of_every_correct_solution_is_right():
    questions = [p.question for p in problems()]
    steps = [teacher.worked_solution(q.removesuffix("=")).split(",") for q in questions]
    for scores in ArithmeticStepVerifier().step_scores(questions, steps):
        np.testing.assert_array_equal(scores, np.ones(3, np.float32))


def test_a_slip_is_wrong_from_the_column_that_drops_the_carry():
    carry = [p.question for p in problems() if teacher.needs_carry(p.question.removesuffix("="))]
    assert len(carry) > 50
    slipped = [teacher.worked_solution(q.removesuffix("="), slip=True).split(",") for q in carry]
    for question, steps, scores in zip(carry, slipped, ArithmeticStepVerifier().step_scores(carry, slipped)):
        # units right; the tens column's sum is true arithmetic but drops the carry; the boxed answer is wrong
        np.testing.assert_array_equal(scores, [1.0, 0.0, 0.0], err_msg=f"{question} {steps}")


@pytest.mark.parametrize(
    "question, steps, expected",
    [
        ("57+38=", ["7+8=15", "5+3+1=9", "\\boxed{95}", "\\boxed{95}"], [1, 1, 1, 0]),  # a step past the last
        ("57+38=", ["7+8=14"], [0]),
        ("57+38=", [" 7+8=15 ", "\\boxed{95}"], [1, 0]),  # the answer where the tens column belongs
        ("Compute 83-57.", ["83-57:13-7=6", "8-5-1=2", "\\boxed{26}"], [1, 1, 1]),  # another question format
        ("57-83=", ["83-57:13-7=6", "8-5-1=2", "\\boxed{26}"], [1, 1, 0]),  # the sign of a-b
        ("what is 2+2?", ["2+2=4"], [0]),  # not a two-digit problem: nothing is right
    ],
)
def test_steps_are_scored_by_place_against_the_problems_solution(question, steps, expected):
    (scores,) = ArithmeticStepVerifier().step_scores([question], [steps])
    np.testing.assert_array_equal(scores, np.asarray(expected, np.float32))
    assert reference_steps("what is 2+2?") is None
