"""Rollout generation behind one protocol: `Sampler.generate(prompts, params) -> Rollouts`.

    from mathrl_jax.sampling import JaxSampler, SamplingParams
    sampler = JaxSampler(model, eos_token_ids=[eos], pad_token_id=pad, tokenizer=tokenizer)
    rollouts = sampler.generate(["1+2="], SamplingParams(n=4, temperature=1.0, max_new_tokens=8))

vLLM's samplers (its engine in this process, or a server) are in `mathrl_jax.sampling.vllm`; a sampler of one process
shared out over the processes of a run is `ProcessSplitSampler`. The JAX sampler is imported when first asked for:
vLLM's own processes import this package for its weight-transfer engine and need no JAX.
"""

import importlib

from mathrl_jax.sampling.base import FINISH_REASONS, Rollouts, Sampler, SamplingParams

_LAZY = {
    "JaxSampler": "jax_sampler",
    "filter_logits": "token_filter",
    "sampling_distribution": "decoding",
    "ProcessSplitSampler": "process_split",
}

__all__ = ["FINISH_REASONS", "Rollouts", "Sampler", "SamplingParams", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
