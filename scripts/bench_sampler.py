"""Decode throughput of `JaxSampler` against `transformers` `generate`, in one run.

Both sides run the same checkpoint (the tiny offline model, random weights,
written with `write_tiny_checkpoint` and read by both), the same batch of
prompts (random ids, lengths 16-24, left-padded for `transformers`), the same
number of new tokens (no end-of-sequence stop: every row produces exactly
`--new-tokens`), with the same number of CPU threads (the process's affinity,
see `scripts/bench_model.py`). Modes: greedy, and sampling at temperature 1.0
with top-p 0.95. Warm-up calls (compilation) are excluded; calls are
interleaved and tokens/s = batch * new tokens / median seconds.

The greedy outputs of the two sides are compared (fraction of equal tokens);
they can differ only through float rounding at near-tied logits.

    python scripts/bench_sampler.py                  # batch 32, 64 new tokens
    python scripts/bench_sampler.py --batch 64 --new-tokens 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for both sides (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("batch", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
    return args


def set_threads(n):
    available = sorted(os.sched_getaffinity(0))
    if n is None:
        n = len(available)
    if not 1 <= n <= len(available):
        raise SystemExit(f"--threads={n}: this process has {len(available)} cores")
    os.sched_setaffinity(0, set(available[:n]))
    os.environ["OMP_NUM_THREADS"] = str(n)
    return n


def main(argv=None):
    args = parse_args(argv)
    threads = set_threads(args.threads)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch
    import transformers

    from mathrl_jax.models import hf, write_tiny_checkpoint
    from mathrl_jax.sampling import JaxSampler, SamplingParams

    torch.set_num_threads(threads)
    directory = tempfile.mkdtemp(prefix="bench_sampler_")
    config = write_tiny_checkpoint(directory, seed=args.seed)
    jax_sampler = JaxSampler(hf.load_model(directory), pad_token_id=config.pad_token_id, eos_token_ids=())
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()

    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(4, config.vocab_size, rng.integers(16, 25)).tolist() for _ in range(args.batch)]
    width = max(len(p) for p in prompts)
    ids = torch.full((args.batch, width), config.pad_token_id, dtype=torch.long)
    mask = torch.zeros((args.batch, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1

    modes = {
        "greedy": (SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens), dict(do_sample=False)),
        "sample T=1 top-p 0.95": (
            SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=args.new_tokens, seed=args.seed),
            dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=0),
        ),
    }

    def run_torch(kwargs):
        with torch.inference_mode():
            return torch_model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=config.pad_token_id,
                eos_token_id=None,
                **kwargs,
            )

    print(
        f"# bench_sampler: tiny Qwen ({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"vocab {config.vocab_size}), batch {args.batch}, {args.new_tokens} new tokens, {threads} threads"
    )
    rows = []
    for name, (params, torch_kwargs) in modes.items():
        jax_out = jax_sampler.generate(prompts, params)  # warm-up: compiles
        torch_out = run_torch(torch_kwargs)
        if params.greedy:
            jax_tokens = np.array(jax_out.completion_ids)
            torch_tokens = torch_out[:, width:].numpy()
            agreement = float(np.mean(jax_tokens == torch_tokens))
        times = {"jax": [], "torch": []}
        for _ in range(args.repeats):
            start = time.perf_counter()
            jax_sampler.generate(prompts, params)
            times["jax"].append(time.perf_counter() - start)
            start = time.perf_counter()
            run_torch(torch_kwargs)
            times["torch"].append(time.perf_counter() - start)
        tokens = args.batch * args.new_tokens
        jax_tps = tokens / statistics.median(times["jax"])
        torch_tps = tokens / statistics.median(times["torch"])
        rows.append((name, jax_tps, torch_tps))
    print(f"{'mode':<24} {'JaxSampler tok/s':>17} {'transformers tok/s':>19} {'ratio':>7}")
    for name, jax_tps, torch_tps in rows:
        print(f"{name:<24} {jax_tps:>17.0f} {torch_tps:>19.0f} {jax_tps / torch_tps:>6.2f}x")
    print(f"greedy token agreement JAX vs transformers: {agreement:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
