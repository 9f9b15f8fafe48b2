"""Student-t intervals: the textbook value at a table's quantile, coverage at 5 seeds (where the bootstrap's
is short), pairing, Welch's degrees of freedom, and the failures."""

from __future__ import annotations

import numpy as np
import pytest

from mathrl_jax import stats

# t_{0.975} from a printed table (Fisher and Yates), not from SciPy: 4 and 9 degrees of freedom.
T_975 = {4: 2.776, 9: 2.262}


@pytest.mark.parametrize("n", [5, 10])
def test_the_interval_is_the_textbook_formula(n):
    x = np.random.default_rng(n).normal(0.6, 0.08, n)
    interval = stats.t_mean_interval(x)
    half = T_975[n - 1] * x.std(ddof=1) / np.sqrt(n)
    assert interval.estimate == pytest.approx(x.mean(), abs=1e-15)
    assert interval.low == pytest.approx(x.mean() - half, rel=1e-3)
    assert interval.high == pytest.approx(x.mean() + half, rel=1e-3)
    assert (interval.confidence, interval.num_values) == (0.95, n)


def test_five_normal_seeds_are_covered_95_percent_where_the_bootstrap_is_short():
    rng = np.random.default_rng(0)
    draws = 2000
    t_hits = boot_hits = 0
    for i in range(draws):
        x = rng.normal(0.5, 0.1, 5)
        t = stats.t_mean_interval(x)
        boot = stats.bootstrap_mean_interval(x, num_resamples=1000, seed=i)
        t_hits += t.low <= 0.5 <= t.high
        boot_hits += boot.low <= 0.5 <= boot.high
    assert 0.935 <= t_hits / draws <= 0.965, t_hits / draws  # 2000 draws: +-0.005 of binomial noise
    assert boot_hits / draws < 0.9, boot_hits / draws


def test_paired_is_the_interval_of_the_differences_and_narrower_when_the_pair_shares_much():
    rng = np.random.default_rng(1)
    shared = rng.normal(0, 0.2, 6)  # what a seed's run and its control share (the warm-start)
    a, b = shared + 0.3 + rng.normal(0, 0.02, 6), shared + rng.normal(0, 0.02, 6)
    paired = stats.t_difference_interval(a, b, paired=True)
    assert paired == stats.t_mean_interval(a - b)
    unpaired = stats.t_difference_interval(a, b)
    assert paired.estimate == pytest.approx(unpaired.estimate)
    assert paired.high - paired.low < (unpaired.high - unpaired.low) / 4
    assert paired.low > 0.2


def test_welch_degrees_of_freedom_match_the_formula():
    a = np.array([0.61, 0.72, 0.55, 0.68, 0.70, 0.64])
    b = np.array([0.40, 0.52, 0.31, 0.47])
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    from scipy import stats as scipy_stats

    half = scipy_stats.t.ppf(0.975, dof) * np.sqrt(va + vb)
    interval = stats.t_difference_interval(a, b)
    assert interval.low == pytest.approx(a.mean() - b.mean() - half, rel=1e-12)
    assert interval.num_values == 10
    # Welch's test as SciPy computes it: 0 outside the interval exactly when p < 0.05
    assert scipy_stats.ttest_ind(a, b, equal_var=False).pvalue < 0.05 and interval.low > 0


def test_equal_values_give_a_point_interval_and_bad_input_raises():
    assert stats.t_mean_interval([0.3, 0.3, 0.3])[:3] == (0.3, 0.3, 0.3)
    with pytest.raises(ValueError, match="at least 2"):
        stats.t_mean_interval([0.5])
    with pytest.raises(ValueError, match="finite"):
        stats.t_mean_interval([0.5, float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        stats.t_mean_interval([0.5, 0.6], confidence=1.0)
    with pytest.raises(ValueError, match="paired"):
        stats.t_difference_interval([0.5, 0.6], [0.5, 0.6, 0.7], paired=True)
