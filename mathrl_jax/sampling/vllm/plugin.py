"""The `vllm.general_plugins` entry point: registers the shared-memory weight-transfer engine in every vLLM process.

vLLM runs its general plugins in each of its processes (the engine core, every worker, a server's front end) before
it builds a weight-transfer engine, so an engine named in `weight_transfer_config={"backend": BACKEND}` is known
wherever it is needed. `setup.cfg` declares the entry point; `pip install -e .` installs it. The registration names
the module lazily: nothing of mathrl_jax beyond this file is imported until the engine is used (no JAX in vLLM's
processes).
"""

BACKEND = "mathrl_shared_memory"  # the shared-memory engine's name in vLLM's factories
_MODULE = "mathrl_jax.sampling.vllm.shared_memory"
TRANSFERS = ("auto", BACKEND, "nccl")
"""How weights reach an engine in other processes: "auto" (NCCL beside a GPU trainer, else shared memory), this
package's shared-memory engine (one host), vLLM's NCCL engine (GPUs). `transfer.py` says more."""


def register() -> None:
    """Registers the worker and trainer engines with vLLM's factories (again is a no-op), and quiets the reload's
    warning in this process."""
    quiet_reload_warning()
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for factory, cls in (
        (WeightTransferEngineFactory, "SharedMemoryWeightTransferEngine"),
        (WeightTransferTrainerFactory, "SharedMemoryTrainerWeightTransferEngine"),
    ):
        try:
            factory.register_engine(BACKEND, _MODULE, cls)
        except ValueError:  # already registered in this process (vLLM's plugin loader, then a sampler)
            pass


def _rotary_reload_warning(record) -> bool:
    """False for vLLM's "RotaryEmbedding: Failed to load weights", which its in-place reload logs at every sync:
    the rotary embedding's cos/sin cache has no checkpoint weight, and the reload puts the cache back as it was
    (the parity tests hold after every sync). Every other record passes."""
    message = record.getMessage()
    return not (message.startswith("RotaryEmbedding") and "Failed to load weights" in message)


def quiet_reload_warning() -> None:
    import logging

    reload_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if _rotary_reload_warning not in reload_logger.filters:
        reload_logger.addFilter(_rotary_reload_warning)
