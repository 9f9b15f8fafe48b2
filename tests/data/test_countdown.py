"""Countdown: the instances (procedural, deterministic, each solvable), the derivation check, the solver, the
teacher; each checked against an independent solver written here (expressions over permutations and trees)."""

import functools
import itertools
import re

import pytest

from mathrl_jax.data.countdown import (
    Instance,
    check_derivation,
    countdown_problems,
    countdown_train_eval,
    parse_instance,
    rules,
    solvable,
    solve,
    teacher,
)
from mathrl_jax.data.countdown import problems as cd_problems
from mathrl_jax.data.hashing import HashStream


@functools.lru_cache(maxsize=None)
def _trees(numbers):
    """Every value of a binary tree over `numbers` in this order with + - * (never a negative result)."""
    if len(numbers) == 1:
        return {numbers[0]}
    values = set()
    for cut in range(1, len(numbers)):
        for a in _trees(numbers[:cut]):
            for b in _trees(numbers[cut:]):
                values.update({a + b, a * b})
                if a >= b:
                    values.add(a - b)
    return frozenset(values)


@functools.lru_cache(maxsize=None)
def independent_values(numbers):
    """Every value an expression using each of `numbers` once reaches: all orders, all trees (the rules' `-` gives
    the larger minus the smaller, which an order with the larger first is)."""
    values = set()
    for order in set(itertools.permutations(numbers)):
        values |= _trees(order)
    return values


def _problems(n, count, seed=0, **kw):
    return countdown_problems(n, seed=seed, count=count, **kw)


@pytest.mark.parametrize("count,n", [(3, 300), (4, 120), (5, 25)])
def test_every_instance_is_solvable_by_an_independent_search(count, n):
    for p in _problems(n, count):
        instance = parse_instance(p.question)
        assert len(instance.numbers) == count and all(1 <= x <= 9 for x in instance.numbers)
        assert 1 <= instance.target <= 99
        assert instance.target in independent_values(tuple(sorted(instance.numbers)))
        assert solvable(instance.numbers, instance.target)


@pytest.mark.parametrize("count", [3, 4, 5, 6])
def test_every_reference_solution_is_a_valid_derivation(count):
    for p in _problems(200, count, max_target=500):
        instance = parse_instance(p.answer)
        assert p.question == instance.question and p.answer == instance.text
        assert p.level == str(count) and p.subject == "countdown"
        assert check_derivation(instance, p.solution).correct, p
        steps = solve(instance.numbers, instance.target)  # the solver's own derivation is valid too
        assert check_derivation(instance, ",".join((*steps, f"\\boxed{{{instance.target}}}"))).correct


def test_solver_agrees_with_the_independent_search():
    for numbers in [(3, 7, 5), (1, 1, 3), (2, 2, 2, 9), (9, 8, 7, 6), (1, 2, 3, 4, 5)]:
        expected = independent_values(tuple(sorted(numbers)))
        assert rules.reachable(numbers) == expected
        for target in range(0, 120):
            steps = solve(numbers, target)
            assert (steps is not None) == (target in expected)
            if steps is not None:
                assert check_derivation(Instance(numbers, target), ",".join((*steps, f"\\boxed{{{target}}}"))).correct


def test_deterministic_prefix_stable_and_seed_and_split_dependent():
    first = _problems(50, 4, seed=3)
    assert first == _problems(50, 4, seed=3)
    assert first[:20] == _problems(20, 4, seed=3)
    assert first != _problems(50, 4, seed=4)
    assert first != _problems(50, 4, seed=3, split="eval")
    # Pinned: the hash stream is BLAKE2b, the same on every platform and Python version.
    assert [p.question for p in _problems(3, 3)] == ["7,6,3->11:", "3,6,9->18:", "2,4,1->10:"]
    assert _problems(1, 3)[0].solution == "3*6=18,18-7=11,\\boxed{11}"


