"""MetricsLogger (tensorboard events read back record by record, the JSONL log, a resumed run's records),
Progress, pass@k against brute force, scripts/plot_metrics.py end to end, and METRIC_NAMES against what short
real training runs log."""

import importlib.util
import io
import itertools
import json
import math
import os
import struct
import subprocess
import sys
import time
import zlib
from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tensorboardX.proto import event_pb2

from mathrl_jax.evaluation import pass_at_k
from mathrl_jax.train.reporting import METRIC_NAMES, RESERVED_KEYS, MetricsLogger, Progress, read_jsonl_metrics
from mathrl_jax.train.reporting._names import documented_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PLOT_SCRIPT = os.path.join(ROOT, "scripts", "plot_metrics.py")


# --------------------------------------------------------------------------------------------
# A reader of tensorboard event files, independent of the writer: TFRecord framing
# (u64 length, masked CRC-32C of it, data, masked CRC-32C of the data) and the Event proto.
# --------------------------------------------------------------------------------------------


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def iter_events(logdir):
    """Every Event of the event files of `logdir`, file by file in name order, CRCs checked."""
    files = sorted(f for f in os.listdir(logdir) if f.startswith("events.out.tfevents"))
    assert files, os.listdir(logdir)
    for name in files:
        with open(os.path.join(logdir, name), "rb") as f:
            blob = f.read()
        offset = 0
        while offset < len(blob):
            header = blob[offset : offset + 8]
            (length,) = struct.unpack("<Q", header)
            (header_crc,) = struct.unpack("<I", blob[offset + 8 : offset + 12])
            assert header_crc == masked(crc32c(header))
            data = blob[offset + 12 : offset + 12 + length]
            (data_crc,) = struct.unpack("<I", blob[offset + 12 + length : offset + 16 + length])
            assert data_crc == masked(crc32c(data))
            offset += 16 + length
            yield event_pb2.Event.FromString(data)


def read_events(logdir):
    """[(tag, step, value)] of every scalar in the event files of `logdir`, CRCs checked."""
    return [
        (value.tag, event.step, value.simple_value) for event in iter_events(logdir) for value in event.summary.value
    ]


def test_crc32c_matches_the_standard_check_value():
    assert crc32c(b"123456789") == 0xE3069283  # RFC 3720 / the CRC catalogue's check value
    assert crc32c(b"") == 0 and zlib.crc32(b"123456789") != crc32c(b"123456789")  # not plain CRC-32


# --------------------------------------------------------------------------------------------
# MetricsLogger
# --------------------------------------------------------------------------------------------

LOGGED = [
    (1, {"rollout/accuracy": 0.25, "train/policy_loss": np.float32(-0.125), "perf/tokens_per_second": 1234}),
    (2, {"rollout/accuracy": jnp.float32(0.5), "train/policy_loss": jnp.asarray([0.1]), "train/kl": np.nan}),
    (3, {"rollout/accuracy": jnp.bfloat16(0.75), "train/grad_norm": np.inf, "train/kl": -np.inf, "flag": True}),
]


def test_logger_writes_tensorboard_scalars_and_jsonl(tmp_path):
    with MetricsLogger(str(tmp_path)) as logger:
        for step, metrics in LOGGED:
            logger.log(step, metrics)

    # JSONL: strict JSON (no NaN/Infinity tokens), one object per call, exact values.
    with open(tmp_path / "metrics.jsonl") as f:
        lines = f.read().splitlines()
    assert len(lines) == len(LOGGED)

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    records = [json.loads(line, parse_constant=refuse) for line in lines]
    assert records == read_jsonl_metrics(str(tmp_path)) == read_jsonl_metrics(str(tmp_path / "metrics.jsonl"))
    for record, (step, metrics) in zip(records, LOGGED):
        assert record["step"] == step and isinstance(record["time"], float)
        assert set(record) == {"step", "time", *metrics}
        for name, value in metrics.items():
            expected = float(np.asarray(value, np.float64).reshape(()))
            if math.isfinite(expected):
                assert record[name] == expected, name
            else:
                assert record[name] is None, name
    assert isinstance(records[0]["perf/tokens_per_second"], int) and records[2]["flag"] == 1

    # tensorboard: every value as float32, non-finite values kept.
    got = {(tag, step): value for tag, step, value in read_events(str(tmp_path))}
    want = {
        (name, step): np.float32(np.asarray(v, np.float64).reshape(())) for step, m in LOGGED for name, v in m.items()
    }
    assert set(got) == set(want)
    for key, value in want.items():
        assert np.float32(got[key]).tobytes() == value.tobytes() or (np.isnan(value) and np.isnan(got[key])), key


