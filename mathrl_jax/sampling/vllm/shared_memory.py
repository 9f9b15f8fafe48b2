"""A vLLM weight-transfer engine over shared memory: the trainer writes safetensors files, every worker reads them.

vLLM's weight-transfer protocol (`vllm.distributed.weight_transfer`) moves a trainer's weights into a running engine:
the trainer side (`TrainerWeightTransferEngine`) iterates a `WeightSource` and drives the engine's four calls
(`init_weight_transfer_engine`, `start_weight_update`, `update_weights`, `finish_weight_update`) through a client
(the in-process `LLM`, or the server's RLHF routes over HTTP); the worker side (`WeightTransferEngine`, one in every
tensor-parallel worker) receives and loads. vLLM ships engines for GPUs (NCCL, CUDA IPC). This one is the transport
for an engine whose workers cannot share the trainer's memory and have no GPU interconnect: vLLM's CPU build at
tensor parallel > 1, or a `vllm serve` process on the trainer's host.

    trainer                                         every vLLM worker
    chunk k of the source -> safetensors file  ->   update_weights({"path": ..., "names": [...]})
    (in `directory`, by default /dev/shm: memory)   safe_open(path) -> model.load_weights (its own TP shard)

Chunks of at most `chunk_bytes` (a larger tensor alone) bound the memory the files take; each file is removed once
every worker has loaded it (`update_weights` returns after all workers did). Loading runs inside vLLM's layerwise
reload, as its NCCL and IPC engines do (`start_weight_update` / `finish_weight_update`): checkpoint names in, vLLM's
own fusing (q/k/v, gate/up) and re-layout after.

The trainer and the engine must see one file system: one host (or a shared mount named by `MATHRL_JAX_TRANSFER_DIR`
in both environments). An engine on another host needs the NCCL engine. Why a file and not a socket or a gloo
group: a file in tmpfs reaches any number of workers in any process with one write, needs no rendezvous that could
hang, and the workers' reads are memory copies; safetensors is the checkpoint format both sides already read.

The engine trusts no request (vLLM's weight routes are unauthenticated, `docs/vllm.md`): it takes as a trainer's
directory only one a trainer made with `mkdtemp` in the agreed base (`default_directory()`): a real directory (not
a link), named `mathrl_weights_*`, directly in the base, this user's and private (mode 0700). It loads only
`chunk_<k>.safetensors` files directly in such a directory, and writes only its failure reports there (never
through a link). A request naming anything else (`/`, `/etc`, a link out) is refused, naming the path.

Registered with vLLM's factories under `BACKEND` by `mathrl_jax.sampling.vllm.plugin`, a `vllm.general_plugins`
entry point, so that every vLLM process (the engine core, each worker, a server) knows it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import tempfile
import weakref
from typing import Any, ClassVar, Dict, Iterator, List, Set, Tuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from mathrl_jax.errors import MathRLError
from mathrl_jax.sampling.vllm.plugin import BACKEND

DEFAULT_CHUNK_BYTES = 1 << 30
FAILED = "failed_worker_"  # a worker's report of a load that failed, in the trainer's directory
BASE_ENV = "MATHRL_JAX_TRANSFER_DIR"  # the base directory both sides agree on, where not /dev/shm
PREFIX = "mathrl_weights_"  # a trainer's directory: mkdtemp(prefix=PREFIX, dir=default_directory())
_DIRECTORY_NAME = re.compile(re.escape(PREFIX) + r"[A-Za-z0-9_]+")  # mkdtemp's random part
_CHUNK_NAME = re.compile(r"chunk_[0-9]+\.safetensors")


class EngineLoadError(MathRLError, RuntimeError):
    """The engine's workers could not load the weights sent (a tensor of another shape: its model is of another
    architecture than the policy's)."""


def default_directory() -> str:
    """The base the trainers' directories go in: `$MATHRL_JAX_TRANSFER_DIR` if set (a shared mount; the engine's
    environment must name the same), else /dev/shm where the host has it (memory, not disk), else the temporary
    directory."""
    if os.environ.get(BASE_ENV):
        return os.environ[BASE_ENV]
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def trainer_directory(directory: Any) -> str:
    """The real path of `directory`, a trainer's directory as a request names it, if the engine may read from it
    (module docstring): a directory named `mathrl_weights_*` directly in `default_directory()`, not a link, this
    user's, mode 0700. Raises `ValueError` naming it otherwise."""
    base = os.path.realpath(default_directory())
    if not isinstance(directory, str) or not directory:
        raise ValueError(f"{BACKEND}: refused the trainer directory {directory!r}: expected a path")
    real = os.path.realpath(directory)
    if os.path.dirname(real) != base or not _DIRECTORY_NAME.fullmatch(os.path.basename(real)):
        why = (
            f"it is not a {PREFIX}* directory the trainer created in {base} (a trainer elsewhere: set {BASE_ENV} to "
            "the same directory for the trainer and the vLLM server)"
        )
    else:
        try:
            st = os.lstat(real)
        except OSError:
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode):
            why = (
                "it is not visible to this vLLM worker (the shared-memory transport needs the trainer and the "
                "engine on one host, or a shared mount)"
            )
        elif st.st_uid != os.geteuid():
            why = f"it belongs to user {st.st_uid}, not this engine's ({os.geteuid()})"
        elif stat.S_IMODE(st.st_mode) & 0o077:
            why = f"it is open to other users (mode {stat.S_IMODE(st.st_mode):o}, expected 700)"
        else:
            return real
    raise ValueError(f"{BACKEND}: refused the trainer directory {directory!r}: {why}")


