"""models/hub.py: local paths versus Hub ids, and Hub ids downloaded (online) or read from the cache (offline),
against a local stand-in for the Hub's file routes (tests/models/hub_server.py), never the network."""

import json
import os
import subprocess
import sys

import pytest

from mathrl_jax.models import hub
from tests.models.hub_server import FakeHub, directory_files

ROWS = b"".join(json.dumps({"problem": f"{i}+1=", "answer": str(i + 1)}).encode() + b"\n" for i in range(6))
DATASET = {"train.jsonl": ROWS, "README.md": b"# sums\n"}


@pytest.fixture
def online(monkeypatch, tmp_path):
    """Downloads allowed now (HF_HUB_OFFLINE=0, also in `huggingface_hub.constants`, read at its import), into an
    empty cache of this test."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """A tiny checkpoint as a model repository's files, plus files a run does not read."""
    from mathrl_jax.models import write_tiny_checkpoint

    directory = str(tmp_path_factory.mktemp("tiny"))
    write_tiny_checkpoint(directory, seed=0, num_hidden_layers=1)
    files = directory_files(directory)
    files.update({"pytorch_model.bin": b"not read", "README.md": b"# tiny\n", "onnx/model.onnx": b"not read"})
    return files


MISTYPED = {
    "a data file's extension": "my_data/nope.jsonl",
    "a checkpoint's extension": "org/model.safetensors",
    "absolute": "/nonexistent_dir_xyz/data",
    "relative": "./nope",
    "parent": "../nope/x",
    "home": "~/nonexistent_dir_xyz/x",
    "more than one '/'": "a/b/c",
    "an existing first directory": "existing/nope",
}


