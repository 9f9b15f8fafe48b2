"""scripts/train.py meeting damaged checkpoints and a failing disk (issue 45): a checkpoint step whose checksums are
missing is never restored silently, and a full disk or a read-only run dir ends with exit 2 and one line naming
the path (and the step), the intact steps kept.

The disk faults are real ones, not mocks: a tmpfs of its own (full once a filler file takes its room) or a
read-only bind mount, in a user and mount namespace (`unshare --user --map-root-user --mount`), which needs no
privileges where the kernel allows unprivileged user namespaces; elsewhere those tests skip, saying why. (As root
a chmod 0o555 directory stays writable, so permissions cannot stand in for a read-only file system.)
"""

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.scripts.test_train_cli import ROOT, SHORT_RUN, run_train
from tests.train.checkpoint.test_checkpoint_integrity import flip_a_byte, remove_checksums

FLAGS = [
    *SHORT_RUN,
    "--config.max_new_tokens=4",
    "--config.save_interval=1",
    "--config.progress=False",
    "--config.export_final=False",
]
"""Two iterations in seconds, a checkpoint at each (max_to_keep 2, the default)."""


def steps_in(run_dir):
    return sorted(int(name) for name in os.listdir(os.path.join(run_dir, "checkpoints")) if name.isdigit())


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished run of 2 iterations with checkpoints 1 and 2 and no final_model; tests copy it."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert steps_in(run_dir) == [1, 2]
    return run_dir


