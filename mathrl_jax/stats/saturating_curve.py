"""ScaleRL's saturating (sigmoidal) compute-performance curve, and its least-squares fit to one learning curve.

Source: Khatri et al., "The Art of Scaling Reinforcement Learning Compute for LLMs" (2025, arXiv:2510.13786),
which models the validation pass rate R_C after training compute C as

    R_C - R_0 = (A - R_0) / (1 + (C_mid / C)^B)

R_0 the starting pass rate, A the asymptote (the pass rate as C grows without bound), B > 0 the scaling exponent
(how sharply the curve rises: "efficiency" with C_mid) and C_mid the compute at which half of the gain A - R_0 is
reached. At C = 0 the curve is R_0 (the limit of the formula). Here C is any measure of compute proportional to
the training done, e.g. the RL iteration of a run whose iterations all cost the same.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np

# The search box of the fit, around the data: C_mid from a hundredth of the first positive compute to a hundred
# times the last, B in EXPONENT_BOUNDS. An optimum on (or next to) its edge means the data do not fix that parameter.
MIDPOINT_RANGE = 100.0
EXPONENT_BOUNDS = (0.05, 50.0)
_GRID = 48  # the coarse grid over (log C_mid, log B), then a pattern search around its best point
_MAX_MOVES = 400
_TOLERANCE = 1e-10  # in log units
_EDGE = 1e-3  # in log units: how close to an edge of the box counts as on it


class SigmoidFit(NamedTuple):
    """A least-squares fit of `saturating_curve` to one learning curve.

    `ok` False means the parameters are not to be reported (`reason` says why: too few points, a flat curve, a
    midpoint or exponent the data do not fix); they are still filled in for inspection. `rmse` is the
    root-mean-square residual sqrt(sum (y - fit)^2 / n) over the n points (`num_points`)."""

    ok: bool
    reason: str
    start: float  # R_0
    asymptote: float  # A
    midpoint: float  # C_mid
    exponent: float  # B
    rmse: float
    num_points: int

    @property
    def gain(self) -> float:
        """A - R_0: the rise the curve is heading for."""
        return self.asymptote - self.start


def saturating_curve(compute, start: float, asymptote: float, midpoint: float, exponent: float) -> np.ndarray:
    """R_0 + (A - R_0) / (1 + (C_mid / C)^B) at each compute C >= 0 (ScaleRL's form; R_0 at C = 0).

    Args: `compute` [n] (C >= 0), `start` R_0, `asymptote` A, `midpoint` C_mid > 0, `exponent` B > 0.
    Returns [n] float64."""
    c = np.asarray(compute, dtype=np.float64)
    if c.ndim != 1 or not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError(f"compute: expected a 1-D array of finite values >= 0, got {compute!r}")
    if not (math.isfinite(midpoint) and midpoint > 0 and math.isfinite(exponent) and exponent > 0):
        raise ValueError(f"midpoint={midpoint}, exponent={exponent}: expected both finite and > 0")
    return start + (asymptote - start) * _rise(c[None, :], np.array([math.log(midpoint)]), np.array([exponent]))[0]


def _rise(compute: np.ndarray, log_midpoint: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """1 / (1 + (C_mid / C)^B) for compute [n] (or [1, n]) and parameters [G]: [G, n]; 0 at C = 0.

    Written as the logistic of B (ln C - ln C_mid), which does not overflow."""
    with np.errstate(divide="ignore"):
        log_c = np.log(compute.reshape(1, -1))
    z = exponent[:, None] * (log_c - log_midpoint[:, None])  # -inf at C = 0
    return np.where(np.isneginf(z), 0.0, 0.5 * (1.0 + np.tanh(0.5 * np.where(np.isneginf(z), 0.0, z))))


def _best_levels(s: np.ndarray, y: np.ndarray, start: Optional[float]) -> tuple[np.ndarray, ...]:
    """For each row of rises s [G, n]: the (R_0, A) in [0, 1]^2 (R_0 = `start` when given) that minimise
    sum (y - R_0 (1 - s) - A s)^2, and that sum. The model is linear in (R_0, A), so the box-constrained
    minimum is exact: the unconstrained one if inside the box, else the best over the box's edges."""
    u = 1.0 - s
    if start is not None:
        ss = np.einsum("gn,gn->g", s, s)
        target = y[None, :] - start * u
        a = np.clip(np.einsum("gn,gn->g", s, target) / np.maximum(ss, 1e-300), 0.0, 1.0)
        r0 = np.full_like(a, start)
        return r0, a, np.sum((target - a[:, None] * s) ** 2, axis=1)
    uu, us, ss = (np.einsum("gn,gn->g", p, q) for p, q in ((u, u), (u, s), (s, s)))
    uy, sy = u @ y, s @ y
    candidates = []
    det = uu * ss - us * us
    with np.errstate(divide="ignore", invalid="ignore"):
        r0 = (uy * ss - sy * us) / det
        a = (sy * uu - uy * us) / det
    inside = (np.abs(det) > 1e-12 * np.maximum(uu * ss, 1e-300)) & (r0 >= 0) & (r0 <= 1) & (a >= 0) & (a <= 1)
    candidates.append((np.where(inside, r0, 0.0), np.where(inside, a, 0.0), inside))
    for fixed in (0.0, 1.0):  # R_0 on an edge: the best A for it, clipped; then A on an edge
        a_edge = np.clip((sy - fixed * us) / np.maximum(ss, 1e-300), 0.0, 1.0)
        candidates.append((np.full_like(a_edge, fixed), a_edge, np.ones_like(inside)))
        r0_edge = np.clip((uy - fixed * us) / np.maximum(uu, 1e-300), 0.0, 1.0)
        candidates.append((r0_edge, np.full_like(r0_edge, fixed), np.ones_like(inside)))
    best_sse = np.full(s.shape[0], np.inf)
    best_r0, best_a = np.zeros(s.shape[0]), np.zeros(s.shape[0])
    for r0_c, a_c, valid in candidates:
        sse = np.sum((y[None, :] - r0_c[:, None] * u - a_c[:, None] * s) ** 2, axis=1)
        better = valid & (sse < best_sse)
        best_sse = np.where(better, sse, best_sse)
        best_r0, best_a = np.where(better, r0_c, best_r0), np.where(better, a_c, best_a)
    return best_r0, best_a, best_sse


def fit_saturating_curve(compute, accuracy, *, start: Optional[float] = None, min_gain: float = 0.02) -> SigmoidFit:
    """Fits ScaleRL's sigmoid R_C = R_0 + (A - R_0) / (1 + (C_mid / C)^B) (module docstring) to one learning curve
    by least squares.

    Args:
      compute: [n] increasing compute of the evaluations, >= 0 (e.g. RL iterations; 0 = before training).
      accuracy: [n] the accuracy (pass rate) measured there, each in [0, 1].
      start: R_0 if known (e.g. the measured accuracy before training); None fits it too.
      min_gain: a fitted |A - R_0| below this is a flat curve: no fit reported (B and C_mid mean nothing then).

    Bounds: R_0 and A in [0, 1]; B in `EXPONENT_BOUNDS`; C_mid within a factor `MIDPOINT_RANGE` of the data's
    positive compute. Method: for fixed (C_mid, B) the model is linear in (R_0, A), solved exactly in the box;
    (ln C_mid, ln B) is searched on a grid, refined around its best point (deterministic, no start values).

    Returns a `SigmoidFit`; `ok` False (a failure, not an exception) when the curve cannot fix the parameters:
      - fewer points than parameters + 1 (5 with R_0 fitted, 4 with `start` given), or fewer than 2 with C > 0;
      - flat: |A - R_0| < `min_gain`;
      - C_mid outside [first positive compute, last compute]: the rise ended before the first evaluation after 0,
        or its midpoint is not reached yet (the asymptote would be an extrapolation);
      - B on its bound: a step between two evaluations (evaluate more often), or no curvature to speak of.
    Raises ValueError on malformed input (shapes, non-finite values, accuracy outside [0, 1], compute < 0 or not
    increasing, `start` outside [0, 1], `min_gain` < 0).
    """
    c = np.asarray(compute, dtype=np.float64)
    y = np.asarray(accuracy, dtype=np.float64)
    if c.ndim != 1 or y.shape != c.shape:
        raise ValueError(f"compute {c.shape} and accuracy {y.shape}: expected two 1-D arrays of the same length")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(y))):
        raise ValueError("compute and accuracy: expected finite values")
    if np.any(c < 0) or np.any(np.diff(c) <= 0):
        raise ValueError(f"compute {c.tolist()}: expected values >= 0, strictly increasing")
    if np.any(y < 0) or np.any(y > 1):
        raise ValueError(f"accuracy {y.tolist()}: expected values in [0, 1]")
    if start is not None and not (math.isfinite(start) and 0 <= start <= 1):
        raise ValueError(f"start={start}: expected None or a value in [0, 1]")
    if not (math.isfinite(min_gain) and min_gain >= 0):
        raise ValueError(f"min_gain={min_gain}: expected >= 0")

    n = int(c.size)
    parameters = 3 if start is not None else 4
    positive = c[c > 0]
    nan = float("nan")
    if n < parameters + 1 or positive.size < 2:
        reason = f"too few points ({n}, {positive.size} after 0): fitting {parameters} parameters needs " + (
            f"{parameters + 1}, 2 after 0"
        )
        return SigmoidFit(False, reason, nan, nan, nan, nan, nan, n)

    low_m, high_m = math.log(positive[0] / MIDPOINT_RANGE), math.log(positive[-1] * MIDPOINT_RANGE)
    low_b, high_b = (math.log(b) for b in EXPONENT_BOUNDS)

    def evaluate(log_m: np.ndarray, log_b: np.ndarray):
        mm, bb = (g.ravel() for g in np.meshgrid(log_m, log_b, indexing="ij"))
        r0, a, sse = _best_levels(_rise(c, mm, np.exp(bb)), y, start)
        best = int(np.argmin(sse))  # the first of equal minima: deterministic
        return mm[best], bb[best], r0[best], a[best], sse[best]

    log_m, log_b, r0, a, sse = evaluate(np.linspace(low_m, high_m, _GRID), np.linspace(low_b, high_b, _GRID))
    # Pattern search: an 11 x 11 window of +-1 step around the best point; it moves while its best point is on
    # its rim (the optimum lies further along a valley), and shrinks 5-fold once the best point is inside it.
    step_m, step_b = (high_m - low_m) / (_GRID - 1), (high_b - low_b) / (_GRID - 1)
    for _ in range(_MAX_MOVES):
        if step_m < _TOLERANCE and step_b < _TOLERANCE:
            break
        grid_m = np.clip(np.linspace(log_m - step_m, log_m + step_m, 11), low_m, high_m)
        grid_b = np.clip(np.linspace(log_b - step_b, log_b + step_b, 11), low_b, high_b)
        candidate = evaluate(grid_m, grid_b)
        if candidate[4] < sse:
            log_m, log_b, r0, a, sse = candidate
        on_rim = (log_m in (grid_m[0], grid_m[-1]) and low_m < log_m < high_m) or (
            log_b in (grid_b[0], grid_b[-1]) and low_b < log_b < high_b
        )
        if not on_rim:
            step_m, step_b = step_m / 5, step_b / 5

    fit = SigmoidFit(True, "", float(r0), float(a), math.exp(log_m), math.exp(log_b), math.sqrt(float(sse) / n), n)
    if abs(fit.gain) < min_gain:
        return fit._replace(ok=False, reason=f"flat: A - R_0 = {fit.gain:+.3f}, within +-{min_gain:g}")
    if fit.midpoint < positive[0] * math.exp(-_EDGE):
        return fit._replace(ok=False, reason=f"rise done before the first evaluation after 0 (C_mid < {positive[0]:g})")
    if fit.midpoint > c[-1] * math.exp(_EDGE):
        return fit._replace(ok=False, reason=f"midpoint not reached (C_mid > {c[-1]:g}): asymptote extrapolated")
    if log_b >= high_b - _EDGE:
        return fit._replace(ok=False, reason="B at its upper bound: a step between two evaluations")
    if log_b <= low_b + _EDGE:
        return fit._replace(ok=False, reason="B at its lower bound: no sigmoid in the data")
    return fit
