"""Worked solutions of two-digit `a+b` / `a-b` problems, from a teacher that forgets carries.

The offline default's warm-start imitates these solutions; RL then has to fix
what the teacher got wrong. Each solution works column by column, units first,
so every step is a one-digit fact, and ends in the boxed answer:

| problem | solution (correct)                  | the teacher's slip (carry / borrow dropped) |
|---------|-------------------------------------|---------------------------------------------|
| `57+38=`| `7+8=15,5+3+1=9,\\boxed{95}`          | `7+8=15,5+3+0=8,\\boxed{85}`                 |
| `57+32=`| `7+2=9,5+3+0=8,\\boxed{89}`           | (no carry: nothing to forget)               |
| `83-57=`| `83-57:13-7=6,8-5-1=2,\\boxed{26}`    | `83-57:13-7=6,8-5-0=3,\\boxed{36}`           |
| `57-83=`| `83-57:13-7=6,8-5-1=2,\\boxed{-26}`   | `83-57:13-7=6,8-5-0=3,\\boxed{-36}`          |

The tens column always names its carry (`+1` / `+0`, `-1` / `-0`), so every
solution has the same shape and a slip is one token: `0` where `1` belongs. A
subtraction first writes the larger operand minus the smaller (`x-y:`), and
the answer takes the sign of `a-b`. A problem "needs a carry" when its units
column overflows (addition) or borrows (subtraction): about 43% of them.

The teacher slips on a problem that needs a carry with probability
`slip_rate`, deciding per (problem, draw) by a hash, so the same arguments give
the same solutions everywhere. With `slip_rate > 0.5`, a model that imitates
the teacher well puts most of its probability on the slip: greedy decoding
fails the carry problems while sampling still finds the right answer some of
the time. That is the room a verifier's reward can exploit; a reward that
carries no information (shuffled) cannot.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

_TWO_TERMS = re.compile(r"^(\d{2})([+-])(\d{2})$")


def parse_two_digit(expr: str) -> tuple[int, str, int]:
    """(a, op, b) of a two-digit `a+b` / `a-b` expression, e.g. "57-83" -> (57, "-", 83).

    Raises ValueError naming the expression for anything else (the teacher knows only this level).
    """
    match = _TWO_TERMS.match(expr)
    if match is None:
        raise ValueError(f"the teacher solves two-digit a+b and a-b only (arithmetic level 2), got {expr!r}")
    return int(match.group(1)), match.group(2), int(match.group(3))


def needs_carry(expr: str) -> bool:
    """Whether the units column of `expr` carries (a+b) or borrows (the larger minus the smaller)."""
    a, op, b = parse_two_digit(expr)
    if op == "+":
        return a % 10 + b % 10 >= 10
    x, y = max(a, b), min(a, b)
    return x % 10 < y % 10


def worked_solution(expr: str, *, slip: bool = False) -> str:
    """The column-by-column solution of `expr` (module table); `slip=True` drops the carry or borrow.

    A slip changes only problems that need a carry (`needs_carry`): it writes the
    tens column without the carry and boxes the resulting wrong answer.
    """
    a, op, b = parse_two_digit(expr)
    slip = slip and needs_carry(expr)
    if op == "+":
        units = a % 10 + b % 10
        carry = int(units >= 10 and not slip)
        tens = a // 10 + b // 10 + carry
        answer = tens * 10 + units % 10
        return f"{a % 10}+{b % 10}={units},{a // 10}+{b // 10}+{carry}={tens},\\boxed{{{answer}}}"
    x, y = max(a, b), min(a, b)
    borrow = x % 10 < y % 10
    top = x % 10 + (10 if borrow else 0)
    units = top - y % 10
    carry = int(borrow and not slip)
    tens = x // 10 - y // 10 - carry
    magnitude = tens * 10 + units
    answer = -magnitude if a < b else magnitude
    return f"{x}-{y}:{top}-{y % 10}={units},{x // 10}-{y // 10}-{carry}={tens},\\boxed{{{answer}}}"


def slips(expr: str, slip_rate: float, *, seed: int, draw: int = 0) -> bool:
    """Whether the teacher slips on draw `draw` of `expr`: a hash of (seed, expr, draw) below `slip_rate`.

    Only problems that need a carry can slip.
    """
    if not 0.0 <= slip_rate <= 1.0:
        raise ValueError(f"slip_rate={slip_rate!r}: expected a probability in [0, 1]")
    if not needs_carry(expr):
        return False
    digest = hashlib.blake2b(f"teacher/{seed}/{expr}/{draw}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < slip_rate


def expression_of(question: str, question_format: str = "{expr}=") -> str:
    """The expression inside a question written with `question_format` ("57+38=" -> "57+38")."""
    prefix, _, suffix = question_format.partition("{expr}")
    if not (question.startswith(prefix) and question.endswith(suffix) and len(question) > len(prefix + suffix)):
        raise ValueError(f"question {question!r} is not written as question_format={question_format!r}")
    return question[len(prefix) : len(question) - len(suffix)]


def teacher_solutions(
    questions: Sequence[str], *, slip_rate: float, seed: int, question_format: str = "{expr}="
) -> list[str]:
    """The teacher's solution of each question ("57+38=" -> "7+8=15,5+3+1=9,\\boxed{95}" or its slip).

    Questions are written with `question_format` (the arithmetic task's; the
    default is the shortest, "{expr}="). Occurrence k of a question in the list is
    draw k of its expression, so a repeated question gets independent draws.
    """
    out = []
    seen: dict[str, int] = {}
    for question in questions:
        expr = expression_of(question, question_format)
        draw = seen.get(expr, 0)
        seen[expr] = draw + 1
        out.append(worked_solution(expr, slip=slips(expr, slip_rate, seed=seed, draw=draw)))
    return out