def copy_of(trained_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    return run_dir


def error_line(done):
    """The last line of stderr, after checking that the run said nothing else worth a traceback."""
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


# ---- checkpoints fail closed ----


def test_a_damaged_step_whose_checksums_were_deleted_is_refused_and_the_intact_step_kept(trained_run, tmp_path):
    """Issue 45's case: a flipped byte in the state and the checksums deleted. Before: exit 0, no message, the
    damaged step trained on, and rotation deleted the intact step before it."""
    run_dir = copy_of(trained_run, tmp_path)
    checkpoints = str(run_dir / "checkpoints")
    flip_a_byte(checkpoints, 2)
    remove_checksums(checkpoints, 2)
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checkpoint step 2 in" in done.stderr and "its checksums are missing" in done.stderr
    assert "restored step 1, the newest intact step" in done.stderr
    # 2 saved anew, 3 the newest; 1, verified at the resume, kept beyond max_to_keep=2
    assert steps_in(run_dir) == [1, 2, 3]


def test_a_step_saved_before_checksums_is_restored_only_when_allowed(trained_run, tmp_path):
    """Before: restored unverified, with an info log nobody sees."""
    run_dir = copy_of(trained_run, tmp_path)
    for step in (1, 2):  # as a version before checksums left them
        remove_checksums(str(run_dir / "checkpoints"), step, from_metadata=True)
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=3")
    assert done.returncode == 2, done.stderr[-3000:]
    line = error_line(done)
    assert line.startswith("train.py: error: checkpoint ") and f"{run_dir}/checkpoints/2 (step 2)" in line
    assert "--config.resume_allow_unverified=True" in line
    assert steps_in(run_dir) == [1, 2]
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=3", "--config.resume_allow_unverified=True")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checkpoints/2 has no checksums (saved before they were kept); restored unverified" in done.stderr
    assert steps_in(run_dir)[-1] == 3


# ---- faults of the disk, in one line ----


def _namespaces_work():
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d && mount --bind $d $d && mount -o remount,bind,ro $d"
    try:
        done = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", probe], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


needs_namespaces = pytest.mark.skipif(
    not _namespaces_work(),
    reason="no unprivileged user + mount namespace here (unshare --user --map-root-user --mount): a real full or "
    "read-only file system cannot be made without privileges",
)


def train_command(run_dir, *flags):
    """The shell words of scripts/train.py on `run_dir`, as `run_train` runs it."""
    script = os.path.join(ROOT, "scripts", "train.py")
    return shlex.join([sys.executable, script, f"--config.run_dir={run_dir}", *flags])


def in_namespace(script, tmp_path):
    """Runs the shell `script` in a user + mount namespace of its own (its mounts vanish with it)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "set -e\n" + script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def fill_leaving(directory, kib):
    """Shell: a filler file that leaves `kib` KiB free on the file system of `directory`."""
    code = (
        "import os, sys; d = sys.argv[1]; s = os.statvfs(d); free = s.f_bavail * s.f_frsize - int(sys.argv[2]) * 1024;"
        " f = open(os.path.join(d, 'filler'), 'wb'); [f.write(b'\\0' * (1 << 20)) for _ in range(free >> 20)];"
        " f.write(b'\\0' * (free & ((1 << 20) - 1))); f.close()"
    )
    return shlex.join([sys.executable, "-c", code, str(directory), str(kib)])


def kib_of(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) // 1024


def run_on_tmpfs(trained_run, tmp_path, leave_kib, flags, rerun_flags=None):
    """The trained run copied onto a 64 MiB tmpfs filled up to `leave_kib` KiB, then train.py with `flags`: its
    exit status, output and run dir (copied back, the filler left out) under tmp_path; with `rerun_flags`, the
    filler removed and train.py run again with them: its exit status and stderr too."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    run_dir.mkdir()
    out.mkdir()
    rerun = "" if rerun_flags is None else f"{train_command(run_dir, *rerun_flags)} 2>{out}/rerun_stderr\n"
    in_namespace(
        f"""
mount -t tmpfs -o size=64m tmpfs {run_dir}
cp -a {trained_run}/. {run_dir}/
{fill_leaving(run_dir, leave_kib)}
set +e
{train_command(run_dir, *flags)} >{out}/stdout 2>{out}/stderr
echo $? >{out}/rc
set -e
rm {run_dir}/filler
cp -a {run_dir}/. {out}/run/
{rerun}""",
        tmp_path,
    )
    stdout, stderr = (out / "stdout").read_text(), (out / "stderr").read_text()
    rerun_stderr = (out / "rerun_stderr").read_text() if rerun_flags is not None else None
    return int((out / "rc").read_text()), stdout, stderr, out / "run", run_dir, rerun_stderr


@needs_namespaces
@pytest.mark.parametrize("iterations, met_at", [(4, "the next save"), (3, "the end of the run")])
def test_a_full_disk_during_a_checkpoint_save_is_one_line_naming_the_step_that_failed(
    trained_run, tmp_path, iterations, met_at
):
    """Step 3's save fails in Orbax's background threads; the failure is met at the next save (step 4) or, for the
    last save, when the run closes its checkpoints. Before: exit 2 after about a thousand lines with over a hundred
    tracebacks from Orbax's threads, naming step 4; at the end of a run, the lock file left behind."""
    step_kib = kib_of(trained_run / "checkpoints" / "2")
    rerun = [*FLAGS, "--config.num_iterations=3"] if iterations == 4 else None  # with room again (must exit 0)
    rc, stdout, stderr, saved, run_dir, rerun_stderr = run_on_tmpfs(
        trained_run, tmp_path, step_kib // 2, [*FLAGS, f"--config.num_iterations={iterations}"], rerun_flags=rerun
    )
    lines = (stdout + stderr).strip().splitlines()
    assert rc == 2 and len(lines) <= 3 and "Traceback" not in stderr, stdout + stderr[-5000:]
    assert lines[-1].startswith(f"train.py: error: cannot save checkpoint step 3 to {run_dir}/checkpoints/3: ")
    assert "No space left on device" in lines[-1] and "the steps 1, 2 there are kept" in lines[-1]
    assert steps_in(saved) == [1, 2] and not (saved / ".lock").exists()
    if rerun_stderr is not None:  # the kept steps are intact: the rerun resumes from step 2 (no step refused)
        assert "failed verification" not in rerun_stderr, rerun_stderr[-3000:]


@needs_namespaces
def test_a_full_disk_during_the_final_export_is_one_line_naming_the_path(trained_run, tmp_path):
    """The finished run rerun with its export: room for the checkpoints, not for the model. Before: exit 1 and a
    traceback ending `OSError: [Errno 28] No space left on device`, naming no path."""
    model_kib = kib_of(trained_run / "initial_model")
    rc, stdout, stderr, saved, run_dir, _ = run_on_tmpfs(
        trained_run, tmp_path, model_kib // 2, [*FLAGS, "--config.num_iterations=2", "--config.export_final=True"]
    )
    lines = (stdout + stderr).strip().splitlines()
    assert rc == 2 and len(lines) <= 3 and "Traceback" not in stderr, stdout + stderr[-5000:]
    assert lines[-1].startswith(f"train.py: error: cannot write the final model to {run_dir}/final_model: ")
    assert "No space left on device" in lines[-1]
    assert steps_in(saved) == [1, 2] and not [name for name in os.listdir(saved) if "final_model" in name]


@needs_namespaces
@pytest.mark.parametrize("where", ["run dir", "its parent"])
def test_a_read_only_run_dir_is_one_line_naming_it(trained_run, tmp_path, where):
    """A run dir (a finished run's, resumed) or the parent of a new one on a read-only mount. Before: exit 1, a
    traceback at the lock file."""
    parent = tmp_path / "parent"
    parent.mkdir()
    run_dir = parent / "run"
    if where == "run dir":
        shutil.copytree(trained_run, run_dir)
    mounted = run_dir if where == "run dir" else parent
    out = tmp_path / "out"
    out.mkdir()
    in_namespace(
        f"""
mount --bind {mounted} {mounted}
mount -o remount,bind,ro {mounted}
set +e
{train_command(run_dir, *FLAGS, "--config.num_iterations=3")} >{out}/stdout 2>{out}/stderr
echo $? >{out}/rc
""",
        tmp_path,
    )
    stdout, stderr = (out / "stdout").read_text(), (out / "stderr").read_text()
    lines = (stdout + stderr).strip().splitlines()
    assert int((out / "rc").read_text()) == 2 and len(lines) <= 3, stdout + stderr[-5000:]
    assert "Traceback" not in stderr
    assert lines[-1].startswith(f"train.py: error: cannot write the run dir {run_dir}: Read-only file system")
