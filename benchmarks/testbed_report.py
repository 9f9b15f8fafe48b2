"""The testbed's predictions (docs/testbed.md), each checked against the sweeps that test it: held or failed.

    python scripts/testbed_report.py --long runs/testbed/d4 --short runs/testbed/d2 [--stress runs/testbed/stress]
                                     [--markdown OUT.md]

`--long` is the sweep of `scripts/learning_curves.py --algorithms grpo tppo ppo dapo --config
mathrl_jax/configs/column_chain.py` (horizon H, 4 digits), `--short` the same at `--config.arithmetic.digits=2`
with the rows grpo, tppo and appo: their `statistics.json`. Prints (and with `--markdown` writes) one table per
sweep (each row's final greedy accuracy, RL gain, its control's, RL minus control, the fitted asymptote and
midpoint, pass@1 / pass@k at the end, token entropy, the harder split) and then each prediction with the
measured gap, its 95% intervals (Student-t, then percentile bootstrap; paired by seed where both runs start from
that seed's warm-start) and the verdict by the prediction's own words. A prediction whose rows are missing is
"not run", never held. `--stress` is the sweep of the stress rows (`--algorithms grpo stress` on 1,000 held-out
problems): predictions 8 to 13, staleness and log-prob noise, and GRPO on 1,000 problems against `--long`'s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

from mathrl_jax import stats
from mathrl_jax.train import run_directory


def fail(message: str) -> None:
    print(f"testbed_report.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def load_sweep(directory: str) -> dict[str, list[dict[str, Any]]]:
    """{row name: its seeds' rows ({"seed", "run", "control"})} from `<directory>/statistics.json`."""
    path = os.path.join(directory, "statistics.json")
    if not os.path.isfile(path):
        fail(f"{path}: not found (run scripts/learning_curves.py --out {directory} first)")
    with open(path, encoding="utf-8") as f:
        return {row["name"]: row["seeds"] for row in json.load(f)["rows"]}


class Gap(NamedTuple):
    """A measured difference (or mean) over seeds with its intervals; `values` one per seed."""

    estimate: float
    t: Optional[stats.Interval]
    bootstrap: Optional[stats.Interval]
    values: list[float]

    def text(self, fmt: str = "+.3f") -> str:
        if not self.values:
            return "- (no seed)"
        if self.t is None:
            return f"{self.estimate:{fmt}} (one seed)"
        return (
            f"{self.estimate:{fmt}} [t {self.t.low:{fmt}}, {self.t.high:{fmt}}; "
            f"bootstrap {self.bootstrap.low:{fmt}}, {self.bootstrap.high:{fmt}}] over {len(self.values)} seeds"
        )

    @property
    def excludes_zero(self) -> bool:
        return self.t is not None and (self.t.low > 0 or self.t.high < 0)


def mean_gap(values: Sequence[float]) -> Gap:
    values = [float(v) for v in values]
    if not values:
        return Gap(math.nan, None, None, [])
    if len(values) < 2:
        return Gap(values[0], None, None, values)
    return Gap(
        math.fsum(values) / len(values), stats.t_mean_interval(values), stats.bootstrap_mean_interval(values), values
    )


def per_seed(seeds: list[dict[str, Any]], value: Callable[[dict[str, Any]], Optional[float]]) -> dict[int, float]:
    return {r["seed"]: v for r in seeds if (v := value(r)) is not None}


def paired(a: dict[int, float], b: dict[int, float]) -> Gap:
    """a[s] - b[s] over the seeds both have (the same warm-start and held-out set per seed)."""
    common = sorted(set(a) & set(b))
    return mean_gap([a[s] - b[s] for s in common])


def final(r: dict[str, Any]) -> Optional[float]:
    return r["run"]["rl_end"]


def fit_value(name: str) -> Callable[[dict[str, Any]], Optional[float]]:
    def value(r: dict[str, Any]) -> Optional[float]:
        fit = r["run"]["fit"]
        return fit[name] if fit and fit.get("ok") else None

    return value


def _cell(values: dict[int, float], fmt: str) -> str:
    if not values:
        return "-"
    gap = mean_gap(list(values.values()))
    return f"{gap.estimate:{fmt}}" if gap.t is None else f"{gap.estimate:{fmt}} [{gap.t.low:{fmt}}, {gap.t.high:{fmt}}]"


def sweep_table(sweep: dict[str, list[dict[str, Any]]]) -> str:
    header = [
        "row", "seeds", "final greedy acc", "RL gain", "control gain", "RL - control", "asymptote A", "C_mid",
        "pass@1 / pass@8 end", "entropy end", "harder split end",
    ]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, seeds in sweep.items():

        def mean_of(value):
            got = list(per_seed(seeds, value).values())
            return "-" if not got else f"{math.fsum(got) / len(got):.3f}"

        gains = per_seed(seeds, lambda r: r["run"]["rl_gain"])
        controls = per_seed(seeds, lambda r: r["control"]["rl_gain"] if r.get("control") else None)
        fitted = per_seed(seeds, fit_value("asymptote"))
        cells = [
            name,
            str(len(seeds)),
            _cell(per_seed(seeds, final), ".3f"),
            _cell(gains, "+.3f"),
            _cell(controls, "+.3f"),
            _cell({s: gains[s] - controls[s] for s in gains if s in controls}, "+.3f"),
            _cell(fitted, ".3f") + f" ({len(fitted)} fits)",
            _cell(per_seed(seeds, fit_value("midpoint")), ".1f"),
            f"{mean_of(lambda r: r['run']['sampled_end'])} / {mean_of(lambda r: r['run']['pass_at_k_end'])}",
            mean_of(lambda r: r["run"]["entropy_end"]),
            mean_of(lambda r: r["run"].get("hard_end")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


class Verdict(NamedTuple):
    number: int
    claim: str
    measured: str
    held: Optional[bool]  # None: not run

    def line(self) -> str:
        verdict = "not run" if self.held is None else ("held" if self.held else "failed")
        return f"{self.number}. **{verdict}**: {self.claim} Measured: {self.measured}"


def predictions(long: dict[str, list], short: dict[str, list]) -> list[Verdict]:
    """Each of docs/testbed.md's predictions, by its own words; None where its rows were not run."""

    def have(sweep, *rows):
        return all(row in sweep for row in rows)

    def acc(sweep, row):
        return per_seed(sweep[row], final)

    verdicts = []
    claim = "at horizon H TPPO beats GRPO by >= 10 points; at horizon 2 they tie within 3."
    if have(long, "tppo", "grpo") and have(short, "tppo", "grpo"):
        far, near = paired(acc(long, "tppo"), acc(long, "grpo")), paired(acc(short, "tppo"), acc(short, "grpo"))
        measured = f"H: TPPO - GRPO {far.text()}; 2: {near.text()}."
        verdicts.append(Verdict(1, claim, measured, far.estimate >= 0.10 and abs(near.estimate) <= 0.03))
    else:
        verdicts.append(Verdict(1, claim, "-", None))

    claim = "at horizon H, PPO - GRPO in [-5, +10] points and TPPO - PPO >= 5."
    if have(long, "ppo", "grpo", "tppo"):
        ppo_grpo, tppo_ppo = paired(acc(long, "ppo"), acc(long, "grpo")), paired(acc(long, "tppo"), acc(long, "ppo"))
        measured = f"PPO - GRPO {ppo_grpo.text()}; TPPO - PPO {tppo_ppo.text()}."
        verdicts.append(Verdict(2, claim, measured, -0.05 <= ppo_grpo.estimate <= 0.10 and tppo_ppo.estimate >= 0.05))
    else:
        verdicts.append(Verdict(2, claim, "-", None))

    claim = (
        "at horizon 2 the fitted asymptotes are within 3 points of each other, and APPO and TPPO reach half their "
        "gain (fitted C_mid) in at most half GRPO's iterations."
    )
    if have(short, "grpo", "tppo", "appo"):
        asymptotes = {row: mean_gap(list(per_seed(short[row], fit_value("asymptote")).values())) for row in short}
        midpoints = {row: per_seed(short[row], fit_value("midpoint")) for row in short}
        mids = {row: mean_gap(list(v.values())) for row, v in midpoints.items() if v}
        spread = max(g.estimate for g in asymptotes.values()) - min(g.estimate for g in asymptotes.values())
        fast = all(row in mids and "grpo" in mids and mids[row].estimate <= mids["grpo"].estimate / 2
                   for row in ("appo", "tppo"))  # fmt: skip
        measured = (
            "asymptotes "
            + ", ".join(f"{row} {g.estimate:.3f}" for row, g in asymptotes.items())
            + f" (spread {spread:.3f}); C_mid "
            + ", ".join(f"{row} {g.text('.1f')}" for row, g in mids.items())
            + "."
        )
        verdicts.append(Verdict(3, claim, measured, spread <= 0.03 and fast))
    else:
        verdicts.append(Verdict(3, claim, "-", None))

    claim = "on the harder split the best algorithm is below 0.50, >= 30 points below its same-distribution accuracy."
    hard = {row: per_seed(seeds, lambda r: r["run"].get("hard_end")) for row, seeds in long.items()}
    hard = {row: v for row, v in hard.items() if v}
    if hard:
        best = max(hard, key=lambda row: mean_gap(list(hard[row].values())).estimate)
        best_hard = mean_gap(list(hard[best].values()))
        drop = paired(acc(long, best), hard[best])
        measured = f"best {best}: harder split {best_hard.text('.3f')}; same-distribution minus harder {drop.text()}."
        verdicts.append(Verdict(4, claim, measured, best_hard.estimate < 0.50 and drop.estimate >= 0.30))
    else:
        verdicts.append(Verdict(4, claim, "-", None))

    claim = "at horizon H DAPO's (clip-higher) token entropy at the end is above GRPO's, the interval excluding 0."
    if have(long, "dapo", "grpo"):

        def entropy(r):
            return r["run"]["entropy_end"]

        gap = paired(per_seed(long["dapo"], entropy), per_seed(long["grpo"], entropy))
        verdicts.append(
            Verdict(5, claim, f"DAPO - GRPO {gap.text('+.4f')} nats.", gap.estimate > 0 and gap.excludes_zero)
        )
    else:
        verdicts.append(Verdict(5, claim, "-", None))

    claim = (
        "every control gains within +-5 points, and every RL row gaining >= 10 points clears its control with an "
        "interval excluding 0."
    )
    parts, held, ran = [], True, False
    for label, sweep in (("H", long), ("2", short)):
        for row, seeds in sweep.items():
            gains = per_seed(seeds, lambda r: r["run"]["rl_gain"])
            controls = per_seed(seeds, lambda r: r["control"]["rl_gain"] if r.get("control") else None)
            if not controls:
                continue
            ran = True
            control, gap, gain = (
                mean_gap(list(controls.values())),
                paired(gains, controls),
                mean_gap(list(gains.values())),
            )
            held &= abs(control.estimate) <= 0.05 and (gain.estimate < 0.10 or gap.excludes_zero)
            parts.append(f"{label}/{row}: control {control.estimate:+.3f}, RL - control {gap.text()}")
    verdicts.append(Verdict(6, claim, "; ".join(parts) + "." if parts else "-", held if ran else None))

    claim = "at horizon H GRPO's pass@8 at the end is at most 2 points below the warm-start's."
    if have(long, "grpo"):
        change = mean_gap(
            [r["run"]["pass_at_k_end"] - r["run"]["pass_at_k_start"] for r in long["grpo"] if r["run"]["pass_at_k_end"]]
        )
        verdicts.append(Verdict(7, claim, f"pass@8 end - start {change.text()}.", change.estimate >= -0.02))
    else:
        verdicts.append(Verdict(7, claim, "-", None))
    return verdicts


def mean_clip_fraction(r: dict[str, Any]) -> Optional[float]:
    """The mean over a run's iterations of `train/clip_fraction` (its `metrics.jsonl`), None without the file."""
    path = run_directory.path(r["run"]["run_dir"], run_directory.METRICS)
    if not os.path.isfile(path):
        return None
    by_step = {}  # a resumed run logs again the iterations after its checkpoint: the later line counts
    with open(path, encoding="utf-8") as f:
        for line in f:
            metrics = json.loads(line)
            if "train/clip_fraction" in metrics:
                by_step[metrics["step"]] = metrics["train/clip_fraction"]
    return math.fsum(by_step.values()) / len(by_step) if by_step else None


def stress_predictions(stress: dict[str, list], long: dict[str, list]) -> list[Verdict]:
    """Predictions 8 to 13 (docs/testbed.md), on the stress sweep; 13 also on `long`'s GRPO row."""

    def have(*rows):
        return all(row in stress for row in rows)

    def acc(row):
        return per_seed(stress[row], final)

    def within(gap: Gap, points: float) -> bool:
        return abs(gap.estimate) <= points

    accuracy_gaps = (  # (number, claim, row a, row b, label, held by the paired gap a - b)
        (8, "async_ppo at staleness 8 ends within 5 points of GRPO at staleness 0.", "async_ppo_staleness8", "grpo",
         "async_ppo(8) - GRPO(0)", lambda gap: within(gap, 0.05)),
        (9, "GRPO at staleness 8 clipped around the behaviour policy ends >= 10 points below async_ppo at 8.",
         "async_ppo_staleness8", "stale8_naive", "async_ppo(8) - naive(8)",
         lambda gap: gap.estimate >= 0.10 and gap.excludes_zero),
        (10, "GRPO at staleness 8 with TIS (cap 2) ends within 5 points of async_ppo at 8.", "stale8_tis",
         "async_ppo_staleness8", "TIS(8) - async_ppo(8)", lambda gap: within(gap, 0.05)),
    )  # fmt: skip
    verdicts = []
    for number, claim, a, b, label, holds in accuracy_gaps:
        if have(a, b):
            gap = paired(acc(a), acc(b))
            verdicts.append(Verdict(number, claim, f"{label} {gap.text()}.", holds(gap) if gap.values else None))
        else:
            verdicts.append(Verdict(number, claim, "-", None))

    claim = "async_ppo at staleness 8 reaches its fitted C_mid >= 3 iterations later than GRPO at 0, excluding 0."
    if have("async_ppo_staleness8", "grpo"):
        midpoint = fit_value("midpoint")
        gap = paired(per_seed(stress["async_ppo_staleness8"], midpoint), per_seed(stress["grpo"], midpoint))
        held = gap.estimate >= 3 and gap.excludes_zero if gap.values else None  # None: no seed has both fits
        verdicts.append(Verdict(11, claim, f"C_mid async_ppo(8) - GRPO(0) {gap.text('+.1f')} iterations.", held))
    else:
        verdicts.append(Verdict(11, claim, "-", None))

    claim = "naive PPO with 0.07 nats of log-prob noise ends within 5 points of GRPO, its clip fraction >= 2x GRPO's."
    if have("noise07_naive", "grpo"):
        gap = paired(acc("noise07_naive"), acc("grpo"))
        noisy, clean = (
            per_seed(stress["noise07_naive"], mean_clip_fraction),
            per_seed(stress["grpo"], mean_clip_fraction),
        )
        common = sorted(set(noisy) & set(clean))
        noisy_mean, clean_mean = (math.fsum(d[s] for s in common) / max(len(common), 1) for d in (noisy, clean))
        measured = (
            f"noise(0.07) - GRPO {gap.text()}; mean clip fraction {noisy_mean:.4f} with noise, {clean_mean:.4f} "
            f"without, over {len(common)} seeds."
        )
        held = None if not (gap.values and common) else within(gap, 0.05) and noisy_mean >= 2 * clean_mean
        verdicts.append(Verdict(12, claim, measured, held))
    else:
        verdicts.append(Verdict(12, claim, "-", None))

    claim = "GRPO's final greedy accuracy on 1,000 problems lies inside the 500-problem row's t interval."
    if have("grpo") and "grpo" in long:
        before, now = mean_gap(list(per_seed(long["grpo"], final).values())), mean_gap(list(acc("grpo").values()))
        held = before.t is not None and before.t.low <= now.estimate <= before.t.high
        measured = f"1,000 problems {now.text('.3f')}; 500 problems {before.text('.3f')}."
        verdicts.append(Verdict(13, claim, measured, held))
    else:
        verdicts.append(Verdict(13, claim, "-", None))
    return verdicts


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long", required=True, help="the sweep at horizon H (its --out directory)")
    parser.add_argument("--short", required=True, help="the sweep at horizon 2 (its --out directory)")
    parser.add_argument("--stress", help="the sweep of the stress rows and GRPO on 1,000 problems (predictions 8-13)")
    parser.add_argument("--markdown", help="also write the report here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    long, short = load_sweep(args.long), load_sweep(args.short)
    verdicts = predictions(long, short)
    text = f"Horizon H ({args.long}):\n\n{sweep_table(long)}\nHorizon 2 ({args.short}):\n\n{sweep_table(short)}\n"
    if args.stress:
        stress = load_sweep(args.stress)
        verdicts += stress_predictions(stress, long)
        text += f"Stress knobs, 1,000 problems ({args.stress}):\n\n{sweep_table(stress)}\n"
    text += "Predictions:\n\n" + "\n".join(v.line() for v in verdicts) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
