"""scripts/testbed_report.py on hand-made sweeps whose verdicts are known: each prediction held, failed or not
run by its own words, the paired gap and its t interval computed apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "testbed_report.py")
SEEDS = range(5)


def load_report():
    from benchmarks import testbed_report

    return testbed_report


def seed_row(seed, end, *, start=0.15, control_gain=-0.03, midpoint=3.0, entropy=0.07, hard=0.0, pass_k=(0.4, 0.8)):
    run = {
        "rl_end": end, "rl_start": start, "rl_gain": end - start, "sampled_end": end - 0.2,
        "pass_at_k_start": pass_k[0], "pass_at_k_end": pass_k[1], "entropy_end": entropy, "hard_end": hard,
        "fit": {"ok": True, "asymptote": end, "midpoint": midpoint},
    }  # fmt: skip
    control = {"rl_gain": control_gain, "rl_end": start + control_gain}
    return {"seed": seed, "run": run, "control": control}


def write_sweep(directory, rows):
    directory.mkdir()
    record = {"rows": [{"name": name, "statistics": {}, "seeds": seeds} for name, seeds in rows.items()]}
    (directory / "statistics.json").write_text(json.dumps(record))
    return str(directory)


def noise(seed, scale=0.01):
    return float(np.random.default_rng(seed).normal(0, scale))


def sweeps(tmp_path, tppo_lead=0.15, dapo_entropy=0.09):
    long = {
        "grpo": [seed_row(s, 0.70 + noise(s)) for s in SEEDS],
        "tppo": [seed_row(s, 0.70 + tppo_lead + noise(s + 10)) for s in SEEDS],
        "ppo": [seed_row(s, 0.74 + noise(s + 20)) for s in SEEDS],
        "dapo": [seed_row(s, 0.72, entropy=dapo_entropy + noise(s, 0.002)) for s in SEEDS],
    }
    short = {
        "grpo": [seed_row(s, 0.95, start=0.6, midpoint=4.0) for s in SEEDS],
        "tppo": [seed_row(s, 0.95 + noise(s), start=0.6, midpoint=1.5) for s in SEEDS],
        "appo": [seed_row(s, 0.94, start=0.6, midpoint=1.8) for s in SEEDS],
    }
    return write_sweep(tmp_path / "d4", long), write_sweep(tmp_path / "d2", short)


def verdicts(text):
    return [line.split("**")[1] for line in text.splitlines() if line[:1].isdigit() and "**" in line]


def test_known_sweeps_give_known_verdicts_and_the_paired_interval(tmp_path):
    long, short = sweeps(tmp_path)
    result = subprocess.run([sys.executable, SCRIPT, "--long", long, "--short", short], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert verdicts(result.stdout) == ["held"] * 7, result.stdout
    gaps = [0.15 + noise(s + 10) - noise(s) for s in SEEDS]
    half = 2.776 * np.std(gaps, ddof=1) / np.sqrt(5)  # t_{0.975, 4} from a printed table
    line = next(line for line in result.stdout.splitlines() if line.startswith("1."))
    assert f"TPPO - GRPO {np.mean(gaps):+.3f} [t {np.mean(gaps) - half:+.3f}, {np.mean(gaps) + half:+.3f};" in line


def test_a_gap_short_of_its_size_fails_and_missing_rows_are_not_run(tmp_path):
    long, short = sweeps(tmp_path, tppo_lead=0.05, dapo_entropy=0.06)
    module = load_report()
    got = module.predictions(module.load_sweep(long), module.load_sweep(short))
    held = {v.number: v.held for v in got}
    assert held[1] is False and held[5] is False  # +5 points is not >= 10; DAPO's entropy below GRPO's
    assert held[2] is False  # TPPO - PPO = +1 point, not >= 5
    partial = module.predictions({"grpo": module.load_sweep(long)["grpo"]}, {})
    assert [v.held for v in partial][:3] == [None, None, None] and partial[4].held is None


def test_a_missing_sweep_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        [sys.executable, SCRIPT, "--long", str(tmp_path / "nope"), "--short", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "statistics.json" in result.stderr


def test_the_report_commands_the_docs_show_parse():
    """Every `testbed_report.py ...` command in docs/ and the README is accepted by the script's parser (its runs
    need the sweeps, hours: the tests above run it on hand-made ones)."""
    import glob
    import re
    import shlex

    module = load_report()
    shown = []
    for path in [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md"))]:
        with open(path, encoding="utf-8") as f:
            shown += re.findall(r"(?:^|`)python scripts/testbed_report\.py([^`\n]*)", f.read(), flags=re.M)
    assert shown, "docs/testbed.md shows the report's command"
    for arguments in shown:
        args = module.parse_args(shlex.split(arguments))
        assert args.long and args.short


def stress_sweep(tmp_path, naive_drop=0.20, noise_clip=0.006):
    """The stress rows: async_ppo at 8 ties GRPO (slower), naive PPO `naive_drop` below, TIS ties, noise ties; each
    run's metrics.jsonl holds its clip fractions (GRPO's 0.002 an iteration, the noisy run's `noise_clip`)."""

    def row(name, end, midpoint=3.0, clip=0.002):
        seeds = []
        for s in SEEDS:
            seed = seed_row(s, end + noise(s + 10 * len(name)), midpoint=midpoint + noise(s, 0.3))
            run_dir = tmp_path / "stress_runs" / name / f"seed{s}"
            run_dir.mkdir(parents=True)
            lines = [json.dumps({"step": k, "train/clip_fraction": clip * (1 + 0.1 * k)}) for k in range(3)]
            lines.append(json.dumps({"step": 2, "train/clip_fraction": clip * 1.1}))  # a resumed run's repeat
            (run_dir / "metrics.jsonl").write_text("\n".join(['{"eval/accuracy": 0.5}', *lines]) + "\n")
            seed["run"]["run_dir"] = str(run_dir)
            seeds.append(seed)
        return seeds

    rows = {
        "grpo": row("grpo", 0.70),
        "async_ppo_staleness8": row("async_ppo_staleness8", 0.69, midpoint=8.0),
        "stale8_naive": row("stale8_naive", 0.69 - naive_drop),
        "stale8_tis": row("stale8_tis", 0.68),
        "noise07_naive": row("noise07_naive", 0.70, clip=noise_clip),
    }
    return write_sweep(tmp_path / "stress", rows)


