"""Procedural arithmetic problems with exact integer answers: the offline default data.

Every problem is an expression over non-negative integers with `+`, `-`, `*` and
parentheses, written in ASCII without spaces ("12+7*3", "(4+5)*6-7"), and its
exact value (Python integers, so no rounding ever) as the gold answer string.

| level | operators | terms | operand digits | parentheses | example             | note                       |
|-------|-----------|-------|----------------|-------------|---------------------|----------------------------|
| 1     | + -       | 2     | 1              | -           | `7-3`, `4+8`        | result >= 0 (155 problems) |
| 2     | + -       | 2     | 2              | -           | `57-83`             | result may be negative     |
| 3     | *         | 2     | 1 or 2         | -           | `7*38`              |                            |
| 4     | + - *     | 3     | 1 or 2         | as needed   | `12+7*3`, `(4+5)*6` | precedence, parentheses    |
| 5     | + - *     | 4-5   | 1 to 3         | as needed   | `(312-4)*7+56`      |                            |

The column chain (`digits=d`, level 2 only): two d-digit operands, `4821+3795`, `4821-7936`
(d = 2..10; 2 is level 2 itself, problem for problem). The teacher (`data/teacher.py`) solves
it one column at a time, so d is the horizon of its worked solutions.

A 1-digit operand is 0-9; a d-digit operand (d >= 2) is 10^(d-1) .. 10^d - 1, its
digit count drawn first, uniformly. Expressions are random binary trees (operators
uniform over the level's), printed with only the parentheses their value needs
under the usual precedence (`*` before `+ -`, left to right).

Randomness is a counter-based hash (BLAKE2b of seed, split, index, attempt: `data/hashing.py`), not a
library RNG: the same arguments give the same problems on every platform and
Python / numpy version, and the first k of n problems are the k problems drawn
with n = k (problem i depends on the arguments and, under `unique`, on problems < i).

For a held-out evaluation set disjoint from training, `arithmetic_train_eval` draws
the evaluation problems from their own stream (split "eval", all distinct) and the
training problems from the "train" stream, skipping every evaluation question.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from mathrl_jax.data.hashing import HashStream
from mathrl_jax.data.layouts import is_int
from mathrl_jax.data.sources import Problem

DEFAULT_QUESTION_FORMAT = "What is {expr}?"
"""The question around an expression; "{expr}=" gives the shortest prompts ("3+5=")."""

MIN_DIGITS, MAX_DIGITS = 2, 10
"""The column chain's operand digits (`digits`): 2 is level 2 as tabled."""

MAX_ATTEMPTS = 10_000
"""Draws tried for one problem (rejections: negative level-1 results, `unique`, `exclude`) before giving up."""


@dataclasses.dataclass(frozen=True)
class ArithmeticLevel:
    """One difficulty level (see the module table)."""

    ops: tuple[str, ...]
    terms: tuple[int, int]  # min, max number of operands
    digits: tuple[int, int]  # min, max digits of an operand
    nonnegative: bool  # reject expressions with a negative value
    description: str


LEVELS = {
    1: ArithmeticLevel(("+", "-"), (2, 2), (1, 1), True, "one-digit a+b, a-b with a result >= 0"),
    2: ArithmeticLevel(("+", "-"), (2, 2), (2, 2), False, "two-digit a+b, a-b"),
    3: ArithmeticLevel(("*",), (2, 2), (1, 2), False, "a*b with one- or two-digit operands"),
    4: ArithmeticLevel(("+", "-", "*"), (3, 3), (1, 2), False, "three terms, precedence and parentheses"),
    5: ArithmeticLevel(("+", "-", "*"), (4, 5), (1, 3), False, "four or five terms up to three digits"),
}
"""Difficulty levels by number: operators, terms and operand digits."""

_PRECEDENCE = {"+": 1, "-": 1, "*": 2}


# An expression tree: an int leaf, or (op, left, right).
_Tree = int | tuple[str, "_Tree", "_Tree"]


def _operand(stream: HashStream, spec: ArithmeticLevel) -> int:
    digits = stream.integer(*spec.digits)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return stream.integer(low, 10**digits - 1)


def _tree(stream: HashStream, spec: ArithmeticLevel, terms: int) -> _Tree:
    if terms == 1:
        return _operand(stream, spec)
    left_terms = stream.integer(1, terms - 1)
    op = stream.choice(spec.ops)
    return (op, _tree(stream, spec, left_terms), _tree(stream, spec, terms - left_terms))


def evaluate(tree: _Tree) -> int:
    """The exact value of an expression tree."""
    if isinstance(tree, int):
        return tree
    op, left, right = tree
    a, b = evaluate(left), evaluate(right)
    return a + b if op == "+" else a - b if op == "-" else a * b


def render(tree: _Tree) -> str:
    """The expression in ASCII with only the parentheses its evaluation order needs.

    A child is parenthesised when it binds looser than its parent, or as tightly but
    as the right operand of `-` (a-(b-c) != a-b-c). `+` and `*` are associative, so
    a right child of equal precedence needs none (a+(b-c) == a+b-c, a*(b*c) == a*b*c).
    """
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree

    def child(sub: _Tree, is_right: bool) -> str:
        text = render(sub)
        if isinstance(sub, int):
            return text
        sub_prec, prec = _PRECEDENCE[sub[0]], _PRECEDENCE[op]
        if sub_prec < prec or (is_right and sub_prec == prec and op == "-"):
            return f"({text})"
        return text

    return f"{child(left, False)}{op}{child(right, True)}"


