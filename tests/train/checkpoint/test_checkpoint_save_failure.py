"""A checkpoint save that fails in Orbax's background threads is one `CheckpointError` naming its own step, not the
next one's, and what Orbax's threads log about it is not printed; the steps saved before it are kept.

The failure is a real one, unprivileged: a child process whose file size limit (`RLIMIT_FSIZE`, SIGXFSZ ignored) is
under the size of a step's data file, so the kernel refuses the write with EFBIG, as a full disk refuses it with
ENOSPC (tests/scripts/test_train_faults.py fills a real tmpfs where user namespaces allow one).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CHILD = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
from mathrl_jax.train.checkpoint._checkpointer import Checkpointer
from mathrl_jax.train.checkpoint._errors import CheckpointError
from tests.train.checkpoint.test_checkpoint_integrity import make_state

directory, met_at = sys.argv[1], sys.argv[2]
checkpointer = Checkpointer(directory, save_interval=2, max_to_keep=1)
checkpointer.save(2, make_state(2), {"iteration": 2})
checkpointer.wait_until_finished()
resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.RLIM_INFINITY))  # under the 8 KiB of params/w
checkpointer.save(4, make_state(4), {"iteration": 4})  # returns at once: written in the background
try:
    if met_at == "next save":
        checkpointer.save(6, make_state(6), {"iteration": 6})
    checkpointer.close()
except CheckpointError as error:
    print("error:", error, flush=True)
    checkpointer.close()  # the failure was reported: not raised again
print("steps:", checkpointer.all_steps(), flush=True)
"""


@pytest.mark.parametrize("met_at", ["next save", "close"])
def test_a_failed_background_save_is_one_error_naming_its_own_step(tmp_path, met_at):
    """Before: the next save raised 'cannot save step 6' for step 4's failure, after dozens of tracebacks that
    Orbax's threads logged."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), met_at],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.strip() == "" and len(done.stdout.strip().splitlines()) == 2, done.stdout + done.stderr[-3000:]
    error = done.stdout.splitlines()[0]
    assert error.startswith(f"error: cannot save checkpoint step 4 to {tmp_path}/4: File too large (errno 27); ")
    assert "the steps 2 there are kept" in error
    assert done.stdout.splitlines()[1] == "steps: [2]"
    assert sorted(name for name in os.listdir(tmp_path) if name.isdigit()) == ["2"]
