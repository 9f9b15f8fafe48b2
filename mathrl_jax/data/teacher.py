"""Worked solutions of `a+b` / `a-b` problems, from a teacher that forgets carries.

The offline default's warm-start imitates these solutions; RL then has to fix
what the teacher got wrong. Each solution works column by column, units first,
so every step is a one-digit fact, and ends in the boxed answer:

| problem | solution (correct)                  | the teacher's slip (carry / borrow dropped) |
|---------|-------------------------------------|---------------------------------------------|
| `57+38=`| `7+8=15,5+3+1=9,\\boxed{95}`          | `7+8=15,5+3+0=8,\\boxed{85}`                 |
| `57+32=`| `7+2=9,5+3+0=8,\\boxed{89}`           | (no carry: nothing to forget)               |
| `83-57=`| `83-57:13-7=6,8-5-1=2,\\boxed{26}`    | `83-57:13-7=6,8-5-0=3,\\boxed{36}`           |
| `57-83=`| `83-57:13-7=6,8-5-1=2,\\boxed{-26}`   | `83-57:13-7=6,8-5-0=3,\\boxed{-36}`          |

Every column after the units names its carry (`+1` / `+0`, `-1` / `-0`), so
every solution has the same shape and a slip is one token: `0` where `1`
belongs. A subtraction first writes the larger operand minus the smaller
(`x-y:`), and the answer takes the sign of `a-b`.

The same format for operands of d digits each (d = 2..`MAX_DIGITS`: the
column chain, `arithmetic.digits`), one step per column:

| problem      | solution (correct)                                        |
|--------------|-----------------------------------------------------------|
| `4821+3795=` | `1+5=6,2+9+0=11,8+7+1=16,4+3+1=8,\\boxed{8616}`             |
| `4821-3795=` | `4821-3795:11-5=6,12-9-1=2,8-7-1=0,4-3-0=1,\\boxed{1026}`   |

- Addition: the units column is `a0+b0=s` (no carry term); column k >= 1 is
  `ak+bk+c=s`, c the carry out of column k-1 (1 when its written sum is >= 10).
  The last column's sum is written whole (`9+8+1=18`: the answer's top digits).
- Subtraction (x the larger operand, y the smaller, as `x-y:`): the units column
  is `t-y0=u`; column k >= 1 is `t-yk-b=u`, b the borrow into it. t is xk, or
  xk+10 when the column borrows from the next (xk-b < yk); the last column never
  borrows (x >= y). The answer is the digits u, with the sign of a-b.
- Two digits is exactly the table above, byte for byte.

A column "needs a carry" when the carry (borrow) into it is 1. The teacher
slips on each such column independently: one hash decision per (problem,
draw, column), below `slip_rate`, so the same arguments give the same
solutions everywhere. A slip writes the column's carry as 0; the teacher then
carries on from what it wrote (the next column's carry is that of the slipped
column's written sum), every step still a true fact, and boxes the resulting
wrong answer. With d digits the teacher is right only when it slips nowhere,
(1 - slip_rate) ** (carries needed): on long numbers it is wrong almost always,
in a structured way. A two-digit problem has one column that can need a
carry; its units column overflows (addition) or borrows (subtraction) on
about 43% of them. With `slip_rate > 0.5`, a model that imitates the teacher
well puts most of its probability on the slip: greedy decoding fails the carry
problems while sampling still finds the right answer some of the time. That is
the room a verifier's reward can exploit; a reward that carries no information
(shuffled) cannot.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Collection, Sequence

MIN_DIGITS = 2
MAX_DIGITS = 10
"""Operand digits the teacher solves (the column chain's horizon, `arithmetic.digits`)."""

_TERMS = re.compile(r"^(\d+)([+-])(\d+)$")


def parse(expr: str) -> tuple[int, str, int]:
    """(a, op, b) of an `a+b` / `a-b` expression whose operands have the same number of digits, 2 to
    `MAX_DIGITS`, e.g. "57-83" -> (57, "-", 83), "4821+3795" -> (4821, "+", 3795).

    Raises ValueError naming the expression for anything else (the teacher knows only these problems).
    """
    match = _TERMS.match(expr)
    lengths = (len(match.group(1)), len(match.group(3))) if match else (0, 1)
    if lengths[0] != lengths[1] or not MIN_DIGITS <= lengths[0] <= MAX_DIGITS:
        raise ValueError(
            f"the teacher solves a+b and a-b of two operands with the same number of digits, {MIN_DIGITS} to "
            f"{MAX_DIGITS} (arithmetic level 2, arithmetic.digits), got {expr!r}"
        )
    return int(match.group(1)), match.group(2), int(match.group(3))


def parse_two_digit(expr: str) -> tuple[int, str, int]:
    """(a, op, b) of a two-digit `a+b` / `a-b` expression, e.g. "57-83" -> (57, "-", 83).

    Raises ValueError naming the expression for anything else.
    """
    a, op, b = parse(expr)
    if len(expr) != 5:
        raise ValueError(f"expected a two-digit a+b or a-b (arithmetic level 2), got {expr!r}")
    return a, op, b


def digits_of(expr: str) -> int:
    """The operands' number of digits (the number of columns): "4821+3795" -> 4."""
    parse(expr)
    return (len(expr) - 1) // 2


@dataclasses.dataclass(frozen=True)
class Solution:
    """A worked solution: its steps (one per column, then the boxed answer), the answer, and per column the carry
    (borrow) it takes (column 0's is 0) and whether it needed a carry that the teacher dropped."""

    steps: tuple[str, ...]
    answer: int
    carries: tuple[int, ...]
    dropped: tuple[bool, ...]

    @property
    def text(self) -> str:
        return ",".join(self.steps)


def solve(expr: str, *, slip: bool | Collection[int] = False) -> Solution:
    """The column-by-column solution of `expr` (module docstring). `slip`: the columns (1 .. d-1) whose carry the
    teacher drops where the chain needs one there; True is every column, False none."""
    a, op, b = parse(expr)
    d = digits_of(expr)
    slipped = set(range(1, d)) if slip is True else set(slip or ())
    x, y = (a, b) if op == "+" else (max(a, b), min(a, b))
    xs = [int(c) for c in reversed(str(x).zfill(d))]
    ys = [int(c) for c in reversed(str(y).zfill(d))]
    steps, carries, dropped = [], [], []
    carry, value = 0, 0
    for k in range(d):
        taken = 0 if k in slipped else carry
        carries.append(taken)
        dropped.append(carry == 1 and taken == 0)
        if op == "+":
            total = xs[k] + ys[k] + taken
            steps.append(f"{xs[k]}+{ys[k]}={total}" if k == 0 else f"{xs[k]}+{ys[k]}+{taken}={total}")
            value += total * 10**k if k == d - 1 else total % 10 * 10**k
            carry = int(total >= 10)
        else:
            borrows = k < d - 1 and xs[k] - taken < ys[k]
            top = xs[k] + 10 * borrows
            digit = top - ys[k] - taken
            steps.append(f"{top}-{ys[k]}={digit}" if k == 0 else f"{top}-{ys[k]}-{taken}={digit}")
            value += digit * 10**k
            carry = int(borrows)
    if op == "-":
        steps[0] = f"{x}-{y}:{steps[0]}"
        value = -value if a < b else value
    steps.append(f"\\boxed{{{value}}}")
    return Solution(tuple(steps), value, tuple(carries), tuple(dropped))


def worked_solution(expr: str, *, slip: bool | Collection[int] = False) -> str:
    """The column-by-column solution of `expr` (module docstring); `slip=True` drops every carry or borrow the
    chain needs, a collection of column indices (1 .. d-1) drops those columns' (`solve`).

    A slip changes only columns that need a carry: it writes that column without the carry and boxes the
    resulting wrong answer. For two digits, `slip=True` drops the tens column's carry, if it has one.
    """
    return solve(expr, slip=slip).text


def needs_carry(expr: str) -> bool:
    """Whether the correct solution of `expr` takes a carry (a+b) or borrow (the larger minus the smaller) into
    some column: for two digits, whether the units column carries or borrows."""
    return any(solve(expr).carries)


def _check_rate(slip_rate: float) -> None:
    if not 0.0 <= slip_rate <= 1.0:
        raise ValueError(f"slip_rate={slip_rate!r}: expected a probability in [0, 1]")


def _below(key: str, slip_rate: float) -> bool:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < slip_rate


def slip_decisions(expr: str, slip_rate: float, *, seed: int, draw: int = 0) -> frozenset[int]:
    """The columns (1 .. d-1) whose carry the teacher drops on draw `draw` of `expr`, should the column need one:
    each column k independently, a hash of (seed, expr, draw, k) below `slip_rate`.

    Column 1's hash is that of (seed, expr, draw) alone, as the two-digit teacher's one decision was, so two-digit
    solutions are byte-identical to that teacher's; column k >= 2 appends "/k" to the key.
    """
    _check_rate(slip_rate)
    base = f"teacher/{seed}/{expr}/{draw}"
    return frozenset(k for k in range(1, digits_of(expr)) if _below(base if k == 1 else f"{base}/{k}", slip_rate))


def slips(expr: str, slip_rate: float, *, seed: int, draw: int = 0) -> bool:
    """Whether the teacher slips on draw `draw` of `expr`: drops at least one carry the chain needs
    (`slip_decisions`). For two digits: a hash of (seed, expr, draw) below `slip_rate`, on a problem that needs a
    carry."""
    return any(solve(expr, slip=slip_decisions(expr, slip_rate, seed=seed, draw=draw)).dropped)


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
    _check_rate(slip_rate)
    out = []
    seen: dict[str, int] = {}
    for question in questions:
        expr = expression_of(question, question_format)
        draw = seen.get(expr, 0)
        seen[expr] = draw + 1
        out.append(worked_solution(expr, slip=slip_decisions(expr, slip_rate, seed=seed, draw=draw)))
    return out


def longest_solution(digits: int) -> int:
    """At most how many characters a solution of two `digits`-digit operands takes, correct or slipped: a bound
    for `max_new_tokens` with a character tokenizer (add one token for EOS).

    Addition: `9+9=18`, then `9+9+1=19` per column, the answer up to digits + 1 long. Subtraction: `x-y:`, a
    borrowing units column `18-9=9`, `19-9-1=9` per middle column, `9-0-0=9` last, a negative answer of `digits`
    digits (a slip only ever adds the dropped borrows' 10^k, which keeps the answer below x).
    """
    if isinstance(digits, bool) or not isinstance(digits, int) or not MIN_DIGITS <= digits <= MAX_DIGITS:
        raise ValueError(f"digits={digits!r}: expected a whole number from {MIN_DIGITS} to {MAX_DIGITS}")
    commas, boxed = digits, len("\\boxed{}")
    addition = 6 + 8 * (digits - 1) + boxed + digits + 1 + commas
    subtraction = 2 * digits + 2 + 6 + 8 * (digits - 2) + 7 + boxed + 1 + digits + commas
    return max(addition, subtraction)
