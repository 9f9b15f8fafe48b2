"""Student-t confidence intervals of a mean over seeds, and of a difference of two groups' means.

Source: any statistics text, e.g. Wasserman, "All of Statistics" (2004), 10.7 (the t interval) and Welch (1947)
for unequal variances:

    mean:        x_bar -+ t_{(1+c)/2, n-1} * s / sqrt(n)                      (s: the unbiased std)
    paired:      the mean interval of the differences d_i = a_i - b_i
    unpaired:    a_bar - b_bar -+ t_{(1+c)/2, nu} * sqrt(s_a^2/n_a + s_b^2/n_b),
                 nu = (s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1))   (Welch)

Beside the percentile bootstrap (`bootstrap.py`) because with 5 seeds the bootstrap ignores that the spread is
estimated (about 84% coverage for a nominal 95%), while the t interval widens for it (95% for normal values at
any n; tests/stats measure both). The quantile is SciPy's (`scipy.stats.t.ppf`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats

from mathrl_jax.stats.interval import Interval, check_confidence, checked_values


def _interval(estimate: float, standard_error: float, dof: float, confidence: float, n: int) -> Interval:
    half = float(scipy_stats.t.ppf((1 + confidence) / 2, dof)) * standard_error if standard_error > 0 else 0.0
    return Interval(float(estimate), float(estimate - half), float(estimate + half), float(confidence), n)


def t_mean_interval(values, *, confidence: float = 0.95) -> Interval:
    """The mean of `values` [n >= 2] and its Student-t interval, x_bar -+ t_{n-1} s / sqrt(n) (module
    docstring). Equal values give a point interval. Raises ValueError with fewer than 2 values, a non-finite
    value, or `confidence` outside (0, 1)."""
    x = checked_values("values", values)
    check_confidence(confidence)
    mean = math.fsum(x) / x.size
    return _interval(mean, float(np.std(x, ddof=1)) / math.sqrt(x.size), x.size - 1, confidence, x.size)


def t_difference_interval(first, second, *, paired: bool = False, confidence: float = 0.95) -> Interval:
    """mean(first) - mean(second) and its Student-t interval: paired (one pair per seed) as `t_mean_interval`
    of the differences; unpaired by Welch's unequal-variance interval (module docstring). Raises ValueError as
    `t_mean_interval`, and for paired groups of different lengths."""
    a, b = checked_values("first", first), checked_values("second", second)
    check_confidence(confidence)
    if paired:
        if a.size != b.size:
            raise ValueError(f"paired: first has {a.size} values, second {b.size}; expected one pair per seed")
        return t_mean_interval(a - b, confidence=confidence)
    va, vb = float(np.var(a, ddof=1)) / a.size, float(np.var(b, ddof=1)) / b.size
    estimate = math.fsum(a) / a.size - math.fsum(b) / b.size
    if va + vb == 0:
        return _interval(estimate, 0.0, 1.0, confidence, a.size + b.size)
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return _interval(estimate, math.sqrt(va + vb), dof, confidence, a.size + b.size)
