"""Plot the learning curves of a run as a PNG.

    python scripts/plot_metrics.py RUN_DIR [--out PNG] [--keys k1,k2,...]

RUN_DIR is a MetricsLogger log directory (it holds `metrics.jsonl`). One
subplot per metric against the step; a step logged twice (a resumed run)
shows its later value, and a non-finite value (null in the file) is a gap.
By default it draws the panels that say how a run goes (`PANELS`: rewards,
accuracy, held-out accuracy, response length, policy loss, entropy, KL, clip
fraction, gradient norm, and the critic's loss and explained variance when
there is one), leaving out any that the run did not log or that never
changed; `--keys all` draws every metric in the file (the standard ones of
`mathrl_jax.train.reporting.METRIC_NAMES` first), `--keys k1,k2` the ones named.
The default output is RUN_DIR/metrics.png. Needs matplotlib
(`pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

from mathrl_jax.train.reporting import METRIC_NAMES, RESERVED_KEYS, read_jsonl_metrics

Curves = dict[str, tuple[list[int], list[float]]]


def metric_keys(records: Sequence[dict]) -> list[str]:
    """The metric names in `records`: the standard ones in METRIC_NAMES order, then the rest as first seen."""
    seen: dict[str, None] = {}
    for record in records:
        for key in record:
            if key not in RESERVED_KEYS:
                seen.setdefault(key, None)
    standard = [k for k in METRIC_NAMES if k in seen]
    return standard + [k for k in seen if k not in METRIC_NAMES]


PANELS = (
    "rollout/rewards",
    "rollout/accuracy",
    "eval/accuracy",
    "rollout/response_length",
    "train/policy_loss",
    "train/entropy",
    "train/approx_kl",
    "train/kl",
    "train/clip_fraction",
    "train/grad_norm",
    "train/value_loss",
    "train/value_explained_variance",
)
"""The default panels, in reading order (the critic's only where the run has one)."""


def default_keys(records: Sequence[dict]) -> list[str]:
    """The `PANELS` the records hold with more than one distinct finite value (a flat line says nothing);
    every such metric if none of the panels is there; every metric if nothing varies."""
    available = metric_keys(records)
    data = curves(records, available)

    def varies(key: str) -> bool:
        return len({v for v in data[key][1] if math.isfinite(v)}) > 1

    chosen = [k for k in PANELS if k in data and varies(k)]
    return chosen or [k for k in available if varies(k)] or available


def curves(records: Sequence[dict], keys: Sequence[str]) -> Curves:
    """{key: (steps ascending, values)} with the last value logged for each step; None -> NaN."""
    result: Curves = {}
    for key in keys:
        by_step: dict[int, float] = {}
        for record in records:
            if key in record:
                value = record[key]
                by_step[int(record["step"])] = math.nan if value is None else float(value)
        steps = sorted(by_step)
        result[key] = (steps, [by_step[s] for s in steps])
    return result


def plot(data: Curves, out: str, title: str = ""):
    """Draws one subplot per curve (3 columns) and saves the figure as a PNG at `out`; returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(3, len(data))
    nrows = math.ceil(len(data) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows), squeeze=False)
    for ax, (key, (steps, values)) in zip(axes.flat, data.items()):
        ax.plot(steps, values, marker="." if len(steps) < 50 else None, linewidth=1.2)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(data) :]:
        ax.set_visible(False)
    if title:  # above the panels, not over the first one
        fig.suptitle(title, fontsize=12)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (3.0 * nrows)))  # half an inch of the 3 per row
    else:
        fig.tight_layout()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return fig


def plot_run(run_dir: str, out: str | None = None, keys: Sequence[str] | None = None) -> str:
    """Writes the PNG of `run_dir`'s metrics; returns its path. Errors name the run dir and the keys."""
    records = read_jsonl_metrics(run_dir)
    available = metric_keys(records)
    if not available:
        raise ValueError(f"{run_dir!r} has a metrics file with no metrics in it")
    if keys == ["all"]:
        keys = available
    elif keys:
        unknown = [k for k in keys if k not in available]
        if unknown:
            raise ValueError(f"no metric {', '.join(map(repr, unknown))} in {run_dir!r}; it has {', '.join(available)}")
    else:
        keys = default_keys(records)
    out = out or os.path.join(run_dir, "metrics.png")
    plot(curves(records, keys), out, title=os.path.basename(os.path.abspath(run_dir)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="run directory holding metrics.jsonl")
    parser.add_argument("--out", help="output PNG (default: RUN_DIR/metrics.png)")
    parser.add_argument("--keys", help="comma-separated metric names, or 'all' (default: the PANELS that vary)")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
    try:
        out = plot_run(args.run_dir, args.out, keys)
    except (FileNotFoundError, ValueError) as e:
        print(f"plot_metrics: error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"plot_metrics: error: {e}; install matplotlib (pip install -e '.[plot]')", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
