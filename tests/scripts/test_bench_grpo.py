"""scripts/bench_grpo.py's mathrl_jax half (`--skip-trl`: the tests never need trl) on a tiny batch: it runs both
variants (rows with no non-zero advantage left out, and every row trained), and each iteration's split (generate
incl. grading, log-probs, update, weight sync) fits in the iteration's time."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_bench(flags: str, out, timeout: int):
    """`scripts/bench_grpo.py FLAGS --json=OUT` on the CPU; (its result, its stdout)."""
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_grpo.py"), *flags.split(), f"--json={out}"],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def test_bench_grpo_skip_trl_reports_a_split_that_fits_each_iteration(tmp_path):
    flags = "--skip-trl --iterations 2 --warmup 1 --prompts 4 --samples 2 --max-new-tokens 4 --minibatches 2"
    result, stdout = run_bench(flags + " --warmstart-steps=2", tmp_path / "bench.json", timeout=600)
    mathrl = result["mathrl_jax"]
    assert "trl" not in result and len(mathrl["iterations"]) == 3
    for it in mathrl["iterations"]:
        parts = [it[k] for k in ("generate_time", "logprob_time", "update_time", "sync_time")]
        assert all(t > 0 for t in parts) and 0 < it["grade_time"] <= it["generate_time"]
        assert sum(parts) <= it["step_time"] * 1.001
    assert mathrl["first_iteration"] == mathrl["iterations"][0]["step_time"]
    # The second run trains every row; the default leaves out the rows with no non-zero advantage.
    assert result["mathrl_jax_every_row"]["trained_token_fraction"] == 1.0
    assert 0.0 <= mathrl["trained_token_fraction"] <= 1.0
    assert "| mathrl_jax, every row trained |" in stdout
    assert "| mathrl_jax |" in stdout and "TRL" not in stdout.split("\n", 2)[2]


@pytest.mark.slow  # ~1 minute and ~11 GB: the 0.5B model's float32 weights, gradients and AdamW moments
def test_bench_grpo_at_the_qwen_0_5b_shape_reports_memory_and_compiles(tmp_path):
    """docs/real_shapes.md's command with a small batch: random weights at the real architecture and
    vocabulary, every row trained (they earn no reward), the peak memory and XLA compiles reported."""
    flags = "--shape qwen2.5-0.5b --skip-trl --prompts 2 --samples 2 --max-new-tokens 4 --minibatches 1"
    result, stdout = run_bench(flags + " --iterations=1 --warmup=1 --default-only", tmp_path / "bench.json", 900)
    mathrl = result["mathrl_jax"]
    assert result["setting"]["shape"] == "qwen2.5-0.5b" and mathrl["trained_token_fraction"] == 1.0
    # float32 weights of ~494M parameters are 2 GB; with gradients and AdamW's moments, 8 GB at least
    assert 8 < mathrl["peak_memory_gib"] < 24
    assert mathrl["compiles"] > 0 and mathrl["compile_seconds"] > 0
    assert "qwen2.5-0.5b shape" in stdout
    # The limits table (benchmarks/limits.py): each stage a positive fraction of the limit measured in the run.
    limits = result["limits"]
    assert limits["rows"] == 4 and limits["counts"]["layers"] == 24
    for name in ("update", "generation", "logprob"):
        stage = limits["stages"][name]
        assert stage["fraction"] > 0 and f"| {name.replace('logprob', 'log-prob pass')} |" in stdout
