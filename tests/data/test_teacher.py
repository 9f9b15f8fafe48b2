"""The warm-start's teacher: every worked solution is true arithmetic, a slip drops exactly the carry; the column
chain's d digits, each needed carry dropped independently, two digits byte-identical to the two-digit teacher's."""

import re

import numpy as np
import pytest

from mathrl_jax.data import arithmetic, teacher
from mathrl_jax.models import char_tokenizer
from tests.data import two_digit_teacher_before as before

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


# --- the column chain: d digits ------------------------------------------------------------------------------------


def chain_problems(digits, n=400, seed=0):
    return [
        p.question[:-1]
        for p in arithmetic.arithmetic_problems(n, seed=seed, level=2, digits=digits, question_format="{expr}=")
    ]


def test_two_digit_solutions_are_byte_identical_to_the_two_digit_teachers():
    for expr in ALL:
        for slip in (False, True):
            assert teacher.worked_solution(expr, slip=slip) == before.worked_solution(expr, slip=slip)
        assert teacher.needs_carry(expr) == before.needs_carry(expr)
        assert teacher.parse_two_digit(expr) == before.parse_two_digit(expr)
    for rate, seed in ((0.7, 0), (0.3, 5), (1.0, 2)):
        assert [teacher.slips(e, rate, seed=seed, draw=d) for e in ALL[::7] for d in range(3)] == [
            before.slips(e, rate, seed=seed, draw=d) for e in ALL[::7] for d in range(3)
        ]
    # The warm-start's targets for the default's 8000 training problems, two question formats, repeats included
    for question_format in ("{expr}=", "What is {expr}?"):
        train, _ = arithmetic.arithmetic_train_eval(8000, 500, seed=1, levels=(2,), question_format=question_format)
        questions = [p.question for p in train]
        kwargs = dict(slip_rate=0.7, seed=1, question_format=question_format)
        assert teacher.teacher_solutions(questions, **kwargs) == before.teacher_solutions(questions, **kwargs)


def column_steps(expr, solution):
    """(x, y, op, [(top, y digit, carry or None, result)] units first, boxed answer) parsed from a solution."""
    steps, answer = steps_and_answer(solution)
    op = "+" if "+" in expr else "-"
    if op == "-":
        prefix = solution.split(":", 1)[0]
        x, y = (int(v) for v in prefix.split("-"))
    else:
        x, y = (int(v) for v in expr.split("+"))
    return x, y, op, [(int(s[0]), int(s[2]), None if s[3] is None else int(s[4]), int(s[5])) for s in steps], answer


@pytest.mark.parametrize("digits", range(2, 11))
def test_every_correct_solution_is_true_column_by_column(digits):
    for expr in chain_problems(digits, n=300, seed=digits):
        solution = teacher.worked_solution(expr)
        x, y, op, columns, answer = column_steps(expr, solution)
        assert answer == eval(expr), (expr, solution)
        assert len(columns) == digits and columns[0][2] is None and all(c[2] is not None for c in columns[1:])
        assert sorted((x, y), reverse=op == "-") == sorted(teacher.parse(expr)[::2], reverse=op == "-")
        xs, ys = str(x).zfill(digits)[::-1], str(y).zfill(digits)[::-1]
        carry = 0
        for k, (top, bottom, taken, result) in enumerate(columns):
            assert (taken or 0) == carry, (expr, solution, k)  # the carry is exactly the previous column's
            assert bottom == int(ys[k])
            if op == "+":
                assert top == int(xs[k]) and result == top + bottom + carry
                carry = int(result >= 10)
                assert k == digits - 1 or result <= 19
            else:
                borrows = top >= 10
                assert top == int(xs[k]) + 10 * borrows and 0 <= result == top - bottom - carry <= 9
                assert borrows == (k < digits - 1 and int(xs[k]) - carry < bottom)
                carry = int(borrows)
        assert len(solution) <= teacher.longest_solution(digits)
        assert teacher.digits_of(expr) == digits


def test_the_documented_column_chain_examples():
    assert teacher.worked_solution("4821+3795") == "1+5=6,2+9+0=11,8+7+1=16,4+3+1=8,\\boxed{8616}"
    assert teacher.worked_solution("4821-3795") == "4821-3795:11-5=6,12-9-1=2,8-7-1=0,4-3-0=1,\\boxed{1026}"
    assert teacher.worked_solution("3795-4821") == "4821-3795:11-5=6,12-9-1=2,8-7-1=0,4-3-0=1,\\boxed{-1026}"
    assert teacher.worked_solution("999+999") == "9+9=18,9+9+1=19,9+9+1=19,\\boxed{1998}"
    # Dropping column 2's carry: the teacher carries on from what it wrote (8+7+0=15 still carries into column 3)
    assert teacher.worked_solution("4821+3795", slip={2}) == "1+5=6,2+9+0=11,8+7+0=15,4+3+1=8,\\boxed{8516}"
    assert teacher.worked_solution("4821+3795", slip={1, 3}) == teacher.worked_solution("4821+3795", slip={3})
    # 9+0+1=10 carries; written as 9+0+0=9 it does not, so the next column needs no carry either
    assert teacher.worked_solution("1951+1050", slip={2}) == "1+0=1,5+5+0=10,9+0+0=9,1+1+0=2,\\boxed{2901}"
    assert teacher.solve("1951+1050", slip={2}).dropped == (False, False, True, False)
    with pytest.raises(ValueError, match="'123\\+45'"):
        teacher.worked_solution("123+45")
    with pytest.raises(ValueError, match="'12345678901\\+12345678901'"):
        teacher.worked_solution("12345678901+12345678901")


