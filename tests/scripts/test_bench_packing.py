"""scripts/bench_packing.py and scripts/bench_grader.py on small shapes: they run, and what they print is
consistent with the batch they measured (the padding ratio recomputed here, the speed-up columns)."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(script, *flags):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", script), *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bench_packing_prints_the_padding_ratio_of_its_batch_and_both_passes():
    flags = dict(rows=8, prompt=8, median=12, longest=40, hidden=32, layers=1, vocab=256, repeats=1, seed=3)
    result = run("bench_packing.py", *[f"--{k.replace('_', '-')}={v}" for k, v in flags.items()])
    assert result.returncode == 0, result.stderr[-2000:]
    from benchmarks import packing as bench

    batch, real = bench.lengths_batch(8, 8, 12, 40, 256, 3)
    assert (batch["response_mask"].sum(axis=1) == 40).any()  # the long tail's row is there
    ratio = float(re.search(r"padding ratio ([\d.]+)", result.stdout).group(1))
    assert abs(ratio - batch["input_ids"].size / real) < 0.006
    rows = re.findall(
        r"^\| (update|log-probs) \| ([\d.e-]+) .*?\| ([\d.e-]+) .*?\| ([\d.]+)x \| ([\d.]+) \|", result.stdout, re.M
    )
    assert [r[0] for r in rows] == ["update", "log-probs"]
    for _, padded, packed, speedup, over_ratio in rows:
        assert float(padded) > 0 and float(packed) > 0
        assert abs(float(over_ratio) - float(speedup) / ratio) < 0.01 + 0.01 * float(speedup)


def test_bench_grader_grades_its_batch():
    result = run("bench_grader.py", "--n", "16", "--repeats", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    accuracy = float(re.search(r"batch of 16: accuracy ([\d.]+), no answer ([\d.]+)", result.stdout).group(1))
    assert 0.0 < accuracy < 1.0  # the teacher's slips are graded wrong, its right answers right
    assert re.search(r"MathGrader.rewards: median [\d.]+ ms", result.stdout)
