"""The countdown warm-start's teacher: it combines the numbers left to right, in the given order, with `+` and `*`,
and is careless with its last operator.

The rule. For `count` numbers it tries the 2^(count-1) chains `((n1 o1 n2) o2 n3) ...`, each `o` in `+ *` (in the
order `+` before `*`, first operator first), and writes the first chain that ends at the target; when none does,
it writes the chain that ends nearest the target (the first of the nearest), boxing where it ended:

| instance      | the rule writes               |                                                          |
|---------------|-------------------------------|----------------------------------------------------------|
| `3,7,5->26:`  | `3*7=21,21+5=26,\\boxed{26}`  | solved                                                   |
| `3,7,5->50:`  | `3+7=10,10*5=50,\\boxed{50}`  | solved                                                   |
| `3,7,5->32:`  | `3*7=21,21+5=26,\\boxed{26}`  | wrong: 7*5-3 needs `-` and another order; 26 is nearest |
| `3,7,5->38:`  | `3+7=10,10*5=50,\\boxed{50}`  | wrong: 7*5+3 is another grouping; 50 and 26 tie, + first |
| `3,7,5->5:`   | `3+7=10,10+5=15,\\boxed{15}`  | wrong: 3+7-5 needs `-`                                   |

On 3 numbers from 1 to 9 the rule solves about a third of the instances (`countdown/problems.py`'s table), fewer
with more numbers; it never writes `-`, another order or another grouping.

The slip. As the arithmetic teacher drops carries, this one slips on its last operator: with probability
`slip_rate` (a hash of (seed, instance, draw), so the same everywhere) it writes its chain's last step with one of
the other two operators of `+ - *` (drawn by another hash; `-` takes the larger minus the smaller) and boxes where
that ends: `3,7,5->26:` -> `3*7=21,21-5=16,\\boxed{16}` or `3*7=21,21*5=105,\\boxed{105}`. So:

- where the rule is right, a slip makes it wrong: with `slip_rate > 0.5` a model that imitates the teacher puts
  most of its probability on a wrong last operator, and greedy decoding fails there while sampling still finds the
  right one some of the time (the arithmetic default's structure, the room a verifier's reward can use and a
  shuffled one cannot);
- where the rule is wrong, a slip to `-` is sometimes right (`3,7,5->5:` -> `3+7=10,10-5=5`): the only `-` the
  model ever sees, so there the right behaviour is rare under the warm-start rather than absent;
- instances that need another order or grouping (`3,7,5->32:`) the teacher never solves: RL has to find them,
  pass@k matters, and the task does not saturate.

`slip_rate=0` is the rule alone, deterministic.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from mathrl_jax.data.countdown import rules
from mathrl_jax.data.hashing import HashStream, hash_unit

TEACHER_OPS = ("+", "*")
"""The operators the teacher's rule tries, in its order of preference."""


def chains(numbers: Sequence[int]) -> list[tuple[tuple[str, ...], int]]:
    """Every chain of the teacher's rule: (its steps, the value it ends at), in the teacher's order."""
    out = []
    for ops in itertools.product(TEACHER_OPS, repeat=len(numbers) - 1):
        value, steps = numbers[0], []
        for op, number in zip(ops, numbers[1:]):
            result = rules.apply(value, op, number)
            steps.append(f"{value}{op}{number}={result}")
            value = result
        out.append((tuple(steps), value))
    return out


def _rule(numbers: Sequence[int], target: int) -> tuple[tuple[str, ...], int]:
    """(ops, value) of the rule's chain: the first that ends at the target, else the first of the nearest."""
    best = None
    for ops in itertools.product(TEACHER_OPS, repeat=len(numbers) - 1):
        value = numbers[0]
        for op, number in zip(ops, numbers[1:]):
            value = rules.apply(value, op, number)
        if best is None or abs(value - target) < abs(best[1] - target):
            best = (ops, value)
    return best


def teacher_steps(instance: rules.Instance, *, last_op: str | None = None) -> tuple[tuple[str, ...], int]:
    """(the teacher's steps, the value it boxes): the rule's chain (module docstring); with `last_op`, its slip: the
    chain's last step with that operator instead (`-` takes the larger minus the smaller)."""
    ops, _ = _rule(instance.numbers, instance.target)
    if last_op is not None:
        if last_op not in rules.OPS:
            raise ValueError(f"last_op={last_op!r}: expected one of {rules.OPS}")
        ops = (*ops[:-1], last_op)
    value, steps = instance.numbers[0], []
    for op, number in zip(ops, instance.numbers[1:]):
        a, b = (max(value, number), min(value, number)) if op == "-" else (value, number)
        value = rules.apply(a, op, b)
        steps.append(f"{a}{op}{b}={value}")
    return tuple(steps), value


def teacher_solves(instance: rules.Instance) -> bool:
    """Whether a chain of the teacher's rule reaches the target (so its solution is right when it does not slip)."""
    return _rule(instance.numbers, instance.target)[1] == instance.target


def teacher_solution(instance: rules.Instance, *, last_op: str | None = None) -> str:
    """The teacher's solution text: `3*7=21,21+5=26,\\boxed{26}`; with `last_op`, its slip (`teacher_steps`)."""
    steps, value = teacher_steps(instance, last_op=last_op)
    return rules.SEPARATOR.join((*steps, rules.boxed(value)))


def slip(instance: rules.Instance, slip_rate: float, *, seed: int, draw: int = 0) -> str | None:
    """The operator the teacher's last step slips to on draw `draw` of `instance`, or None when it does not slip:
    it slips when a hash of (seed, instance, draw) is below `slip_rate`, to one of the two operators of `+ - *` its
    rule did not choose there, drawn by a second hash."""
    if not 0.0 <= slip_rate <= 1.0:
        raise ValueError(f"slip_rate={slip_rate!r}: expected a probability in [0, 1]")
    key = f"countdown-teacher/{seed}/{instance.text}/{draw}"
    if hash_unit(key) >= slip_rate:
        return None
    chosen = _rule(instance.numbers, instance.target)[0][-1]
    return HashStream(key + "/op").choice([op for op in rules.OPS if op != chosen])


def teacher_solutions(questions: Sequence[str], *, slip_rate: float = 0.0, seed: int = 0) -> list[str]:
    """The teacher's solution of each question (`3,7,5->26:`), its last operator slipping with probability
    `slip_rate`. Occurrence k of a question in the list is draw k of it, so a repeated question gets independent
    draws."""
    out = []
    seen: dict[str, int] = {}
    for question in questions:
        draw = seen.get(question, 0)
        seen[question] = draw + 1
        instance = rules.parse_instance(question)
        out.append(teacher_solution(instance, last_op=slip(instance, slip_rate, seed=seed, draw=draw)))
    return out


def longest_solution(count: int, max_number: int) -> int:
    """At most how many characters a solution of the teacher's takes for `count` numbers up to `max_number`, slipped
    or not: a bound for `max_new_tokens` with a character tokenizer (add one token for EOS).

    After k numbers the rule's value is at most max(max_number, 2)^k (`a+b <= a*b` for a, b >= 2; `1+1 = 2`); a
    slip only changes the last step, whose value is then at most that bound too (`-` and `+` give less than `*`,
    except `1+1`)."""
    base = max(max_number, 2)
    length = 0
    for k in range(1, count):  # step k combines the chain's value so far with number k+1
        length += len(str(base**k)) + 1 + len(str(max_number)) + 1 + len(str(base ** (k + 1))) + 1  # "a*b=c,"
    return length + len(rules.boxed(base**count))