@dataclasses.dataclass
class SharedMemoryInitInfo(WeightTransferInitInfo):
    """Worker side: the directory the trainer writes its files in (checked: `trainer_directory`)."""

    directory: str


@dataclasses.dataclass
class SharedMemoryUpdateInfo(WeightTransferUpdateInfo):
    """One chunk: its file and the Hugging Face names it holds, in order."""

    path: str
    names: List[str]


class SharedMemoryWeightTransferEngine(WeightTransferEngine[SharedMemoryInitInfo, SharedMemoryUpdateInfo]):
    """The worker side: loads each chunk's file into this worker's model (its tensor-parallel shard)."""

    init_info_cls = SharedMemoryInitInfo
    update_info_cls = SharedMemoryUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        # Every trainer that opened a transfer (a server outlives its trainers, and a run's processes or a rerun
        # each open their own): a request may name files in these directories only.
        self.directories: Set[str] = set()

    def init_transfer_engine(self, init_info: SharedMemoryInitInfo) -> None:
        self.directories.add(trainer_directory(init_info.directory))

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self.failed = False
        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if not getattr(self, "failed", False):  # after a failed load the reload was finished then
            finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises where there is no accelerator
        # (vLLM's CPU build); loading here is synchronous on a CPU.
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: SharedMemoryUpdateInfo) -> None:
        """Loads the chunk; a load that fails is reported in a file beside it (`FAILED`), not raised.

        Why not raised: vLLM's multiprocess executor answers a collective call with the first worker's error
        without reading the other workers' answers, which then answer the next calls in their place (the trainer
        was told a later chunk had loaded while a worker had not read it yet, and removed it under that worker).
        Why the reload is finished here: vLLM's worker leaves its layerwise reload half-done after an error, and
        the next sync failed on its leftovers. The layers not reached keep their old weights; the trainer raises,
        and its sampler knows the model is not the source's (it refuses to sample until a sync completes)."""
        path = chunk_path(update_info.path, self.directories)
        if getattr(self, "failed", False):  # a later chunk of a sync that already failed here: nothing more loads
            return
        try:
            with safe_open(path, framework="pt", device="cpu") as chunk:
                held = list(chunk.keys())
                if sorted(held) != sorted(update_info.names):
                    raise ValueError(f"{BACKEND}: {path} holds {held}, the update names {update_info.names}")
                self.model.load_weights((name, chunk.get_tensor(name)) for name in update_info.names)
        except Exception as error:
            try:
                self.finish_weight_update()
            except Exception:  # the load's own error is the one to report
                pass
            self.failed = True
            message = f"{type(error).__name__}: {error}"
            _write_new(os.path.join(os.path.dirname(path), f"{FAILED}{os.getpid()}.txt"), message)

    def shutdown(self) -> None:
        pass  # nothing held between updates; a trainer removes its own directory