def test_hash_stream_is_blake2b_of_key_and_counter():
    """The stream both procedural tasks draw from (data/arithmetic.py too), pinned to its formula."""
    import hashlib

    stream = HashStream("k/1")
    for counter in range(20):
        digest = hashlib.blake2b(f"k/1/{counter}".encode(), digest_size=8).digest()
        assert stream.integer(3, 99) == 3 + int.from_bytes(digest, "little") % 97
    with pytest.raises(ValueError, match="empty range"):
        stream.integer(2, 1)


def test_train_eval_disjoint_and_eval_unique():
    train, held_out = countdown_train_eval(3000, 300, seed=0)
    questions = {p.question for p in held_out}
    assert len(questions) == 300
    assert not questions & {p.question for p in train}
    assert all(p.uid.startswith("countdown:eval:0:") for p in held_out)


def test_prompts_are_short_for_the_tiny_model():
    for count, longest in ((3, 10), (4, 12), (5, 14), (6, 16)):
        assert max(len(p.question) for p in _problems(300, count)) <= longest


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(count=2), "count=2"),
        (dict(count=7), "count=7"),
        (dict(min_number=0), "min_number=0"),
        (dict(min_number=5, max_number=4), "min_number=5"),
        (dict(max_number=100), "max_number=100"),
        (dict(max_target=0), "max_target=0"),
        (dict(count=True), "count=True"),
    ],
)
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        countdown_problems(1, seed=0, **kwargs)


def test_too_few_distinct_problems_raises():
    with pytest.raises(ValueError, match="could not draw countdown problem"):  # 1,1,1 reaches 1, 2, 3 and 0
        countdown_problems(5, seed=0, min_number=1, max_number=1, unique=True)
    assert cd_problems.MAX_ATTEMPTS >= 1000


def test_parse_instance():
    assert parse_instance("3,7,5->26:") == parse_instance("3,7,5->26") == Instance((3, 7, 5), 26)
    for bad in ("3,7->2:", "3,7,5=26", "3, 7,5->26", "", "3,7,5->-2"):
        with pytest.raises(ValueError):
            parse_instance(bad)


# --- the derivation check -------------------------------------------------------------------------------------

INSTANCE = Instance((3, 7, 5), 26)


@pytest.mark.parametrize(
    "response",
    [
        "7*3=21,21+5=26,\\boxed{26}",
        "3*7=21,5+21=26,\\boxed{26}",  # either order of + and * operands
        "  3*7=21,21+5=26,\\boxed{26}\n",  # surrounding whitespace
    ],
)
def test_right_derivations_are_accepted(response):
    verdict = check_derivation(INSTANCE, response)
    assert verdict.correct and verdict.boxed == "26" and verdict.wrong_piece is None


def test_subtraction_and_a_repeated_number():
    assert check_derivation(Instance((7, 5, 3), 32), "7*5=35,35-3=32,\\boxed{32}").correct
    assert not check_derivation(Instance((7, 5, 3), 32), "7*5=35,3-35=32,\\boxed{32}").correct  # a-b needs a >= b
    assert check_derivation(Instance((2, 2, 9), 13), "2+2=4,4+9=13,\\boxed{13}").correct  # 2 given twice
    assert check_derivation(Instance((4, 4, 1), 1), "4-4=0,0+1=1,\\boxed{1}").correct  # a zero in between


