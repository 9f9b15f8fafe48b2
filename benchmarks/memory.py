"""Memory and compile time of one GRPO update step at a real shape, and one real step where it fits.

The update is the trainer's (`train.update.make_update_fn`: float32 master params, bfloat16 compute, remat, the
state donated) on `--rows` x `--length` tokens at a model shape of `benchmarks.shapes.SHAPES` (random weights, Qwen's
151,936-token vocabulary). Four variants are compiled from abstract shapes, so nothing is allocated:

- `adamw`, layers unrolled: the baseline (the default settings);
- `adamw`, layers scanned (`scan_layers=True`): what compiling one layer saves in time, and costs or saves in
  memory (the stacked weights against the activations);
- `adafactor` (`optimizer="adafactor"`), unrolled and scanned: what a factored optimizer state saves.

For each: XLA's compile seconds and its memory analysis (arguments + outputs + temporaries - donated aliases =
the bytes the step needs), and the ratio of both to the baseline. Then the leanest variant that fits this
machine's available memory runs one real step in a fresh process: its seconds, the process's peak resident
memory, the loss, and the fraction of parameter leaves that moved (most of their first 65,536 entries changed).

    python scripts/bench_memory.py --shape tiny                                    # seconds; what the test runs
    python scripts/bench_memory.py --shape qwen2.5-1.5b --rows 1 --length 512     # ~10 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS = (("adamw", False), ("adamw", True), ("adafactor", False), ("adafactor", True))
SAMPLE = 65536  # entries per parameter leaf compared before and after the real step


def model_config(shape: str, scan_layers: bool, remat_policy: str = "nothing_saveable"):
    from benchmarks.shapes import SHAPES
    from mathrl_jax.models import tiny_config

    return tiny_config(
        **SHAPES[shape],
        param_dtype="float32",
        dtype="bfloat16",
        remat=True,
        remat_policy=remat_policy,
        scan_layers=scan_layers,
    )


def update_parts(shape: str, optimizer_name: str, scan_layers: bool, abstract: bool, remat_policy="nothing_saveable"):
    """(update function, state, optimizer) of the trainer's GRPO update; `abstract`: shapes only."""
    import jax
    from flax import nnx

    from mathrl_jax.models import QwenForCausalLM
    from mathrl_jax.train.state import create_train_state, make_optimizer
    from mathrl_jax.train.update import UpdateConfig, make_update_fn

    config = model_config(shape, scan_layers, remat_policy)
    build = lambda: nnx.split(QwenForCausalLM(config, rngs=nnx.Rngs(0)))  # noqa: E731
    graphdef, params = nnx.eval_shape(build) if abstract else build()
    optimizer = make_optimizer(1e-6, name=optimizer_name)
    make_state = lambda p: create_train_state(p, optimizer, seed=0)  # noqa: E731
    state = jax.eval_shape(make_state, params) if abstract else make_state(params)
    update = make_update_fn(graphdef, optimizer, UpdateConfig(num_mini_batch=1), donate=True)
    return update, state, config


def batch(rows: int, length: int, vocab: int, abstract: bool):
    import jax

    from benchmarks.gpu import grpo_batch

    values = grpo_batch(rows, length // 4, length, vocab)
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in values.items()} if abstract else values


def compiled_needs(
    shape: str, optimizer_name: str, scan_layers: bool, rows: int, length: int, remat_policy="nothing_saveable"
) -> dict:
    """Compile seconds and XLA's memory analysis of one variant, from abstract shapes."""
    update, state, config = update_parts(shape, optimizer_name, scan_layers, abstract=True, remat_policy=remat_policy)
    start = time.perf_counter()
    compiled = update.lower(state, batch(rows, length, config.vocab_size, abstract=True)).compile()
    seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    needed = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    return dict(
        compile_seconds=seconds,
        arguments=m.argument_size_in_bytes,
        temporaries=m.temp_size_in_bytes,
        needed=needed,
    )


