"""Issue 48, friction 5, replayed through the scripts a user runs: a Hub id is downloaded when the environment allows
it (from a local stand-in for the Hub, tests/models/hub_server.py, never the network) and read from the cache
offline; a mistyped local path is reported missing, the Hub never asked."""

import json
import os
import subprocess
import sys

import pytest

from tests.models.hub_server import FakeHub, directory_files
from tests.scripts.test_train_cli import ROOT, SHORT_RUN, run_train

SHORT = [*SHORT_RUN, "--config.max_new_tokens=4", "--config.num_iterations=1", "--config.dataset_name=math500"]
HUB_FLAGS = [
    "--config.model_name_or_path=tiny-org/tiny-qwen",
    "--config.dataset_path=tiny-org/tiny-sums",
    "--config.eval_dataset_path=tiny-org/tiny-sums",
    "--config.dataset_split=train",
    "--config.eval_dataset_split=test",
]


def sums_jsonl(problems):
    """MATH-500's layout, one problem a line."""
    rows = [{"problem": q, "answer": a, "unique_id": f"p{i}"} for i, (q, a) in enumerate(problems)]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """A model repository (the tiny checkpoint, plus a file a run does not read) and a dataset repository."""
    from mathrl_jax.models import write_tiny_checkpoint

    directory = str(tmp_path_factory.mktemp("tiny_qwen"))
    write_tiny_checkpoint(directory, seed=0, num_hidden_layers=1)
    model = {**directory_files(directory), "pytorch_model.bin": b"not read"}
    sums = [(f"{a}+{b}=", str(a + b)) for a in range(1, 9) for b in range(1, 9)]
    data = {"train.jsonl": sums_jsonl(sums[:48]), "test.jsonl": sums_jsonl(sums[48:]), "README.md": b"# sums\n"}
    return {("model", "tiny-org/tiny-qwen"): model, ("dataset", "tiny-org/tiny-sums"): data}


def last_line(done):
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def test_train_py_downloads_hub_ids_then_reads_them_offline_from_the_cache(tmp_path, monkeypatch, repos):
    """Online, `--config.model_name_or_path=org/name --config.dataset_path=org/name` fetch both into the cache (one
    stderr line each: id, endpoint, cache) and the run trains on them; offline (HF_HUB_OFFLINE=1) with the server
    gone the same run reads the same snapshots; offline with an empty cache: exit 2, one line, nothing written."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with FakeHub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        online = run_train(tmp_path / "online", *HUB_FLAGS, *SHORT)
    assert online.returncode == 0, online.stderr[-3000:]
    for what, kind, name in [("model_name_or_path", "model", "tiny-qwen"), ("dataset_path", "dataset", "tiny-sums")]:
        assert f"{what}: {kind} tiny-org/{name} from {server.url} into the cache {cache}" in online.stderr
    saved = json.loads((tmp_path / "online" / "config.json").read_text())
    model, data = saved["model_name_or_path"], saved["dataset_path"]
    assert saved["eval_dataset_path"] == data and os.path.commonpath([model, data, str(cache)]) == str(cache)
    assert directory_files(data) == repos["dataset", "tiny-org/tiny-sums"]
    served = repos["model", "tiny-org/tiny-qwen"]
    assert directory_files(model) == {path: content for path, content in served.items() if path != "pytorch_model.bin"}

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # and the server is closed
    offline = run_train(tmp_path / "offline", *HUB_FLAGS, *SHORT)
    assert offline.returncode == 0, offline.stderr[-3000:]
    again = json.loads((tmp_path / "offline" / "config.json").read_text())
    assert (again["model_name_or_path"], again["dataset_path"]) == (model, data)
    assert server.url not in offline.stderr

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    empty = run_train(tmp_path / "empty_run", *HUB_FLAGS, *SHORT)
    assert empty.returncode == 2 and "Traceback" not in empty.stderr, empty.stderr[-2000:]
    message = last_line(empty)
    assert message.startswith("train.py: error: model_name_or_path 'tiny-org/tiny-qwen'"), message
    assert "HF_HUB_OFFLINE" in message and "hf download tiny-org/tiny-qwen" in message
    assert str(tmp_path / "empty") in message and not (tmp_path / "empty_run").exists()


def run_evaluate(*flags):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    script = os.path.join(ROOT, "scripts", "evaluate.py")
    return subprocess.run(
        [sys.executable, script, *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


CASES = {
    # (script, flags, what the one line says, whether the Hub is asked)
    "a mistyped data file": (
        "train",
        ["--config.dataset_name=math500", "--config.dataset_path=my_data/nope.jsonl"],
        ["dataset_path 'my_data/nope.jsonl'", f"{ROOT}/my_data/nope.jsonl does not exist"],
        False,
    ),
    "a mistyped checkpoint directory": (
        "train",
        ["--config.model_name_or_path=./my_model"],
        ["model_name_or_path './my_model'", f"{ROOT}/my_model does not exist"],
        False,
    ),
    "evaluate.py, a mistyped checkpoint directory": (
        "evaluate",
        ["--model", "checkpoints/run1/final_model"],
        ["--model 'checkpoints/run1/final_model'", f"{ROOT}/checkpoints/run1/final_model does not exist"],
        False,
    ),
    "a dataset the Hub does not have": (
        "train",
        ["--config.dataset_name=math500", "--config.dataset_path=tiny-org/no-such-data"],
        ["dataset_path 'tiny-org/no-such-data'", "{url}", "hf download tiny-org/no-such-data --repo-type dataset"],
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_name_that_resolves_to_nothing_is_one_line_before_anything_is_written(case, tmp_path, monkeypatch):
    """Online, with a Hub at hand: a mistyped local path is said not to exist (with the path looked at) and the Hub
    is never asked; an id the Hub lacks is named with the endpoint and the offline way."""
    script, flags, expected, asks_hub = CASES[case]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with FakeHub({}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        done = run_train(tmp_path / "run", *flags) if script == "train" else run_evaluate(*flags)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    message = last_line(done)
    assert message.startswith(f"{script}.py: error: "), done.stderr[-2000:]
    for part in expected:
        assert part.format(url=server.url) in message, (part, message)
    assert bool(server.requests) == asks_hub, server.requests
    assert ("hf download" in done.stderr) == asks_hub
    assert not (tmp_path / "run").exists()
