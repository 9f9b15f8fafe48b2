"""Counter-based randomness for procedural data: integers from BLAKE2b(key, counter), the same on every platform.

A library RNG's stream can change with its version; a hash of a key and a counter cannot. The procedural tasks
draw each problem from a stream keyed by what defines it ("countdown/<seed>/<split>/<index>/<attempt>"), so the
same arguments give the same problems everywhere, and problem i does not depend on how many are drawn.

    stream = HashStream("countdown/0/train/7/0")
    stream.integer(1, 9), stream.choice("+-*")

The arithmetic task (`data/arithmetic.py`) and countdown (`data/countdown/`) draw from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def hash_unit(key: str) -> float:
    """A number in [0, 1) from BLAKE2b(key): a deterministic coin (`hash_unit(key) < p` is true with probability p)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class HashStream:
    """Integers from BLAKE2b(key + "/" + counter), the counter advancing with each draw: deterministic everywhere."""

    def __init__(self, key: str):
        self._key = key.encode()
        self._counter = 0

    def integer(self, low: int, high: int) -> int:
        """Uniform (up to a 2^-64 bias) in [low, high]."""
        if high < low:
            raise ValueError(f"empty range [{low}, {high}]")
        digest = hashlib.blake2b(self._key + b"/" + str(self._counter).encode(), digest_size=8).digest()
        self._counter += 1
        return low + int.from_bytes(digest, "little") % (high - low + 1)

    def choice(self, options: Sequence):
        """One of `options`, uniformly."""
        return options[self.integer(0, len(options) - 1)]