@pytest.mark.parametrize("case", list(MISTYPED))
@pytest.mark.parametrize("resolve", [hub.resolve_dataset_path, hub.resolve_model_dir])
def test_a_missing_local_path_is_refused_and_the_hub_never_asked(case, resolve, online, tmp_path, monkeypatch):
    """A name shaped like a local path that does not exist: one line saying it does not exist, with the absolute
    path looked at; no `hf download` advice, and no request reaches the Hub (issue 48, friction 5)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()
    name = MISTYPED[case]
    with FakeHub({}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(hub.HubModelError) as raised:
            resolve(name, "some_option")
    message = str(raised.value)
    assert server.requests == []
    assert hub.local_path_reason(name) is not None
    assert message.startswith(f"some_option {name!r}") and "\n" not in message
    assert f"{os.path.abspath(os.path.expanduser(name))} does not exist" in message
    assert "hf download" not in message


@pytest.mark.parametrize("name", ["org/name", "Qwen/Qwen2.5-Math-1.5B", "HuggingFaceH4/MATH-500", "a_b/c.d-e"])
def test_hub_ids_are_not_read_as_local_paths(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no first component exists here
    assert hub.local_path_reason(name) is None


def test_existing_local_paths_are_taken_as_they_are(tmp_path, monkeypatch, online):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_bytes(ROWS)
    assert hub.resolve_dataset_path("data/a.jsonl") == str(tmp_path / "data" / "a.jsonl")
    assert hub.resolve_dataset_path("data") == str(tmp_path / "data")
    assert hub.resolve_model_dir("data") == str(tmp_path / "data")
    with pytest.raises(hub.HubModelError, match="is a file"):
        hub.resolve_model_dir("data/a.jsonl")
    assert hub.resolve_model_dir("") == "" and hub.resolve_dataset_path("") == ""


def test_a_hub_id_is_downloaded_online_then_read_from_the_cache_offline(online, model_files, monkeypatch, capfd):
    """Online: the snapshot holds the served files byte for byte (a model: only `MODEL_FILES`), and one stderr line
    names the id, the endpoint and the cache. Offline, the server gone: the same snapshot, without a request."""
    repos = {("dataset", "org/sums"): DATASET, ("model", "org/tiny"): model_files}
    with FakeHub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        data = hub.resolve_dataset_path("org/sums")
        model = hub.resolve_model_dir("org/tiny")
    assert directory_files(data) == DATASET
    wanted = {path for path in model_files if path not in ("pytorch_model.bin", "README.md", "onnx/model.onnx")}
    assert directory_files(model) == {path: model_files[path] for path in wanted}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= wanted
    assert os.path.commonpath([data, str(online)]) == str(online) == os.path.commonpath([model, str(online)])
    lines = capfd.readouterr().err.splitlines()
    assert f"dataset_path: dataset org/sums from {server.url} into the cache {online}" in lines
    assert f"model_name_or_path: model org/tiny from {server.url} into the cache {online}" in lines
    fetched = {path.rsplit("/", 1)[-1] for method, path in server.requests if "/resolve/" in path and method == "GET"}
    assert "pytorch_model.bin" not in fetched and "config.json" in fetched

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    server.requests.clear()
    assert hub.resolve_dataset_path("org/sums") == data and hub.resolve_model_dir("org/tiny") == model
    assert server.requests == [] and "from http" not in capfd.readouterr().err


def test_offline_a_hub_id_not_cached_is_one_line_and_asks_nothing(online, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with FakeHub({("dataset", "org/sums"): DATASET}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(hub.HubModelError) as raised:
            hub.resolve_dataset_path("org/sums")
    message = str(raised.value)
    assert server.requests == [] and "\n" not in message
    assert "hf download org/sums --repo-type dataset" in message and str(online) in message
    assert "HF_HUB_OFFLINE" in message


@pytest.mark.parametrize("reachable", [True, False])
def test_a_failed_download_names_the_id_the_endpoint_and_what_to_do(reachable, online, monkeypatch):
    """An unknown repository (the Hub answers 404) or an endpoint that does not answer (a closed port): one line
    with the id, the endpoint, the cache and the offline way (`hf download`, HF_HUB_OFFLINE=1)."""
    with FakeHub({}) as server:
        url = server.url
        if not reachable:
            server.close()
        monkeypatch.setenv("HF_ENDPOINT", url)
        with pytest.raises(hub.HubModelError) as raised:
            hub.resolve_model_dir("org/missing", "--model")
    message = str(raised.value)
    assert message.startswith("--model 'org/missing'") and "\n" not in message
    assert url in message and str(online) in message and "hf download org/missing" in message
    assert ("no model repository org/missing" in message) == reachable
    assert ("ConnectError" in message) == (not reachable)


ENVIRONMENTS = [
    {},
    {"HF_HOME": "/h/home"},
    {"XDG_CACHE_HOME": "/x/cache"},
    {"HF_HOME": "/h/home", "HF_HUB_CACHE": "/h/cache", "HF_HUB_OFFLINE": "1"},
    {"HUGGINGFACE_HUB_CACHE": "/old/cache", "HF_HUB_OFFLINE": "true"},
    {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"},
    {"TRANSFORMERS_OFFLINE": "ON"},
    {"HF_HUB_OFFLINE": "no"},
]


def test_the_cache_and_offline_mode_are_huggingface_hubs_own():
    """`hub_cache_dir()` and `hub_offline()`, read at call time, equal `huggingface_hub.constants`' HF_HUB_CACHE and
    HF_HUB_OFFLINE computed at its import from the same environment (one fresh import per environment)."""
    script = (
        "import importlib, json, os, sys\n"
        "from huggingface_hub import constants\n"
        "from mathrl_jax.models import hub\n"
        "out = []\n"
        "for env in json.loads(sys.argv[1]):\n"
        "    for key in ('HF_HOME', 'HF_HUB_CACHE', 'HUGGINGFACE_HUB_CACHE', 'XDG_CACHE_HOME', 'HF_HUB_OFFLINE',\n"
        "                'TRANSFORMERS_OFFLINE'):\n"
        "        os.environ.pop(key, None)\n"
        "    os.environ.update(env)\n"
        "    importlib.reload(constants)\n"
        "    out.append([constants.HF_HUB_CACHE, hub.hub_cache_dir(), constants.HF_HUB_OFFLINE, hub.hub_offline()])\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(ENVIRONMENTS)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for env, (theirs, ours, their_offline, our_offline) in zip(ENVIRONMENTS, results):
        assert ours == theirs and our_offline == their_offline, env
    assert len({cache for cache, *_ in results}) > 3 and {offline for *_, offline in results} == {True, False}
