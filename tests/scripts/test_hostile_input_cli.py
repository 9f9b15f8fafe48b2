"""scripts/train.py on hostile input (issue 60, point 5): a data file, a flag, a flag file, a config file or a
checkpoint that once hung the run, ended it in an OverflowError / MemoryError, or passed the start to fail at
iteration 7; each is now exit status 2 with one line naming it, in bounded time, before anything is written."""

import json
import os
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

QUICK = [
    "--config.warmstart.steps=0",
    "--config.n_rollout_threads=4",
    "--config.group_size=2",
    "--config.num_mini_batch=1",
    "--config.eval_interval=0",
    "--config.num_iterations=1",
    "--config.max_new_tokens=4",
    "--config.progress=False",
]
"""A run that would train in seconds, should a refusal below not happen (then the test fails, not hangs)."""


def run_train(run_dir, *flags, timeout=180):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"), *flags, f"--config.run_dir={run_dir}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_refused(done, *expected):
    """Exit 2, the last stderr line `train.py: error: ...` naming each of `expected`, no traceback."""
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    lines = done.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("train.py: error: "), done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    for part in expected:
        assert part in lines[-1], lines[-1]


def refused_with_nothing_written(tmp_path, flags, *expected, timeout=180):
    run_dir = tmp_path / "run"
    done = run_train(run_dir, *flags, timeout=timeout)
    assert_refused(done, *expected)
    assert not run_dir.exists(), sorted(os.listdir(run_dir))


GOOD = json.dumps({"problem": "1+1=", "answer": "2"}).encode() + b"\n"


def data_file(tmp_path, second_line: bytes):
    path = tmp_path / "data.jsonl"
    path.write_bytes(GOOD + second_line + b"\n")
    return str(path)


DATA = ["--config.dataset_name=auto", "--config.eval_holdout=0", "--config.num_eval_problems=0"]


@pytest.mark.parametrize(
    "line, named",
    [
        (b'{"problem": "2+2=", "answer": "4", "answer": "5"}', "line 2: duplicate key 'answer'"),
        (b'{"problem": "2+2=", "answer": 1e400}', "line 2: 1e400 is beyond the range"),
        (b'{"problem": "2+\\ud800", "answer": "4"}', "line 2: a string with a lone surrogate escape"),
        (json.dumps({"problem": "1+" * 25_000_000 + "1=", "answer": "x"}).encode(), "MAX_PROMPT_CHARS"),
    ],
    ids=["duplicate key", "1e400", "lone surrogate", "50 MB prompt"],
)
def test_a_hostile_data_line_is_one_line_naming_file_and_line(tmp_path, line, named):
    path = data_file(tmp_path, line)
    refused_with_nothing_written(tmp_path, [f"--config.dataset_path={path}", *DATA, *QUICK], path, named)


def test_a_fifo_as_the_data_file_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    flags = [f"--config.dataset_path={fifo}", *DATA, *QUICK]
    refused_with_nothing_written(tmp_path, flags, str(fifo), "not a regular file or directory (a FIFO)", timeout=90)


def test_every_prompt_is_length_checked_not_the_first_thousand(tmp_path):
    """The 1,201st problem's prompt is over max_prompt_length: refused at the start, naming it, where the run used
    to start and die at the iteration that drew it (the same iteration on every rerun)."""
    rows = [{"problem": f"{i % 10}+{i % 7}=", "answer": str(i % 10 + i % 7)} for i in range(1500)]
    rows[1200]["problem"] = "1+" * 20 + "1="
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    flags = [f"--config.dataset_path={path}", *DATA, *QUICK, "--config.max_prompt_length=16"]
    refused_with_nothing_written(
        tmp_path, flags, "problem 'long:1200' (training problem 1201 of 1500) has a 42-token prompt", "=16"
    )


@pytest.mark.parametrize(
    "flag, named",
    [
        ("--config.n_rollout_threads=1000000000000", "n_rollout_threads=1000000000000 is out of range"),
        ("--config.seed=100000000000000000000000", "seed=100000000000000000000000 is out of range"),
        ("--config.data.train_batch_size=1000000000000", "n_rollout_threads=1000000000000 is out of range"),
        ("--config.num_iterations=100000000000000000000", "num_iterations=100000000000000000000 is out of range"),
    ],
    ids=["n_rollout_threads", "seed", "verl's train_batch_size", "an option without its own bound"],
)
def test_an_absurd_count_is_refused_naming_the_option_and_its_bound(tmp_path, flag, named):
    quick = [f for f in QUICK if not f.startswith("--config.n_rollout_threads")]
    refused_with_nothing_written(tmp_path, [*quick, flag], named, timeout=120)


