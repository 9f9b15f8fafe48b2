"""Packed against padded: the GRPO update and the log-prob pass at a realistic spread of response lengths.

A small Qwen shape with random weights (default: hidden 512, 8 layers, vocabulary 32k) and a batch whose
response lengths are drawn from a long tail (log-normal, median 200, at most 1024 tokens, one row at the
maximum as a real batch has); every padded row is as wide as the longest. The same batch, the same
`UpdateConfig` and the same state go through the update (and the old-log-prob pass) padded and packed
(`config.packing`'s plan, as the training loop builds it), in one run. Printed: the padding ratio (padded
tokens / real tokens), each time, the speed-up, and the speed-up over the padding ratio (the issue's
target: at least 0.8).

    python scripts/bench_packing.py                       # the default shape; 6-18 minutes on a 2-core CPU
    python scripts/bench_packing.py --rows 32 --repeats 1  # 16 sequences per minibatch: whole rows weigh more

The default batch is 64 sequences in 2 minibatches: 32 sequences per minibatch step (a real GRPO minibatch
holds tens to hundreds), each step packed into whole rows as wide as the longest sequence, so a step wastes
about half a row: a share of the packed rows that grows as the steps get smaller (a twelfth of them with 16
sequences per step, a quarter with 8).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mathrl_jax.models import QwenForCausalLM
from mathrl_jax.models.qwen import QwenConfig
from mathrl_jax.train.state import create_train_state
from mathrl_jax.train.update import UpdateConfig, compute_logprobs_fn, make_update_fn, plan_passes, with_packing


def lengths_batch(rows: int, prompt: int, median: int, longest: int, vocab: int, seed: int):
    """A padded GRPO batch `[rows, prompt + longest]`: prompts of `prompt / 2 .. prompt` tokens, responses
    log-normal around `median` (sigma 0.8), clipped to [8, longest], the first at `longest`."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(prompt // 2, prompt + 1, rows)
    responses = np.clip(np.round(median * np.exp(0.8 * rng.standard_normal(rows))), 8, longest).astype(int)
    responses[0] = longest
    width = prompt + longest
    columns = np.arange(width)
    attention = ((columns >= prompt - prompts[:, None]) & (columns < prompt + responses[:, None])).astype(np.int32)
    response = ((columns >= prompt) & (columns < prompt + responses[:, None])).astype(np.float32)
    ids = (rng.integers(3, vocab, (rows, width)) * attention).astype(np.int32)
    batch = {
        "input_ids": ids,
        "attention_mask": attention,
        "response_mask": response,
        "old_logprobs": (-2.0 + 0.1 * rng.standard_normal((rows, width))).astype(np.float32) * response,
        "advantages": np.repeat(rng.standard_normal((rows, 1)), width, axis=1).astype(np.float32) * response,
    }
    return batch, int(attention.sum())


def seconds(fn, repeats: int):
    """(first call, median of `repeats` more): the first includes compiling."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return first, statistics.median(times), min(times), max(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64, help="sequences in the batch")
    parser.add_argument("--prompt", type=int, default=128, help="longest prompt")
    parser.add_argument("--median", type=int, default=200, help="median response length")
    parser.add_argument("--longest", type=int, default=1024, help="longest response")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--mini-batches", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=2, help="rows per padded micro-batch (the token budget)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    heads = max(args.hidden // 64, 2)
    config = QwenConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 4, 1),
        head_dim=64,
        max_position_embeddings=args.prompt + args.longest,
        tie_word_embeddings=True,
        architecture="Qwen2ForCausalLM",
    )
    graphdef, params = nnx.split(QwenForCausalLM(config, rngs=nnx.Rngs(args.seed)))
    optimizer = optax.adamw(1e-6)
    state = create_train_state(params, optimizer, seed=args.seed)
    cfg = UpdateConfig(num_mini_batch=args.mini_batches, micro_batch_size=args.micro_batch)
    update = make_update_fn(graphdef, optimizer, cfg, donate=False)
    host, real = lengths_batch(args.rows, args.prompt, args.median, args.longest, args.vocab, args.seed)
    width = host["input_ids"].shape[1]
    padded = {k: jnp.asarray(v) for k, v in host.items()}
    # The loop's plan (train/batch/_prepare.py `pack_shape`): rows of the batch width, micro-batches of the same tokens.
    shape = dict(row_tokens=width, max_rows_per_micro=args.micro_batch, rows_multiple=1)
    packed = with_packing(padded, state.rng, ppo_epoch=1, num_mini_batch=args.mini_batches, **shape)
    passes_plan = plan_passes(host["attention_mask"], width, max_rows_per_chunk=args.micro_batch)
    passes_plan = {k: jnp.asarray(v) for k, v in passes_plan.items()}
    logprobs = compute_logprobs_fn(graphdef, chunk_rows=args.micro_batch)

    ratio = args.rows * width / real
    results = {
        ("update", "padded"): seconds(lambda: update(state, padded)[1], args.repeats),
        ("update", "packed"): seconds(lambda: update(state, packed)[1], args.repeats),
        ("log-probs", "padded"): seconds(
            lambda: logprobs(state.params, padded["input_ids"], padded["attention_mask"]), args.repeats
        ),
        ("log-probs", "packed"): seconds(
            lambda: logprobs(state.params, padded["input_ids"], padded["attention_mask"], passes_plan), args.repeats
        ),
    }
    packed_rows = int((np.asarray(packed["packed"]["segment_ids"]) > 0).any(axis=-1).sum())
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    device = f"{jax.device_count()} x {jax.devices()[0].platform}"
    print(f"## Packed against padded ({datetime.date.today()}, {cpu}, {device})")
    print(
        f"model: hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}, random weights, float32; "
        f"{args.rows} sequences, prompts <= {args.prompt}, responses median {args.median} / max {args.longest}; "
        f"{args.mini_batches} minibatches, micro-batches of {args.micro_batch} padded rows' tokens"
    )
    print(
        f"padded: {args.rows} rows x {width} = {args.rows * width} tokens; real tokens {real}; packed into "
        f"{packed_rows} rows of {width}; **padding ratio {ratio:.2f}**\n"
    )
    print("| pass | padded (s) | packed (s) | speed-up | speed-up / padding ratio | first call padded / packed (s) |")
    print("|---|---|---|---|---|---|")
    for name in ("update", "log-probs"):
        pad, pack = results[(name, "padded")], results[(name, "packed")]
        speedup = pad[1] / pack[1]
        print(
            f"| {name} | {pad[1]:.3g} ({pad[2]:.3g}-{pad[3]:.3g}) | {pack[1]:.3g} ({pack[2]:.3g}-{pack[3]:.3g}) | "
            f"{speedup:.2f}x | {speedup / ratio:.2f} | {pad[0]:.1f} / {pack[0]:.1f} |"
        )
    print(f"\njax {jax.__version__}, python {platform.python_version()}")


if __name__ == "__main__":
    main()