def _check_level(level: int) -> int:
    if isinstance(level, bool) or level not in LEVELS:
        raise ValueError(f"unknown arithmetic level {level!r}; expected one of {sorted(LEVELS)}")
    return level


def _check_digits(digits, levels: tuple[int, ...]) -> int:
    if isinstance(digits, bool) or not isinstance(digits, int) or not MIN_DIGITS <= digits <= MAX_DIGITS:
        raise ValueError(f"digits={digits!r}: expected a whole number from {MIN_DIGITS} to {MAX_DIGITS}")
    if digits != 2 and levels != (2,):
        raise ValueError(f"digits={digits} sets the operands of level 2 (a+b, a-b); got levels {list(levels)}")
    return digits


def _draw(
    seed: int, split: str, index: int, attempt: int, levels: tuple[int, ...], digits: int = 2
) -> tuple[int, str, int]:
    """(level, expression, value) of one draw; `digits` != 2: level 2's operands have that many digits."""
    key = f"arithmetic/{seed}/{split}/{index}/{attempt}"
    level = HashStream(key).choice(levels)
    spec = LEVELS[level]
    if digits == 2:  # one stream per level: levels do not share operands
        stream = HashStream(f"{key}/level{level}")
    else:  # and one per length: the column chain at d digits shares no draws with another length's
        stream = HashStream(f"{key}/level{level}/digits{digits}")
        spec = dataclasses.replace(spec, digits=(digits, digits))
    tree = _tree(stream, spec, stream.integer(*spec.terms))
    return level, render(tree), evaluate(tree)


def arithmetic_problems(
    n: int,
    *,
    seed: int,
    level: int = 1,
    levels: Sequence[int] | None = None,
    question_format: str = DEFAULT_QUESTION_FORMAT,
    split: str = "train",
    unique: bool = False,
    exclude: Iterable[str] = (),
    digits: int = 2,
) -> list[Problem]:
    """`n` arithmetic problems, deterministic from (seed, split, levels, question_format).

    Args:
      n: number of problems.
      seed: any integer.
      level: the difficulty level (`LEVELS`), when `levels` is None.
      levels: several levels; each problem's level is drawn uniformly from them.
      question_format: the question text, with "{expr}" where the expression goes:
        "What is {expr}?" (default) or, shortest, "{expr}=".
      split: the name of the random stream ("train", "eval", ...): different splits
        give independent problems from the same seed.
      unique: no two problems with the same question (raises if the levels have
        too few distinct problems).
      exclude: questions never to return (e.g. an evaluation set's).
      digits: the column chain's operand digits, 2 to 10, with `level=2` only: two `digits`-digit
        operands. 2 (the default) is level 2 as tabled, the same problems.

    Returns:
      Problems with uid "arithmetic:<split>:<seed>:<index>", question
      `question_format` around the expression, answer the exact value as a
      string ("-26"), level "1".."5", subject "arithmetic".
    """
    if not is_int(n) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if not is_int(seed):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not isinstance(question_format, str) or "{expr}" not in question_format:
        raise ValueError(f"question_format must contain '{{expr}}', got {question_format!r}")
    chosen = tuple(_check_level(v) for v in levels) if levels is not None else (_check_level(level),)
    if not chosen:
        raise ValueError("levels must name at least one level, got an empty sequence")
    digits = _check_digits(digits, chosen)
    banned = set(exclude)

    problems = []
    for index in range(n):
        for attempt in range(MAX_ATTEMPTS):
            drawn_level, expr, value = _draw(seed, split, index, attempt, chosen, digits)
            question = question_format.replace("{expr}", expr)
            if LEVELS[drawn_level].nonnegative and value < 0:
                continue
            if question in banned:
                continue
            break
        else:
            raise ValueError(
                f"could not draw arithmetic problem {index} of n={n} at levels {list(chosen)} in {MAX_ATTEMPTS} "
                f"attempts: these levels have too few distinct problems for unique={unique} and "
                f"{len(banned)} excluded questions"
            )
        if unique:
            banned.add(question)
        problems.append(
            Problem(
                uid=f"arithmetic:{split}:{seed}:{index}",
                question=question,
                answer=str(value),
                level=str(drawn_level),
                subject="arithmetic",
            )
        )
    return problems


def arithmetic_train_eval(
    n_train: int,
    n_eval: int,
    *,
    seed: int,
    level: int = 1,
    levels: Sequence[int] | None = None,
    question_format: str = DEFAULT_QUESTION_FORMAT,
    digits: int = 2,
) -> tuple[list[Problem], list[Problem]]:
    """(train, eval): `n_eval` distinct evaluation problems and `n_train` training problems sharing none of them.

    The evaluation set is `arithmetic_problems(split="eval", unique=True)`; the
    training set is `arithmetic_problems(split="train", exclude=<eval questions>)`
    and may repeat a question (level 1 has only 155 distinct problems). `digits`: the column chain's operand
    digits (`arithmetic_problems`).
    """
    eval_problems = arithmetic_problems(
        n_eval,
        seed=seed,
        level=level,
        levels=levels,
        question_format=question_format,
        split="eval",
        unique=True,
        digits=digits,
    )
    train_problems = arithmetic_problems(
        n_train,
        seed=seed,
        level=level,
        levels=levels,
        question_format=question_format,
        split="train",
        exclude={p.question for p in eval_problems},
        digits=digits,
    )
    return train_problems, eval_problems
