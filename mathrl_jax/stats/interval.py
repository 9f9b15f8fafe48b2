"""A confidence interval of a statistic over seeds, and the check of the values it rests on (shared by the
bootstrap and Student-t intervals)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Interval(NamedTuple):
    """A statistic's value on the data (`estimate`), its interval [`low`, `high`] (bootstrap or Student-t) at
    `confidence`, and the number of values it rests on (`num_values`: the pairs when paired, both groups' values
    when not)."""

    estimate: float
    low: float
    high: float
    confidence: float
    num_values: int


def checked_values(name: str, values, minimum: int = 2) -> np.ndarray:
    """`values` as a 1-D float64 array of at least `minimum` finite numbers, else ValueError naming `name`."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of numbers, got shape {array.shape}")
    if array.size < minimum:
        raise ValueError(f"{name}: {array.size} value(s); an interval needs at least {minimum}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: expected finite values, got {array.tolist()}")
    return array


def check_confidence(confidence: float) -> None:
    """ValueError unless `confidence` is a number in (0, 1)."""
    if not (isinstance(confidence, float | int) and 0 < confidence < 1):
        raise ValueError(f"confidence={confidence!r}: expected a number in (0, 1)")
