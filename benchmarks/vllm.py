"""The JAX-to-vLLM weight sync and vLLM's generation, per way of running the engine, in one run.

Modes (each on the same random checkpoint of `--shape`, one after the other, so each has the machine alone):

- `in-process`: `VllmSampler`, one worker in this process; the sync streams the JAX params into vLLM's in-place
  reload (`reload_weights` with an iterator: no copy of the model).
- `tp2`: `VllmSampler(tensor_parallel_size=2)`, two worker processes; the sync goes through vLLM's weight-transfer
  protocol with this package's shared-memory engine (safetensors files in /dev/shm, each worker reading its shard).
- `server`: `VllmServerSampler` against a vLLM server started here (`launch.start_server`, the command of
  `scripts/vllm_server.py`); the sync is the same transfer driven over the server's RLHF routes, with the server
  paused around it.

For each: the engine's start (seconds until it answers), `--syncs` syncs of the params (median seconds; bytes: the
weights in the engine's dtype, each tensor once), the baseline vLLM itself offers, its own `reload_weights` from
the checkpoint on disk (page-cached: read after the first time from memory), timed the same number of times in the
same engine, and the ratio of the two; then generation: `--batch` random prompts, up to `--new-tokens` new tokens,
greedy and sampled (T=1), tokens made per second, the median over `--repeats` calls after a warm-up call.

    python scripts/bench_vllm.py                                               # tiny shape, every mode
    python scripts/bench_vllm.py --shape qwen2.5-0.5b --batch 8 --new-tokens 32 --syncs 3 --repeats 2
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODES = ("in-process", "tp2", "server")


def parse_args(argv=None):
    from benchmarks.shapes import SHAPES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-cache-gib", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("batch", "new_tokens", "syncs", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
    if not args.kv_cache_gib > 0:
        parser.error(f"--kv-cache-gib={args.kv_cache_gib}: must be > 0")
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, times: int):
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


def measure(sampler, reload_from_disk, state, prompts, args) -> dict:
    """Sync and reload seconds, and generation tokens/s, of one engine."""
    from mathrl_jax.sampling import SamplingParams

    version = iter(range(1, 10**6))
    sync = timed(lambda: sampler.update_weights(state, next(version)), args.syncs)
    reload = timed(reload_from_disk, args.syncs)
    sampler.update_weights(state, next(version))  # the params again after the reloads, for generation
    rates = {}
    for name, params in {
        "greedy": SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens),
        "sampled": SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=args.seed),
    }.items():
        sampler.generate(prompts, params)  # warm-up
        made, seconds = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = sampler.generate(prompts, params)
            seconds.append(time.perf_counter() - start)
            made.append(sum(len(c) for c in out.completion_ids))
        rates[name] = statistics.median(m / s for m, s in zip(made, seconds))
    return dict(sync=statistics.median(sync), reload=statistics.median(reload), **rates)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import jax
    import numpy as np
    import requests
    from flax import nnx

    from benchmarks.shapes import SHAPES
    from mathrl_jax.models import hf, write_tiny_checkpoint
    from mathrl_jax.sampling.vllm import VllmSampler, VllmServerSampler, start_server, weight_bytes

    directory = tempfile.mkdtemp(prefix="bench_vllm_")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)  # a real shape's checkpoint is GBs
    config = write_tiny_checkpoint(directory, seed=args.seed, **SHAPES[args.shape])
    model = hf.load_model(directory, param_dtype=args.dtype, dtype=args.dtype)
    state = jax.block_until_ready(nnx.state(model))
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(4, min(config.vocab_size, 5000), rng.integers(16, 25)).tolist() for _ in range(args.batch)]
    megabytes = weight_bytes(model.config, args.dtype) / 1e6
    print(
        f"# bench_vllm: {args.shape} Qwen ({config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab "
        f"{config.vocab_size}, {args.dtype}; {megabytes:.1f} MB of weights), batch {args.batch}, {args.new_tokens} "
        f"new tokens, {args.syncs} syncs, {len(os.sched_getaffinity(0))} cores, JAX on {jax.default_backend()}"
    )
    # Random ids beyond the character tokenizer's: the engines work on ids alone.
    # The longest request (prompts of 16-24 tokens): a checkpoint's own limit (32,768 at Qwen's shapes) would need a
    # KV cache that holds one such sequence.
    max_model_len = 32 + args.new_tokens
    common = dict(
        config=model.config, kv_cache_gib=args.kv_cache_gib, dtype=args.dtype, skip_tokenizer_init=True,
        max_model_len=max_model_len,
    )  # fmt: skip
    results = {}
    for mode in args.modes:
        start = time.perf_counter()
        if mode == "server":
            log = os.path.join(directory, "server.log")
            server = start_server(
                directory, port=free_port(), log_path=log, kv_cache_gib=args.kv_cache_gib, dtype=args.dtype,
                max_model_len=max_model_len, extra=["--skip-tokenizer-init"],
            )  # fmt: skip
            try:
                sampler = VllmServerSampler(server.url, config=model.config)
                started = time.perf_counter() - start

                def reload():
                    body = {"method": "reload_weights", "kwargs": {"weights_path": directory}}
                    requests.post(server.url + "/collective_rpc", json=body, timeout=600).raise_for_status()

                results[mode] = dict(start=started, **measure(sampler, reload, state, prompts, args))
                sampler.close()
            finally:
                server.stop()
            continue
        sampler = VllmSampler(directory, tensor_parallel_size=2 if mode == "tp2" else 1, **common)
        started = time.perf_counter() - start

        def reload():
            sampler.llm.collective_rpc("reload_weights", kwargs={"weights_path": directory})

        results[mode] = dict(start=started, **measure(sampler, reload, state, prompts, args))
        sampler.close()
    print(
        f"{'mode':<12}{'start s':>9}{'sync s':>9}{'MB/s':>9}{'reload s':>10}{'sync/reload':>13}"
        f"{'greedy tok/s':>14}{'sampled tok/s':>15}"
    )
    for mode, r in results.items():
        print(
            f"{mode:<12}{r['start']:>9.1f}{r['sync']:>9.3f}{megabytes / r['sync']:>9.0f}{r['reload']:>10.3f}"
            f"{r['sync'] / r['reload']:>12.2f}x{r['greedy']:>14.0f}{r['sampled']:>15.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