def test_a_resumed_run_appends_and_other_processes_write_nothing(tmp_path):
    with MetricsLogger(str(tmp_path), tensorboard=False) as logger:
        logger.log(1, {"train/loss": 1.0})
        logger.log(2, {"train/loss": 0.5})
    with MetricsLogger(str(tmp_path), tensorboard=False) as logger:  # resumed from step 1
        logger.log(2, {"train/loss": 0.25})
    assert [(r["step"], r["train/loss"]) for r in read_jsonl_metrics(str(tmp_path))] == [(1, 1.0), (2, 0.5), (2, 0.25)]
    assert not [f for f in os.listdir(tmp_path) if f.startswith("events")]

    other = tmp_path / "worker"
    with MetricsLogger(str(other), main_process=False) as logger:
        logger.log(1, {"train/loss": 1.0})
    assert not other.exists()


def test_a_logger_resumed_from_a_step_drops_the_records_after_it(tmp_path):
    with MetricsLogger(str(tmp_path)) as logger:  # the interrupted run: steps 1..5, its last checkpoint at 3
        for step in range(1, 6):
            logger.log(step, {"train/loss": float(step), "rollout/accuracy": step / 10})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "train/lo')  # and killed while writing step 6

    with MetricsLogger(str(tmp_path), resumed_from=3) as logger:
        # Rewritten before the first log: a crash now leaves a clean run of steps 1..3.
        assert [r["step"] for r in read_jsonl_metrics(str(tmp_path))] == [1, 2, 3]
        for step in range(4, 7):
            logger.log(step, {"train/loss": 10.0 * step, "rollout/accuracy": 0.5})

    records = read_jsonl_metrics(str(tmp_path))
    assert [(r["step"], r["train/loss"]) for r in records] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
        (5, 50.0),
        (6, 60.0),
    ]
    assert [f for f in os.listdir(tmp_path) if not f.startswith("events.out.tfevents")] == ["metrics.jsonl"]
    # tensorboard: the old event file is not rewritten; the new one starts with a purge marker at step 4, which
    # makes TensorBoard hide the old file's scalars of steps >= 4.
    starts = [e.step for e in iter_events(str(tmp_path)) if e.session_log.status == event_pb2.SessionLog.START]
    assert starts == [4]

    # Resumed from the last step logged, or a later one: nothing to drop, and the file is not rewritten.
    mtime = os.stat(tmp_path / "metrics.jsonl").st_mtime_ns
    MetricsLogger(str(tmp_path), tensorboard=False, resumed_from=6).close()
    MetricsLogger(str(tmp_path), tensorboard=False, resumed_from=9).close()
    assert os.stat(tmp_path / "metrics.jsonl").st_mtime_ns == mtime
    assert read_jsonl_metrics(str(tmp_path)) == records
    # A run that starts over (resumed from 0) keeps the step-0 records; another process changes nothing.
    with MetricsLogger(str(tmp_path), tensorboard=False) as logger:
        logger.log(0, {"eval/accuracy": 0.1})
    MetricsLogger(str(tmp_path), tensorboard=False, resumed_from=0, main_process=False).close()
    assert [r["step"] for r in read_jsonl_metrics(str(tmp_path))] == [1, 2, 3, 4, 5, 6, 0]
    MetricsLogger(str(tmp_path), tensorboard=False, resumed_from=0).close()
    assert [(r["step"], r["eval/accuracy"]) for r in read_jsonl_metrics(str(tmp_path))] == [(0, 0.1)]
    with pytest.raises(ValueError, match="resumed_from=-1"):
        MetricsLogger(str(tmp_path), resumed_from=-1)


