"""The offline task's process verifier: every step of the teacher's correct solutions scored right, a slip's
dropped carry and everything after it scored wrong, as OpenR's PRM would score them; on the column chain's d digits
each column scored alone, and on two digits the scores of the two-digit verifier before it."""

import re

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


# --- the column chain: d digits ------------------------------------------------------------------------------------


def chain(digits, n=200, seed=0):
    return [
        p.question
        for p in arithmetic.arithmetic_problems(n, seed=seed, level=2, digits=digits, question_format="{expr}=")
    ]


def plant_wrong_carry(step):
    """The step with its carry flipped (1 <-> 0) and its result recomputed: true arithmetic, the wrong carry."""
    top, op, bottom, carry = re.match(r"^(?:\d+-\d+:)?(\d+)([+-])(\d+)[+-](\d)=\d+$", step).groups()
    flipped = 1 - int(carry)
    result = int(top) + int(bottom) + flipped if op == "+" else int(top) - int(bottom) - flipped
    return f"{top}{op}{bottom}{op}{flipped}={result}"


@pytest.mark.parametrize("digits", range(2, 9))
def test_a_planted_wrong_carry_in_column_k_scores_exactly_step_k_wrong(digits):
    questions = chain(digits, n=60, seed=digits)
    verifier = ArithmeticStepVerifier()
    right = [teacher.worked_solution(q[:-1]).split(",") for q in questions]
    for scores in verifier.step_scores(questions, right):
        np.testing.assert_array_equal(scores, np.ones(digits + 1, np.float32))
    for k in range(1, digits):
        planted = [steps[:k] + [plant_wrong_carry(steps[k])] + steps[k + 1 :] for steps in right]
        expected = np.ones(digits + 1, np.float32)
        expected[k] = 0.0
        for question, steps, scores in zip(questions, planted, verifier.step_scores(questions, planted)):
            np.testing.assert_array_equal(scores, expected, err_msg=f"{question} {steps}")


@pytest.mark.parametrize("digits", [3, 5, 8])
def test_the_teachers_slips_are_wrong_from_the_first_dropped_carry(digits):
    verifier = ArithmeticStepVerifier()
    questions = chain(digits, n=200, seed=1)
    for question in questions:
        expr = question[:-1]
        slipped = teacher.solve(expr, slip=teacher.slip_decisions(expr, 0.5, seed=2))
        (scores,) = verifier.step_scores([question], [list(slipped.steps)])
        if not any(slipped.dropped):
            np.testing.assert_array_equal(scores, np.ones(digits + 1, np.float32))
            continue
        first = slipped.dropped.index(True)
        assert scores[:first].all() and scores[first] == 0.0 and scores[-1] == 0.0, (question, slipped.steps, scores)


def test_it_agrees_with_the_two_digit_verifier_on_two_digits():
    from tests.data import two_digit_teacher_before as before

    verifier = ArithmeticStepVerifier()
    train, _ = arithmetic.arithmetic_train_eval(300, 1, seed=5, levels=(2,), question_format="What is {expr}?")
    questions = [p.question for p in train] + chain(2, n=300)
    samples = []
    for i, question in enumerate(questions):
        expr = teacher.expression_of(question, "What is {expr}?" if question.startswith("What") else "{expr}=")
        samples.append(
            [
                teacher.worked_solution(expr).split(","),
                teacher.worked_solution(expr, slip=True).split(","),
                teacher.worked_solution(expr).split(",")[::-1],
                ["garbage", " " + teacher.worked_solution(expr).split(",")[0] + " "],
            ][i % 4]
        )
    new = [list(s) for s in verifier.step_scores(questions, samples)]
    assert new == before.step_scores(questions, samples)
    for question in ("57+38=", "Compute 83-57.", "what is 2+2?", "no problem here"):
        assert reference_steps(question) == before.reference_steps(question)


@pytest.mark.parametrize("question", ["123+45=", "12345678901+12345678901=", "what is 2+2?", "7*3="])
def test_no_reference_for_what_the_teacher_does_not_solve(question):
    assert reference_steps(question) is None
    (scores,) = ArithmeticStepVerifier().step_scores([question], [["1+2=3", "\\boxed{3}"]])
    np.testing.assert_array_equal(scores, [0.0, 0.0])
