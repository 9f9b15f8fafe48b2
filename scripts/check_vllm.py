"""GPU check of the vLLM sampler: weight sync from JAX, parity with the JAX model, timings.

Steps: write a checkpoint (the tiny model, or a random Qwen2.5-1.5B-shaped one
with `--shape qwen2.5-1.5b`, or use `--model DIR`), start `VllmSampler` on it,
perturb the JAX weights (so the engine's original weights are wrong), sync
them, and check that vLLM's greedy completions and log-probs now match the
`JaxSampler`'s on the same prompts. Reports the sync time (median of
`--syncs`), vLLM generation tokens/s and JaxSampler tokens/s on the same GPU.

    python scripts/check_vllm.py                           # tiny model, float32
    python scripts/check_vllm.py --shape qwen2.5-1.5b      # the sync-time target: < 1 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

SHAPES = {
    "tiny": {},
    # Qwen2.5-1.5B: hidden 1536, 28 layers, 12 heads / 2 kv heads, intermediate 8960, vocab 151936, tied.
    "qwen2.5-1.5b": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--model", default=None, help="an existing local checkpoint instead of a random one")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default=None, help="default: float32 tiny, bf16 else"
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--syncs", type=int, default=5)
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from flax import nnx

    from mathrl_jax.models import hf, write_tiny_checkpoint
    from mathrl_jax.sampling import JaxSampler, SamplingParams
    from mathrl_jax.sampling.vllm_sampler import VllmSampler

    if not torch.cuda.is_available() or jax.default_backend() != "gpu":
        print("check_vllm: needs a CUDA GPU visible to both torch and JAX", file=sys.stderr)
        return 2
    dtype = args.dtype or ("float32" if args.shape == "tiny" and args.model is None else "bfloat16")
    directory = args.model
    if directory is None:
        directory = tempfile.mkdtemp(prefix="check_vllm_")
        write_tiny_checkpoint(directory, seed=0, **SHAPES[args.shape])
    model = hf.load_model(directory, param_dtype=dtype, dtype=dtype)
    graphdef, state = nnx.split(model)
    key = jax.random.key(1)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(key, len(leaves))
    # Perturb every matrix by 5% noise: the engine's weights from disk are now stale.
    leaves = [
        (x + 0.05 * jnp.std(x.astype(jnp.float32)) * jax.random.normal(k, x.shape)).astype(x.dtype)
        if x.ndim == 2
        else x
        for x, k in zip(leaves, keys)
    ]
    state = jax.tree.unflatten(treedef, leaves)
    config = model.config

    sampler = VllmSampler(directory, config=config, dtype=dtype, gpu_memory_utilization=0.4)
    sync_times = []
    for version in range(1, args.syncs + 1):
        jax.block_until_ready(state)
        torch.cuda.synchronize()
        start = time.perf_counter()
        sampler.update_weights(state, version=version)
        torch.cuda.synchronize()
        sync_times.append(time.perf_counter() - start)

    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, min(config.vocab_size, 5000), rng.integers(16, 33)).tolist() for _ in range(args.batch)]
    params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    jax_sampler = JaxSampler(nnx.merge(graphdef, state), pad_token_id=config.pad_token_id or 0)
    got = sampler.generate(prompts, params)
    want = jax_sampler.generate(prompts, params)
    same_tokens = np.mean([a == b for x, y in zip(got.completion_ids, want.completion_ids) for a, b in zip(x, y)])
    first_diffs = [
        float(np.max(np.abs(a[:4] - b[:4]))) for a, b in zip(got.policy_logprobs, want.policy_logprobs) if len(a) >= 4
    ]

    def throughput(fn):
        fn()  # warm-up
        start = time.perf_counter()
        out = fn()
        return sum(len(c) for c in out.completion_ids) / (time.perf_counter() - start)

    sample = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    vllm_tps = throughput(lambda: sampler.generate(prompts, sample))
    jax_tps = throughput(lambda: jax_sampler.generate(prompts, sample))
    print(f"checkpoint: {directory} ({args.shape if args.model is None else 'given'}, {dtype})")
    print(f"weight sync: median {statistics.median(sync_times):.3f} s over {len(sync_times)} syncs")
    print(f"greedy token agreement vLLM vs JAX after sync: {same_tokens:.3f}")
    print(f"max |logprob diff| over the first 4 tokens: {max(first_diffs):.2e}")
    print(
        f"generation tokens/s (batch {args.batch}, {args.new_tokens} new): "
        f"vLLM {vllm_tps:.0f}, JaxSampler {jax_tps:.0f}"
    )
    ok = same_tokens > 0.95 and max(first_diffs) < (1e-3 if dtype == "float32" else 5e-2)
    print("OK: vLLM follows the JAX weights" if ok else "MISMATCH: vLLM does not follow the JAX weights")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