@pytest.mark.parametrize(
    "step, metrics, error, words",
    [
        (1, {"train/kl": np.ones(3)}, ValueError, "'train/kl' has shape (3,)"),
        (1, {"train/kl": "high"}, TypeError, "'train/kl' is a str"),
        (1, {"train/kl": None}, TypeError, "'train/kl' is a NoneType"),
        (1, {"train/kl": 1 + 2j}, TypeError, "'train/kl' is a complex"),
        (1, {"step": 3.0}, ValueError, "'step' is reserved"),
        (1, {"": 3.0}, ValueError, "metric name ''"),
        (-1, {"train/kl": 1.0}, ValueError, "step=-1"),
        (1.5, {"train/kl": 1.0}, ValueError, "step=1.5"),
    ],
)
def test_bad_metrics_are_named(tmp_path, step, metrics, error, words):
    with MetricsLogger(str(tmp_path)) as logger:
        with pytest.raises(error) as raised:
            logger.log(step, metrics)
        logger.log(0, {"ok": 1.0})
    assert words in str(raised.value)
    assert [r["step"] for r in read_jsonl_metrics(str(tmp_path))] == [0]  # nothing half-written


def test_read_jsonl_skips_a_cut_last_line_and_names_a_corrupt_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a"')
    with pytest.warns(UserWarning, match="incomplete last line"):
        assert [r["step"] for r in read_jsonl_metrics(str(tmp_path))] == [1, 2]
    path.write_text('{"step": 1}\n{"step": oops}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not a JSON object"):
        read_jsonl_metrics(str(path))
    path.write_text('{"a": 1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1 is not a metrics record"):
        read_jsonl_metrics(str(path))
    with pytest.raises(FileNotFoundError, match=f"no metrics file at '{tmp_path / 'nowhere'}/metrics.jsonl'"):
        read_jsonl_metrics(str(tmp_path / "nowhere"))


def test_metric_names_cover_the_reference_names():
    required = [
        "rollout/rewards",
        "rollout/response_length",
        "rollout/accuracy",
        "train/entropy",
        "train/policy_loss",
        "train/value_loss",
        "train/kl",
        "train/approx_kl",
        "train/clip_fraction",
        "train/importance_weight",
        "train/grad_norm",
        "perf/tokens_per_second",
        "perf/step_time",
    ]
    assert set(required) <= set(METRIC_NAMES)
    for name, meaning in METRIC_NAMES.items():
        groups = {"rollout", "train", "eval", "eval_hard", "perf", "async", "dapo", "warmstart"}
        assert name.split("/")[0] in groups and meaning, name


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------


def test_progress_shows_steps_and_key_figures():
    out = io.StringIO()
    with Progress(10, initial_step=2, keys=("rollout/accuracy", "eval/accuracy", "train/policy_loss"), file=out) as bar:
        for step in range(3, 6):
            bar.update(step, {"rollout/accuracy": step / 8, "train/policy_loss": jnp.float32(-0.01 * step), "x": 1})
        bar.write("a message")
        assert bar.step == 5
    text = out.getvalue()
    assert "5/10" in text and "a message" in text
    # Two keys share the last name "accuracy": both are shown in full; the unique one is shortened.
    assert "rollout/accuracy=0.625" in text and "policy_loss=-0.05" in text
    assert "eval/accuracy" not in text  # absent from the metrics: not shown

    silent = io.StringIO()
    with Progress(4, disable=True, file=silent) as bar:
        bar.update(4, {"rollout/accuracy": 1.0})
    assert silent.getvalue() == ""
    with pytest.raises(ValueError, match="initial_step=5 is after total_steps=4"):
        Progress(4, initial_step=5)


def test_progress_says_compiling_and_leaves_the_first_step_out_of_the_rate():
    """Before: a 7-minute ETA after a first iteration that compiled for minutes, and a bar frozen at 0/N."""
    out = io.StringIO()
    with Progress(10, file=out, desc="RL") as bar:
        bar._bar.refresh()
        assert "RL (compiling)" in out.getvalue()
        time.sleep(0.5)  # the first step: compiling
        bar.update(1, {})
        bar.update(2, {})
        rate = bar._bar.format_dict
        assert rate["n"] == 2 and rate["initial"] == 1 and rate["elapsed"] < 0.4  # measured from step 1 on
        assert bar._bar.desc.startswith("RL") and "compiling" not in bar._bar.desc


# --------------------------------------------------------------------------------------------
# pass@k
# --------------------------------------------------------------------------------------------


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_probability_a_random_k_subset_holds_a_correct_sample(args):
    n, c, k = args
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets))
    assert pass_at_k(n, c, k) == float(brute)


