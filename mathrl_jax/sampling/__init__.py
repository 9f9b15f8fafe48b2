"""Rollout generation behind one protocol: `Sampler.generate(prompts, params) -> Rollouts`.

    from mathrl_jax.sampling import JaxSampler, SamplingParams
    sampler = JaxSampler(model, eos_token_ids=[eos], pad_token_id=pad, tokenizer=tokenizer)
    rollouts = sampler.generate(["1+2="], SamplingParams(n=4, temperature=1.0, max_new_tokens=8))

`VllmSampler` (GPU, `pip install mathrl_jax[vllm]`) lives in
`mathrl_jax.sampling.vllm_sampler` and is imported only when asked for.
"""

from mathrl_jax.sampling.base import FINISH_REASONS, Rollouts, Sampler, SamplingParams
from mathrl_jax.sampling.decoding import filter_logits, sampling_distribution
from mathrl_jax.sampling.jax_sampler import JaxSampler

__all__ = [
    "FINISH_REASONS",
    "JaxSampler",
    "Rollouts",
    "Sampler",
    "SamplingParams",
    "filter_logits",
    "sampling_distribution",
]
