"""Shuffled, resumable batches of problems: `shuffled_order` and `ProblemLoader`.

`ProblemLoader` hands out batches of a shuffled list, epoch after epoch; its
position (`state()`, a small JSON-serialisable dict) can be saved with a
checkpoint and restored into a fresh loader, which then continues exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from mathrl_jax.data.layouts import Problem, is_int


def shuffled_order(num_items: int, seed: int, epoch: int) -> list[int]:
    """The permutation of range(num_items) for (seed, epoch): indices sorted by BLAKE2b(seed, epoch, index).

    A hash rather than a library RNG, so the order is the same on every platform and
    every numpy / Python version: a checkpoint taken on one machine resumes on another.
    """
    prefix = f"{seed}:{epoch}:".encode()

    def key(i: int) -> bytes:
        return hashlib.blake2b(prefix + str(i).encode(), digest_size=8).digest()

    return sorted(range(num_items), key=key)


class ProblemLoader:
    """Deterministic shuffled epochs over a sequence of problems, resumable from a small state.

    Epoch e visits every problem once, in `shuffled_order(len(problems), seed, e)` (or in
    order if shuffle=False). `next_batch(n)` continues where the last batch stopped and
    wraps into the next epoch. `state()` is {"epoch", "position", "seed", "num_problems"}
    (JSON-serialisable); `restore(state)` on a loader over the same problems with the
    same seed continues exactly as the loader that produced it.
    """

    def __init__(self, problems: Sequence[Problem], *, seed: int, shuffle: bool = True):
        if len(problems) == 0:
            raise ValueError("ProblemLoader needs at least one problem, got an empty sequence")
        if not is_int(seed):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self._problems = problems
        self._seed = seed
        self._shuffle = bool(shuffle)
        self._epoch = 0
        self._position = 0
        self._order_cache: tuple[int, list[int]] = (-1, [])

    def __len__(self) -> int:
        return len(self._problems)

    @property
    def epoch(self) -> int:
        return self._epoch

    def epoch_order(self, epoch: int) -> list[int]:
        """Indices into the problems, in the order epoch `epoch` visits them."""
        if self._order_cache[0] != epoch:
            n = len(self._problems)
            order = shuffled_order(n, self._seed, epoch) if self._shuffle else list(range(n))
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def next_batch(self, n: int) -> list[Problem]:
        """The next `n` problems; crosses into the next epoch (reshuffled) when this one ends."""
        if not is_int(n) or n < 1:
            raise ValueError(f"batch size must be a positive integer, got {n!r}")
        batch: list[Problem] = []
        size = len(self._problems)
        while len(batch) < n:
            order = self.epoch_order(self._epoch)
            take = min(n - len(batch), size - self._position)
            batch.extend(self._problems[i] for i in order[self._position : self._position + take])
            self._position += take
            if self._position == size:
                self._epoch += 1
                self._position = 0
        return batch

    def state(self) -> dict[str, int]:
        """{"epoch", "position", "seed", "num_problems"}: plain ints, for a JSON checkpoint."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "seed": self._seed,
            "num_problems": len(self._problems),
        }

    def restore(self, state: Mapping[str, int]) -> None:
        """Continue from `state` (from `state()`). "seed" and "num_problems" are optional, checked if present."""
        if not isinstance(state, Mapping):
            raise TypeError(f"loader state must be a mapping, got {state!r}")
        values = {}
        for key in ("epoch", "position"):
            if key not in state:
                raise ValueError(f"loader state {dict(state)!r} has no {key!r}")
            value = state[key]
            if not is_int(value) or value < 0:
                raise ValueError(f"loader state {key!r} must be a non-negative integer, got {value!r}")
            values[key] = value
        size = len(self._problems)
        if values["position"] >= size:
            raise ValueError(f"loader state position {values['position']} is not below the {size} problems")
        if "num_problems" in state and state["num_problems"] != size:
            raise ValueError(
                f"loader state is for {state['num_problems']!r} problems, this loader has {size}: "
                "restore into a loader over the same problems"
            )
        if "seed" in state and state["seed"] != self._seed:
            raise ValueError(f"loader state has seed {state['seed']!r}, this loader has seed {self._seed}")
        self._epoch = values["epoch"]
        self._position = values["position"]
