"""LoRA against full fine-tuning at a real shape: the update's memory and time, and how the adapters reach each
sampler (applied in the JAX sampler's passes or merged into its weights; vLLM's own LoRA or merged weights).

1. The update. The trainer's GRPO update (`train.update.make_update_fn`: float32 master params, bfloat16 compute,
   remat, the state donated; a LoRA run's base passed beside the state, `frozen`) at a model shape of
   `benchmarks.shapes.SHAPES` (random weights, Qwen's 151,936-token vocabulary), compiled from abstract shapes:
   the training state's bytes (params and AdamW moments: what the optimizer holds), XLA's memory analysis
   (arguments + outputs + temporaries - donated aliases), and the ratio of each to full fine-tuning. Then one
   real step of each in a fresh process, timed after its compile: seconds and the process's peak resident memory.
2. The JAX sampler's `lora_sync`s: the same prompts decoded greedily by the adapted model (`"adapter"`: adapters
   applied in each projection) and by the plain model holding the merged kernels (`"merged"`), each timed after a
   warm-up call, with a merged sync's own time.
3. With `--vllm` (vLLM installed): the same for two engines on the same base, `lora_sync="merged"` and
   `lora_sync="adapter"` (vLLM's LoRA and a `LoRARequest`): a sync and a generate call each.

    python scripts/bench_lora.py --shape tiny --sampler-dtype=float32       # seconds; what the test runs
    python scripts/bench_lora.py --shape qwen2.5-0.5b --layers 4 --vllm     # the 0.5B shape's layers, 4 of 24
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import resource
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_config(shape: str, layers: int, lora: dict):
    from benchmarks.shapes import SHAPES
    from mathrl_jax.models import tiny_config

    fields = dict(SHAPES[shape], param_dtype="float32", dtype="bfloat16", remat=True, **lora)
    if layers:
        fields["num_hidden_layers"] = layers
    return tiny_config(**fields)


def update_parts(shape: str, layers: int, lora: dict, abstract: bool):
    """(update, state, frozen, config) of the trainer's GRPO update; `abstract`: shapes only."""
    import jax
    from flax import nnx

    from mathrl_jax.models import QwenForCausalLM
    from mathrl_jax.train.state import create_train_state, make_optimizer
    from mathrl_jax.train.update import UpdateConfig, make_update_fn

    config = model_config(shape, layers, lora)

    def build():
        model = QwenForCausalLM(config, rngs=nnx.Rngs(0))
        return nnx.split(model, nnx.LoRAParam, ...) if lora else (*nnx.split(model), None)

    graphdef, params, frozen = nnx.eval_shape(build) if abstract else build()
    optimizer = make_optimizer(1e-5)
    make_state = lambda p: create_train_state(p, optimizer, seed=0)  # noqa: E731
    state = jax.eval_shape(make_state, params) if abstract else make_state(params)
    update = make_update_fn(graphdef, optimizer, UpdateConfig(num_mini_batch=1), donate=True)
    return update, state, frozen, config


def batch(rows: int, length: int, vocab: int, abstract: bool):
    import jax

    from benchmarks.gpu import grpo_batch

    values = grpo_batch(rows, length // 4, length, vocab)
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in values.items()} if abstract else values


