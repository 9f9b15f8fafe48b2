"""Procedural arithmetic: exact answers (checked by Python's own parser), the level table, determinism, splits."""

import ast
import operator
import re

import pytest

from mathrl_jax.data.arithmetic import LEVELS, arithmetic_problems, arithmetic_train_eval
from mathrl_jax.models.char_tokenizer import CHARACTERS

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def python_value(expr):
    """The value of `expr` as Python parses it (precedence, parentheses): an independent evaluator."""

    def walk(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise AssertionError(f"unexpected syntax {ast.dump(node)} in {expr!r}")

    return walk(ast.parse(expr, mode="eval").body)


def expression(problem):
    match = re.fullmatch(r"What is (.*)\?", problem.question)
    assert match, problem.question
    return match.group(1)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_answers_are_exact_and_questions_follow_the_level_table(level):
    spec = LEVELS[level]
    problems = arithmetic_problems(300, seed=7, level=level)
    for p in problems:
        expr = expression(p)
        assert p.answer == str(python_value(expr))
        assert p.level == str(level) and p.subject == "arithmetic"
        assert p.question.isascii() and set(p.question) <= set(CHARACTERS)
        operands = re.findall(r"\d+", expr)
        assert spec.terms[0] <= len(operands) <= spec.terms[1]
        for operand in operands:
            assert spec.digits[0] <= len(operand) <= spec.digits[1]
            assert operand == "0" or not operand.startswith("0")
        assert set(re.findall(r"[-+*]", expr)) <= set(spec.ops)
        assert set(expr) <= set("0123456789()") | set(spec.ops)
        if spec.nonnegative:
            assert int(p.answer) >= 0
    assert len({p.uid for p in problems}) == len(problems)
    if level >= 4:  # precedence and parentheses both occur
        assert any("(" in expression(p) for p in problems)
        assert any(
            "(" not in expression(p) and "*" in expression(p) and re.search(r"[-+]", expression(p)) for p in problems
        )
    else:
        assert not any("(" in p.question for p in problems)


def test_parentheses_are_exactly_those_needed():
    """Dropping any one pair of parentheses changes how Python parses the expression."""
    for p in arithmetic_problems(300, seed=1, levels=[4, 5]):
        expr = expression(p)
        tree = ast.dump(ast.parse(expr, mode="eval"))
        stack, pairs = [], []
        for i, c in enumerate(expr):
            if c == "(":
                stack.append(i)
            elif c == ")":
                pairs.append((stack.pop(), i))
        for open_, close in pairs:
            dropped = expr[:open_] + expr[open_ + 1 : close] + expr[close + 1 :]
            assert ast.dump(ast.parse(dropped, mode="eval")) != tree, (expr, dropped)


def test_level_one_covers_its_155_problems_and_no_more():
    every = {f"What is {a}+{b}?" for a in range(10) for b in range(10)}
    every |= {f"What is {a}-{b}?" for a in range(10) for b in range(a + 1)}
    assert len(every) == 155
    problems = arithmetic_problems(155, seed=3, unique=True)
    assert {p.question for p in problems} == every
    with pytest.raises(ValueError, match="too few distinct problems"):
        arithmetic_problems(156, seed=3, unique=True)


def test_deterministic_prefix_stable_and_seed_and_split_dependent():
    a = arithmetic_problems(40, seed=5, levels=[1, 2, 3, 4])
    assert a == arithmetic_problems(40, seed=5, levels=[1, 2, 3, 4])
    assert a[:13] == arithmetic_problems(13, seed=5, levels=[1, 2, 3, 4])
    assert [p.question for p in a] != [p.question for p in arithmetic_problems(40, seed=6, levels=[1, 2, 3, 4])]
    other_split = arithmetic_problems(40, seed=5, levels=[1, 2, 3, 4], split="eval")
    assert [p.question for p in a] != [p.question for p in other_split]


def test_levels_mixture_uses_exactly_the_given_levels():
    problems = arithmetic_problems(200, seed=0, levels=[2, 5])
    assert {p.level for p in problems} == {"2", "5"}


def test_short_question_format_for_a_tiny_model():
    problems = arithmetic_problems(100, seed=0, level=1, question_format="{expr}=")
    for p in problems:
        assert re.fullmatch(r"\d[-+]\d=", p.question), p.question
        assert p.answer == str(python_value(p.question[:-1]))


def test_train_eval_disjoint():
    train, evaluation = arithmetic_train_eval(500, 60, seed=2)
    eval_questions = [p.question for p in evaluation]
    assert len(set(eval_questions)) == 60
    assert not set(eval_questions) & {p.question for p in train}
    assert len(train) == 500
    assert not {p.uid for p in train} & {p.uid for p in evaluation}


def test_exclude_is_respected():
    banned = {p.question for p in arithmetic_problems(100, seed=9, unique=True)}
    assert not banned & {p.question for p in arithmetic_problems(300, seed=4, exclude=banned)}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"level": 0}, "unknown arithmetic level 0; expected one of \\[1, 2, 3, 4, 5\\]"),
        ({"level": "1"}, "unknown arithmetic level '1'"),
        ({"level": True}, "unknown arithmetic level True"),
        ({"levels": [1, 9]}, "unknown arithmetic level 9"),
        ({"levels": []}, "at least one level"),
        ({"question_format": "What is {x}?"}, "must contain '\\{expr\\}', got 'What is \\{x\\}\\?'"),
        ({"seed": 1.5}, "seed must be an integer, got 1.5"),
    ],
)
def test_bad_arguments(kwargs, message):
    arguments = {"seed": 0}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        arithmetic_problems(5, **arguments)
    with pytest.raises(ValueError, match="n must be a non-negative integer, got -1"):
        arithmetic_problems(-1, seed=0)