def one_real_step(
    shape: str, optimizer_name: str, scan_layers: bool, rows: int, length: int, remat_policy="nothing_saveable"
) -> dict:
    """One real update step (run in a fresh process, so the peak resident memory is the step's own)."""
    import jax
    import numpy as np

    update, state, config = update_parts(shape, optimizer_name, scan_layers, abstract=False, remat_policy=remat_policy)
    # The first SAMPLE entries of each leaf, copied (a whole copy of the params would be 6 GB at 1.5B, and the
    # donated buffers are reused by the step).
    before = [np.asarray(x).reshape(-1)[:SAMPLE].copy() for x in jax.tree.leaves(state.params)]
    data = batch(rows, length, config.vocab_size, abstract=False)
    start = time.perf_counter()
    state, metrics = jax.block_until_ready(update(state, data))
    seconds = time.perf_counter() - start
    after = [np.asarray(x).reshape(-1)[:SAMPLE] for x in jax.tree.leaves(state.params)]
    moved = [float(np.mean(a != b)) for a, b in zip(before, after)]
    return dict(
        seconds=seconds,
        loss=float(metrics["loss"]),
        skipped=int(state.skipped_updates),
        leaves_moved=sum(f > 0.5 for f in moved) / len(moved),
        params=int(sum(x.size for x in jax.tree.leaves(state.params))),
        peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    )


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info["MemAvailable"]


def gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-1.5b", help="tiny, qwen2.5-0.5b or qwen2.5-1.5b")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--no-run", action="store_true", help="compile only; run no real step")
    parser.add_argument(
        "--remat-policy",
        default="nothing_saveable",
        choices=("nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable"),
        help="config.remat_policy: what remat keeps for the backward (models.qwen.REMAT_POLICIES)",
    )
    parser.add_argument("--optimizers", default="adamw,adafactor", help="the variants' optimizers, comma-separated")
    args = parser.parse_args(argv)
    from benchmarks.shapes import SHAPES

    if args.shape not in SHAPES:
        print(f"unknown --shape {args.shape!r}; expected one of {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    if args.rows < 1 or args.length < 8:
        print(f"--rows {args.rows} / --length {args.length}: need rows >= 1 and length >= 8", file=sys.stderr)
        return 2
    spawn = multiprocessing.get_context("spawn")
    results = {}
    variants = [(name, scan) for name, scan in VARIANTS if name in args.optimizers.split(",")]
    if not variants:
        print(f"--optimizers={args.optimizers}: expected adamw and/or adafactor", file=sys.stderr)
        return 2
    for name, scan in variants:  # each compile in a fresh process: no cache shared between variants
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            needs = pool.submit(compiled_needs, args.shape, name, scan, args.rows, args.length, args.remat_policy)
            results[name, scan] = needs.result()
    base = next(iter(results.values()))  # the first variant: adamw unrolled unless --optimizers leaves it out
    print(
        f"update step, {args.shape}, {args.rows} x {args.length} tokens, float32 master params, bfloat16 compute, "
        f"remat ({args.remat_policy}); available memory {gib(available_bytes())} GiB\n"
    )
    print("| optimizer | layers | compile (s) | vs baseline | needs (GiB) | vs baseline | temporaries (GiB) |")
    print("|---|---|---|---|---|---|---|")
    for (name, scan), r in results.items():
        print(
            f"| {name} | {'scanned' if scan else 'unrolled'} | {r['compile_seconds']:.1f} | "
            f"{r['compile_seconds'] / base['compile_seconds']:.2f}x | {gib(r['needed'])} | "
            f"{r['needed'] / base['needed']:.2f}x | {gib(r['temporaries'])} |"
        )
    if args.no_run:
        return 0
    fitting = [(r["needed"], variant) for variant, r in results.items() if r["needed"] < available_bytes()]
    if not fitting:
        print(f"\nno variant fits the {gib(available_bytes())} GiB available: no real step run")
        return 0
    _, (name, scan) = min(fitting)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        step = pool.submit(one_real_step, args.shape, name, scan, args.rows, args.length, args.remat_policy).result()
    print(
        f"\none real step, {name}, layers {'scanned' if scan else 'unrolled'}, {step['params'] / 1e9:.3f}B params: "
        f"{step['seconds']:.1f} s, peak resident memory {gib(step['peak_rss'])} GiB, loss {step['loss']:.4f}, "
        f"skipped {step['skipped']}, parameter leaves moved {step['leaves_moved']:.0%}"
    )
    return 0 if step["skipped"] == 0 and step["leaves_moved"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