def test_pass_at_k_matches_the_closed_form_at_large_n():
    for n, c, k in [(200, 13, 10), (1000, 1, 100), (100, 0, 5), (100, 100, 1), (64, 32, 1)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == float(exact)  # the exact value, rounded once
    assert pass_at_k(64, 32, 1) == 0.5  # pass@1 is the fraction correct


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 0, 1), "num_samples=0"),
        ((4, 5, 1), "num_correct=5"),
        ((4, 1, 5), "k=5"),
        ((4, 1, 0), "k=0"),
        ((4.0, 1, 1), "num_samples=4.0"),
    ],
)
def test_pass_at_k_rejects_impossible_counts(args, message):
    with pytest.raises((ValueError, TypeError), match=message):
        pass_at_k(*args)


# --------------------------------------------------------------------------------------------
# scripts/plot_metrics.py
# --------------------------------------------------------------------------------------------


def load_plot_script():
    spec = importlib.util.spec_from_file_location("plot_metrics", PLOT_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(run_dir):
    steps = range(1, 13)
    with MetricsLogger(str(run_dir), tensorboard=False) as logger:
        for step in steps:
            metrics = {"rollout/accuracy": step / 12, "train/policy_loss": 1.0 / step, "custom/thing": step % 3}
            if step == 6:
                metrics["train/policy_loss"] = float("nan")
            logger.log(step, metrics)
    with MetricsLogger(str(run_dir), tensorboard=False) as logger:  # resumed: step 12 again
        logger.log(12, {"rollout/accuracy": 0.99, "train/policy_loss": 0.01, "custom/thing": 7})


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_plot_script_writes_a_png_of_the_run(tmp_path):
    run = tmp_path / "run"
    write_run(run)
    done = subprocess.run(
        [sys.executable, PLOT_SCRIPT, str(run)], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = run / "metrics.png"
    assert f"wrote {out}" in done.stdout
    width, height = png_size(out)
    assert width > 100 and height > 100 and os.path.getsize(out) > 1000
    import matplotlib.image

    pixels = matplotlib.image.imread(str(out))
    assert pixels.shape[:2] == (height, width) and pixels[..., :3].std() > 0.01  # something is drawn


def test_plot_curves_hold_the_last_value_per_step(tmp_path):
    run = tmp_path / "run"
    write_run(run)
    plot_metrics = load_plot_script()
    records = read_jsonl_metrics(str(run))
    keys = plot_metrics.metric_keys(records)
    assert keys == ["rollout/accuracy", "train/policy_loss", "custom/thing"]  # standard names first
    data = plot_metrics.curves(records, keys)
    assert data["rollout/accuracy"][0] == list(range(1, 13))
    assert data["rollout/accuracy"][1] == [s / 12 for s in range(1, 12)] + [0.99]
    assert math.isnan(data["train/policy_loss"][1][5]) and data["custom/thing"][1][-1] == 7.0
    out = str(tmp_path / "two.png")
    figure = plot_metrics.plot({k: data[k] for k in keys[:2]}, out)
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == keys[:2]
    for ax, key in zip(visible, keys[:2]):
        np.testing.assert_array_equal(ax.lines[0].get_ydata(), np.array(data[key][1]))
    assert png_size(out)[0] > 0


def test_plot_script_errors_name_the_run_dir_and_the_keys(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, PLOT_SCRIPT, str(empty)], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert f"no metrics file at '{empty}/metrics.jsonl'" in done.stderr and "Traceback" not in done.stderr

    plot_metrics = load_plot_script()
    run = tmp_path / "run"
    write_run(run)
    assert plot_metrics.main([str(run), "--keys", "rollout/accuracy,train/nope", "--out", str(tmp_path / "x.png")]) == 1
    assert not (tmp_path / "x.png").exists()
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "metrics.jsonl").write_text('{"step": 1, "time": 0.0}\n')
    assert plot_metrics.main([str(tmp_path / "blank")]) == 1


def test_plot_script_unknown_key_message(tmp_path, capsys):
    plot_metrics = load_plot_script()
    run = tmp_path / "run"
    write_run(run)
    assert plot_metrics.main([str(run), "--keys", "train/nope"]) == 1
    err = capsys.readouterr().err
    assert "no metric 'train/nope'" in err and "rollout/accuracy" in err
    assert plot_metrics.main([str(run), "--keys", "custom/thing", "--out", str(tmp_path / "one.png")]) == 0
    assert png_size(tmp_path / "one.png")[0] > 0


def test_default_panels_skip_flat_and_unlogged_metrics(tmp_path):
    plot_metrics = load_plot_script()
    run = tmp_path / "run"
    with MetricsLogger(str(run), tensorboard=False) as logger:
        for step in range(1, 6):
            logger.log(
                step,
                {
                    "rollout/rewards": step / 5,
                    "train/policy_loss": 0.1 * step,
                    "train/kl_skipped_fraction": 0.0,  # flat: says nothing
                    "train/clip_fraction": 0.0,  # flat too, though a standard panel
                    "perf/step_time": 1.0 + step,  # varies, but not a panel
                },
            )
    records = read_jsonl_metrics(str(run))
    assert plot_metrics.default_keys(records) == ["rollout/rewards", "train/policy_loss"]
    out = plot_metrics.plot_run(str(run))
    assert png_size(out)[0] > 100
    assert plot_metrics.plot_run(str(run), str(tmp_path / "all.png"), ["all"]) == str(tmp_path / "all.png")


# --------------------------------------------------------------------------------------------
# METRIC_NAMES is what the training loop logs: short real runs of each family of algorithms
# --------------------------------------------------------------------------------------------

MODEL = "<the tiny model>"  # replaced by the tiny checkpoint's directory

CHEAP = {
    "n_rollout_threads": 4,
    "group_size": 2,
    "num_eval_problems": 4,
    "num_iterations": 2,
    "num_mini_batch": 2,
    "eval_interval": 2,  # evaluations at 0 and at the end, both with samples: eval/pass@1, eval/pass@2
    "eval_n_samples": 2,
    "num_logged_samples": 0,
    "export_final": False,
}

RUNS = {
    # The GRPO family (grpo, drgrpo and single-turn reinforce_rebn log the same keys), with the KL to the
    # reference (train/kl) and a checkpoint at each iteration.
    "grpo": {"kl_coef": 0.01, "save_interval": 1},
    # A critic (train/value_*; ppo and tppo log the same), APPO's action-level ratio, PRM step rewards.
    "appo_prm": {
        "algorithm_name": "appo",
        "reward_source": "prm+verifier",
        "prm_model_name_or_path": MODEL,
        "prm.step_tag": "@",
        "step_separator": "+",
    },
    # DAPO's filter (dapo/kept_fraction), after a one-step supervised warm-start (warmstart/*).
    "dapo": {
        "algorithm_name": "dapo",
        "clip_high": 0.28,
        "warmstart.steps": 1,
        "warmstart.batch_size": 4,
        "warmstart.targets": "answer",
    },
    # The decoupled loss's behaviour_*, and the column chain's harder held-out split (eval_hard/*).
    "async_ppo": {"algorithm_name": "async_ppo", "max_head_offpolicyness": 1, "arithmetic.eval_digits": 3},
    # Multi-turn episodes (rollout/episode_*), ReBN advantages, padded rows, greedy held-out games.
    "reinforce_rebn_multiturn": {
        "algorithm_name": "reinforce_rebn",
        "env_name": "guess_number",
        "prompt_template": "chat",
        "gamma": 0.9,
        "group_size": 1,
        "n_rollout_threads": 2,
        "episode_length": 2,
        "max_new_tokens": 8,
        "max_prompt_length": 600,
        "eval_interval": 1,  # held-out games (eval/episode_*)
        "num_eval_problems": 2,
    },
}
DEFAULT_RUN = "grpo"  # the one the default test run trains; the others are slow

# Documented names that none of RUNS logs, each with the reason it cannot be produced cheaply here. Keep it short:
# every other name must be logged by some run. (Conditional counters such as rollout/grader_timeouts are logged as 0
# when nothing happened, so they need no entry.)
NOT_LOGGED_BY_RUNS: dict[str, str] = {
    "perf/device_memory_gb": "the CPU backend reports no device memory (memory_stats() is None)",
    "perf/device_memory_peak_gb": "the CPU backend reports no device memory (memory_stats() is None)",
}


@pytest.fixture(scope="module")
def logged_keys(tmp_path_factory):
    """`logged_keys(run)`: every metric name that the run of RUNS[run] passed to `on_metrics` or wrote to
    metrics.jsonl (each run trained once per module)."""
    from mathrl_jax.train import loop
    from tests.train.loop_fixtures import small_config, tiny_dir

    model_dir = tiny_dir(str(tmp_path_factory.mktemp("model")))
    root = tmp_path_factory.mktemp("runs")
    cache = {}

    def get(run):
        if run not in cache:
            overrides = {k: model_dir if v == MODEL else v for k, v in {**CHEAP, **RUNS[run]}.items()}
            config = small_config(model_dir, root / run, **overrides)
            keys = set()
            loop.train(config, on_metrics=lambda iteration, metrics: keys.update(metrics))
            for record in read_jsonl_metrics(config.run_dir):
                keys.update(k for k in record if k not in RESERVED_KEYS)
            cache[run] = (config, keys)
        return cache[run]

    return get


def test_documented_name_knows_the_families():
    assert documented_name("train/policy_loss") == "train/policy_loss"
    assert documented_name("eval/pass@1") == documented_name("eval/pass@16") == "eval/pass@{k}"
    for name in ("eval/pass@{k}", "eval/pass@", "eval/pass@0", "eval/pass@k", "eval/pass@4x", "train/lr_step", "x"):
        assert documented_name(name) is None, name


@pytest.mark.parametrize("run", [r if r == DEFAULT_RUN else pytest.param(r, marks=pytest.mark.slow) for r in RUNS])
def test_every_metric_the_training_loop_logs_is_documented(run, logged_keys):
    _, keys = logged_keys(run)
    assert {"rollout/rewards", "train/policy_loss", "train/update_step"} <= keys, sorted(keys)
    undocumented = sorted(k for k in keys if documented_name(k) is None)
    assert not undocumented, f"the {run} run logs metrics that METRIC_NAMES does not document: {undocumented}"


@pytest.mark.slow
def test_every_documented_metric_is_logged_by_some_run(logged_keys):
    logged = {documented_name(k) for run in RUNS for k in logged_keys(run)[1]}
    assert set(NOT_LOGGED_BY_RUNS) <= set(METRIC_NAMES)
    assert not set(NOT_LOGGED_BY_RUNS) & logged, "logged after all: remove it from NOT_LOGGED_BY_RUNS"
    never = sorted(set(METRIC_NAMES) - logged - set(NOT_LOGGED_BY_RUNS))
    assert not never, f"METRIC_NAMES documents metrics that no run logs: {never}"


@pytest.mark.slow
def test_a_resumed_training_run_logs_each_step_once(logged_keys, tmp_path):
    """The default run, as if killed after its checkpoint of iteration 1 but after logging iteration 2: resumed,
    it logs iteration 2 again, and metrics.jsonl holds that record once, the new one."""
    import shutil

    from mathrl_jax.train import loop

    config, _ = logged_keys(DEFAULT_RUN)
    before = read_jsonl_metrics(config.run_dir)
    assert [r["step"] for r in before] == [0, 1, 2]  # the first evaluation, 2 iterations
    run_dir = tmp_path / "run"
    shutil.copytree(config.run_dir, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "2")
    config = config.copy_and_resolve_references()
    config.run_dir = str(run_dir)
    history = []
    loop.train(config, on_metrics=lambda iteration, metrics: history.append((iteration, metrics)))
    assert [i for i, _ in history] == [2]
    after = read_jsonl_metrics(str(run_dir))
    assert [r["step"] for r in after] == [0, 1, 2]
    assert after[:2] == before[:2]
    assert after[2]["time"] > before[2]["time"] and after[2]["train/policy_loss"] == history[0][1]["train/policy_loss"]
