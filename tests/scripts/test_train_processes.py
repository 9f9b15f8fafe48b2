"""scripts/train.py and the processes its reward functions start: none outlives the run (issue 60, point 6)."""

import os
import re
import select
import signal
import subprocess
import sys
import time

from tests.rewards.test_reward_functions import DAEMONS, sleeps
from tests.scripts.test_train_cli import ROOT, SHORT_RUN


def test_a_daemon_a_reward_function_starts_ends_with_the_run_and_the_pipe_closes(tmp_path):
    """Before: `train.py | cat` waited after the trainer had exited, until the `sleep` a reward function had started
    in a session of its own (holding the trainer's stdout) ended. Now EOF comes with the trainer's exit, no such
    process is left, and one line says how many were killed."""
    mark = f"{61 + os.getpid() % 1000 / 1000:.3f}"  # this test's sleeps, told apart from any other
    module = tmp_path / "daemons.py"
    module.write_text(DAEMONS)
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        MATHRL_TEST_DAEMON_MARK=mark,
    )
    flags = [
        f"--config.run_dir={tmp_path / 'run'}",
        "--config.reward_source=functions",
        f"--config.reward.functions={module}:starts_daemons",
        *SHORT_RUN,
        "--config.max_new_tokens=4",
        "--config.num_iterations=1",
        "--config.progress=False",
    ]
    trainer = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"), *flags],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # `train.py 2>&1 | cat`: the daemons inherit the pipe
    )
    output, exited, start = b"", None, time.monotonic()
    try:
        while True:
            ready, _, _ = select.select([trainer.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(trainer.stdout.fileno(), 1 << 16)
                if not chunk:
                    break  # EOF: no process holds the pipe any more
                output += chunk
            if exited is None and trainer.poll() is not None:
                exited = time.monotonic()
            assert exited is None or time.monotonic() - exited < 10, (
                f"the pipe stayed open 10 s after the trainer exited; output: {output[-3000:]!r}"
            )
            assert time.monotonic() - start < 300, output[-3000:]
        lag = time.monotonic() - exited if exited is not None else 0.0
        assert trainer.wait(10) == 0, output.decode(errors="replace")[-3000:]
        text = output.decode(errors="replace")
        assert lag < 5, (lag, text[-3000:])
        assert sleeps(mark) == []
        assert re.search(r"killed [1-9]\d* process(es)? left by reward functions", text), text[-3000:]
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        trainer.stdout.close()
        for pid in sleeps(mark):
            os.kill(pid, signal.SIGKILL)
