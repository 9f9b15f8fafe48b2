"""scripts/bench_kernels.py on a small shape: it checks attention parity with torch before timing, and prints
one row per kernel of the model (3 matmuls per projection, 2 attention passes) and the weighted totals."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "bench_kernels.py")


def run(*flags):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return subprocess.run(
        [sys.executable, SCRIPT, *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_bench_kernels_prints_every_kernel_of_the_model():
    result = run("--preset", "project-tiny", "--batch", "1", "--length", "16", "--repeats", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$", result.stdout, re.M)
    kernels = [row[0] for row in rows]
    projections = ["q_proj", "k_proj, v_proj", "o_proj", "gate_proj, up_proj", "down_proj", "lm_head"]
    expected = [f"{p}: {k}" for p in projections for k in ("x @ W", "dy @ W^T", "x^T @ dy")]
    assert kernels == expected + ["attention: forward", "attention: forward+backward"]
    counts = {row[0]: int(row[2]) for row in rows}
    assert counts["k_proj, v_proj: x @ W"] == 8 and counts["lm_head: x @ W"] == 1  # 4 layers of project-tiny
    for _, _, _, jax_ms, torch_ms, ratio in rows:  # the ratio is torch / JAX, up to the printed rounding
        jax_ms, torch_ms, ratio = float(jax_ms), float(torch_ms), float(ratio)
        if jax_ms > 0 and torch_ms > 0:
            rounding = (torch_ms / jax_ms) * (0.005 / jax_ms + 0.005 / torch_ms) + 0.005
            assert abs(ratio - torch_ms / jax_ms) <= rounding + 1e-9
    assert "- matmuls + attention: JAX" in result.stdout


def test_bench_kernels_rejects_a_bad_flag_value():
    result = run("--repeats", "0")
    assert result.returncode == 2 and "--repeats=0" in result.stderr and "Traceback" not in result.stderr
