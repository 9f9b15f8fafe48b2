"""The JAX side of vLLM's weight-transfer protocol: a `WeightSource` over the params, and which engine carries them.

An engine whose workers are other processes (tensor parallel, a server) cannot take tensors from this process's
memory; vLLM's protocol moves them (`vllm.distributed.weight_transfer`): a trainer engine iterates the source and
drives the inference side's four calls through a client. `open_transfer` builds that trainer engine:

| backend (`transfer`)       | where it runs                                       | status                           |
|----------------------------|-----------------------------------------------------|----------------------------------|
| `mathrl_shared_memory`     | any engine on the trainer's host (CPU build, GPU)   | tested here: TP=2, a server      |
| `nccl`                     | a GPU server anywhere (vLLM's NCCL broadcast)       | written from vLLM 0.32, not run  |

"auto": shared memory for the in-process engine's workers (on this host by definition), and for a server the engine
it was started with (`scripts/vllm_server.py`: shared memory on vLLM's CPU build, NCCL on a GPU).
"""

from __future__ import annotations

import socket
from typing import Any, Iterator, List, Optional, Tuple

import jax.numpy as jnp
from vllm.distributed.weight_transfer import ParamMeta, WeightSource, WeightTransferTrainerFactory

from mathrl_jax.models import hf
from mathrl_jax.models.qwen import QwenConfig
from mathrl_jax.sampling.vllm import plugin
from mathrl_jax.sampling.vllm.weights import torch_weights

TRANSFERS = plugin.TRANSFERS


class JaxWeightSource(WeightSource):
    """vLLM's `WeightSource` over a JAX policy state: (Hugging Face name, full tensor) in the export table's order.

    `state` is replaced before each send (`source.state = params`); iteration is `torch_weights` over it, in the
    engine's dtype, and `metadata()` describes the same tensors without touching the arrays (the table's shapes)."""

    def __init__(self, config: QwenConfig, dtype: str, transpose_in_torch: bool = False):
        import torch

        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.torch_dtype = getattr(torch, dtype)
        self.transpose_in_torch = transpose_in_torch
        self.state: Any = None

    def metadata(self) -> List[ParamMeta]:
        return [
            ParamMeta(name, self.torch_dtype, tuple(spec.shape))
            for name, spec in hf.parameter_table(self.config).items()
        ]

    def __iter__(self) -> Iterator[Tuple[str, Any]]:
        if self.state is None:
            raise RuntimeError("JaxWeightSource: no state to send (set source.state first)")
        return torch_weights(self.state, self.config, dtype=self.dtype, transpose_in_torch=self.transpose_in_torch)


class OfflineClient:
    """vLLM's `VLLMWeightSyncClient` protocol over an in-process `vllm.LLM` (whose own methods take the request
    dicts of the HTTP routes rather than the bare infos)."""

    def __init__(self, llm):
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        self.llm.finish_weight_update(weight_version)


def resolve_transfer(transfer: str) -> str:
    """The backend `transfer` names for an engine whose workers share this host ("auto": shared memory, which any
    of them can read; NCCL from the trainer's process would put its rank on worker 0's GPU)."""
    if transfer not in TRANSFERS:
        raise ValueError(f"weight transfer {transfer!r}: expected one of {TRANSFERS}")
    return plugin.BACKEND if transfer == "auto" else transfer


def open_transfer(
    backend: str,
    client,
    source: JaxWeightSource,
    *,
    engine_world_size: int,
    host: str = "",
    chunk_bytes: Optional[int] = None,
):
    """The trainer engine of `backend`, joined to the inference side through `client` (`init_info`'s arguments)."""
    plugin.register()
    info = init_info(backend, engine_world_size=engine_world_size, host=host, chunk_bytes=chunk_bytes)
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)


def init_info(backend: str, *, engine_world_size: int, host: str = "", chunk_bytes: Optional[int] = None):
    """The trainer side's init info of `backend`: this process is the sender (rank 0). For NCCL the group is this
    process and the engine's `engine_world_size` workers (ranks 1..N), meeting at `host` (default: this host's
    address) on a free port. `chunk_bytes` bounds what one transfer step holds (a shared-memory file, NCCL's
    packed buffer); None: the engine's default (1 GiB, vLLM's)."""
    if backend == plugin.BACKEND:
        from mathrl_jax.sampling.vllm.shared_memory import SharedMemoryTrainerInitInfo

        sizes = {} if chunk_bytes is None else {"chunk_bytes": int(chunk_bytes)}
        return SharedMemoryTrainerInitInfo(rank=0, **sizes)
    if backend == "nccl":  # Not run: no GPU here.
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        sizes = {} if chunk_bytes is None else {"packed_buffer_size_bytes": int(chunk_bytes)}
        return NCCLTrainerInitInfo(
            rank=0,
            master_address=host or address_facing(None),
            master_port=_free_port(),
            world_size=1 + engine_world_size,
            **sizes,
        )
    raise ValueError(f"weight transfer {backend!r}: expected one of {TRANSFERS[1:]}")


def address_facing(host: Optional[str]) -> str:
    """This machine's address on the route to `host` (the one `host` can reach it at): the local end of a UDP
    socket "connected" there, which sends nothing. For a local `host`, the loopback address."""
    if not host or host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
