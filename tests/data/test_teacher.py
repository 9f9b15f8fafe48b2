"""The warm-start's teacher: every worked solution is true arithmetic, a slip drops exactly the carry."""

import re

import numpy as np
import pytest

from mathrl_jax.data import arithmetic, teacher
from mathrl_jax.models import char_tokenizer

ALL = [f"{a}{op}{b}" for a in range(10, 100) for b in range(10, 100) for op in "+-"]
STEP = re.compile(r"^(\d+)([+-])(\d+)(?:([+-])(\d))?=(\d+)$")


def steps_and_answer(solution):
    """(steps as (a, op, b, carry op, carry, result), boxed answer) parsed from a solution."""
    body, boxed = solution.rsplit(",\\boxed{", 1)
    assert boxed.endswith("}")
    if ":" in body:
        body = body.split(":", 1)[1]
    steps = []
    for text in body.split(","):
        m = STEP.match(text)
        assert m, (solution, text)
        steps.append(m.groups())
    return steps, int(boxed[:-1])


def column_value(step):
    a, op, b, carry_op, carry, _ = step
    value = int(a) + int(b) if op == "+" else int(a) - int(b)
    if carry_op:
        value = value + int(carry) if carry_op == "+" else value - int(carry)
    return value


def test_every_correct_solution_is_true_and_boxes_the_exact_value():
    for expr in ALL:
        solution = teacher.worked_solution(expr)
        steps, answer = steps_and_answer(solution)
        assert answer == eval(expr), (expr, solution)
        assert all(column_value(s) == int(s[-1]) for s in steps), solution  # every step is a true fact
        assert len(steps) == 2


def test_a_slip_drops_the_carry_and_nothing_else():
    carries = 0
    for expr in ALL:
        right, slipped = teacher.worked_solution(expr), teacher.worked_solution(expr, slip=True)
        (units, tens), answer = steps_and_answer(slipped)
        assert column_value(units) == int(units[-1]) and column_value(tens) == int(tens[-1])  # still true facts
        a, b = int(expr[:2]), int(expr[3:])
        overflow = (a % 10 + b % 10 >= 10) if expr[2] == "+" else (max(a, b) % 10 < min(a, b) % 10)
        assert teacher.needs_carry(expr) == overflow
        if overflow:
            carries += 1
            assert tens[4] == "0"  # the one slipped token: the carry written as 0
            # Addition loses the carried ten; subtraction keeps the borrowed one: |answer| is 10 too large.
            expected = eval(expr) - 10 if expr[2] == "+" else int(np.sign(eval(expr))) * (abs(eval(expr)) + 10)
            assert answer == expected, (expr, slipped)
            # The two agree up to the carry token, where the slip writes 0 instead of 1.
            first = next(i for i, (x, y) in enumerate(zip(right, slipped)) if x != y)
            assert (right[first], slipped[first]) == ("1", "0") and right[first - 1] in "+-"
        else:
            assert slipped == right
    assert 0.40 < carries / len(ALL) < 0.50  # about 45% of the problems carry or borrow


def test_slips_happen_at_the_slip_rate_on_carry_problems_only():
    carry = [e for e in ALL if teacher.needs_carry(e)]
    plain = [e for e in ALL if not teacher.needs_carry(e)]
    for rate in (0.0, 0.3, 0.7, 1.0):
        hits = np.mean([teacher.slips(e, rate, seed=3) for e in carry])
        assert abs(hits - rate) < 4 * np.sqrt(rate * (1 - rate) / len(carry)) + 1e-9, (rate, hits)
        assert not any(teacher.slips(e, rate, seed=3) for e in plain)
    draws = [teacher.slips(carry[0], 0.5, seed=0, draw=d) for d in range(64)]
    assert draws == [teacher.slips(carry[0], 0.5, seed=0, draw=d) for d in range(64)]  # deterministic
    assert 10 < sum(draws) < 54  # independent draws
    with pytest.raises(ValueError, match="1.5"):
        teacher.slips(carry[0], 1.5, seed=0)


def test_teacher_solutions_of_questions():
    train, _ = arithmetic.arithmetic_train_eval(400, 10, seed=0, levels=(2,), question_format="What is {expr}?")
    questions = [p.question for p in train]
    solutions = teacher.teacher_solutions(questions, slip_rate=0.7, seed=0, question_format="What is {expr}?")
    for problem, solution in zip(train, solutions):
        _, answer = steps_and_answer(solution)
        expr = problem.question[len("What is ") : -1]
        assert solution in (teacher.worked_solution(expr), teacher.worked_solution(expr, slip=True))
        assert (answer == int(problem.answer)) or teacher.needs_carry(expr)
    # A repeated question is a new draw each time: with rate 0.5 both kinds turn up.
    carry_question = next(q for q in questions if teacher.needs_carry(q[len("What is ") : -1]))
    repeated = teacher.teacher_solutions(
        [carry_question] * 40, slip_rate=0.5, seed=0, question_format="What is {expr}?"
    )
    assert len(set(repeated)) == 2
    with pytest.raises(ValueError, match="'7\\*3'"):
        teacher.teacher_solutions(["7*3="], slip_rate=0.5, seed=0)
    with pytest.raises(ValueError, match="question_format"):
        teacher.teacher_solutions(["57+38"], slip_rate=0.5, seed=0)


def test_solutions_fit_the_default_generation_budget():
    from mathrl_jax.configs import default

    longest = max(len(teacher.worked_solution(e)) for e in ALL)  # one token per character
    assert longest + 1 <= default.get_config().max_new_tokens  # + EOS
    assert set("".join(teacher.worked_solution(e) for e in ALL[::37])) <= set(char_tokenizer.CHARACTERS)
