"""scripts/bench_lora.py at the tiny shape (the command its docstring shows): the LoRA training state is a small
fraction of full fine-tuning's, both real steps train, and the JAX sampler decodes the same tokens with the
adapters applied as with the merged weights (in float32: in bfloat16 they part after near-ties of random weights)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_bench_lora_compares_full_and_lora_updates_and_both_samplings():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_lora.py"), "--shape", "tiny", "--sampler-dtype=float32"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = dict(re.findall(r"^\| (full|lora [^|]+) \| [\d.]+ \| [\d.]+ \| ([\d.]+)x \|", result.stdout, re.M))
    assert float(rows["full"]) == 1.0
    # rank 8 on q and v of a 128-wide model: adapters and their two moments, a few percent of the full state
    assert float(rows["lora r8 q_proj,v_proj"]) < 0.05, rows
    assert "the same tokens for 100% of the prompts" in result.stdout


def test_bench_lora_refuses_bad_arguments():
    script = os.path.join(ROOT, "scripts", "bench_lora.py")
    for args, named in ((["--shape", "qwen9"], "--shape 'qwen9'"), (["--rank", "0"], "--rank 0")):
        result = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and named in result.stderr, result.stderr
