"""The countdown game's rules: an instance, a derivation, its check, and an exhaustive solver.

An instance is a few positive integers and a target: `3,7,5->26`. A solution combines two available numbers per
step with `+`, `-` or `*`, the result becoming available in their place, until one number is left; it must be the
target, and every given number must have been used exactly once (an intermediate result once, too):

    3,7,5->26:   7*3=21,21+5=26,\\boxed{26}

The format, exactly (a response is split at ","):

- a step is `a<op>b=c`: non-negative decimal integers without leading zeros (`0` itself is allowed; at most
  `MAX_DIGITS` digits), no spaces, `<op>` one of `+ - *`, with `c` the exact value of `a<op>b`. Each operand is
  a number available at that point (a given number not yet used, or an earlier step's result not yet used); a
  number given twice may be used twice. Either order of `+` / `*` operands is fine.
- intermediate results are never negative (the classic game's rule): `a-b` needs `a >= b` (`3-7=-4` is not a
  step). Every instance generated has a solution within this rule (`solvable`).
- there are exactly (count of numbers - 1) steps, then the last piece, `\\boxed{t}`, the target. Nothing follows.

The boxed value alone proves nothing (the target is in the prompt): `check_derivation` accepts a response only
when its steps are a valid derivation of the target from the given numbers, and says why it refuses one
(`Verdict.reason`, `Verdict.wrong_piece`). `step_checks` scores each piece on its own for a process verifier: a
piece is good when it and every piece before it are valid and the target can still be reached from the numbers
then available (Math-Shepherd's "a step from which the answer is still reachable", exact here by search), so the
first wrong piece is the first step that breaks a rule or leads into a dead end, and every piece after it is wrong
too.

The solver (`reachable`, `solvable`, `solve`) tries every pair, operator and order: exhaustive, memoised on the
sorted multiset of available numbers, cheap at these sizes (up to `MAX_NUMBERS` numbers).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import Counter
from collections.abc import Sequence

MIN_NUMBERS, MAX_NUMBERS = 3, 6
"""How many numbers an instance may have (the training task uses 3 to 5, its harder split one more)."""

OPS = ("+", "-", "*")
SEPARATOR = ","  # between the pieces of a derivation: the steps, then the boxed target

MAX_DIGITS = 30
"""The longest number a step may write: no derivation of these sizes comes near it (6 numbers of 99 multiply to
12 digits), and it keeps a runaway response from turning a 5,000-digit string into an int (which Python refuses)."""

_INSTANCE = re.compile(rf"^([0-9]{{1,{MAX_DIGITS}}}(?:,[0-9]{{1,{MAX_DIGITS}}})+)->([0-9]{{1,{MAX_DIGITS}}}):?$")
_NUMBER = rf"(0|[1-9][0-9]{{0,{MAX_DIGITS - 1}}})"
_STEP = re.compile(rf"^{_NUMBER}([+*-]){_NUMBER}={_NUMBER}$")
_BOXED = re.compile(rf"^\\boxed\{{{_NUMBER}\}}$")


@dataclasses.dataclass(frozen=True)
class Instance:
    """Numbers (in the order the prompt gives them) and a target."""

    numbers: tuple[int, ...]
    target: int

    def __post_init__(self):
        if not MIN_NUMBERS <= len(self.numbers) <= MAX_NUMBERS:
            raise ValueError(f"{len(self.numbers)} numbers: expected {MIN_NUMBERS} to {MAX_NUMBERS}")
        if any(n < 1 for n in self.numbers) or self.target < 0:
            raise ValueError(f"numbers {self.numbers} and target {self.target}: expected positive numbers")

    @property
    def text(self) -> str:
        """`3,7,5->26`: the gold answer a verifier reads (`Problem.answer`)."""
        return ",".join(map(str, self.numbers)) + f"->{self.target}"

    @property
    def question(self) -> str:
        """`3,7,5->26:`: the prompt."""
        return self.text + ":"


def parse_instance(text: str) -> Instance:
    """The instance of `3,7,5->26` or `3,7,5->26:` (a question or a gold answer); ValueError for anything else."""
    match = _INSTANCE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a countdown instance like '3,7,5->26:'")
    return Instance(tuple(int(n) for n in match.group(1).split(",")), int(match.group(2)))


def apply(a: int, op: str, b: int) -> int | None:
    """`a op b`, or None where the rules forbid it (`a - b < 0`)."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b if a >= b else None
    raise ValueError(f"unknown operator {op!r}; expected one of {OPS}")


def _key(pool) -> tuple[int, ...]:
    return tuple(sorted(pool))


@functools.lru_cache(maxsize=1 << 16)
def _reachable(pool: tuple[int, ...]) -> frozenset[int]:
    if len(pool) == 1:
        return frozenset(pool)
    values: set[int] = set()
    for i in range(len(pool)):
        for j in range(i + 1, len(pool)):
            rest = pool[:i] + pool[i + 1 : j] + pool[j + 1 :]
            a, b = pool[j], pool[i]  # sorted: a >= b
            for value in {a + b, a * b, a - b}:
                values |= _reachable(_key(rest + (value,)))
    return frozenset(values)


def reachable(pool: Sequence[int]) -> frozenset[int]:
    """Every value a derivation can end at using all of `pool` (one number: itself)."""
    if not pool:
        raise ValueError("an empty pool reaches nothing")
    return _reachable(_key(pool))


def solvable(numbers: Sequence[int], target: int) -> bool:
    """Whether some derivation from all of `numbers` ends at `target`."""
    return target in reachable(numbers)


