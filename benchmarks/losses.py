"""Benchmark of mathrl_jax.losses against eager NumPy, in one run.

For each loss / estimator: median wall time of the jitted JAX function (and of
its gradient, for losses) against an eager NumPy implementation of the same
formula (and its hand-derived gradient), at realistic sizes. For the chunked
log-prob path: the peak memory during the call against the size of the
logits, measured two ways (XLA's compiled memory analysis, and the process's
peak resident memory in a fresh subprocess), next to the unchunked
`log_softmax` formula.

    python scripts/bench_losses.py                # B=64, T=2048; logits 8 x 1024 x 151936
    python scripts/bench_losses.py --quick        # small sizes, a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from mathrl_jax import losses
from mathrl_jax.losses.logprobs import default_chunk_rows

# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------


SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench_losses.py")
"""This benchmark's command line, which its child processes run."""


def median_seconds(fn, repeats):
    """Median wall time of `fn()` after one warm-up call (which also compiles)."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ---------------------------------------------------------------------------
# eager NumPy implementations of the same formulas (token-mean aggregation)
# ---------------------------------------------------------------------------


def np_ppo(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, grad=False):
    ratio = np.exp(np.clip(logp - old, -20, 20))
    unclipped = -adv * ratio
    clipped = -adv * np.clip(ratio, 1 - eps_low, 1 + eps_high)
    den = mask.sum()
    loss = (np.maximum(unclipped, clipped) * mask).sum() / den
    if not grad:
        return loss
    return loss, np.where(clipped > unclipped, 0.0, -adv * ratio) * mask / den


def np_decoupled(logp, behav, prox, adv, mask, cap=5.0, grad=False):
    ratio = np.exp(np.clip(logp - prox, -20, 20))
    weight = np.exp(np.clip(prox - behav, -20, 20))
    weight = np.where(weight <= cap, weight, 0.0)
    unclipped = -adv * ratio
    clipped = -adv * np.clip(ratio, 0.8, 1.2)
    den = mask.sum()
    loss = (weight * np.maximum(unclipped, clipped) * mask).sum() / den
    if not grad:
        return loss
    return loss, weight * np.where(clipped > unclipped, 0.0, -adv * ratio) * mask / den


def np_gspo(logp, old, adv, mask, eps_low=3e-4, eps_high=4e-4, grad=False):
    lengths = np.maximum(mask.sum(-1, keepdims=True), 1)
    seq_ratio = np.exp(np.minimum(((logp - old) * mask).sum(-1, keepdims=True) / lengths, 10.0))
    unclipped = -adv * seq_ratio
    clipped = -adv * np.clip(seq_ratio, 1 - eps_low, 1 + eps_high)
    num_seqs = (mask.sum(-1) > 0).sum()
    loss = ((np.maximum(unclipped, clipped) * mask).sum(-1) / lengths[:, 0]).sum() / num_seqs
    if not grad:
        return loss
    return loss, np.where(clipped > unclipped, 0.0, -adv * seq_ratio) * mask / lengths / num_seqs


def np_reinforce(logp, adv, mask, grad=False):
    den = mask.sum()
    loss = (-adv * logp * mask).sum() / den
    return (loss, -adv * mask / den) if grad else loss


def np_kl_k3(logp, ref, mask, grad=False):
    log_r = np.clip(ref - logp, -20, 20)
    kl = np.clip(np.exp(log_r) - log_r - 1, -10, 10)
    den = mask.sum()
    loss = (kl * mask).sum() / den
    return (loss, (1.0 - np.exp(log_r)) * mask / den) if grad else loss


def np_value_huber(values, old_values, returns, mask, clip=0.2, delta=10.0, grad=False):
    def huber(e):
        return np.where(np.abs(e) <= delta, 0.5 * e * e, delta * (np.abs(e) - 0.5 * delta))

    clipped_values = old_values + np.clip(values - old_values, -clip, clip)
    unclipped_loss, clipped_loss = huber(returns - values), huber(returns - clipped_values)
    den = mask.sum()
    loss = (np.maximum(unclipped_loss, clipped_loss) * mask).sum() / den
    if not grad:
        return loss
    inside = np.abs(values - old_values) < clip
    grad_unclipped = -np.clip(returns - values, -delta, delta)
    grad_clipped = np.where(inside, -np.clip(returns - clipped_values, -delta, delta), 0.0)
    return loss, np.where(clipped_loss > unclipped_loss, grad_clipped, grad_unclipped) * mask / den


def np_gae(rewards, values, mask, gamma=1.0, lam=0.95):
    # Plain GAE is the action-decomposed recursion with every token an action end.
    return np_action_decomposed_gae(rewards, values, np.ones_like(mask), mask, gamma, lam)


def np_action_decomposed_gae(rewards, values, ends, mask, gamma=0.99, lam=0.95):
    batch, length = rewards.shape
    adv = np.zeros_like(rewards)
    next_value = np.zeros(batch, rewards.dtype)
    next_adv = np.zeros(batch, rewards.dtype)
    for t in range(length - 1, -1, -1):
        m = mask[:, t] > 0
        g = np.where(ends[:, t] > 0, gamma, 1.0)
        a = rewards[:, t] + g * next_value - values[:, t] + g * lam * next_adv
        adv[:, t] = np.where(m, a, 0.0)
        next_value = np.where(m, values[:, t], next_value)
        next_adv = np.where(m, a, next_adv)
    return adv, (adv + values) * mask


def np_grpo(scores, group_size, eps=1e-6):
    grouped = scores.reshape(-1, group_size)
    return ((grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, ddof=1, keepdims=True) + eps)).reshape(-1)


def np_reinforce_pp(rewards, mask, gamma=1.0):
    returns = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[0], rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = np.where(mask[:, t] > 0, rewards[:, t] + gamma * running, running)
        returns[:, t] = running * mask[:, t]
    n = mask.sum()
    mean = (returns * mask).sum() / n
    var = (((returns - mean) * mask) ** 2).sum() / (n - 1)
    return (returns - mean) / np.sqrt(var + 1e-8) * mask


def np_chunked_logprobs(logits, tokens, chunk=128, with_grad=False):
    """Eager NumPy of the same chunked formula (a full-size copy would not fit at V = 151,936)."""
    flat = logits.reshape(-1, logits.shape[-1])
    flat_tokens = tokens.reshape(-1)
    logp = np.empty(flat.shape[0], np.float32)
    entropy = np.empty(flat.shape[0], np.float32)
    grad = np.empty_like(flat) if with_grad else None
    for start in range(0, flat.shape[0], chunk):
        rows = flat[start : start + chunk]
        shifted = rows - rows.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        probs = np.exp(log_probs)
        idx = flat_tokens[start : start + chunk]
        logp[start : start + chunk] = log_probs[np.arange(len(idx)), idx]
        entropy[start : start + chunk] = -(probs * log_probs).sum(-1)
        if with_grad:  # d/dz of sum(logp): one_hot - p
            g = -probs
            g[np.arange(len(idx)), idx] += 1.0
            grad[start : start + chunk] = g
    return logp, entropy, grad


def np_logprobs_from_hidden(hidden, kernel, tokens, chunk=512):
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = np.empty(flat.shape[0], np.float32)
    flat_tokens = tokens.reshape(-1)
    for start in range(0, flat.shape[0], chunk):
        z = flat[start : start + chunk] @ kernel
        z = z - z.max(-1, keepdims=True)
        log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
        out[start : start + chunk] = log_probs[np.arange(len(z)), flat_tokens[start : start + chunk]]
    return out


# ---------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------


def token_inputs(batch, length, seed=0):
    rng = np.random.RandomState(seed)
    f32 = lambda x: x.astype(np.float32)
    lengths = rng.randint(length // 4, length + 1, size=batch)
    mask = f32(np.arange(length)[None, :] < lengths[:, None])
    logp = f32(-np.abs(rng.randn(batch, length)) - 0.1)
    return dict(
        logp=logp,
        old=f32(logp + 0.1 * rng.randn(batch, length)),
        prox=f32(logp + 0.05 * rng.randn(batch, length)),
        ref=f32(logp + 0.1 * rng.randn(batch, length)),
        adv=f32(rng.randn(batch, length)),
        mask=mask,
        values=f32(rng.randn(batch, length)),
        old_values=f32(rng.randn(batch, length) * 0.1),
        returns=f32(rng.randn(batch, length)),
        rewards=f32((rng.rand(batch, length) < 0.01) * rng.randn(batch, length)),
        ends=f32(rng.rand(batch, length) < 0.05),
        scores=f32(rng.rand(batch) < 0.5),
    )


def loss_cases(d, group_size):
    j = {k: jnp.asarray(v) for k, v in d.items()}
    batch = d["scores"].shape[0]
    group_ids = jnp.repeat(jnp.arange(batch // group_size), group_size)
    return [
        (
            "ppo_clip_loss (clip-higher)",
            lambda x: losses.ppo_clip_loss(x, j["old"], j["adv"], j["mask"], clip_low=0.2, clip_high=0.28)[0],
            lambda grad=False: np_ppo(d["logp"], d["old"], d["adv"], d["mask"], grad=grad),
        ),
        (
            "decoupled_ppo_loss (AReaL)",
            lambda x: losses.decoupled_ppo_loss(
                x, j["old"], j["adv"], j["mask"], proximal_logprobs=j["prox"], behaviour_weight_cap=5.0
            )[0],
            lambda grad=False: np_decoupled(d["logp"], d["old"], d["prox"], d["adv"], d["mask"], grad=grad),
        ),
        (
            "gspo_loss",
            lambda x: losses.gspo_loss(x, j["old"], j["adv"], j["mask"])[0],
            lambda grad=False: np_gspo(d["logp"], d["old"], d["adv"], d["mask"], grad=grad),
        ),
        (
            "reinforce_loss",
            lambda x: losses.reinforce_loss(x, j["old"], j["adv"], j["mask"])[0],
            lambda grad=False: np_reinforce(d["logp"], d["adv"], d["mask"], grad=grad),
        ),
        (
            "kl_loss (k3)",
            lambda x: losses.kl_loss(x, j["ref"], j["mask"], kind="k3")[0],
            lambda grad=False: np_kl_k3(d["logp"], d["ref"], d["mask"], grad=grad),
        ),
        (
            "clipped_value_loss (huber)",
            lambda x: losses.clipped_value_loss(x, j["old_values"], j["returns"], j["mask"], loss_type="huber")[0],
            lambda grad=False: np_value_huber(d["values"], d["old_values"], d["returns"], d["mask"], grad=grad),
            "values",
        ),
        (
            "gae_advantages",
            lambda: losses.gae_advantages(j["rewards"], j["values"], j["mask"], gamma=1.0, lam=0.95),
            lambda: np_gae(d["rewards"], d["values"], d["mask"]),
        ),
        (
            "action_decomposed_gae (POAD)",
            lambda: losses.action_decomposed_gae(j["rewards"], j["values"], j["ends"], j["mask"], gamma=0.99, lam=0.95),
            lambda: np_action_decomposed_gae(d["rewards"], d["values"], d["ends"], d["mask"]),
        ),
        (
            "group_relative_advantages",
            lambda: losses.group_relative_advantages(j["scores"], group_ids),
            lambda: np_grpo(d["scores"], group_size),
        ),
        (
            "reinforce_plus_plus_advantages",
            lambda: losses.reinforce_plus_plus_advantages(j["rewards"], j["mask"]),
            lambda: np_reinforce_pp(d["rewards"], d["mask"]),
        ),
    ]


def bench_losses(batch, length, repeats, group_size=8):
    d = token_inputs(batch, length)
    rows = []
    for case in loss_cases(d, group_size):
        name, jax_fn, np_fn = case[:3]
        wrt = case[3] if len(case) > 3 else "logp"
        np_time = median_seconds(np_fn, repeats)
        if jax_fn.__code__.co_argcount == 0:  # an estimator: no gradient
            fwd = jax.jit(jax_fn)
            rows.append((name, f"{batch}x{length}", median_seconds(fwd, repeats), np_time, None, None))
            continue
        x = jnp.asarray(d[wrt])
        fwd, grad = jax.jit(jax_fn), jax.jit(jax.grad(jax_fn))
        # Check the two implementations agree before timing them.
        np_loss, np_grad = np_fn(grad=True)
        np.testing.assert_allclose(float(fwd(x)), np_loss, rtol=2e-4, atol=1e-6)
        np.testing.assert_allclose(np.asarray(grad(x)), np_grad, rtol=2e-3, atol=1e-9)
        jax_fwd = median_seconds(lambda: fwd(x), repeats)
        jax_grad = median_seconds(lambda: grad(x), repeats)
        np_grad_time = median_seconds(lambda: np_fn(grad=True), repeats)
        rows.append((name, f"{batch}x{length}", jax_fwd, np_time, jax_grad, np_grad_time))
    return rows


def bench_logprobs(batch, length, vocab, repeats, chunk_size):
    rng = np.random.RandomState(0)
    tokens_np = rng.randint(0, vocab, (batch, length)).astype(np.int32)
    tokens = jnp.asarray(tokens_np)
    logits = jax.jit(lambda k: jax.random.normal(k, (batch, length, vocab), jnp.float32) * 3.0)(jax.random.PRNGKey(0))
    fwd = jax.jit(lambda l: losses.token_logprobs_from_logits(l, tokens, chunk_size=chunk_size))
    grad = jax.jit(jax.grad(lambda l: losses.token_logprobs_from_logits(l, tokens, chunk_size=chunk_size)[0].sum()))
    jax_fwd = median_seconds(lambda: fwd(logits), repeats)
    jax_grad = median_seconds(lambda: grad(logits), max(1, repeats // 2))
    logits_np = np.asarray(logits)
    np_fwd = median_seconds(lambda: np_chunked_logprobs(logits_np, tokens_np, chunk_size)[0], max(1, repeats // 2))
    np_grad = median_seconds(lambda: np_chunked_logprobs(logits_np, tokens_np, chunk_size, True)[2], 1)
    shape = f"{batch}x{length}x{vocab}"
    return [("token_logprobs_from_logits", shape, jax_fwd, np_fwd, jax_grad, np_grad)]


def bench_from_hidden(batch, length, dim, vocab, repeats):
    rng = np.random.RandomState(1)
    hidden_np = rng.randn(batch, length, dim).astype(np.float32)
    kernel_np = (rng.randn(dim, vocab) / np.sqrt(dim)).astype(np.float32)
    tokens_np = rng.randint(0, vocab, (batch, length)).astype(np.int32)
    hidden, kernel, tokens = map(jnp.asarray, (hidden_np, kernel_np, tokens_np))
    fn = lambda h, w: losses.token_logprobs_from_hidden(h, w, tokens)[0].sum()
    fwd, grad = jax.jit(fn), jax.jit(jax.grad(fn, argnums=(0, 1)))
    jax_fwd = median_seconds(lambda: fwd(hidden, kernel), repeats)
    jax_grad = median_seconds(lambda: grad(hidden, kernel), max(1, repeats // 2))
    np_fwd = median_seconds(lambda: np_logprobs_from_hidden(hidden_np, kernel_np, tokens_np), max(1, repeats // 2))
    return [("token_logprobs_from_hidden", f"{batch}x{length}x{dim}->{vocab}", jax_fwd, np_fwd, jax_grad, None)]


# ---------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------


def _rss_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_probe(path, batch, length, vocab, chunk_size):
    """Runs in a fresh subprocess: peak RSS during one call, relative to the logits."""
    tokens = jnp.zeros((batch, length), jnp.int32)
    logits = jax.jit(lambda: jnp.full((batch, length, vocab), 0.5, jnp.float32))()
    if path == "chunked":
        fn = jax.jit(lambda l: losses.token_logprobs_from_logits(l, tokens, chunk_size=chunk_size))
    else:

        def fn(l):
            log_probs = jax.nn.log_softmax(l.astype(jnp.float32), axis=-1)
            taken = jnp.take_along_axis(log_probs, tokens[..., None], -1)[..., 0]
            return taken, -jnp.sum(jnp.exp(log_probs) * log_probs, -1)

        fn = jax.jit(fn)
    compiled = fn.lower(logits).compile()
    analysis = compiled.memory_analysis()
    jax.block_until_ready(compiled(logits))  # first call: allocator warm-up
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _rss_bytes("VmRSS")
    jax.block_until_ready(compiled(logits))
    peak = _rss_bytes("VmHWM")
    logits_bytes = batch * length * vocab * 4
    return {
        "logits_bytes": logits_bytes,
        "peak_over_logits": (peak - before + logits_bytes) / logits_bytes,
        "xla_peak_over_logits": (
            analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
        )
        / logits_bytes,
    }


def bench_memory(batch, length, vocab, chunk_size):
    rows = []
    for path in ("chunked", "log_softmax"):
        out = subprocess.run(
            [
                sys.executable,
                SCRIPT,
                "--memory-probe",
                path,
                "--logits-batch",
                str(batch),
                "--logits-length",
                str(length),
                "--vocab",
                str(vocab),
                "--chunk-size",
                str(chunk_size),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append((path, json.loads(out.stdout.strip().splitlines()[-1])))
    return rows


# ---------------------------------------------------------------------------


def fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def fmt_ratio(numpy_s, jax_s):
    return "-" if numpy_s is None or jax_s is None else f"{numpy_s / jax_s:.1f}x"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--logits-batch", type=int, default=8)
    parser.add_argument("--logits-length", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden-size", type=int, default=896)
    parser.add_argument("--chunk-size", type=int, default=None, help="default: the library's default_chunk_rows(vocab)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--memory-probe", choices=["chunked", "log_softmax"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.batch, args.length, args.repeats = 8, 256, 2
        args.logits_batch, args.logits_length, args.vocab, args.hidden_size = 2, 64, 4096, 64
    if args.chunk_size is None:
        args.chunk_size = default_chunk_rows(args.vocab)
    if args.memory_probe:
        print(
            json.dumps(
                memory_probe(args.memory_probe, args.logits_batch, args.logits_length, args.vocab, args.chunk_size)
            )
        )
        return

    print(
        f"# bench_losses: jax {jax.__version__} on {jax.devices()[0].platform} "
        f"({os.cpu_count()} cpus, {platform.processor() or platform.machine()}), numpy {np.__version__}"
    )
    rows = bench_losses(args.batch, args.length, args.repeats)
    rows += bench_logprobs(args.logits_batch, args.logits_length, args.vocab, args.repeats, args.chunk_size)
    # From hidden states: a quarter of the logits batch keeps the NumPy matmul baseline short.
    rows += bench_from_hidden(
        max(1, args.logits_batch // 4), args.logits_length, args.hidden_size, args.vocab, args.repeats
    )
    print()
    print(
        "| function | shape | jax fwd ms | numpy fwd ms | fwd speed-up | jax grad ms | numpy grad ms | grad speed-up |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, shape, jax_fwd, np_fwd, jax_grad, np_grad in rows:
        print(
            f"| {name} | {shape} | {fmt_ms(jax_fwd)} | {fmt_ms(np_fwd)} | {fmt_ratio(np_fwd, jax_fwd)} "
            f"| {fmt_ms(jax_grad)} | {fmt_ms(np_grad)} | {fmt_ratio(np_grad, jax_grad)} |"
        )
    print(
        "\nNumPy gradients are hand-derived and computed with the loss; JAX gradients are jax.grad of the jitted loss."
    )
    if not args.skip_memory:
        print(
            f"\nPeak memory of one forward call, logits {args.logits_batch}x{args.logits_length}x{args.vocab} "
            f"float32, chunk {args.chunk_size} rows:\n"
        )
        print("| path | logits GB | peak / logits (process RSS) | peak / logits (XLA analysis) |")
        print("|---|---:|---:|---:|")
        for path, m in bench_memory(args.logits_batch, args.logits_length, args.vocab, args.chunk_size):
            print(
                f"| {path} | {m['logits_bytes'] / 1e9:.2f} | {m['peak_over_logits']:.3f} "
                f"| {m['xla_peak_over_logits']:.3f} |"
            )


if __name__ == "__main__":
    main()
