"""A vLLM sampler whose weights are the JAX policy's, converted at every sync.

    sampler = VllmSampler("/ckpt/Qwen2.5-Math-1.5B", config=model.config)
    rollouts = sampler.generate(prompt_ids, SamplingParams(n=8, temperature=1.0, max_new_tokens=1024))
    sampler.update_weights(train_state.params, version=step)   # JAX params -> vLLM, no host copy on GPU

Weight sync: the JAX state is walked through the export table of `models/hf.py`
(`hf_tensors`), each tensor handed to torch through DLPack (the same GPU
memory, no host round trip when JAX and vLLM share the GPU), and fed to the
running engine's `model.load_weights`, which does vLLM's own fusing (qkv,
gate/up) and tensor-parallel slicing. Then the prefix cache is reset (its
entries were computed with the old weights) and the version recorded.

The engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so its model
is reachable from here. With tensor parallelism its workers are separate
processes; the tensors then travel as CUDA IPC handles to a worker extension
(`WeightSyncWorker`) that rebuilds them in each worker, as OpenRLHF and verl do.

`vllm` (and torch) are imported only here and only when a sampler is built.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Sequence, Tuple

import jax
import numpy as np

from mathrl_jax.models import hf
from mathrl_jax.models.qwen import QwenConfig
from mathrl_jax.sampling.base import Rollouts, SamplingParams


def torch_weights(state: Any, config: QwenConfig, *, dtype: Any = None) -> Iterator[Tuple[str, Any]]:
    """(Hugging Face name, torch tensor) for every parameter of the JAX `state`, one at a time.

    Tensors are shared with JAX through DLPack: on a GPU they are the same device
    memory. A leaf sharded over several devices is first gathered onto its first
    device (DLPack describes one buffer). `dtype` (a jnp dtype) casts on the JAX
    side first, e.g. float32 training params to vLLM's bfloat16.
    """
    import torch

    for name, array in hf.hf_tensors(state, hf.parameter_table(config)):
        if dtype is not None and array.dtype != dtype:
            array = array.astype(dtype)
        if len(array.sharding.device_set) > 1:
            array = jax.device_put(array, next(iter(sorted(array.sharding.device_set, key=lambda d: d.id))))
        yield name, torch.from_dlpack(array)


def _vllm_params(params: SamplingParams, logprobs: int = 0):
    from vllm import SamplingParams as VllmParams

    return VllmParams(
        n=params.n,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,
        max_tokens=params.max_new_tokens,
        stop_token_ids=list(params.stop_token_ids),
        stop=list(params.stop),
        seed=params.seed,
        logprobs=logprobs,
    )


class WeightSyncWorker:
    """vLLM worker extension (`worker_extension_cls`): loads weights sent as CUDA IPC handles.

    Used with tensor parallelism, where each worker lives in its own process.
    """

    def load_weights_from_ipc(self, handles):
        from torch.multiprocessing.reductions import rebuild_cuda_tensor  # noqa: F401  (registers the rebuild)

        weights = []
        for name, (rebuild, args) in handles:
            args = list(args)
            args[6] = self.device.index  # rebuild on this worker's device (peer access within the node)
            weights.append((name, rebuild(*args)))
        self.model_runner.model.load_weights(weights=weights)
        return True


class VllmSampler:
    """`Sampler` over an in-process `vllm.LLM` of the policy's architecture.

    Args:
      model_path: a local Hugging Face checkpoint of the same architecture (its
        weights are replaced at the first `update_weights`).
      config: the JAX model's config (the export table of the sync).
      tensor_parallel_size, gpu_memory_utilization, max_model_len, dtype,
      enable_sleep_mode, seed: passed to `vllm.LLM`.
      logprobs_mode: vLLM's "raw_logprobs" (the untempered policy: filled into
        `Rollouts.policy_logprobs` and `logprobs`) or "processed_logprobs" (the
        distribution sampled from: `Rollouts.logprobs`; `policy_logprobs` are
        then NaN and the trainer recomputes them).
      llm_kwargs: any other `vllm.LLM` argument.
    """

    def __init__(
        self,
        model_path: str,
        *,
        config: QwenConfig,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        max_model_len: Optional[int] = None,
        dtype: str = "bfloat16",
        enable_sleep_mode: bool = False,
        seed: int = 0,
        logprobs_mode: str = "raw_logprobs",
        policy_version: int = 0,
        **llm_kwargs,
    ):
        if not os.path.isdir(model_path):
            raise FileNotFoundError(f"VllmSampler: model_path {model_path!r} is not a local checkpoint directory")
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"logprobs_mode={logprobs_mode!r}: expected 'raw_logprobs' or 'processed_logprobs'")
        # In-process engine core: its model object is reachable for the weight sync.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        if tensor_parallel_size > 1:
            llm_kwargs.setdefault("worker_extension_cls", f"{__name__}.WeightSyncWorker")
        self.llm = LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            dtype=dtype,
            enable_sleep_mode=enable_sleep_mode,
            seed=seed,
            logprobs_mode=logprobs_mode,
            **llm_kwargs,
        )
        self.config = config
        self.tensor_parallel_size = tensor_parallel_size
        self.logprobs_mode = logprobs_mode
        self.weight_dtype = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}.get(dtype)
        self.policy_version = int(policy_version)

    # ------------------------------------------------------------------ weights

    def _engine_model(self):
        """The engine's torch model (in-process engine, one worker)."""
        engine = self.llm.llm_engine
        executor = getattr(engine, "model_executor", None) or engine.engine_core.engine_core.model_executor
        worker = executor.driver_worker
        worker = getattr(worker, "worker", worker)
        return worker.model_runner.model

    def update_weights(self, state: Any, version: int) -> None:
        """Loads the JAX policy `state` into the engine and resets its prefix cache."""
        import jax.numpy as jnp

        dtype = jnp.dtype(self.weight_dtype) if self.weight_dtype else None
        weights = torch_weights(state, self.config, dtype=dtype)
        if self.tensor_parallel_size == 1:
            self._engine_model().load_weights(weights=weights)
        else:
            from torch.multiprocessing.reductions import reduce_tensor

            kept = [(name, tensor) for name, tensor in weights]  # alive until every worker has loaded
            handles = [(name, reduce_tensor(tensor)) for name, tensor in kept]
            self.llm.collective_rpc("load_weights_from_ipc", args=(handles,))
            del kept
        self.llm.reset_prefix_cache()
        self.policy_version = int(version)

    def sleep(self, level: int = 1) -> None:
        """Frees the GPU for training (level 1 offloads weights to CPU, level 2 drops them; resync after)."""
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        self.llm.wake_up()

    # ------------------------------------------------------------------ sampling

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        from vllm.inputs import TokensPrompt

        prompt_ids = [[int(t) for t in p] for p in prompts]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompt_ids], _vllm_params(params, logprobs=0), use_tqdm=False
        )
        completions, lps, reasons, stop_reasons, texts = [], [], [], [], []
        for request in outputs:
            for sample in request.outputs:
                ids = list(sample.token_ids)
                completions.append(ids)
                # logprobs[t] maps token id -> Logprob for the sampled token (and the top-k, here none).
                lps.append(np.array([step[tok].logprob for step, tok in zip(sample.logprobs, ids)], np.float32))
                reason = sample.finish_reason if sample.finish_reason in ("stop", "length", "abort") else "abort"
                reasons.append(reason)
                stop = sample.stop_reason
                if reason == "stop" and stop is None and ids:
                    stop = ids[-1]  # an end-of-sequence token
                stop_reasons.append(stop)
                texts.append(sample.text)
        if self.logprobs_mode == "raw_logprobs":
            sampler_lps, policy_lps = lps, [lp.copy() for lp in lps]
        else:
            sampler_lps, policy_lps = lps, [np.full_like(lp, np.nan) for lp in lps]
        return Rollouts(
            prompt_ids=[p for p in prompt_ids for _ in range(params.n)],
            completion_ids=completions,
            logprobs=sampler_lps,
            policy_logprobs=policy_lps,
            finish_reasons=reasons,
            stop_reasons=stop_reasons,
            prompt_indices=np.repeat(np.arange(len(prompt_ids), dtype=np.int32), params.n),
            policy_version=self.policy_version,
            texts=texts,
        )