@pytest.mark.parametrize(
    "response,wrong_piece,reason",
    [
        ("\\boxed{26}", 0, "still to combine"),  # the target copied from the prompt, no steps
        ("26", None, "no \\\\boxed"),
        ("7*3=21,21+5=26", None, "no \\\\boxed"),
        ("7*3=21,21+3=24,\\boxed{24}", 1, "uses \\[3\\]"),  # 3 used twice
        ("7*7=49,49-5=44,\\boxed{44}", 0, "uses \\[7\\]"),  # a number given once, used twice
        ("7*3=21,\\boxed{21}", 1, "still to combine"),  # 5 skipped
        ("3+7=10,10*5=50,\\boxed{26}", 0, "cannot be reached"),  # valid steps ending elsewhere, the target boxed
        ("7*3=21,21+5=27,\\boxed{27}", 1, "21\\+5 is 26"),  # wrong arithmetic
        ("7*3=22,22+4=26,\\boxed{26}", 0, "7\\*3 is 21"),
        ("7*3=21,21+5=26,\\boxed{25}", 2, "boxes 25"),  # the wrong boxed value
        ("7*3=21,21+5=26,\\boxed{26},1+1=2", 3, "follows the boxed"),  # something after the answer
        ("7*3=21,21+5=26,26-0=26,\\boxed{26}", 2, "uses \\[0\\]"),
        ("7 * 3=21,21+5=26,\\boxed{26}", 0, "is not a step"),
        ("07*3=21,21+5=26,\\boxed{26}", 0, "is not a step"),  # leading zeros
        ("7*3=21,21+5=26,The answer is \\boxed{26}", 2, "is not a step"),
        ("3-7=-4,-4*5=..,\\boxed{26}", 0, "is not a step"),  # a negative intermediate
        ("1" * 5000 + "*3=21,21+5=26,\\boxed{26}", 0, "is not a step"),  # a runaway number, refused, not raised
    ],
)
def test_wrong_derivations_are_refused(response, wrong_piece, reason):
    verdict = check_derivation(INSTANCE, response)
    assert not verdict.correct
    assert verdict.wrong_piece == wrong_piece, verdict
    assert re.search(reason, verdict.reason), verdict


def test_a_wrong_target_is_refused():
    """A right derivation of another instance's target is not one of this instance's."""
    assert not check_derivation(Instance((3, 7, 5), 50), "7*3=21,21+5=26,\\boxed{26}").correct
    assert not check_derivation(Instance((3, 7, 5), 50), "7*3=21,21+5=26,\\boxed{50}").correct


def test_step_checks_mark_the_first_wrong_piece_and_everything_after():
    checks = rules.step_checks(INSTANCE, ["7*3=21", "21+5=27", "27-1=26", "\\boxed{26}"])
    assert [c.good for c in checks] == [True, False, False, False]
    checks = rules.step_checks(Instance((3, 7, 5), 32), ["3*7=21", "21+5=26", "\\boxed{26}"])  # the teacher's chain
    assert [c.good for c in checks] == [False, False, False] and checks[0].valid  # a valid step into a dead end
    checks = rules.step_checks(Instance((3, 7, 5), 32), ["7*5=35", "35-3=32", "\\boxed{32}"])
    assert [c.good for c in checks] == [True, True, True]


# --- the teacher ------------------------------------------------------------------------------------------------


def _rule_values(numbers):
    """The values of the teacher's rule, independently: ((n1 o n2) o n3) ... as Python expressions, o in + *."""
    values = []
    for ops in itertools.product("+*", repeat=len(numbers) - 1):
        text = str(numbers[0])
        for op, number in zip(ops, numbers[1:]):
            text = f"({text}{op}{number})"
        values.append(eval(text))  # noqa: S307  digits, + * and parentheses only
    return values


@pytest.mark.parametrize("count,n", [(3, 400), (4, 200), (5, 100)])
def test_teacher_solves_exactly_the_instances_its_rule_allows(count, n):
    solved = 0
    for p in _problems(n, count):
        instance = parse_instance(p.question)
        values = _rule_values(instance.numbers)
        allowed = instance.target in values
        text = teacher.teacher_solution(instance)
        verdict = check_derivation(instance, text)
        assert teacher.teacher_solves(instance) == allowed == verdict.correct, (p, text)
        boxed = int(verdict.boxed)
        assert boxed == min(values, key=lambda v: abs(v - instance.target))  # nearest, the first of a tie
        assert text == teacher.teacher_solutions([p.question], slip_rate=0.0)[0]
        assert "-" not in text.split("\\boxed")[0]
        assert re.match(rf"{instance.numbers[0]}[+*]{instance.numbers[1]}=", text)  # the given order
        solved += allowed
    assert 0.02 < solved / n < 0.4  # the teacher solves some instances, not most (module tables)


