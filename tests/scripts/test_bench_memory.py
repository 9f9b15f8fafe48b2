"""scripts/bench_memory.py at the tiny shape (the command its docstring shows): the three variants compile, the
layer scan and the factored optimizer state each need less memory than the baseline, and the real step trains."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_memory_compares_the_variants_and_runs_the_leanest_step():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_memory.py"), "--shape", "tiny"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    row = r"^\| (\w+) \| (scanned|unrolled) \| [\d.]+ \| [\d.]+x \| [\d.]+ \| ([\d.]+)x \|"
    rows = re.findall(row, result.stdout, re.M)
    needs = {(name, layers): float(ratio) for name, layers, ratio in rows}
    assert set(needs) == {(o, layers) for o in ("adamw", "adafactor") for layers in ("scanned", "unrolled")}
    assert needs["adamw", "unrolled"] == 1.0
    # The factored state is smaller whatever the layers; so, at this shape, is the scan (its stacked weights are
    # small beside the activations it saves).
    assert needs["adafactor", "unrolled"] < 1.0 and needs["adafactor", "scanned"] < needs["adamw", "scanned"] < 1.0
    step = re.search(
        r"one real step, (\w+), layers (\w+), .*skipped (\d+), parameter leaves moved (\d+)%", result.stdout
    )
    assert step and step.groups() == ("adafactor", "scanned", "0", "100")


def test_bench_memory_refuses_an_unknown_shape():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_memory.py"), "--shape", "qwen9"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "--shape 'qwen9'" in result.stderr


@pytest.mark.slow  # 36 s; the remat policies' memory order is also tested in tests/train/setup/test_micro_batches.py
def test_a_remat_policy_that_keeps_more_needs_more_with_the_layers_scanned():
    """`--remat-policy` reaches the compiled update: with the layers scanned (where XLA:CPU keeps remat's saving),
    keeping every matmul's output needs more temporaries than keeping only each layer's input."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    temporaries = {}
    for policy in ("nothing_saveable", "dots_saveable"):
        result = subprocess.run(
            [sys.executable, os.path.join(ROOT, "scripts", "bench_memory.py"), "--shape", "tiny", "--no-run",
             "--optimizers", "adamw", "--remat-policy", policy, "--rows", "8", "--length", "256"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0 and f"remat ({policy})" in result.stdout, result.stderr[-2000:]
        row = re.search(r"^\| adamw \| scanned \|.* \| ([\d.]+) \|$", result.stdout, re.M)
        temporaries[policy] = float(row.group(1))
    assert temporaries["dots_saveable"] > temporaries["nothing_saveable"], temporaries