def tree_bytes(tree) -> int:
    import jax
    import numpy as np

    return int(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def compiled_needs(shape: str, layers: int, lora: dict, rows: int, length: int) -> dict:
    update, state, frozen, config = update_parts(shape, layers, lora, abstract=True)
    compiled = update.lower(state, batch(rows, length, config.vocab_size, abstract=True), frozen).compile()
    m = compiled.memory_analysis()
    return dict(
        state=tree_bytes((state.params, state.opt_state)),
        trained=tree_bytes(state.params),
        base=tree_bytes(frozen) if frozen is not None else 0,
        needed=m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes,
    )


def one_real_step(shape: str, layers: int, lora: dict, rows: int, length: int) -> dict:
    """Two real update steps in this (fresh) process: the second one timed (the first compiles)."""
    import jax

    update, state, frozen, config = update_parts(shape, layers, lora, abstract=False)
    data = batch(rows, length, config.vocab_size, abstract=False)
    state, _ = jax.block_until_ready(update(state, data, frozen))
    start = time.perf_counter()
    state, metrics = jax.block_until_ready(update(state, data, frozen))
    return dict(
        seconds=time.perf_counter() - start,
        skipped=int(state.skipped_updates),
        loss=float(metrics["loss"]),
        peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        peak_device=(jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use"),  # None on the CPU
    )


def adapted_model(shape: str, layers: int, lora: dict, directory: str, dtype: str = "bfloat16"):
    """A random checkpoint of the shape in `directory` and its LoRA model, the adapters moved off B = 0."""
    import jax
    from flax import nnx

    from mathrl_jax.models import hf, write_tiny_checkpoint

    config = model_config(shape, layers, {})
    fields = {f: getattr(config, f) for f in ("hidden_size", "intermediate_size", "num_hidden_layers")}
    fields.update({f: getattr(config, f) for f in ("num_attention_heads", "num_key_value_heads", "head_dim")})
    fields["vocab_size"] = config.vocab_size
    write_tiny_checkpoint(directory, seed=0, **fields)
    model = hf.load_model(directory, param_dtype="float32", dtype=dtype, **lora)  # float32 master weights
    graphdef, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
    adapters = jax.tree.map(lambda x: x + 0.01, adapters)
    return nnx.merge(graphdef, adapters, rest)


def timed(fn, repeats: int = 2) -> float:
    fn()  # compile / warm up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def jax_sampler_times(model, prompts, max_new_tokens: int) -> dict:
    """The JAX sampler's two `lora_sync`s on the same adapted model: greedy generate time of each (after a warm-up
    call), and the merged one's sync (`lora.merge_adapters`, timed after its compile)."""
    import jax
    from flax import nnx

    from mathrl_jax.sampling import JaxSampler, SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    state = nnx.state(model)
    adapted = JaxSampler(model, eos_token_ids=[-1], pad_token_id=0, lora_sync="adapter")
    merged = JaxSampler(model, eos_token_ids=[-1], pad_token_id=0, lora_sync="merged")  # compiles the merge

    def sync():
        merged.update_weights(jax.tree.map(lambda x: x, state), 1)  # another State object: merged anew
        jax.block_until_ready(merged.state)

    got = adapted.generate(prompts, params)
    want = merged.generate(prompts, params)
    same = sum(a == b for a, b in zip(got.completion_ids, want.completion_ids)) / len(prompts)
    return dict(
        adapters=timed(lambda: adapted.generate(prompts, params)),
        merged=timed(lambda: merged.generate(prompts, params)),
        merge=timed(sync),
        same_tokens=same,
    )


def vllm_times(model, directory: str, prompts, max_new_tokens: int) -> dict:
    from flax import nnx

    from mathrl_jax.sampling import SamplingParams
    from mathrl_jax.sampling.vllm import VllmSampler

    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    state = nnx.state(model)
    results = {}
    for mode in ("merged", "adapter"):
        engine = VllmSampler(directory, config=model.config, kv_cache_gib=0.5, dtype="bfloat16", lora_sync=mode)
        engine.update_weights(state, version=1)
        sync = engine.last_sync_seconds
        results[mode] = dict(sync=sync, generate=timed(lambda engine=engine: engine.generate(prompts, params)))
        del engine
    return results


def gib(n: float) -> str:
    return f"{n / 2**30:.3f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-0.5b", help="tiny, qwen2.5-0.5b or qwen2.5-1.5b")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers (0: the shape's own)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", default="q_proj,v_proj", help='e.g. "q_proj,v_proj" (OpenR) or "all-linear"')
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--prompts", type=int, default=8, help="prompts decoded by the samplers")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--vllm", action="store_true", help="also time vLLM's merged and adapter syncs")
    parser.add_argument("--no-run", action="store_true", help="compile only: no real update step")
    parser.add_argument(
        "--sampler-dtype",
        default="bfloat16",
        choices=("bfloat16", "float32"),
        help="the samplers' compute dtype (bfloat16: the trainer's; in float32 the two ways draw the same tokens)",
    )
    args = parser.parse_args(argv)
    from benchmarks.shapes import SHAPES

    if args.shape not in SHAPES:
        print(f"unknown --shape {args.shape!r}; expected one of {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    if args.rank < 1 or args.layers < 0 or args.rows < 1 or args.length < 8:
        print(f"--rank {args.rank} --layers {args.layers} --rows {args.rows} --length {args.length}", file=sys.stderr)
        return 2
    lora = dict(lora_rank=args.rank, lora_alpha=2.0 * args.rank, lora_targets=args.targets)
    variants = {"full": {}, f"lora r{args.rank} {args.targets}": lora}
    spawn = multiprocessing.get_context("spawn")
    needs, steps = {}, {}
    for name, settings in variants.items():  # each in a fresh process: its own compile, its own peak memory
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            needs[name] = pool.submit(
                compiled_needs, args.shape, args.layers, settings, args.rows, args.length
            ).result()
        if not args.no_run:
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
                step = pool.submit(one_real_step, args.shape, args.layers, settings, args.rows, args.length)
                steps[name] = step.result()
    layers = args.layers or SHAPES[args.shape].get("num_hidden_layers", "the tiny model's")
    print(f"update step, {args.shape} ({layers} layers), {args.rows} x {args.length} tokens, AdamW, bf16 compute\n")
    print("| variant | trained (GiB) | training state (GiB) | vs full | frozen base (GiB) | needs (GiB) | vs full |"
          " step (s) | vs full | peak RSS (GiB) | peak device (GiB) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    full, full_step = needs["full"], steps.get("full")
    for name, r in needs.items():
        s = steps.get(name)
        timing = (
            f"{s['seconds']:.2f} | {s['seconds'] / full_step['seconds']:.2f}x | {gib(s['peak_rss'])} | "
            + (gib(s["peak_device"]) if s["peak_device"] else "-")
            if s
            else "- | - | - | -"
        )
        print(
            f"| {name} | {gib(r['trained'])} | {gib(r['state'])} | {r['state'] / full['state']:.4f}x | "
            f"{gib(r['base'])} | {gib(r['needed'])} | {r['needed'] / full['needed']:.2f}x | {timing} |"
        )
    if any(s["skipped"] for s in steps.values()):
        print("a real step was skipped (non-finite loss or gradient)")
        return 1

    import numpy as np

    with tempfile.TemporaryDirectory() as directory:
        model = adapted_model(args.shape, args.layers, lora, directory, args.sampler_dtype)
        rng = np.random.default_rng(0)
        prompts = [list(rng.integers(3, 90, 12)) for _ in range(args.prompts)]
        j = jax_sampler_times(model, prompts, args.new_tokens)
        ratio = j["adapters"] / j["merged"]
        print(
            f"\nJAX sampler, {args.prompts} prompts x {args.new_tokens} greedy tokens: adapters applied "
            f"{j['adapters']:.3f} s, merged weights {j['merged']:.3f} s (adapters / merged {ratio:.2f}x); "
            f"a merged sync took {j['merge']:.3f} s; the same tokens for {j['same_tokens']:.0%} of the prompts"
        )
        if args.vllm:
            v = vllm_times(model, directory, prompts, args.new_tokens)
            merged, adapter = v["merged"], v["adapter"]
            print(
                f"vLLM, the same prompts: merged sync {merged['sync']:.3f} s, generate {merged['generate']:.3f} s; "
                f"adapter sync {adapter['sync']:.3f} s, generate {adapter['generate']:.3f} s "
                f"(adapter / merged generate {adapter['generate'] / merged['generate']:.2f}x)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