def test_teacher_examples_and_its_solutions_fit_their_bound():
    assert teacher.teacher_solution(Instance((3, 7, 5), 26)) == "3*7=21,21+5=26,\\boxed{26}"
    assert teacher.teacher_solution(Instance((3, 7, 5), 50)) == "3+7=10,10*5=50,\\boxed{50}"
    assert teacher.teacher_solution(Instance((3, 7, 5), 32)) == "3*7=21,21+5=26,\\boxed{26}"
    assert teacher.teacher_solution(Instance((3, 7, 5), 38)) == "3+7=10,10*5=50,\\boxed{50}"
    assert teacher.teacher_solutions(["3,7,5->26:", "3,7,5->50:"]) == [
        "3*7=21,21+5=26,\\boxed{26}",
        "3+7=10,10*5=50,\\boxed{50}",
    ]
    for count in (3, 4, 5, 6):
        bound = teacher.longest_solution(count, 9)
        assert len(teacher.teacher_solution(Instance((9,) * count, 1))) <= bound
        assert len(teacher.teacher_solution(Instance((1,) * count, 99))) <= bound
        assert max(len(teacher.teacher_solution(parse_instance(p.question))) for p in _problems(200, count)) <= bound


def test_the_teacher_slips_on_its_last_operator_only():
    questions = [p.question for p in _problems(400, 3)]
    plain = teacher.teacher_solutions(questions)
    slipped = teacher.teacher_solutions(questions, slip_rate=0.7, seed=0)
    assert slipped == teacher.teacher_solutions(questions, slip_rate=0.7, seed=0)  # deterministic
    assert slipped != teacher.teacher_solutions(questions, slip_rate=0.7, seed=1)
    assert teacher.teacher_solutions(questions, slip_rate=0.0, seed=5) == plain
    changed = minus_right = 0
    for question, rule, text in zip(questions, plain, slipped):
        instance = parse_instance(question)
        *rule_steps, rule_last, _ = rule.split(",")
        *steps, last, boxed = text.split(",")
        assert steps == rule_steps  # every step but the last is the rule's
        a, op, b, c = re.fullmatch(r"(\d+)([+*-])(\d+)=(\d+)", last).groups()
        assert rules.apply(int(a), op, int(b)) == int(c) and boxed == f"\\boxed{{{c}}}"  # right arithmetic
        if text != rule:
            changed += 1
            rule_op = re.search(r"[+*-]", rule_last).group()
            assert op != rule_op and rule_op in "+*"
            minus_right += op == "-" and check_derivation(instance, text).correct
        assert check_derivation(instance, text).correct == (int(c) == instance.target)
    assert 0.6 < changed / len(questions) < 0.8
    assert minus_right > 0  # a slip to - is sometimes right where the rule is not: the rare right behaviour


def test_slip_decisions():
    instance = Instance((3, 7, 5), 26)  # the rule's last operator is +
    assert teacher.slip(instance, 0.0, seed=0) is None
    assert {teacher.slip(instance, 1.0, seed=0, draw=d) for d in range(40)} == {"-", "*"}
    assert teacher.teacher_solution(instance, last_op="-") == "3*7=21,21-5=16,\\boxed{16}"
    assert teacher.teacher_solution(Instance((3, 7, 5), 5)) == "3+7=10,10+5=15,\\boxed{15}"  # the rule: wrong
    right = teacher.teacher_solution(Instance((3, 7, 5), 5), last_op="-")  # its slip to -: right
    assert right == "3+7=10,10-5=5,\\boxed{5}" and check_derivation(Instance((3, 7, 5), 5), right).correct
    assert teacher.teacher_solution(Instance((2, 3, 9), 1), last_op="-") == "2+3=5,9-5=4,\\boxed{4}"  # larger first
    repeated = teacher.teacher_solutions(["3,7,5->26:"] * 20, slip_rate=0.5, seed=0)
    assert len(set(repeated)) > 1  # a repeated question gets independent draws
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="slip_rate"):
            teacher.slip(instance, bad, seed=0)
