"""ScaleRL's sigmoid: the formula against a direct evaluation, known parameters recovered, the fit no worse than
SciPy's bounded least squares (an independent optimiser), and the documented failures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mathrl_jax import stats


def direct(c, r0, a, c_mid, b):
    """R_C = R_0 + (A - R_0) / (1 + (C_mid / C)^B), term by term (R_0 at C = 0)."""
    return np.array([r0 if x == 0 else r0 + (a - r0) / (1.0 + (c_mid / x) ** b) for x in c])


def test_the_curve_is_scalerls_formula():
    c = np.array([0.0, 0.5, 1.0, 3.0, 6.0, 12.0, 100.0, 1e6])
    for r0, a, c_mid, b in ((0.3, 0.8, 6.0, 1.5), (0.6, 0.2, 2.0, 0.7), (0.0, 1.0, 40.0, 4.0)):
        np.testing.assert_allclose(stats.saturating_curve(c, r0, a, c_mid, b), direct(c, r0, a, c_mid, b), atol=1e-12)
    # half the gain at C_mid, R_0 at 0, A far out
    curve = stats.saturating_curve([0.0, 6.0, 1e12], 0.3, 0.8, 6.0, 1.5)
    np.testing.assert_allclose(curve, [0.3, 0.55, 0.8], atol=1e-12)
    with pytest.raises(ValueError, match="midpoint"):
        stats.saturating_curve([1.0], 0.3, 0.8, 0.0, 1.5)
    with pytest.raises(ValueError, match="compute"):
        stats.saturating_curve([-1.0], 0.3, 0.8, 1.0, 1.5)


@pytest.mark.parametrize(
    "r0, a, c_mid, b",
    [(0.3, 0.8, 6.0, 1.5), (0.55, 0.95, 3.0, 2.5), (0.1, 0.45, 15.0, 1.0), (0.7, 0.4, 8.0, 2.0)],  # last: a fall
)
def test_known_parameters_are_recovered(r0, a, c_mid, b):
    c = np.arange(0.0, 41.0, 2.0)  # every 2 of 40 iterations, as with --eval-interval 2
    fit = stats.fit_saturating_curve(c, direct(c, r0, a, c_mid, b))
    assert fit.ok, fit.reason
    assert (fit.start, fit.asymptote, fit.midpoint, fit.exponent) == pytest.approx((r0, a, c_mid, b), rel=1e-5)
    assert fit.rmse < 1e-6 and fit.num_points == c.size and fit.gain == pytest.approx(a - r0)
    known = stats.fit_saturating_curve(c, direct(c, r0, a, c_mid, b), start=r0)
    assert known.ok and known.start == r0 and known.asymptote == pytest.approx(a, rel=1e-5)


def test_noisy_curves_recover_the_asymptote_within_the_noise():
    rng = np.random.default_rng(0)
    c = np.arange(0.0, 41.0, 2.0)
    truth = direct(c, 0.3, 0.8, 6.0, 1.5)
    errors = []
    for _ in range(20):
        noisy = np.clip(truth + rng.normal(0.0, 0.02, c.size), 0.0, 1.0)  # 500 problems: about 0.02 of noise
        fit = stats.fit_saturating_curve(c, noisy)
        assert fit.ok, fit.reason
        errors.append(fit.asymptote - 0.8)
        assert fit.rmse == pytest.approx(np.sqrt(np.mean((noisy - direct(c, *fit[2:6])) ** 2)), rel=1e-9)
    assert abs(np.mean(errors)) < 0.015 and np.std(errors) < 0.03  # measured: +0.004 and 0.021


def test_the_fit_is_no_worse_than_scipys_least_squares():
    optimize = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(1)
    c = np.arange(0.0, 21.0, 1.0)
    for r0, a, c_mid, b in ((0.3, 0.8, 6.0, 1.5), (0.5, 0.9, 3.0, 3.0), (0.2, 0.5, 10.0, 0.8)):
        y = np.clip(direct(c, r0, a, c_mid, b) + rng.normal(0.0, 0.03, c.size), 0.0, 1.0)
        fit = stats.fit_saturating_curve(c, y)

        def residuals(p):
            return direct(c, p[0], p[1], math.exp(p[2]), math.exp(p[3])) - y

        best = math.inf
        for start in ((0.5, 0.5, math.log(5.0), 0.0), (r0, a, math.log(c_mid), math.log(b))):  # incl. the truth
            found = optimize.least_squares(
                residuals, start, bounds=([0, 0, math.log(0.01), math.log(0.05)], [1, 1, math.log(2000), math.log(50)])
            )
            best = min(best, float(np.sum(found.fun**2)))
        assert fit.rmse**2 * c.size <= best * (1 + 1e-6) + 1e-12


def test_a_flat_curve_is_a_documented_failure_not_a_fit():
    rng = np.random.default_rng(2)
    c = np.arange(0.0, 41.0, 2.0)
    fit = stats.fit_saturating_curve(c, 0.6 + rng.normal(0.0, 0.005, c.size))
    assert not fit.ok and fit.reason.startswith("flat")
    assert not stats.fit_saturating_curve(c, np.full(c.size, 0.6)).ok


def test_too_few_points_and_unidentified_parameters_are_failures():
    fit = stats.fit_saturating_curve([0, 10, 20, 30], [0.6, 0.9, 0.95, 0.96])  # 4 points for 4 parameters
    assert not fit.ok and fit.reason.startswith("too few points") and math.isnan(fit.asymptote)
    four = stats.fit_saturating_curve([0, 10, 20, 30], direct([0, 10, 20, 30], 0.6, 0.8, 15.0, 2.0), start=0.6)
    assert four.ok and four.midpoint == pytest.approx(15.0, rel=1e-5)  # R_0 given: 3 parameters
    assert "too few" in stats.fit_saturating_curve([0, 40], [0.6, 0.99]).reason
    # Today's default: at 0.99 by the first evaluation after 0, so C_mid is anywhere below it.
    step = stats.fit_saturating_curve([0, 10, 20, 30, 40], [0.60, 0.985, 0.99, 0.988, 0.99])
    assert not step.ok and "before the first evaluation" in step.reason
    assert step.asymptote == pytest.approx(0.99, abs=0.01)  # still filled in, for inspection
    # Still rising linearly at the end: its midpoint is not reached.
    c = np.arange(0.0, 21.0, 2.0)
    early = stats.fit_saturating_curve(c, direct(c, 0.2, 0.9, 60.0, 1.0))
    assert not early.ok and "midpoint not reached" in early.reason
    # A step between two evaluations in the middle of the data: B runs to its bound.
    jump = stats.fit_saturating_curve(c, np.where(c < 9, 0.3, 0.8))
    assert not jump.ok and "B at its upper bound" in jump.reason


@pytest.mark.parametrize(
    "compute, accuracy, kwargs, match",
    [
        ([0, 1, 2], [0.1, 0.2], {}, "same length"),
        ([0, 2, 1, 3, 4], [0.1] * 5, {}, "increasing"),
        ([-1, 1, 2, 3, 4], [0.1] * 5, {}, "increasing"),
        ([0, 1, 2, 3, 4], [0.1, 0.2, float("nan"), 0.3, 0.3], {}, "finite"),
        ([0, 1, 2, 3, 4], [0.1, 0.2, 1.2, 0.3, 0.3], {}, r"\[0, 1\]"),
        ([0, 1, 2, 3, 4], [0.1] * 5, {"start": 1.5}, "start"),
        ([0, 1, 2, 3, 4], [0.1] * 5, {"min_gain": -1.0}, "min_gain"),
    ],
)
def test_malformed_input_raises(compute, accuracy, kwargs, match):
    with pytest.raises(ValueError, match=match):
        stats.fit_saturating_curve(compute, accuracy, **kwargs)
