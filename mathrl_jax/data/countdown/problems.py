"""Countdown instances, drawn procedurally and deterministically: each has a solution by construction.

One draw (`countdown/<seed>/<split>/<index>/<attempt>`, a `HashStream`): `count` numbers, each uniform in
[`min_number`, `max_number`]; then a random derivation over them: two numbers of the pool picked uniformly, an
operator uniform over `+ - *` (`-` takes the larger minus the smaller), the result back into the pool, until one
number is left: the target. A draw whose target is outside [1, `max_target`] is drawn again (the next attempt).
That derivation is the problem's reference solution, so every instance is solvable under the rules
(`rules.check_derivation` accepts the solution; the tests check each against the exhaustive solver too).

| count | e.g. (numbers 1-9, targets <= 99) | prompt         | the teacher solves (`teacher.py`) |
|-------|-----------------------------------|----------------|-----------------------------------|
| 3     | `7,6,3->11:`                      | 9 to 10 tokens | about 33%                         |
| 4     | `3,7,5,2->52:`                    | 11 to 12       | about 15%                         |
| 5     | `3,7,5,2,8->41:`                  | 13 to 14       | about 9%                          |
| 6     | `3,7,5,2,8,4->96:`                | 15 to 16       | about 7%                          |

A problem: uid `countdown:<split>:<seed>:<index>`, question the prompt `3,7,5->26:`, answer the instance
`3,7,5->26` (what the verifier needs: the numbers and the target, not just the target, which is in the prompt),
solution the reference derivation `7*3=21,21+5=26,\\boxed{26}`, level the count of numbers ("3"), subject
"countdown". The first k of n problems are the k problems drawn with n = k (under `unique`, problem i depends on
the problems before it).

For evaluation, `countdown_train_eval` draws a held-out set from its own stream (split "eval", all distinct) and
the training set from the "train" stream, skipping every held-out question; `countdown_problems(split=...,
count=count + 1, exclude=...)` draws the harder split (one more number).
"""

from __future__ import annotations

from collections.abc import Iterable

from mathrl_jax.data.countdown import rules
from mathrl_jax.data.hashing import HashStream
from mathrl_jax.data.layouts import Problem

MAX_ATTEMPTS = 10_000
"""Draws tried for one problem (rejections: a target out of range, `unique`, `exclude`) before giving up."""

MAX_NUMBER = 99
MAX_TARGET = 9999
"""Bounds of `max_number` and `max_target`: prompts stay short for the tiny model's context."""


def check_settings(count: int, min_number: int, max_number: int, max_target: int) -> None:
    """ValueError naming the setting unless the instance settings are in range (whole numbers)."""
    for name, value in (("count", count), ("min_number", min_number), ("max_number", max_number)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}={value!r}: expected a whole number")
    if isinstance(max_target, bool) or not isinstance(max_target, int):
        raise ValueError(f"max_target={max_target!r}: expected a whole number")
    if not rules.MIN_NUMBERS <= count <= rules.MAX_NUMBERS:
        raise ValueError(f"count={count}: expected {rules.MIN_NUMBERS} to {rules.MAX_NUMBERS} numbers")
    if not 1 <= min_number <= max_number <= MAX_NUMBER:
        raise ValueError(
            f"min_number={min_number}, max_number={max_number}: expected 1 <= min_number <= max_number <= {MAX_NUMBER}"
        )
    if not 1 <= max_target <= MAX_TARGET:
        raise ValueError(f"max_target={max_target}: expected 1 to {MAX_TARGET}")


def random_derivation(numbers: tuple[int, ...], stream: HashStream) -> tuple[tuple[str, ...], int]:
    """(steps, the value they end at) of a random derivation from all of `numbers`: two numbers of the pool picked
    uniformly, an operator uniform over `+ - *` (`-` takes the larger minus the smaller), the result back into the
    pool (at its end), until one number is left."""
    pool = list(numbers)
    steps = []
    while len(pool) > 1:
        i = stream.integer(0, len(pool) - 1)
        j = stream.integer(0, len(pool) - 2)
        j += j >= i  # a second, different position
        op = stream.choice(rules.OPS)
        a, b = pool[i], pool[j]
        if op == "-" and a < b:
            a, b = b, a
        value = rules.apply(a, op, b)
        steps.append(f"{a}{op}{b}={value}")
        pool = [n for k, n in enumerate(pool) if k not in (i, j)] + [value]
    return tuple(steps), pool[0]


def draw(
    seed: int, split: str, index: int, attempt: int, count: int, min_number: int, max_number: int
) -> tuple[rules.Instance, tuple[str, ...]]:
    """(instance, the steps of the derivation that made its target) of one draw (module docstring)."""
    stream = HashStream(f"countdown/{seed}/{split}/{index}/{attempt}")
    numbers = tuple(stream.integer(min_number, max_number) for _ in range(count))
    steps, target = random_derivation(numbers, stream)
    return rules.Instance(numbers, target), steps


def countdown_problems(
    n: int,
    *,
    seed: int,
    count: int = 3,
    min_number: int = 1,
    max_number: int = 9,
    max_target: int = 99,
    split: str = "train",
    unique: bool = False,
    exclude: Iterable[str] = (),
) -> list[Problem]:
    """`n` countdown problems, deterministic from (seed, split, count, min_number, max_number, max_target).

    Args:
      n: number of problems.
      seed: any integer.
      count: how many numbers an instance has (3 to 6): the difficulty knob.
      min_number, max_number: the range of the numbers (1 <= min <= max <= 99).
      max_target: the largest target (1 to 9999); targets are at least 1.
      split: the name of the random stream ("train", "eval", ...): different splits give independent problems.
      unique: no two problems with the same question.
      exclude: questions never to return (e.g. a held-out set's).

    Returns:
      Problems as in the module docstring.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    check_settings(count, min_number, max_number, max_target)
    banned = set(exclude)
    problems = []
    for index in range(n):
        for attempt in range(MAX_ATTEMPTS):
            instance, steps = draw(seed, split, index, attempt, count, min_number, max_number)
            if 1 <= instance.target <= max_target and instance.question not in banned:
                break
        else:
            raise ValueError(
                f"could not draw countdown problem {index} of n={n} (count={count}, numbers {min_number} to "
                f"{max_number}, targets up to {max_target}) in {MAX_ATTEMPTS} attempts: too few distinct problems "
                f"for unique={unique} and {len(banned)} excluded questions"
            )
        if unique:
            banned.add(instance.question)
        problems.append(
            Problem(
                uid=f"countdown:{split}:{seed}:{index}",
                question=instance.question,
                answer=instance.text,
                solution=rules.SEPARATOR.join((*steps, rules.boxed(instance.target))),
                level=str(count),
                subject="countdown",
            )
        )
    return problems


def countdown_train_eval(
    n_train: int,
    n_eval: int,
    *,
    seed: int,
    count: int = 3,
    min_number: int = 1,
    max_number: int = 9,
    max_target: int = 99,
) -> tuple[list[Problem], list[Problem]]:
    """(train, eval): `n_eval` distinct held-out problems (split "eval") and `n_train` training problems (split
    "train", repeats allowed) sharing none of their questions."""
    settings = dict(seed=seed, count=count, min_number=min_number, max_number=max_number, max_target=max_target)
    held_out = countdown_problems(n_eval, split="eval", unique=True, **settings)
    train = countdown_problems(n_train, split="train", exclude={p.question for p in held_out}, **settings)
    return train, held_out
