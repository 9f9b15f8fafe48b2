"""vLLM as the sampler: its engine in this process (one worker or tensor parallel), or a vLLM server, synced from
the JAX params at every iteration (docs/vllm.md).

    from mathrl_jax.sampling.vllm import VllmSampler, VllmServerSampler
    sampler = VllmSampler(checkpoint_dir, config=model.config, tensor_parallel_size=2)     # in this process
    sampler = VllmServerSampler("http://127.0.0.1:8000", config=model.config)             # `vllm serve` elsewhere
    sampler.update_weights(params, version=1)

| module            | what                                                                                     |
|-------------------|------------------------------------------------------------------------------------------|
| `engine`          | `VllmSampler`: `vllm.LLM` in this process; TP > 1 syncs through the weight transfer      |
| `server`          | `VllmServerSampler`: a vLLM server over HTTP (generate, and the RLHF weight routes)       |
| `launch`          | the server's command, started and stopped (`scripts/vllm_server.py`, the tests)          |
| `sampler`         | `EngineSampler`: what both do alike (versions of a sync, refusal of half-synced weights)  |
| `requests`        | our `SamplingParams` as vLLM requests, vLLM's completions as `Rollouts`                  |
| `weights`         | `torch_weights`: the JAX params as torch tensors under Hugging Face names                |
| `transfer`        | `JaxWeightSource` (vLLM's `WeightSource`), the trainer side of vLLM's weight transfer    |
| `shared_memory`   | a weight-transfer engine over files in shared memory (vLLM's CPU build, one host)        |
| `plugin`          | the `vllm.general_plugins` entry point that registers it in every vLLM process           |
| `memory`          | `kv_cache_refusal`: a KV cache over the host's memory, said before the CPU engine starts  |

Nothing here imports vLLM or torch until a name that needs them is asked for.
"""

import importlib

_WHERE = {
    "VllmSampler": "engine",
    "VLLM_MISSING": "engine",
    "is_cpu_build": "engine",
    "kv_cache_refusal": "memory",
    "VllmServerSampler": "server",
    "ServerError": "server",
    "describe_server": "server",
    "EngineSampler": "sampler",
    "ENGINE_DTYPES": "sampler",
    "VersionMismatchError": "requests",
    "torch_weights": "weights",
    "weight_bytes": "weights",
    "JaxWeightSource": "transfer",
    "TRANSFERS": "plugin",
    "BACKEND": "plugin",
    "serve_command": "launch",
    "start_server": "launch",
}

__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
