"""Two processes on localhost, joined by jax.distributed (CPU collectives), run one sharded
forward pass over a mesh spanning both; each agrees with the single-process result."""

import os
import socket
import subprocess
import sys

import jax.numpy as jnp
import numpy as np

from mathrl_jax.models import hf, write_tiny_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_agree_with_one(tmp_path):
    checkpoint = str(tmp_path / "tiny")
    write_tiny_checkpoint(checkpoint, num_hidden_layers=2)
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = ROOT
    workers = [
        subprocess.Popen(
            [sys.executable, WORKER, str(pid), port, checkpoint, str(tmp_path / f"logits{pid}.npy")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pid in (0, 1)
    ]
    outputs = []
    for worker in workers:
        try:
            out, _ = worker.communicate(timeout=240)
        finally:
            worker.kill()
        outputs.append(out)
        assert worker.returncode == 0, out
    assert "process 0: main=True ok" in outputs[0] and "process 1: main=False ok" in outputs[1]

    ids = np.random.RandomState(0).randint(0, 100, (4, 12)).astype(np.int32)
    expected, _ = hf.load_model(checkpoint)(jnp.asarray(ids))
    for pid in (0, 1):
        np.testing.assert_allclose(np.load(tmp_path / f"logits{pid}.npy"), np.asarray(expected), atol=2e-5)
