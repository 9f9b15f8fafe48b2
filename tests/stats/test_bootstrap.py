"""Bootstrap intervals: coverage of a known mean over many draws, the normal-theory width at large n, pairing,
determinism, and the documented failures."""

from __future__ import annotations

import numpy as np
import pytest

from mathrl_jax import stats


def coverage(n, draws=600, resamples=2000, seed=0):
    rng = np.random.default_rng(seed)
    hits = 0
    for i in range(draws):
        x = rng.exponential(0.5, n)  # skewed: mean 0.5
        interval = stats.bootstrap_mean_interval(x, num_resamples=resamples, seed=i)
        hits += interval.low <= 0.5 <= interval.high
    return hits / draws


def test_the_mean_interval_covers_about_95_percent_with_many_values():
    assert 0.91 <= coverage(60) <= 0.98  # nominal 0.95; 600 draws: +-0.009 of binomial noise


def test_the_mean_interval_is_too_narrow_with_few_values_as_documented():
    assert coverage(5, draws=800) < 0.9  # the docstring's caveat: ~0.84 for normal values, less when skewed


def test_the_interval_matches_normal_theory_at_large_n():
    x = np.random.default_rng(3).normal(0.7, 0.05, 400)
    interval = stats.bootstrap_mean_interval(x, num_resamples=20_000, seed=1)
    half = 1.959964 * x.std(ddof=0) / np.sqrt(x.size)
    assert interval.estimate == pytest.approx(x.mean(), abs=1e-15)
    assert interval.low == pytest.approx(x.mean() - half, rel=2e-3)
    assert interval.high == pytest.approx(x.mean() + half, rel=2e-3)
    assert (interval.confidence, interval.num_values) == (0.95, 400)


def test_the_difference_interval_covers_the_true_difference():
    rng = np.random.default_rng(4)
    hits = 0
    for i in range(400):
        a, b = rng.normal(0.8, 0.05, 40), rng.normal(0.6, 0.08, 50)
        interval = stats.bootstrap_difference_interval(a, b, num_resamples=2000, seed=i)
        assert interval.estimate == pytest.approx(a.mean() - b.mean())
        hits += interval.low <= 0.2 <= interval.high
    assert 0.91 <= hits / 400 <= 0.98


def test_pairing_by_seed_removes_what_the_pair_shares():
    rng = np.random.default_rng(5)
    shared = rng.normal(0.6, 0.1, 8)  # e.g. each seed's warm-start
    runs, controls = shared + 0.3 + rng.normal(0, 0.01, 8), shared + rng.normal(0, 0.01, 8)
    paired = stats.bootstrap_difference_interval(runs, controls, paired=True)
    unpaired = stats.bootstrap_difference_interval(runs, controls)
    assert paired.estimate == pytest.approx(unpaired.estimate) == pytest.approx(np.mean(runs - controls))
    assert paired.high - paired.low < 0.25 * (unpaired.high - unpaired.low)
    assert paired == stats.bootstrap_mean_interval(runs - controls)
    with pytest.raises(ValueError, match="one pair per seed"):
        stats.bootstrap_difference_interval([1.0, 2.0, 3.0], [1.0, 2.0], paired=True)


def test_deterministic_given_the_seed():
    x = [0.61, 0.58, 0.66, 0.70, 0.59]
    assert stats.bootstrap_mean_interval(x, seed=7) == stats.bootstrap_mean_interval(x, seed=7)
    y = np.random.default_rng(0).uniform(0, 1, 30)  # 5 values: the quantiles fall on the same few means
    assert stats.bootstrap_mean_interval(y, seed=7) != stats.bootstrap_mean_interval(y, seed=8)
    assert stats.bootstrap_difference_interval(x, x[::-1], seed=3) == stats.bootstrap_difference_interval(
        x, x[::-1], seed=3
    )


def test_equal_values_give_a_point_interval():
    assert stats.bootstrap_mean_interval([0.3] * 5)[:3] == (0.3, 0.3, 0.3)


@pytest.mark.parametrize(
    "values, kwargs, match",
    [
        ([0.5], {}, "at least 2"),
        ([], {}, "at least 2"),
        ([[0.5, 0.6]], {}, "1-D"),
        ([0.5, float("inf")], {}, "finite"),
        ([0.5, 0.6], {"confidence": 1.0}, "confidence"),
        ([0.5, 0.6], {"num_resamples": 10}, "num_resamples"),
    ],
)
def test_degenerate_input_raises(values, kwargs, match):
    with pytest.raises(ValueError, match=match):
        stats.bootstrap_mean_interval(values, **kwargs)