def _write_new(path: str, text: str) -> None:
    """`text` into a new file at `path` (whatever was there, a link included, is removed first: never followed)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as file:
        file.write(text)


def chunk_path(path: Any, directories: Set[str]) -> str:
    """The real path of the chunk file a request names, if the engine may load it: `chunk_<k>.safetensors` directly
    in one of `directories` (trainers' directories, `trainer_directory`, checked again: still private), a file.
    Raises `ValueError` naming it otherwise."""
    real = os.path.realpath(path) if isinstance(path, str) and path else ""
    directory, name = os.path.split(real)
    if directory not in directories or not _CHUNK_NAME.fullmatch(name):
        raise ValueError(
            f"{BACKEND}: refused to load {path!r}: not a chunk file in a directory a trainer opened a transfer with"
        )
    trainer_directory(directory)
    if not os.path.isfile(real):
        raise ValueError(f"{BACKEND}: refused to load {path!r}: not a file")
    return real


@dataclasses.dataclass
class SharedMemoryTrainerInitInfo(TrainerInitInfo):
    """Trainer side: where the files go (a tmpfs by default) and the most bytes one file holds."""

    backend: ClassVar[str] = BACKEND
    directory: str = dataclasses.field(default_factory=default_directory)
    chunk_bytes: int = DEFAULT_CHUNK_BYTES


class SharedMemoryTrainerWeightTransferEngine(TrainerWeightTransferEngine[SharedMemoryTrainerInitInfo]):
    """The trainer side: writes the source in chunks of files and has the engine load each (`send_weights`).

    A failure part-way on this side (the source, a write, no room left in the directory) or a load the workers
    report failed (`EngineLoadError`) ends the engine's update session, so that it can take the next one; an engine
    that did not answer, or refused a call, is not asked again (its answer would be as late, or the same). The files
    are removed either way, and the directory with the engine (or at exit). The caller must treat the engine's
    weights as unknown until a `send_weights` completes (the samplers do: they refuse to sample until then)."""

    init_info_cls = SharedMemoryTrainerInitInfo

    def __init__(self, *, client, source, is_sender: bool = True, directory: str, chunk_bytes: int) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.directory = directory
        self.chunk_bytes = int(chunk_bytes)
        self.bytes_sent = 0  # of the last send_weights
        if directory:
            self._remove = weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)

    @classmethod
    def trainer_init(cls, init_info: SharedMemoryTrainerInitInfo, *, client, source=None):
        if source is None:
            raise ValueError(f"{BACKEND}: the trainer engine needs a WeightSource")
        if init_info.chunk_bytes < 1:
            raise ValueError(f"{BACKEND}: chunk_bytes={init_info.chunk_bytes}, expected >= 1")
        if not os.path.isdir(init_info.directory):
            raise ValueError(f"{BACKEND}: directory {init_info.directory!r} does not exist")
        directory = tempfile.mkdtemp(prefix=PREFIX, dir=init_info.directory) if init_info.is_sender else ""
        engine = cls(
            client=client,
            source=source,
            is_sender=init_info.is_sender,
            directory=directory,
            chunk_bytes=init_info.chunk_bytes,
        )
        if engine.is_sender:
            try:
                client.init_weight_transfer_engine({"directory": directory})
            except BaseException:
                engine.shutdown()
                raise
        return engine

    def send_weights(self) -> None:
        if not self.is_sender:
            for _ in self.source:  # a source whose iteration is a collective: every rank takes part
                pass
            return
        self.bytes_sent = 0
        try:
            self.client.start_weight_update()
        except Exception as error:
            if not _answered(error):
                raise
            # The engine refused a second session: one left open by a trainer that died mid-sync. Close it and start
            # again; a second refusal is the engine's real answer. (A trainer still syncing is not told apart here:
            # the samplers' labels catch it, `sampler.py`.)
            _quietly(self.client.finish_weight_update)
            self.client.start_weight_update()
        engine_failed = False
        try:
            for index, chunk in enumerate(chunk_pairs(iter(self.source), self.chunk_bytes)):
                path = os.path.join(self.directory, f"chunk_{index}.safetensors")
                nbytes = sum(t.numel() * t.element_size() for _, t in chunk)
                free = shutil.disk_usage(self.directory).free
                if free < nbytes:
                    raise OSError(
                        f"{BACKEND}: {self.directory} has {free / 2**20:.0f} MiB free, a chunk of the weights needs "
                        f"{nbytes / 2**20:.0f} MiB: give it more room (a container's /dev/shm: --shm-size) or send "
                        "smaller chunks (vllm.transfer_chunk_gib)"
                    )
                try:
                    save_file(dict(chunk), path)
                    try:
                        self.client.update_weights({"path": path, "names": [name for name, _ in chunk]})
                    except BaseException:
                        engine_failed = True
                        raise
                finally:
                    if os.path.exists(path):
                        os.unlink(path)
                reports = self._failure_reports()
                if reports:  # the workers finished their reloads; their session is still open: closed below
                    raise EngineLoadError(f"the engine's workers could not load the weights: {reports[0]}")
                self.bytes_sent += nbytes
        except BaseException:
            if not engine_failed:  # this side failed: the engine's session is still open
                _quietly(self.client.finish_weight_update)
            raise
        self.client.finish_weight_update()

    def _failure_reports(self) -> List[str]:
        """The workers' reports of a failed load (read and removed)."""
        reports = []
        for name in sorted(os.listdir(self.directory)):
            if name.startswith(FAILED):
                with open(os.path.join(self.directory, name)) as report:
                    reports.append(report.read())
                os.unlink(os.path.join(self.directory, name))
        return reports

    def shutdown(self) -> None:
        if self.directory:
            self._remove()
            self.directory = ""


def _answered(error: BaseException) -> bool:
    """Whether `error` is an engine's answer (a refusal), not a connection that failed or timed out."""
    try:
        import requests
    except ImportError:
        return True
    return not isinstance(error, (requests.ConnectionError, requests.Timeout))


def _quietly(call) -> None:
    """`call()`, its failure ignored (a clean-up whose own error would hide the one being raised)."""
    try:
        call()
    except Exception:
        pass


def chunk_pairs(
    pairs: Iterator[Tuple[str, torch.Tensor]], chunk_bytes: int
) -> Iterator[List[Tuple[str, torch.Tensor]]]:
    """Consecutive groups of `(name, tensor)` pairs of at most `chunk_bytes`; a tensor larger than that travels
    alone, in a chunk of its own size."""
    chunk: List[Tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in pairs:
        nbytes = tensor.numel() * tensor.element_size()
        if chunk and size + nbytes > chunk_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, tensor.contiguous()))
        size += nbytes
    if chunk:
        yield chunk