def test_the_stress_predictions_by_their_own_words(tmp_path):
    long, short = sweeps(tmp_path)
    stress = stress_sweep(tmp_path)
    result = subprocess.run(
        [sys.executable, SCRIPT, "--long", long, "--short", short, "--stress", stress], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert verdicts(result.stdout) == ["held"] * 13, result.stdout
    # 0.006 and 0.002 times (1 + 1.1 + 1.1) / 3: the repeated step 2 counts once, with its later value
    assert "mean clip fraction 0.0064 with noise, 0.0021 without, over 5 seeds" in result.stdout
    # GRPO on 1,000 problems (0.70) is outside a 500-problem row at 0.60 +- 0.01: 13 fails;
    # naive PPO 5 points below is short of 10; noise at GRPO's clip fraction is not twice it.
    module = load_report()
    long_sweep = module.load_sweep(long)
    long_sweep["grpo"] = [seed_row(s, 0.60 + noise(s)) for s in SEEDS]
    got = module.stress_predictions(module.load_sweep(stress_sweep(tmp_path / "b", 0.05, 0.002)), long_sweep)
    assert {v.number: v.held for v in got} == {8: True, 9: False, 10: True, 11: True, 12: False, 13: False}
    assert all(v.held is None for v in module.stress_predictions({"grpo": long_sweep["grpo"]}, {}))
    disjoint = module.load_sweep(stress)
    disjoint["stale8_naive"] = [dict(r, seed=r["seed"] + 100) for r in disjoint["stale8_naive"]]
    assert module.stress_predictions(disjoint, long_sweep)[1].held is None  # no seed in common: not measured
