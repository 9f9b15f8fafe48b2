"""Statistics of learning curves over seeds: ScaleRL's saturating fit of a run's curve, bootstrap intervals.

    from mathrl_jax import stats
    fit = stats.fit_saturating_curve(iterations, accuracies)   # fit.ok, fit.asymptote, fit.exponent, fit.midpoint
    stats.bootstrap_mean_interval(final_accuracies, seed=0)    # Interval(estimate, low, high, ...)
    stats.bootstrap_difference_interval(gains, control_gains, paired=True)
    stats.t_difference_interval(gains, control_gains, paired=True)  # Student-t: honest at 5 seeds

| module             | what                                                                                   |
|--------------------|----------------------------------------------------------------------------------------|
| `saturating_curve` | R_0 + (A - R_0) / (1 + (C_mid / C)^B) (ScaleRL, Khatri et al. 2025) and its bounded fit |
| `bootstrap`        | percentile bootstrap intervals of a mean, of a difference of means (paired or not)     |
| `student_t`        | Student-t intervals of the same (Welch's when unpaired): 95% coverage at 5 seeds         |
| `interval`         | `Interval`, the result of both, and the check of the values                            |

NumPy and SciPy only; nothing here imports the rest of the package. The unbiased pass@k estimator (Chen et al. 2021) is
`mathrl_jax.evaluation.pass_at_k`, where the evaluation uses it; the runs log `eval/pass@{k}`.
"""

from mathrl_jax.stats.bootstrap import bootstrap_difference_interval, bootstrap_mean_interval
from mathrl_jax.stats.interval import Interval
from mathrl_jax.stats.saturating_curve import (
    EXPONENT_BOUNDS,
    MIDPOINT_RANGE,
    SigmoidFit,
    fit_saturating_curve,
    saturating_curve,
)
from mathrl_jax.stats.student_t import t_difference_interval, t_mean_interval

__all__ = [
    "EXPONENT_BOUNDS",
    "MIDPOINT_RANGE",
    "Interval",
    "SigmoidFit",
    "bootstrap_difference_interval",
    "bootstrap_mean_interval",
    "fit_saturating_curve",
    "saturating_curve",
    "t_difference_interval",
    "t_mean_interval",
]
