"""`report_to="tensorboard,wandb"`: a training run logs to an offline wandb run exactly what it logs to tensorboard
and to metrics.jsonl, every metric at every step, read back with readers independent of the writers (TensorBoard's
own `EventAccumulator`; the wandb run file read here, record by record)."""

import glob
import json
import math
import os
import re
import struct
import subprocess
import sys

import pytest

pytest.importorskip("wandb", reason="wandb: pip install -e '.[dev]'")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
from wandb.proto import wandb_internal_pb2  # noqa: E402  (the record schema; the file is read below)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BLOCK, HEADER = 32768, 7  # the wandb run file: LevelDB's log format, 32 KiB blocks of 7-byte-headed chunks


def wandb_history(path):
    """{step: {name: value}} of the history records in a `.wandb` run file."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    history, pending, offset = {}, b"", HEADER  # the file's own 7-byte header comes first
    while offset + HEADER <= len(data):
        left = BLOCK - offset % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is padding
            offset += left
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
        if kind == 0:  # zero padding to the end of the block
            offset += left
            continue
        pending += data[offset + HEADER : offset + HEADER + length]
        offset += HEADER + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                history[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return history


def tensorboard_scalars(logdir):
    view = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.SCALARS: 0})
    view.Reload()
    found = {}
    for tag in view.Tags()["scalars"]:
        for event in view.Scalars(tag):
            found.setdefault(event.step, {})[tag] = event.value
    return found


def tensorboard_tag(name):
    """The tag TensorBoard shows for a metric name: tensorboardX replaces characters TensorFlow's tags may not
    hold (`eval/pass@8` shows as `eval/pass_8`)."""
    return re.sub(r"[^-/\w\.]", "_", name)


def close(a, b):
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
        return (a is None or math.isnan(a)) and (b is None or math.isnan(float(b)))
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-7)


def test_a_run_logs_the_same_metrics_to_wandb_tensorboard_and_jsonl(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    env.pop("WANDB_MODE", None)  # offline comes from the config's default
    flags = [
        f"--config.run_dir={run_dir}",
        "--config.report_to=tensorboard,wandb",
        "--config.warmstart.steps=0",
        "--config.n_rollout_threads=4",
        "--config.group_size=2",
        "--config.num_mini_batch=1",
        "--config.eval_interval=2",
        "--config.arithmetic.num_train=16",
        "--config.arithmetic.num_eval=4",
        "--config.num_eval_problems=4",
        "--config.max_new_tokens=4",
        "--config.num_iterations=3",
    ]
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"), *flags],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(runs) == 1, runs  # offline: kept in the run directory
    from_wandb = wandb_history(runs[0])
    from_tensorboard = tensorboard_scalars(run_dir)
    from_jsonl = {}
    for line in open(run_dir / "metrics.jsonl"):
        record = json.loads(line)
        from_jsonl.setdefault(record.pop("step"), {}).update({k: v for k, v in record.items() if k != "time"})
    assert sorted(from_wandb) == sorted(from_tensorboard) == sorted(from_jsonl) and len(from_jsonl) >= 3
    for step, values in from_jsonl.items():
        assert set(from_wandb[step]) == set(values), step
        assert {tensorboard_tag(name) for name in values} == set(from_tensorboard[step]), step
        for name, value in values.items():
            assert close(value, from_wandb[step][name]), (step, name, value, from_wandb[step][name])
            shown = from_tensorboard[step][tensorboard_tag(name)]
            assert close(value, shown), (step, name, value, shown)


def test_wandb_without_the_package_or_with_an_unknown_sink_is_refused(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"), f"--config.run_dir={tmp_path / 'r'}",
         "--config.report_to=tensorboard,comet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "report_to='tensorboard,comet'" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "r").exists()


def test_a_fresh_start_gets_its_own_wandb_run_and_a_resume_continues_it(tmp_path, monkeypatch):
    """The same run directory started over is another wandb run (wandb would drop its steps below the old run's
    last); resumed, the same one."""
    from mathrl_jax.train.reporting._metrics import MetricsLogger

    monkeypatch.chdir(tmp_path)
    ids = []
    for resumed_from in (None, None, 3):
        settings = dict(tensorboard=False, wandb=dict(project="t"), resumed_from=resumed_from)
        with MetricsLogger(str(tmp_path / "run"), **settings):
            pass
        ids.append((tmp_path / "run" / "wandb" / "run_id").read_text())
    assert ids[0] != ids[1] and ids[1] == ids[2]
