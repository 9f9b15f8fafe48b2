"""scripts/bench_vllm.py on a small batch, every mode on the real engine: a row per mode, whose MB/s is the
weights' megabytes over its sync seconds and whose ratio is its sync over vLLM's own reload from disk."""

import os
import re
import subprocess
import sys

from tests.sampling.conftest import require_vllm

require_vllm()

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*flags):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_vllm.py"), *flags],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_every_mode_reports_its_sync_beside_vllms_reload_and_its_generation():
    done = run("--batch=4", "--new-tokens=8", "--syncs=2", "--repeats=1")
    assert done.returncode == 0, done.stderr[-3000:]
    megabytes = float(re.search(r"; ([\d.]+) MB of weights\)", done.stdout).group(1))
    assert megabytes == 3.3  # the tiny model's float32 tensors
    rows = {m.group(1): [float(x) for x in m.group(2).replace("x", "").split()]
            for m in re.finditer(r"^(in-process|tp2|server)\s+(.*)$", done.stdout, re.M)}  # fmt: skip
    assert sorted(rows) == ["in-process", "server", "tp2"]
    for start, sync, rate, reload, ratio, greedy, sampled in rows.values():
        assert start > 0 and sync > 0 and reload > 0 and greedy > 0 and sampled > 0
        # The printed figures are rounded (MB to 0.1, seconds to 1 ms): each ratio within what that rounding allows.
        assert (megabytes - 0.05) / (sync + 5e-4) - 0.5 <= rate <= (megabytes + 0.05) / (sync - 5e-4) + 0.5
        assert (sync - 5e-4) / (reload + 5e-4) - 0.005 <= ratio <= (sync + 5e-4) / (reload - 5e-4) + 0.005


def test_bad_flags_are_refused():
    done = run("--syncs=0")
    assert done.returncode == 2 and "--syncs=0" in done.stderr
