"""The countdown warm-start's teacher: it combines the numbers left to right, in the given order, with `+` and `*`.

For `count` numbers it tries the 2^(count-1) chains `((n1 o1 n2) o2 n3) ...`, each `o` in `+ *` (in the order
`+` before `*`, first operator first), and writes the first chain that ends at the target; when none does, it
writes the chain that ends nearest the target (the first of the nearest), boxing where it ended:

| instance      | the teacher writes            |                                                          |
|---------------|-------------------------------|----------------------------------------------------------|
| `3,7,5->26:`  | `3*7=21,21+5=26,\\boxed{26}`  | solved                                                   |
| `3,7,5->50:`  | `3+7=10,10*5=50,\\boxed{50}`  | solved                                                   |
| `3,7,5->32:`  | `3*7=21,21+5=26,\\boxed{26}`  | wrong: 7*5-3 needs `-` and another order; 26 is nearest |
| `3,7,5->38:`  | `3+7=10,10*5=50,\\boxed{50}`  | wrong: 7*5+3 is another grouping; 50 and 26 tie, + first |

So it is wrong in a structured way: never `-`, never another order or grouping. On 3 numbers from 1 to 9 it
solves about a third of the instances (`countdown/problems.py`'s table), fewer with more numbers. A model that
imitates it writes the rule's chain; the right behaviour on the rest (another order, `-`, a grouping such as
`a*(b+c)`) is rare under the warm-start, and RL has to find it. It is deterministic: the same instance, the same
solution (no slip rate).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from mathrl_jax.data.countdown import rules

TEACHER_OPS = ("+", "*")
"""The operators the teacher tries, in its order of preference."""


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


def teacher_steps(instance: rules.Instance) -> tuple[tuple[str, ...], int]:
    """(the teacher's steps, the value it boxes): the first chain that ends at the target, else the first of those
    that end nearest it."""
    candidates = chains(instance.numbers)
    return min(candidates, key=lambda chain: abs(chain[1] - instance.target))  # min keeps the first of a tie


def teacher_solves(instance: rules.Instance) -> bool:
    """Whether a chain of the teacher's rule reaches the target (so its solution is right)."""
    return teacher_steps(instance)[1] == instance.target


def teacher_solution(instance: rules.Instance) -> str:
    """The teacher's solution text: `3*7=21,21+5=26,\\boxed{26}` (module docstring)."""
    steps, value = teacher_steps(instance)
    return rules.SEPARATOR.join((*steps, rules.boxed(value)))


def teacher_solutions(questions: Sequence[str]) -> list[str]:
    """The teacher's solution of each question (`3,7,5->26:`)."""
    return [teacher_solution(rules.parse_instance(q)) for q in questions]


def longest_solution(count: int, max_number: int) -> int:
    """At most how many characters a solution of the teacher's takes for `count` numbers up to `max_number`: a bound
    for `max_new_tokens` with a character tokenizer (add one token for EOS).

    After k numbers its value is at most max(max_number, 2)^k (`a+b <= a*b` for a, b >= 2; `1+1 = 2`)."""
    base = max(max_number, 2)
    length = 0
    for k in range(1, count):  # step k combines the chain's value so far with number k+1
        length += len(str(base**k)) + 1 + len(str(max_number)) + 1 + len(str(base ** (k + 1))) + 1  # "a*b=c,"
    return length + len(rules.boxed(base**count))
