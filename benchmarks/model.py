"""Benchmark of the JAX Qwen model against PyTorch `transformers`, in one run.

Both sides run the same model: a random Qwen2 config is built with
`transformers`, its float32 weights are saved with `save_pretrained` and read
into JAX with `mathrl_jax.models.hf.load_model`; the logits (and, for
forward+backward, the loss and the gradient norm) are compared once before
any timing. Then, on the same batch and with the same number of CPU threads:

- forward: the `[B, T, V]` logits of a `[B, T]` batch with an attention mask
  (jitted JAX; torch under `inference_mode`);
- forward+backward: loss = -mean log p(next token) (log_softmax cross-entropy
  on shifted tokens, in float32) and its gradient with respect to every
  parameter (JAX: `jax.jit(jax.value_and_grad)` over the `nnx.Param` state;
  torch: `model.train()` with dropout 0, `loss.backward()`, gradients set to
  None between repetitions). A second JAX row computes the same loss with the
  library's chunked `losses.token_logprobs_from_logits` (which also returns the
  entropy), against the same torch time.

Warm-up calls (JIT compilation) are excluded; each side is timed `--repeats`
times, JAX and torch calls interleaved so that load from other processes falls
on both, each call started `SETTLE_SECONDS` after the previous one ended (so
that neither side shares the cores with the other's still-spinning thread
pool), and tokens/s = B * T / median seconds. The ratio of each repetition's
back-to-back pair is also printed (median and range): the steadier number on a
shared machine. `scripts/bench_kernels.py` times the model's matmuls and
attention one at a time on the same shapes: where the difference comes from.

Threads: `n` (default `os.cpu_count()`) is applied to both sides by restricting
the process's CPU affinity to `n` cores before JAX starts (XLA's CPU client
sizes its thread pool from the schedulable CPUs; XLA_FLAGS has no thread-count
flag in jax 0.10: `intra_op_parallelism_threads` is a TensorFlow option that
XLA rejects or ignores), plus `torch.set_num_threads(n)` and `OMP_NUM_THREADS`.

On a GPU backend (`jax.default_backend() == "gpu"`) the JAX forward+backward
is also reported as model FLOPs utilisation: flops/token = 6 * N + 12 * L * H * T
(N: parameters outside the input embedding table, the output projection
included; L layers; H = heads * head_dim; T tokens), over `--peak-tflops`.
torch is timed only where it runs on the same kind of device as JAX (the
parity check then uses one row of the batch, with torch on the CPU).

Reading the numbers: run on an otherwise idle machine. When another process
holds a core, torch's OpenMP threads stall each other (a 2-thread torch step
was measured 3-30x slower under such load while XLA slowed far less), which
inflates JAX / torch; the last line says how much CPU other processes used
while timing and flags a disturbed run. `--threads 1` is far less sensitive to
such load (no thread waits for a descheduled sibling) when no idle machine is
at hand.

    python scripts/bench_model.py                      # tiny Qwen2, B=8, T=256, float32
    python scripts/bench_model.py --dtype bfloat16
    python scripts/bench_model.py --quick              # smoke run
    python scripts/bench_model.py --preset qwen2.5-0.5b-shape --dtype bfloat16   # on a GPU
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time

from benchmarks.shapes import SHAPES  # noqa: E402

PRESETS = {
    # A small model with realistic proportions (head_dim 64, intermediate = 4 x hidden).
    "tiny": dict(vocab=128, hidden=256, intermediate=1024, layers=4, heads=4, kv_heads=2, tie=False),
    # The shape of `mathrl_jax.models.tiny` (the offline checkpoint) over a 128-token vocabulary.
    "project-tiny": dict(vocab=128, hidden=128, intermediate=384, layers=4, heads=4, kv_heads=2, tie=False),
    # Qwen2.5-0.5B's shape (random weights): for GPU runs.
    "qwen2.5-0.5b-shape": dict(
        vocab=SHAPES["qwen2.5-0.5b"]["vocab_size"],
        hidden=SHAPES["qwen2.5-0.5b"]["hidden_size"],
        intermediate=SHAPES["qwen2.5-0.5b"]["intermediate_size"],
        layers=SHAPES["qwen2.5-0.5b"]["num_hidden_layers"],
        heads=SHAPES["qwen2.5-0.5b"]["num_attention_heads"],
        kv_heads=SHAPES["qwen2.5-0.5b"]["num_key_value_heads"],
        tie=SHAPES["qwen2.5-0.5b"]["tie_word_embeddings"],
    ),
}


class UsageError(ValueError):
    """A bad command-line value; printed without a traceback."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model shape (default: tiny)")
    for name, help_ in (
        ("vocab", "vocabulary size"),
        ("hidden", "hidden size"),
        ("intermediate", "MLP intermediate size"),
        ("layers", "decoder layers"),
        ("heads", "attention heads"),
        ("kv-heads", "key/value heads"),
    ):
        parser.add_argument(f"--{name}", type=int, default=None, help=f"{help_} (default: the preset's)")
    parser.add_argument("--tie-word-embeddings", choices=["true", "false"], default=None)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256, help="tokens per sequence")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="compute and parameter dtype on both sides (loss in float32)",
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for both sides (default: cpu_count)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per side before timing")
    parser.add_argument("--remat", action="store_true", help="JAX: rematerialise each decoder layer")
    parser.add_argument(
        "--torch-attn",
        choices=["sdpa", "eager"],
        default="sdpa",
        help="transformers attention implementation (default: sdpa)",
    )
    parser.add_argument(
        "--schedule",
        choices=["interleaved", "blocked"],
        default="interleaved",
        help="interleave JAX and torch repetitions (default) or time each side in one block",
    )
    parser.add_argument("--xla-flags", default="", help="extra XLA_FLAGS for the JAX side (e.g. for experiments)")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=989.0,
        help="device peak for the GPU MFU row (default: 989, H100 bf16 dense)",
    )
    parser.add_argument("--no-torch", action="store_true", help="time JAX only (torch still checks parity)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny batch and few repeats: a smoke run")
    args = parser.parse_args(argv)

    preset = PRESETS[args.preset]
    for key in ("vocab", "hidden", "intermediate", "layers", "heads"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    if args.kv_heads is None:
        args.kv_heads = preset["kv_heads"]
    args.tie = preset["tie"] if args.tie_word_embeddings is None else args.tie_word_embeddings == "true"
    if args.quick:
        args.batch, args.length, args.repeats, args.warmup = 2, 32, 2, 1
    if args.threads is None:
        args.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    positive = ("vocab", "hidden", "intermediate", "layers", "heads", "kv_heads", "batch", "repeats", "threads")
    for key in positive:
        if getattr(args, key) < 1:
            raise UsageError(f"--{key.replace('_', '-')}={getattr(args, key)}; expected a positive integer")
    if args.length < 2:
        raise UsageError(f"--length={args.length}; expected at least 2 (the loss scores the next token)")
    if args.warmup < 1:
        raise UsageError(f"--warmup={args.warmup}; expected at least 1 (the first call compiles)")
    if args.hidden % args.heads:
        raise UsageError(f"--hidden={args.hidden} is not a multiple of --heads={args.heads}")
    if (args.hidden // args.heads) % 2:
        raise UsageError(f"head_dim = hidden / heads = {args.hidden // args.heads}; RoPE needs it even")
    if args.heads % args.kv_heads:
        raise UsageError(f"--heads={args.heads} is not a multiple of --kv-heads={args.kv_heads}")
    if args.peak_tflops <= 0:
        raise UsageError(f"--peak-tflops={args.peak_tflops}; expected a positive number")
    return args


def set_threads(n: int) -> str:
    """Restricts this process (and so XLA's and torch's pools) to `n` cores; must run before JAX starts."""
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    if n > len(available):
        raise UsageError(f"--threads={n}, but only {len(available)} cores are available to this process")
    if n < len(available):
        os.sched_setaffinity(0, set(available[:n]))
    os.environ["OMP_NUM_THREADS"] = str(n)
    return f"cores {sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else available[:n]}"


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------


SETTLE_SECONDS = 0.05


def time_calls(calls, repeats, schedule, settle=SETTLE_SECONDS):
    """Per-side lists of wall times; `calls` maps a side to a zero-argument function that blocks until done.

    Each call starts `settle` seconds after the previous one ended: a thread
    pool spins for a while after its work (torch's OpenMP threads, XLA's pool),
    and a call started at once shares the cores with those spinning threads (a
    2048x256x1024 JAX matmul right after a torch call measured 1.6x slower).
    """
    times = {name: [] for name in calls}

    def once(name):
        time.sleep(settle)
        start = time.perf_counter()
        calls[name]()
        times[name].append(time.perf_counter() - start)

    if schedule == "interleaved":
        for _ in range(repeats):
            for name in calls:
                once(name)
    else:
        for name in calls:
            for _ in range(repeats):
                once(name)
    return times


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_usage():
    """(busy seconds of the whole machine, busy seconds of this process, wall time, cpus) or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return (sum(fields[:8]) - idle) / tick, own.user + own.system, time.monotonic(), os.cpu_count()


def other_processes_share(before, after) -> float:
    """Fraction of all cores busy with work of other processes between two `cpu_usage()` snapshots."""
    machine = after[0] - before[0]
    own = after[1] - before[1]
    wall = after[2] - before[2]
    return max(0.0, machine - own) / max(wall * after[3], 1e-9)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# ---------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------


def run(args):
    thread_note = set_threads(args.threads)
    if args.xla_flags:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()

    import flax
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    from flax import nnx

    from mathrl_jax import losses
    from mathrl_jax.models import hf

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    backend = jax.default_backend()
    torch_device = "cuda" if backend == "gpu" and torch.cuda.is_available() else "cpu"
    time_torch = not args.no_torch and (backend == "cpu") == (torch_device == "cpu")
    B, T = args.batch, args.length

    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    device = jax.devices()[0]
    device_name = (
        f"{backend} ({cpu_name()}, {os.cpu_count()} cpus)"
        if backend == "cpu"
        else (f"{backend} ({device.device_kind}); torch on {torch_device}")
    )
    print(
        f"# bench_model: jax {jax.__version__}, flax {flax.__version__}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, python {platform.python_version()} | device: {device_name} | "
        f"threads: {args.threads} ({thread_note}; torch.get_num_threads()={torch.get_num_threads()}, "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}) | {date} | load average {load_average()}"
    )

    config = transformers.Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(2048, T),
        rope_theta=1_000_000.0,
        tie_word_embeddings=args.tie,
        attention_dropout=0.0,
        use_sliding_window=False,
        attn_implementation=args.torch_attn,
    )
    torch_model = transformers.Qwen2ForCausalLM(config)  # float32, random (initializer_range 0.02)
    n_params = sum(p.numel() for p in torch_model.parameters())
    print(
        f"# model: Qwen2 ({args.preset}) vocab {args.vocab}, hidden {args.hidden}, intermediate {args.intermediate}, "
        f"layers {args.layers}, heads {args.heads} ({args.kv_heads} kv), tied {args.tie}, {n_params / 1e6:.2f}M "
        f"params | dtype {args.dtype} | batch {B} x {T} tokens | JAX remat {args.remat} | torch attention "
        f"{torch_model.config._attn_implementation} | median of {args.repeats} ({args.schedule}), "
        f"{args.warmup} warm-up"
    )
    with tempfile.TemporaryDirectory() as directory:
        torch_model.save_pretrained(directory)
        jax_model = hf.load_model(directory, dtype=args.dtype, param_dtype=args.dtype, remat=args.remat)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    torch_model = torch_model.to(device=torch_device, dtype=torch_dtype)

    graphdef, params, rest = nnx.split(jax_model, nnx.Param, ...)
    del jax_model

    rng = np.random.default_rng(args.seed)
    ids_np = rng.integers(0, args.vocab, size=(B, T), dtype=np.int64)
    mask_np = np.ones((B, T), np.int64)
    ids, mask = jnp.asarray(ids_np, jnp.int32), jnp.asarray(mask_np, jnp.int32)
    ids_t = torch.from_numpy(ids_np).to(torch_device)
    mask_t = torch.from_numpy(mask_np).to(torch_device)

    # ---- JAX ----------------------------------------------------------------
    def jax_logits(params, rest, ids, mask):
        logits, _ = nnx.merge(graphdef, params, rest)(ids, attention_mask=mask)
        return logits

    def jax_loss(params, rest, ids, mask):
        logits = jax_logits(params, rest, ids, mask)[:, :-1].astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0].mean()

    def jax_loss_library(params, rest, ids, mask):
        logits = jax_logits(params, rest, ids, mask)[:, :-1]
        logp, _ = losses.token_logprobs_from_logits(logits, ids[:, 1:])
        return -logp.mean()

    jax_forward = jax.jit(jax_logits)
    jax_grad = jax.jit(jax.value_and_grad(jax_loss))
    jax_grad_library = jax.jit(jax.value_and_grad(jax_loss_library))

    # ---- torch ----------------------------------------------------------------
    def torch_forward(ids_t=ids_t, mask_t=mask_t):
        torch_model.eval()
        with torch.inference_mode():
            return torch_model(input_ids=ids_t, attention_mask=mask_t, use_cache=False).logits

    def torch_grad(ids_t=ids_t, mask_t=mask_t):
        torch_model.train()
        torch_model.zero_grad(set_to_none=True)
        logits = torch_model(input_ids=ids_t, attention_mask=mask_t, use_cache=False).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        loss = -logp.gather(-1, ids_t[:, 1:, None]).squeeze(-1).mean()
        loss.backward()
        return loss.detach()

    def sync():
        if torch_device == "cuda":
            torch.cuda.synchronize()

    # ---- parity, once, before timing -------------------------------------------
    # On the timed batch; when torch is not timed (it runs on another device), on one row of it.
    rows = B if time_torch else 1
    p_ids, p_mask = ids[:rows], mask[:rows]
    with jax.default_matmul_precision("highest"):  # no TF32 on GPUs for the comparison
        logits_j = np.asarray(jax.jit(jax_logits)(params, rest, p_ids, p_mask), np.float32)
        loss_j, grads_j = jax.jit(jax.value_and_grad(jax_loss))(params, rest, p_ids, p_mask)
        loss_lib, _ = jax.jit(jax.value_and_grad(jax_loss_library))(params, rest, p_ids, p_mask)
        gnorm_j = float(jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads_j))))
    logits_t = torch_forward(ids_t[:rows], mask_t[:rows]).float().cpu().numpy()
    loss_t = torch_grad(ids_t[:rows], mask_t[:rows])
    sync()
    gnorm_t = float(torch.sqrt(sum(torch.sum(p.grad.float() ** 2) for p in torch_model.parameters())).cpu())
    torch_model.zero_grad(set_to_none=True)
    diff = float(np.max(np.abs(logits_j - logits_t)))
    scale = max(1.0, float(np.max(np.abs(logits_t))))
    grad_rel = abs(gnorm_j - gnorm_t) / max(gnorm_t, 1e-12)
    # Expected agreement: float32 ~1e-6 relative; bfloat16 ~1e-2. Far beyond it, the models differ.
    expected = 1e-3 if args.dtype == "float32" else 5e-2
    verdict = "ok" if diff <= expected * scale and grad_rel <= expected else "LARGER THAN EXPECTED for " + args.dtype
    print(
        f"# parity ({rows} x {T}): logits max |JAX - torch| = {diff:.2e} (max |logit| {scale:.2f}); loss JAX "
        f"{float(loss_j):.6f} (with token_logprobs_from_logits {float(loss_lib):.6f}), torch {float(loss_t):.6f}; "
        f"grad norm JAX {gnorm_j:.6f}, torch {gnorm_t:.6f}: {verdict}"
    )
    if diff > 0.5 * scale or grad_rel > 0.5:
        raise SystemExit(
            f"bench_model: the JAX and torch models disagree (logits diff {diff:.2e}, grad norm relative diff "
            f"{grad_rel:.2e}); not timing different models"
        )
    del logits_j, logits_t, grads_j

    # ---- timing ---------------------------------------------------------------
    def jax_call(fn):
        return lambda: jax.block_until_ready(fn(params, rest, ids, mask))

    def torch_call(fn):
        def call():
            fn()
            sync()

        return call

    passes = [
        ("forward", {"jax": jax_call(jax_forward), "torch": torch_call(torch_forward)}),
        ("forward+backward", {"jax": jax_call(jax_grad), "torch": torch_call(torch_grad)}),
        ("forward+backward, JAX loss via `token_logprobs_from_logits`", {"jax": jax_call(jax_grad_library)}),
    ]
    results = {}
    usage_before = cpu_usage()
    for name, calls in passes:
        if not time_torch:
            calls.pop("torch", None)
        for fn in calls.values():
            for _ in range(args.warmup):
                fn()
        results[name] = time_calls(calls, args.repeats, args.schedule)
        if name.startswith("forward+backward, JAX loss") and "torch" in results["forward+backward"]:
            results[name]["torch"] = results["forward+backward"]["torch"]  # the same torch pass

    usage_after = cpu_usage()
    tokens = B * T
    print()
    print("| pass | batch x tokens | JAX tokens/s | torch tokens/s | JAX / torch |")
    print("|---|---|---:|---:|---:|")
    for name, _ in passes:
        jax_s = statistics.median(results[name]["jax"])
        torch_times = results[name].get("torch")
        torch_s = statistics.median(torch_times) if torch_times else None
        torch_col = f"{tokens / torch_s:,.0f}" if torch_s else "n/a"
        ratio = f"{torch_s / jax_s:.2f}x" if torch_s else "n/a"
        print(f"| {name} | {B} x {T} | {tokens / jax_s:,.0f} | {torch_col} | {ratio} |")
    if backend == "gpu":
        flops = mfu_flops_per_token(params, args, T)
        jax_s = statistics.median(results["forward+backward"]["jax"])
        achieved = flops * tokens / jax_s / 1e12
        print(
            f"| MFU, forward+backward (JAX; {flops / 1e9:.2f} GFLOP/token, peak {args.peak_tflops:g} TFLOP/s) "
            f"| {B} x {T} | {achieved:.1f} TFLOP/s | - | {100 * achieved / args.peak_tflops:.1f}% MFU |"
        )
    print()
    print("Per call, milliseconds, median [min - max] over the timed repetitions:")
    for name, _ in passes:
        parts = []
        for side, times in results[name].items():
            parts.append(
                f"{side} {1e3 * statistics.median(times):.1f} [{1e3 * min(times):.1f} - {1e3 * max(times):.1f}]"
            )
        print(f"- {name}: " + "; ".join(parts))
    if args.schedule == "interleaved":
        for name, calls in passes:
            if "torch" not in calls:  # no torch call of its own to pair with
                continue
            pairs = paired_ratios(results[name]["jax"], results[name]["torch"])
            print(
                f"- {name}: JAX / torch of each repetition (the two calls back to back), median "
                f"{statistics.median(pairs):.2f}x [{min(pairs):.2f}x - {max(pairs):.2f}x]"
            )
    if not time_torch and not args.no_torch:
        print(f"- torch not timed: JAX runs on {backend}, torch on {torch_device}.")
    print(f"- load average at the end: {load_average()}")
    if usage_before and usage_after:
        other = other_processes_share(usage_before, usage_after)
        print(
            f"- CPU used by other processes while timing: {100 * other:.0f}% of the machine"
            + (" (results disturbed: rerun on an idle machine)" if other > 0.1 else "")
        )


def paired_ratios(jax_times, torch_times):
    """torch seconds / JAX seconds of each interleaved repetition: load that hits one pair hits both calls."""
    return [t / j for j, t in zip(jax_times, torch_times)]


def mfu_flops_per_token(params, args, length) -> float:
    """6 * N + 12 * L * H * T: N parameters outside the input embedding table (the output projection counted)."""
    import jax

    total = sum(x.size for x in jax.tree.leaves(params))
    embedding = args.vocab * args.hidden
    n = total - embedding + (embedding if args.tie else 0)  # a tied head is still a V x H matmul
    head_dim = args.hidden // args.heads
    return 6.0 * n + 12.0 * args.layers * args.heads * head_dim * length


def main(argv=None):
    try:
        args = parse_args(argv)
        run(args)
    except UsageError as e:
        print(f"bench_model: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
