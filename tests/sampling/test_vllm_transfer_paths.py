"""The shared-memory weight-transfer engine takes nothing on trust: its worker side (what runs in a vLLM server's
workers, behind unauthenticated routes) reads only from a directory a trainer created for its transfer (private,
`mathrl_weights_*`, directly in the agreed base), loads only the chunk files there, and writes nothing elsewhere.
The engine classes here are the real ones, wired to each other in this process (the trainer's client calls the
worker's methods as the server's routes would), without a server: a request to the routes reaches exactly these
methods (`init_transfer_engine`, `update_weights`)."""

import os
import tempfile
import types

import pytest

from tests.sampling.conftest import require_vllm

require_vllm()

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from mathrl_jax.sampling.vllm import shared_memory  # noqa: E402
from mathrl_jax.sampling.vllm.shared_memory import (  # noqa: E402
    FAILED,
    SharedMemoryTrainerInitInfo,
    SharedMemoryTrainerWeightTransferEngine,
    SharedMemoryWeightTransferEngine,
)


class Model:
    """A worker's model as the engine sees it: `load_weights` records what it was given."""

    def __init__(self):
        self.loaded = {}

    def load_weights(self, pairs):
        self.loaded.update((name, tensor.clone()) for name, tensor in pairs)


def worker():
    return SharedMemoryWeightTransferEngine(
        None, types.SimpleNamespace(parallel_config=None, model_config=None), torch.device("cpu"), Model()
    )


def init(engine, directory):
    """The worker's side of `/init_weight_transfer_engine` with `{"directory": directory}`."""
    engine.init_transfer_engine(engine.parse_init_info({"directory": directory}))


@pytest.fixture
def base(tmp_path, monkeypatch):
    """The agreed base directory (`MATHRL_JAX_TRANSFER_DIR`, /dev/shm by default), here a fresh one."""
    directory = tmp_path / "shm"
    directory.mkdir()
    monkeypatch.setenv(shared_memory.BASE_ENV, str(directory))
    return directory


def trainer_directory(base):
    return tempfile.mkdtemp(prefix=shared_memory.PREFIX, dir=base)  # as the trainer makes it


def listing(directory):
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("directory", ["/", "/etc", "/etc/", "/proc/self", ""])
def test_a_request_naming_a_system_directory_is_refused_naming_it(base, directory):
    engine = worker()
    with pytest.raises(ValueError, match=f"refused the trainer directory {directory!r}"):
        init(engine, directory)
    assert engine.directories == set()


def outside(tmp_path, base, how):
    """A directory a request could name that no trainer created for this engine, made as an attacker could."""
    if how == "another directory":
        path = tmp_path / "elsewhere" / f"{shared_memory.PREFIX}abc"
        path.mkdir(parents=True, mode=0o700)
    elif how == "the base itself":
        path = base
    elif how == "a link in the base":
        target = tmp_path / "elsewhere"
        target.mkdir(exist_ok=True)
        path = base / f"{shared_memory.PREFIX}link"
        path.symlink_to(target, target_is_directory=True)
    elif how == "a directory open to others":
        path = base / f"{shared_memory.PREFIX}open"
        path.mkdir()
        path.chmod(0o777)
    elif how == "another name":
        path = base / "checkpoints"
        path.mkdir(mode=0o700)
    elif how == "a path with ..":
        inner = trainer_directory(base)
        path = os.path.join(inner, "..", "..", "elsewhere")
        os.makedirs(path, exist_ok=True)
    return str(path)


@pytest.mark.parametrize(
    "how",
    ["another directory", "the base itself", "a link in the base", "a directory open to others", "another name",
     "a path with .."],
)  # fmt: skip
def test_only_a_directory_the_trainer_created_is_read_and_nothing_is_written_elsewhere(tmp_path, base, how):
    """A request naming any directory but a trainer's is refused, naming it; a chunk there is never loaded, and no
    report is written there."""
    directory = outside(tmp_path, base, how)
    chunk = os.path.join(directory, "chunk_0.safetensors")
    save_file({"w": torch.ones(2)}, chunk)
    before = listing(directory)
    engine = worker()
    with pytest.raises(ValueError, match=f"refused the trainer directory {directory!r}"):
        init(engine, directory)
    with pytest.raises(ValueError, match=f"refused to load {chunk!r}"):
        engine.update_weights({"path": chunk, "names": ["w"]})
    assert engine.model.loaded == {}
    assert listing(directory) == before


def test_a_request_naming_a_file_but_a_chunk_of_the_trainers_directory_is_refused(tmp_path, base):
    engine = worker()
    directory = trainer_directory(base)
    init(engine, directory)
    secret = tmp_path / "secret.safetensors"
    save_file({"w": torch.ones(2)}, str(secret))
    os.symlink(secret, os.path.join(directory, "chunk_1.safetensors"))  # a link out
    save_file({"w": torch.ones(2)}, os.path.join(directory, "weights.safetensors"))  # not a chunk's name
    refused = [
        os.path.join(directory, "weights.safetensors"),
        directory,
        "/etc/passwd",
        str(secret),
        os.path.join(directory, "chunk_1.safetensors"),
        os.path.join(directory, "..", "chunk_0.safetensors"),
    ]
    for path in refused:
        with pytest.raises(ValueError, match=f"refused to load {path!r}"):
            engine.update_weights({"path": path, "names": ["w"]})
    assert engine.model.loaded == {}


def test_a_failure_report_is_never_written_through_a_link(tmp_path, base):
    """A worker reports a failed load in a file beside the chunk: a link planted under that name is replaced, its
    target untouched."""
    engine = worker()
    directory = trainer_directory(base)
    init(engine, directory)
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    report = os.path.join(directory, f"{FAILED}{os.getpid()}.txt")
    os.symlink(victim, report)
    chunk = os.path.join(directory, "chunk_0.safetensors")
    with open(chunk, "w") as f:
        f.write("not safetensors")
    engine.update_weights({"path": chunk, "names": ["w"]})
    assert victim.read_text() == "untouched"
    assert not os.path.islink(report) and "Error" in open(report).read()


class Client:
    """The trainer's client, its calls landing on `engine` as the server's routes land them on its workers."""

    def __init__(self, engine):
        self.engine = engine

    def init_weight_transfer_engine(self, info):
        init(self.engine, info["directory"])

    def start_weight_update(self):
        pass

    def update_weights(self, info):
        self.engine.update_weights(info)

    def finish_weight_update(self, weight_version=None):
        pass


def test_the_trainers_own_directory_is_accepted_and_its_chunks_loaded():
    """The default base (/dev/shm here): the trainer engine's directory is one the worker accepts, every tensor
    arrives, and the directory goes with the trainer engine."""
    engine = worker()
    tensors = {f"layer_{i}.weight": torch.full((64,), float(i)) for i in range(5)}
    trainer = SharedMemoryTrainerWeightTransferEngine.trainer_init(
        SharedMemoryTrainerInitInfo(rank=0, chunk_bytes=600), client=Client(engine), source=list(tensors.items())
    )
    try:
        assert os.path.dirname(trainer.directory) == os.path.realpath(shared_memory.default_directory())
        assert os.stat(trainer.directory).st_mode & 0o777 == 0o700
        trainer.send_weights()
    finally:
        directory = trainer.directory
        trainer.shutdown()
    assert sorted(engine.model.loaded) == sorted(tensors)
    assert all(torch.equal(engine.model.loaded[name], tensor) for name, tensor in tensors.items())
    assert not os.path.exists(directory)
