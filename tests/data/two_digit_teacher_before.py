"""The two-digit teacher and process verifier as they were before the column chain (commit 7e99c56), kept verbatim
as the reference the generalised `data/teacher.py` and `rewards/arithmetic_steps.py` must match byte for byte on
two digits."""

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


_EXPRESSION = re.compile(r"\d{2}[+-]\d{2}")


def reference_steps(question: str) -> list[str] | None:
    found = _EXPRESSION.search(question)
    return None if found is None else worked_solution(found.group()).split(",")


def step_scores(questions, steps) -> list[list[float]]:
    scores = []
    for question, sample in zip(questions, steps):
        reference = reference_steps(question) or []
        scores.append([float(i < len(reference) and step.strip() == reference[i]) for i, step in enumerate(sample)])
    return scores