@pytest.mark.parametrize("digits", [3, 4, 6, 8])
def test_slips_drop_only_needed_carries_each_column_independently_at_the_rate(digits):
    rate = 0.6
    exprs = chain_problems(digits, n=1500, seed=digits)
    needed = {k: 0 for k in range(1, digits)}
    dropped = {k: 0 for k in range(1, digits)}
    decided = []
    wrong = 0
    for expr in exprs:
        decisions = teacher.slip_decisions(expr, rate, seed=3)
        decided.append(decisions)
        solution = teacher.solve(expr, slip=decisions)
        right = teacher.solve(expr)
        _, _, _, columns, answer = column_steps(expr, solution.text)
        assert answer == solution.answer
        for k, (top, bottom, taken, result) in enumerate(columns):
            if k == 0:
                continue
            # The chain needs a carry where the column before carried out, as the teacher wrote it
            previous = columns[k - 1]
            carried_out = previous[3] >= 10 if "+" in expr else previous[0] >= 10
            assert solution.dropped[k] == (carried_out and k in decisions), (expr, solution.text, k)
            assert taken == (int(carried_out) and not solution.dropped[k])
            needed[k] += carried_out
            dropped[k] += solution.dropped[k]
        assert (solution.answer == eval(expr)) == (not any(solution.dropped)), (expr, solution.text)
        assert teacher.slips(expr, rate, seed=3) == any(solution.dropped)
        assert solution.text == teacher.teacher_solutions([expr + "="], slip_rate=rate, seed=3)[0]
        wrong += solution.answer != right.answer
        assert len(solution.text) <= teacher.longest_solution(digits)
        assert all(column_value(s) == int(s[-1]) for s in steps_and_answer(solution.text)[0])  # still true facts
    for k in range(1, digits):  # each column's needed carries dropped at the rate
        sigma = (rate * (1 - rate) / needed[k]) ** 0.5
        assert needed[k] > 200 and abs(dropped[k] / needed[k] - rate) < 4 * sigma, (k, needed[k], dropped[k])
    # The decisions are independent across columns: pairs co-occur at rate^2
    for j, k in [(1, 2), (1, digits - 1), (digits - 2, digits - 1)]:
        if j < k:
            both = sum(j in d and k in d for d in decided) / len(decided)
            assert abs(both - rate**2) < 4 * (rate**2 * (1 - rate**2) / len(decided)) ** 0.5, (j, k, both)
    assert wrong / len(exprs) > {3: 0.4, 4: 0.5, 6: 0.65, 8: 0.75}[digits]  # wrong ever more often


def test_slip_decisions_are_deterministic_per_draw_and_checked():
    expr = "48213+37951"
    draws = [teacher.slip_decisions(expr, 0.5, seed=1, draw=d) for d in range(64)]
    assert draws == [teacher.slip_decisions(expr, 0.5, seed=1, draw=d) for d in range(64)]
    assert len(set(draws)) > 8 and all(d <= {1, 2, 3, 4} for d in draws)
    assert teacher.slip_decisions(expr, 0.0, seed=1) == frozenset()
    assert teacher.slip_decisions(expr, 1.0, seed=1) == {1, 2, 3, 4}
    # A repeated question is a new draw each time
    assert len(set(teacher.teacher_solutions([expr + "="] * 40, slip_rate=0.5, seed=0))) > 3
    with pytest.raises(ValueError, match="1.5"):
        teacher.slip_decisions(expr, 1.5, seed=0)
    with pytest.raises(ValueError, match="-0.1"):
        teacher.teacher_solutions([expr + "="], slip_rate=-0.1, seed=0)


def test_longest_solution_is_the_bound_and_attained():
    witnesses = {4: ("9999+9999", "1999-9998")}
    for digits in range(2, 11):
        nines, low = "9" * digits, "1" + "9" * (digits - 1)
        borrowing = "9" * (digits - 1) + "8"
        longest = teacher.longest_solution(digits)
        assert max(len(teacher.worked_solution(e)) for e in (f"{nines}+{nines}", f"{low}-{borrowing}")) == longest
        if digits in witnesses:
            assert witnesses[digits] == (f"{nines}+{nines}", f"{low}-{borrowing}")
    for bad in (1, 11, 2.0, True):
        with pytest.raises(ValueError, match="digits"):
            teacher.longest_solution(bad)
