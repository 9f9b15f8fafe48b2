"""The kernels of one Qwen forward+backward, JAX against torch, one at a time.

`scripts/bench_model.py` times the whole model; this script times its pieces
on the same shapes, to say where the difference comes from:

- every matmul of a forward+backward step: for each projection `[N, in] @
  [in, out]` (q, k, v, o, gate, up, down, lm_head; N = batch x tokens), its
  forward product, its input gradient `dy @ W^T` and its weight gradient
  `x^T @ dy`, each one jitted `jnp` dot against one `torch` matmul on the same
  float32 arrays;
- attention: `mathrl_jax.models.attention.causal_attention` (forward, and forward +
  backward) against `torch.nn.functional.scaled_dot_product_attention(...,
  is_causal=True, enable_gqa=True)`, the kernel `transformers` runs with
  `attn_implementation="sdpa"`.

Each row is a median over `--repeats` interleaved JAX / torch calls on the
same threads (the process is pinned to `--threads` cores, as in
bench_model.py), after warm-up. `count` is how many times one forward+backward
of the model runs that kernel; the last rows weight each kernel by its count,
giving what a model made of only these kernels would measure. What it leaves
out (RMSNorm, RoPE, SwiGLU, residual adds, layout copies, the loss) is the
rest of bench_model.py's time.

    python scripts/bench_kernels.py                    # the `tiny` preset of bench_model.py
    python scripts/bench_kernels.py --preset project-tiny
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys

from benchmarks import model as bench_model  # presets, thread pinning, timing


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(bench_model.PRESETS), default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for both sides (default: all)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--xla-flags", default="", help="extra XLA_FLAGS for the JAX side")
    args = parser.parse_args(argv)
    for key in ("batch", "length", "repeats"):
        if getattr(args, key) < 1:
            raise bench_model.UsageError(f"--{key}={getattr(args, key)}; expected a positive integer")
    if args.threads is None:
        args.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return args


def projections(shape: dict):
    """(name, n_in, n_out, count per forward+backward) of every linear layer of the model."""
    head_dim = shape["hidden"] // shape["heads"]
    q_out, kv_out = shape["heads"] * head_dim, shape["kv_heads"] * head_dim
    layers = shape["layers"]
    return [
        ("q_proj", shape["hidden"], q_out, layers),
        ("k_proj, v_proj", shape["hidden"], kv_out, 2 * layers),
        ("o_proj", q_out, shape["hidden"], layers),
        ("gate_proj, up_proj", shape["hidden"], shape["intermediate"], 2 * layers),
        ("down_proj", shape["intermediate"], shape["hidden"], layers),
        ("lm_head", shape["hidden"], shape["vocab"], 1),
    ]


def run(args):
    where = bench_model.set_threads(args.threads)
    if args.xla_flags:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from mathrl_jax.models.attention import causal_attention, full_sequence_attention

    torch.set_num_threads(args.threads)
    if jax.default_backend() != "cpu":
        raise bench_model.UsageError(f"bench_kernels compares CPU kernels; JAX runs on {jax.default_backend()}")
    shape = bench_model.PRESETS[args.preset]
    tokens = args.batch * args.length
    rng = np.random.default_rng(0)
    print(
        f"# bench_kernels: jax {jax.__version__}, torch {torch.__version__}, python {platform.python_version()} | "
        f"{bench_model.cpu_name()} | threads {args.threads} ({where}) | "
        f"{datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')} | load {bench_model.load_average()}"
    )
    print(
        f"# preset {args.preset} {shape} | batch {args.batch} x {args.length} tokens | float32 | median of "
        f"{args.repeats} interleaved"
    )

    def timed(jax_fn, torch_fn):
        for _ in range(2):
            jax_fn()
            torch_fn()
        times = bench_model.time_calls({"jax": jax_fn, "torch": torch_fn}, args.repeats, "interleaved")
        return 1e3 * statistics.median(times["jax"]), 1e3 * statistics.median(times["torch"])

    rows = []  # (kernel, shape, count, jax ms, torch ms)
    nt = (((1,), (1,)), ((), ()))  # dy [N, out] . W [in, out] over `out`
    tn = (((0,), (0,)), ((), ()))  # x [N, in] . dy [N, out] over N
    forward = jax.jit(lambda x, w: x @ w)
    input_grad = jax.jit(lambda dy, w: jax.lax.dot_general(dy, w, nt))
    weight_grad = jax.jit(lambda x, dy: jax.lax.dot_general(x, dy, tn))
    for name, n_in, n_out, count in projections(shape):
        x, w, dy = (rng.standard_normal(s, dtype=np.float32) for s in ((tokens, n_in), (n_in, n_out), (tokens, n_out)))
        jx, jw, jdy = jnp.asarray(x), jnp.asarray(w), jnp.asarray(dy)
        tx, tw, tdy = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(dy)
        for kernel, jax_call, torch_call, dims in (
            (
                "x @ W",
                lambda: forward(jx, jw).block_until_ready(),
                lambda: tx @ tw,
                f"{tokens}x{n_in} @ {n_in}x{n_out}",
            ),
            (
                "dy @ W^T",
                lambda: input_grad(jdy, jw).block_until_ready(),
                lambda: tdy @ tw.T,
                f"{tokens}x{n_out} @ ({n_in}x{n_out})^T",
            ),
            (
                "x^T @ dy",
                lambda: weight_grad(jx, jdy).block_until_ready(),
                lambda: tx.T @ tdy,
                f"({tokens}x{n_in})^T @ {tokens}x{n_out}",
            ),
        ):
            rows.append((f"{name}: {kernel}", dims, count, *timed(jax_call, torch_call)))

    heads, kv_heads = shape["heads"], shape["kv_heads"]
    head_dim = shape["hidden"] // heads
    q = rng.standard_normal((args.batch, args.length, heads, head_dim), dtype=np.float32)
    k, v = (rng.standard_normal((args.batch, args.length, kv_heads, head_dim), dtype=np.float32) for _ in range(2))
    weights = rng.standard_normal(q.shape, dtype=np.float32)
    _, allowed = full_sequence_attention(jnp.zeros((args.batch, args.length), jnp.int32))
    jq, jk, jv, jweights = map(jnp.asarray, (q, k, v, weights))
    attend = jax.jit(lambda q, k, v: causal_attention(q, k, v, allowed))
    attend_grad = jax.jit(
        jax.grad(lambda q, k, v: jnp.sum(causal_attention(q, k, v, allowed) * jweights), argnums=(0, 1, 2))
    )
    heads_first = lambda a: torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1, 3)))  # torch: [B, H, T, d]
    tq, tk, tv, tweights = map(heads_first, (q, k, v, weights))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    np.testing.assert_allclose(  # the same function on both sides, before timing it
        np.asarray(attend(jq, jk, jv)).transpose(0, 2, 1, 3),
        sdpa(tq, tk, tv, is_causal=True, enable_gqa=True).numpy(),
        atol=1e-4,
    )

    def torch_attend():
        with torch.inference_mode():
            sdpa(tq, tk, tv, is_causal=True, enable_gqa=True)

    leaves = [t.clone().requires_grad_() for t in (tq, tk, tv)]

    def torch_attend_grad():
        for leaf in leaves:
            leaf.grad = None
        (sdpa(*leaves, is_causal=True, enable_gqa=True) * tweights).sum().backward()

    dims = f"q {args.batch}x{args.length}x{heads}x{head_dim}, kv {kv_heads} heads, causal"
    layers = shape["layers"]
    rows.append(
        ("attention: forward", dims, layers, *timed(lambda: attend(jq, jk, jv).block_until_ready(), torch_attend))
    )
    rows.append(
        (
            "attention: forward+backward",
            dims,
            layers,
            *timed(lambda: jax.block_until_ready(attend_grad(jq, jk, jv)), torch_attend_grad),
        )
    )

    print()
    print("| kernel | shape | count | JAX ms | torch ms | JAX / torch |")
    print("|---|---|---:|---:|---:|---:|")
    for kernel, dims, count, jax_ms, torch_ms in rows:
        print(f"| {kernel} | {dims} | {count} | {jax_ms:.2f} | {torch_ms:.2f} | {torch_ms / jax_ms:.2f}x |")
    matmuls = [r for r in rows if not r[0].startswith("attention")]
    attention = [r for r in rows if r[0] == "attention: forward+backward"]
    print()
    print("Weighted by count over one forward+backward (JAX / torch = torch time / JAX time):")
    for label, group in (("matmuls", matmuls), ("attention", attention), ("matmuls + attention", matmuls + attention)):
        jax_total = sum(r[2] * r[3] for r in group)
        torch_total = sum(r[2] * r[4] for r in group)
        print(f"- {label}: JAX {jax_total:.1f} ms, torch {torch_total:.1f} ms, {torch_total / jax_total:.2f}x")
    print(f"- load average at the end: {bench_model.load_average()}")


def main(argv=None):
    try:
        args = parse_args(argv)
        run(args)
    except bench_model.UsageError as error:
        print(f"bench_kernels: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