def test_a_count_of_rows_past_the_limit_is_refused(tmp_path):
    flags = [*QUICK, "--config.n_rollout_threads=1048576", "--config.group_size=65536"]
    refused_with_nothing_written(tmp_path, flags, "68719476736 rows per iteration", "MAX_ROWS_PER_ITERATION")


def test_a_float_count_in_a_config_file_is_one_line_without_a_traceback(tmp_path):
    config = tmp_path / "big.py"
    config.write_text(
        "from mathrl_jax.configs import default\n\n\ndef get_config():\n    c = default.get_config()\n"
        "    c.n_rollout_threads = 1e12\n    return c\n"
    )
    refused_with_nothing_written(
        tmp_path, [f"--config={config}", *QUICK], "TypeError: Could not override field 'n_rollout_threads'"
    )


def test_the_same_value_written_two_ways_under_two_names_is_one_value(tmp_path):
    """`--config.learning_rate=1e-5 --config.lr=0.00001` was refused as "given twice" (compared as text)."""
    done = run_train(tmp_path / "run", "--config.learning_rate=1e-5", "--config.lr=0.00001", "--help", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--config.lr=1e-05" in done.stdout


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--config.learning_rate", "1e-5", "--config.lr=0.001"], "--config.learning_rate 1e-5 and --config.lr=0.001"),
        (["--config.lr=0.001", "--config.learning_rate", "1e-5"], "--config.lr=0.001 and --config.learning_rate 1e-5"),
    ],
    ids=["space form first", "space form second"],
)
def test_an_option_given_twice_in_the_space_form_is_refused(tmp_path, flags, named):
    refused_with_nothing_written(tmp_path, [*flags, *QUICK], "--config.lr is given twice", named)


def test_names_in_a_flag_file_are_resolved_and_checked(tmp_path):
    flagfile = tmp_path / "flags.txt"
    flagfile.write_text("# TRL's names\n--config.learning_rate=0.5\n")
    done = run_train(tmp_path / "run0", f"--flagfile={flagfile}", "--help", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--config.lr=0.5" in done.stdout
    assert "--config.learning_rate is TRL's name of --config.lr" in done.stderr
    refused_with_nothing_written(
        tmp_path,
        [f"--flagfile={flagfile}", "--config.lr=0.001", *QUICK],
        "--config.lr is given twice, as --config.learning_rate=0.5 and --config.lr=0.001",
    )


def test_a_fifo_as_a_flag_file_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "flags.txt"
    os.mkfifo(fifo)
    flags = ["--flagfile", str(fifo), *QUICK]
    refused_with_nothing_written(tmp_path, flags, str(fifo), "not a regular file", timeout=60)


def tiny_model(tmp_path):
    from mathrl_jax.models import write_tiny_checkpoint

    directory = tmp_path / "model"
    write_tiny_checkpoint(str(directory), seed=0, num_hidden_layers=1)
    return directory


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("num_hidden_layers", 1e6, "num_hidden_layers=1000000.0: expected a whole number"),
        ("num_hidden_layers", 1_000_000, "num_hidden_layers=1000000 is out of range"),
        ("intermediate_size", 1 << 20, "over the limit of"),
    ],
    ids=["1e6 layers", "a million layers", "sizes past any memory"],
)
def test_an_absurd_size_in_config_json_is_refused_before_allocation(tmp_path, field, value, named):
    directory = tiny_model(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config[field] = value
    if field == "intermediate_size":
        config.update(num_hidden_layers=4096, hidden_size=1 << 17)
    (directory / "config.json").write_text(json.dumps(config))
    flags = [f"--config.model_name_or_path={directory}", *QUICK]
    refused_with_nothing_written(tmp_path, flags, str(directory), named, timeout=120)


@pytest.mark.parametrize("length", [10**15, 2**64 - 1], ids=["1e15", "2**64-1"])
def test_a_safetensors_header_length_past_the_file_is_refused_naming_it(tmp_path, length):
    directory = tiny_model(tmp_path)
    path = directory / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[:8] = struct.pack("<Q", length)
    path.write_bytes(bytes(data))
    flags = [f"--config.model_name_or_path={directory}", *QUICK]
    refused_with_nothing_written(tmp_path, flags, str(path), f"header length {length} is over", timeout=120)
