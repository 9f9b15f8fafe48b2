"""A phase of a run's build: the sampler the run's rollouts and evaluations come from."""

from __future__ import annotations

import jax

from mathrl_jax import sharding
from mathrl_jax.errors import fail
from mathrl_jax.sampling import JaxSampler
from mathrl_jax.sampling.process_split import ProcessSplitSampler
from mathrl_jax.sampling.vllm import ServerError, VllmSampler, VllmServerSampler
from mathrl_jax.sharding import distributed
from mathrl_jax.train.setup._inputs import vllm_max_model_len


def make_sampler(config, model_dir, model, codec, sampler_args):
    """The run's sampler: the JAX sampler on its mesh, or vLLM (in-process, or the server at `vllm.server_url`),
    each process sampling its share of a batch where several train."""
    if config.sampler == "vllm":
        sampler = _vllm_sampler(config, model_dir, model, codec, sampler_args)
        if jax.process_count() == 1:
            return sampler
        # Each process samples its share of every batch; each syncs its own engine, or process 0 a shared server.
        return ProcessSplitSampler(sampler, sends=not config.vllm.server_url or distributed.is_main_process())
    sampler_mesh = sharding.follow_mesh(config.sampler_mesh.to_dict(), config.mesh.to_dict())
    mesh = sharding.make_mesh(sampler_mesh) if jax.device_count() > 1 else None
    return JaxSampler(model, mesh=mesh, **sampler_args)


def _vllm_sampler(config, model_dir, model, codec, sampler_args):
    """The in-process engine, or the server at `vllm.server_url` (refused with its reason, before training)."""
    v = config.vllm
    max_model_len = vllm_max_model_len(config)
    if v.server_url:
        try:
            return VllmServerSampler(
                v.server_url,
                config=model.config,
                eos_token_ids=sampler_args["eos_token_ids"],
                tokenizer=codec,
                dtype=v.dtype or None,
                timeout_s=v.timeout_s,
                transfer=v.transfer,
                transfer_chunk_bytes=int(v.transfer_chunk_gib * (1 << 30)),
                max_model_len=max_model_len,
            )
        except ServerError as error:
            fail(str(error))
    return VllmSampler(
        model_dir,
        config=model.config,
        eos_token_ids=sampler_args["eos_token_ids"],
        tokenizer=codec,
        kv_cache_gib=v.kv_cache_gib,
        max_model_len=max_model_len,
        dtype=v.dtype or config.dtype,
        tensor_parallel_size=v.tensor_parallel_size,
        transfer=v.transfer,
        transfer_chunk_bytes=int(v.transfer_chunk_gib * (1 << 30)),
        seed=config.seed,
        lora_sync=v.lora_sync,
    )