def solve(numbers: Sequence[int], target: int) -> tuple[str, ...] | None:
    """The steps (`"7*3=21"`, ...) of one derivation from all of `numbers` to `target`, or None when there is none.

    Deterministic: at each step the first pair (by position in the pool, results appended at its end) and operator
    (`+ - *`) from which the target is still reachable."""
    pool = list(numbers)
    if not solvable(pool, target):
        return None
    steps = []
    while len(pool) > 1:
        step = _next_step(pool, target)
        steps.append(step[0])
        pool = step[1]
    return tuple(steps)


def _next_step(pool: list[int], target: int) -> tuple[str, list[int]]:
    for i in range(len(pool)):
        for j in range(i + 1, len(pool)):
            rest = pool[:i] + pool[i + 1 : j] + pool[j + 1 :]
            for op in OPS:
                a, b = (max(pool[i], pool[j]), min(pool[i], pool[j])) if op == "-" else (pool[i], pool[j])
                value = apply(a, op, b)
                if target in reachable(rest + [value]):
                    return f"{a}{op}{b}={value}", rest + [value]
    raise AssertionError(f"no step from {pool} reaches {target}, which was reachable")  # pragma: no cover


def boxed(target: int) -> str:
    """The last piece of a derivation: `\\boxed{26}`."""
    return f"\\boxed{{{target}}}"


@dataclasses.dataclass(frozen=True)
class PieceCheck:
    """One piece of a derivation checked in order: `valid` (the rules hold so far), `good` (valid and the target is
    still reachable from what is then available; for the boxed piece: the derivation is complete and right), and
    why not (`reason`, "" when good)."""

    valid: bool
    good: bool
    reason: str = ""


def step_checks(instance: Instance, pieces: Sequence[str]) -> list[PieceCheck]:
    """Each piece of a derivation checked in order (see the module docstring); after the first piece that is not
    good, every piece is not good ("after a wrong step")."""
    pool = Counter(instance.numbers)
    out: list[PieceCheck] = []
    broken = ""  # why an earlier piece was not good
    finished = False  # the boxed piece has been read
    for piece in pieces:
        piece = piece.strip()
        if broken:
            out.append(PieceCheck(False, False, f"after a wrong step ({broken})"))
            continue
        check = _check_piece(instance, pool, piece, finished)
        finished = finished or bool(_BOXED.match(piece))
        out.append(check)
        if not check.good:
            broken = check.reason
    return out


def _show(piece: str) -> str:
    """A piece as a reason quotes it: its repr, cut to 40 characters."""
    text = repr(piece)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_piece(instance: Instance, pool: Counter, piece: str, finished: bool) -> PieceCheck:
    """Checks one piece against the available numbers `pool`, which it updates (a step takes its operands and adds
    its result)."""
    if finished:
        return PieceCheck(False, False, f"{_show(piece)} follows the boxed answer")
    found = _BOXED.match(piece)
    if found:
        value = int(found.group(1))
        left = sorted(pool.elements())
        if len(left) != 1:
            return PieceCheck(False, False, f"{_show(piece)} with numbers {left} still to combine")
        if left[0] != instance.target:
            return PieceCheck(True, False, f"the steps end at {left[0]}, not the target {instance.target}")
        if value != instance.target:
            return PieceCheck(False, False, f"{_show(piece)} boxes {value}, not the target {instance.target}")
        return PieceCheck(True, True)
    found = _STEP.match(piece)
    if found is None:
        return PieceCheck(False, False, f"{_show(piece)} is not a step 'a+b=c' (or '-', '*') nor '\\boxed{{target}}'")
    a, op, b, c = int(found.group(1)), found.group(2), int(found.group(3)), int(found.group(4))
    operands = Counter((a, b))
    missing = operands - pool
    if missing:
        return PieceCheck(
            False, False, f"{_show(piece)} uses {sorted(missing.elements())}, not available {sorted(pool)}"
        )
    value = apply(a, op, b)
    if value != c:
        return PieceCheck(False, False, f"{_show(piece)} is wrong: {a}{op}{b} is {value}")
    pool.subtract(operands)
    pool += Counter()  # drops the zero counts
    pool[c] += 1
    if instance.target not in reachable(list(pool.elements())):
        return PieceCheck(True, False, f"after {_show(piece)} the target {instance.target} cannot be reached")
    return PieceCheck(True, True)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A response's verdict: `correct`; `boxed`, the boxed value's text (None: the response boxes nothing); for a
    wrong response, why (`reason`) and the first wrong piece's index (`wrong_piece`, None when the fault is the
    whole response's, e.g. too few steps)."""

    correct: bool
    boxed: str | None
    reason: str = ""
    wrong_piece: int | None = None


_ANY_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def check_derivation(instance: Instance, response: str) -> Verdict:
    """Whether `response` (the completion, surrounding whitespace ignored) is a valid derivation of `instance`'s
    target in the format of the module docstring: every step right, each number used exactly once, the boxed target
    last. A wrong response's `wrong_piece` is the first piece `step_checks` finds not good: the first that breaks a
    rule, or the first step after which the target cannot be reached any more (the steps that follow a dead end
    can never end at the target)."""
    text = response.strip()
    found = _ANY_BOXED.findall(text)
    if not found:
        return Verdict(False, None, "no \\boxed{} answer")
    answer = found[-1]
    pieces = text.split(SEPARATOR)
    for index, check in enumerate(step_checks(instance, pieces)):
        if not check.good:
            return Verdict(False, answer, check.reason, index)
    if not _BOXED.match(pieces[-1].strip()):  # every piece good but no boxed piece: cannot happen, kept as a guard
        return Verdict(False, answer, f"the last piece {_show(pieces[-1])} is not {boxed(instance.target)}")
    return Verdict(True, answer)