# --- the column chain: level 2 with `digits` operand digits ------------------------------------------------------


def test_two_digits_is_level_two_problem_for_problem():
    for split in ("train", "eval"):
        assert arithmetic_problems(300, seed=4, level=2, split=split, digits=2) == arithmetic_problems(
            300, seed=4, level=2, split=split
        )
    assert arithmetic_train_eval(200, 50, seed=1, level=2, digits=2) == arithmetic_train_eval(200, 50, seed=1, level=2)


@pytest.mark.parametrize("digits", [2, 3, 4, 5, 6, 8, 10])
def test_column_chain_problems_have_two_operands_of_d_digits(digits):
    problems = arithmetic_problems(400, seed=3, level=2, digits=digits, question_format="{expr}=")
    ops = []
    for p in problems:
        match = re.fullmatch(r"([1-9]\d*)([+-])([1-9]\d*)=", p.question)
        assert match, p.question
        a, op, b = match.groups()
        assert len(a) == len(b) == digits
        assert p.answer == str(python_value(a + op + b))
        ops.append(op)
    # + and - equally likely; operands uniform over the d-digit numbers: leading digits spread, mean near the middle
    assert 0.4 < ops.count("+") / len(ops) < 0.6
    leading = [int(p.question[0]) for p in problems]
    assert set(leading) == set(range(1, 10))
    first = [int(re.match(r"\d+", p.question).group()) for p in problems]
    middle = (10 ** (digits - 1) + 10**digits - 1) / 2
    assert abs(sum(first) / len(first) - middle) < 0.1 * middle
    assert len({p.question for p in problems}) > 0.95 * len(problems)  # so many problems that repeats are rare


def test_column_chain_is_deterministic_and_each_length_its_own_stream():
    a = arithmetic_problems(50, seed=9, level=2, digits=5)
    assert a == arithmetic_problems(50, seed=9, level=2, digits=5)
    assert a[:20] == arithmetic_problems(20, seed=9, level=2, digits=5)  # the first k of n are the k drawn alone
    assert a != arithmetic_problems(50, seed=10, level=2, digits=5)
    assert a != arithmetic_problems(50, seed=9, level=2, digits=5, split="eval")
    # Lengths do not share draws: the operation of problem i at 4 digits says nothing of it at 5.
    ops = [
        [re.search("[-+]", p.question).group() for p in arithmetic_problems(200, seed=9, level=2, digits=d)]
        for d in (4, 5)
    ]
    agree = sum(x == y for x, y in zip(*ops)) / 200
    assert 0.35 < agree < 0.65
    train, held_out = arithmetic_train_eval(500, 100, seed=0, level=2, digits=4)
    assert not {p.question for p in train} & {p.question for p in held_out}
    assert all(len(p.question) == len("What is 1234+5678?") for p in train + held_out)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(level=2, digits=1), "digits=1"),
        (dict(level=2, digits=11), "digits=11"),
        (dict(level=2, digits=True), "digits=True"),
        (dict(level=2, digits=3.0), "digits=3.0"),
        (dict(level=3, digits=4), "levels \\[3\\]"),
        (dict(levels=(1, 2), digits=4), "levels \\[1, 2\\]"),
    ],
)
def test_column_chain_bad_digits(kwargs, message):
    with pytest.raises(ValueError, match=message):
        arithmetic_problems(3, seed=0, **kwargs)
