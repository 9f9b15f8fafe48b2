"""How close to the machine's limit each stage runs: the machine's matmul rate and copy bandwidth measured through
XLA, and the work (FLOPs, bytes) of mathrl_jax's stages counted by formula.

Measurements (jitted, inputs made on the device, warm-up call excluded, median of `repeats`):

- `matmul_rate`: `[n, n] @ [n, n]` in float32 or bfloat16, 2 n^3 FLOPs per call.
- `copy_bandwidth`: `x * 2` in place (donated) over a float32 array of `nbytes` (1 GiB by default: far past any
  cache); the bytes read plus the bytes written, 2 x nbytes per call.

Counts (the PaLM "model FLOPs" convention, Chowdhery et al. 2022, appendix B; Kaplan et al. 2020, section 2.1):

- N = the parameters of the matmuls a token goes through: every layer's q, k, v, o, gate, up and down projections
  and the output projection (lm_head, or the tied embedding used as it: its `[T, D] x [D, V]` matmul is real
  compute at a 151,936-token vocabulary); not the embedding lookup (a gather), nor the norms' weights and the
  biases (elementwise, O(D) per token).
- Attention, as PaLM counts it: Q K^T and the weighted sum over V, 2 x 2 x W FLOPs per attended position per layer
  (W = heads x head_dim), each token attending to its whole sequence (the causal mask's half is not subtracted,
  as PaLM's 12 L H Q T does not; XLA's dense attention computes it too). For sequences of lengths l_s that is
  4 L W sum_s l_s^2 forward.
- Forward (`logprob_flops`) = 2 N T + 4 L W sum_s l_s^2; forward + backward (`update_flops`) = 3 x that:
  6 N T + 12 L W sum_s l_s^2 (the backward's two matmuls per forward one). Remat's recomputed forward is not
  counted (MFU, not hardware FLOPs).
- Decoding (`decode_bytes`): a generation of n new tokens is n forward calls (the prefill, then n - 1 decode
  steps); each reads the weights once (`weight_bytes`: every parameter but an untied embedding table, of which a
  step reads B rows), and the decode step that feeds new token s reads each row's cache so far, p_r + s positions
  of `kv_bytes_per_position` = 2 x layers x kv_heads x head_dim x bytes. The bytes the stage cannot do without:
  a sampler that reads its whole preallocated cache, or the weights once per sub-batch, reads more.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import numpy as np

GIB = 2**30


def _median_seconds(fn, *args, repeats: int) -> float:
    """Median seconds of `fn(*args)` (results ready), after one warm-up call (compilation) that is not counted."""
    import jax

    jax.block_until_ready(fn(*args))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def matmul_rate(dtype: str = "float32", size: int = 4096, repeats: int = 5) -> float:
    """FLOP/s of a jitted `[size, size] @ [size, size]` in `dtype` (2 size^3 FLOPs per call) on the default device.

    The denominator of the update's fraction: what this machine, this JAX and this XLA reach on the op the model is
    made of, not a datasheet's peak. ~0.6 s per float32 call at size 4096 on 2 CPU cores.
    """
    import jax
    import jax.numpy as jnp

    a, b = (jax.random.normal(jax.random.key(i), (size, size), getattr(jnp, dtype)) for i in range(2))
    return 2 * size**3 / _median_seconds(jax.jit(jnp.dot), a, b, repeats=repeats)


def copy_bandwidth(nbytes: int = GIB, repeats: int = 5) -> float:
    """Bytes/s of a jitted, donated `x * 2` over a float32 array of `nbytes`: its bytes read plus its bytes
    written (2 x nbytes per call; XLA's own `bytes accessed` of the program, tested), over the median seconds.

    The array is donated, so each call writes over the pages the last one wrote: a fresh output array would
    time the kernel's first touch of 1 GiB of new pages too (8.7 GB/s against 68 GB/s here, 2026-11-29).
    """
    import jax
    import jax.numpy as jnp

    double = jax.jit(lambda v: v * 2, donate_argnums=0)
    x = double(jnp.ones((nbytes // 4,), jnp.float32))  # compiled, and its pages touched
    seconds = []
    for _ in range(repeats):
        jax.block_until_ready(x)
        start = time.perf_counter()
        x = jax.block_until_ready(double(x))
        seconds.append(time.perf_counter() - start)
    return 2 * x.nbytes / statistics.median(seconds)


def matmul_params(config) -> int:
    """N: the parameters of the matmuls a token goes through (`QwenConfig`): per layer q [D, H d], k and v
    [D, K d], o [H d, D], gate and up [D, I], down [I, D]; and the output projection [D, V] (tied or not)."""
    c = config
    attention = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    return c.num_hidden_layers * (attention + mlp) + c.hidden_size * c.vocab_size


def attention_width(config) -> int:
    """W = heads x head_dim: the width of Q K^T's contraction and of the attention's output."""
    return config.num_attention_heads * config.head_dim


def logprob_flops(num_params: int, sequence_lengths: Sequence[float], num_layers: int, width: int) -> float:
    """FLOPs of one forward pass over sequences of `sequence_lengths` tokens: 2 N T + 4 L W sum_s l_s^2.

    T = sum_s l_s. 2 N T: a multiply and an add per matmul parameter per token (Kaplan et al. 2020, C_forward);
    4 L W l_s^2 per sequence: Q K^T and the weighted sum over V, each 2 W l_s^2, in each of the L layers (PaLM,
    Chowdhery et al. 2022, appendix B: full l_s, no causal halving). Elementwise work (norms, softmax, RoPE) is
    left out: a few % at a hidden size of a few hundred (tested against XLA's count).
    """
    lengths = np.asarray(sequence_lengths, np.float64)
    return float(2 * num_params * lengths.sum() + 4 * num_layers * width * np.square(lengths).sum())


def update_flops(num_params: int, sequence_lengths: Sequence[float], num_layers: int, width: int) -> float:
    """FLOPs of one forward + backward pass: 6 N T + 12 L W sum_s l_s^2 (3 x `logprob_flops`).

    The backward pass's two matmuls per forward one (the input's gradient and the weight's) make it 2x the
    forward: PaLM's model FLOPs per token, 6 N + 12 L H Q T (Chowdhery et al. 2022, appendix B), summed over the
    tokens; Kaplan et al. 2020's C = 6 N per token plus attention.
    """
    return 3 * logprob_flops(num_params, sequence_lengths, num_layers, width)


def weight_bytes(config, dtype: str) -> int:
    """Bytes of the weights one forward step reads in `dtype`: every parameter (`QwenConfig`'s projections,
    biases, norms) except an untied embedding table, of which a step reads its B rows (tied: the table is the
    output projection, read whole)."""
    c = config
    d, kv = c.head_dim, c.num_key_value_heads * c.head_dim
    per_layer = c.hidden_size * (c.num_attention_heads * d + 2 * kv)  # q, k, v
    per_layer += c.num_attention_heads * d * c.hidden_size  # o
    per_layer += 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size  # MLP, its two norms
    if c.attention_bias:
        per_layer += c.num_attention_heads * d + 2 * kv
    if c.qk_norm:
        per_layer += 2 * d
    count = c.num_hidden_layers * per_layer + c.hidden_size + c.vocab_size * c.hidden_size  # final norm, output
    return count * np.dtype(_numpy_dtype(dtype)).itemsize


def kv_bytes_per_position(config, dtype: str) -> int:
    """Bytes of one row's cache per position: keys and values, 2 x layers x kv_heads x head_dim x bytes."""
    c = config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * np.dtype(_numpy_dtype(dtype)).itemsize


def decode_bytes(weight_bytes: int, kv_bytes_per_position: int, prompt_lengths: Sequence[float], new_tokens: int):
    """Bytes a generation of `new_tokens` tokens for rows of `prompt_lengths` reads at the least:

        n W + c sum_{s=1}^{n-1} sum_r (p_r + s) = n W + c (n - 1) (sum_r p_r + R n / 2)

    n = new_tokens forward calls (the prefill and n - 1 decode steps), each reading the weights W once; the decode
    step feeding new token s reads p_r + s cached positions of c = `kv_bytes_per_position` bytes for each row r of
    R. The memory-bound decoding model of LLM inference (Pope et al. 2022, "Efficiently Scaling Transformer
    Inference", section 2: weights and KV cache loaded once per step). Linear in the p_r: their mean serves.
    """
    prompts = np.asarray(prompt_lengths, np.float64)
    n = new_tokens
    return float(n * weight_bytes + kv_bytes_per_position * (n - 1) * (prompts.sum() + len(prompts) * n / 2))


def generation_flops(
    num_params: int, num_layers: int, width: int, prompt_lengths: Sequence[float], new_tokens: int
) -> float:
    """FLOPs of a generation of `new_tokens` tokens for rows of `prompt_lengths`: the prefill's forward over the
    prompts (`logprob_flops`), then the decode step feeding new token s for each row r, a one-token forward over
    p_r + s cached positions: 2 N + 4 L W (p_r + s) (the terms of `logprob_flops` for one query position).

        logprob_flops(p) + sum_{s=1}^{n-1} sum_r (2 N + 4 L W (p_r + s))

    Beside `decode_bytes`, the other half of decoding's roofline (Williams et al. 2009): a step of R rows does
    2 R FLOPs per weight read, so on a CPU whose matmul rate over its bandwidth is a few FLOPs per byte, a batch of
    a few rows is already bound by the matmul rate, not the bandwidth.
    """
    prompts = np.asarray(prompt_lengths, np.float64)
    n = new_tokens
    steps = (n - 1) * (2 * num_params * len(prompts) + 4 * num_layers * width * (prompts.sum() + len(prompts) * n / 2))
    return logprob_flops(num_params, prompts, num_layers, width) + float(steps)


def _numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def machine_limits(matmul_size: int = 4096, copy_nbytes: int = GIB, repeats: int = 5) -> dict:
    """The machine's matmul rate in float32 and bfloat16 (FLOP/s) and its copy bandwidth (bytes/s), one after the
    other in this process."""
    return {
        "matmul_size": matmul_size,
        "copy_bytes": copy_nbytes,
        "matmul_flops": {d: matmul_rate(d, matmul_size, repeats) for d in ("float32", "bfloat16")},
        "copy_bytes_per_second": copy_bandwidth(copy_nbytes, repeats),
    }


def model_counts(model_config, dtype: str) -> dict:
    """What the formulas take from a `QwenConfig` in the compute `dtype`."""
    return {
        "matmul_params": matmul_params(model_config),
        "layers": model_config.num_hidden_layers,
        "attention_width": attention_width(model_config),
        "weight_bytes": weight_bytes(model_config, dtype),
        "kv_bytes_per_position": kv_bytes_per_position(model_config, dtype),
        "dtype": dtype,
    }


def stage_fractions(records, counts: dict, machine: dict, rows: int, prompt_length: float, ppo_epoch: int = 1):
    """Per-iteration rates of the loop's stages and their fractions of the machine's limits, medians over `records`
    (the loop's `on_metrics` dicts of the iterations measured).

    From each record: `rollout/response_length` (mean response tokens r), `rollout/response_length_max` (the
    decode steps the batch ran), `train/trained_token_fraction` (f), `perf/update_time`, `perf/generate_time`
    less `perf/grade_time` (the grading is timed apart; the prefill and the sampler's host work stay in).
    Every one of the `rows` sequences counted at `prompt_length` + r tokens (mean lengths: the attention term's
    sum of squares is then a slight under-count).

    - update: `ppo_epoch` x f x `update_flops` over the rows, per second of the update, over the compute dtype's
      matmul rate (f scales the rows trained: exact at f = 1, every row trained);
    - generation: `decode_bytes` of the rows at `prompt_length` over the decode steps, per second of generation
      without grading, over the copy bandwidth; and its `generation_flops` over the matmul rate (whichever
      fraction is larger is the limit that binds).
    """
    c = counts
    update, generation, generation_compute = [], [], []
    for r in records:
        lengths = np.full(rows, prompt_length + r["rollout/response_length"])
        flops = (
            ppo_epoch
            * r["train/trained_token_fraction"]
            * update_flops(c["matmul_params"], lengths, c["layers"], c["attention_width"])
        )
        update.append(flops / r["perf/update_time"])
        steps = int(r["rollout/response_length_max"])
        nbytes = decode_bytes(c["weight_bytes"], c["kv_bytes_per_position"], np.full(rows, prompt_length), steps)
        seconds = r["perf/generate_time"] - r["perf/grade_time"]
        generation.append(nbytes / seconds)
        flops = generation_flops(
            c["matmul_params"], c["layers"], c["attention_width"], np.full(rows, prompt_length), steps
        )
        generation_compute.append(flops / seconds)
    matmul = machine["matmul_flops"][c["dtype"]]
    bandwidth = machine["copy_bytes_per_second"]
    return {
        "update": {"flops_per_second": statistics.median(update), "limit": matmul},
        "generation": {"bytes_per_second": statistics.median(generation), "limit": bandwidth},
        "generation_flops": {"flops_per_second": statistics.median(generation_compute), "limit": matmul},
    }


def time_logprob_pass(model_dir: str, dtype: str, rows: int, length: int, repeats: int = 1) -> float:
    """Median seconds of the trainer's log-prob pass (`train.update.compute_logprobs_fn`: the forward to the final
    hidden states, then the log-probs a chunk of logits at a time) on `[rows, length]` real tokens, float32 params
    computing in `dtype`, with the trainer's compile options; compiled first, not counted."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from mathrl_jax.compile_options import trainer_pass_options
    from mathrl_jax.models import load_model
    from mathrl_jax.train.update import compute_logprobs_fn

    model = load_model(model_dir, param_dtype="float32", dtype=dtype)
    vocab = model.config.vocab_size
    graphdef, params = nnx.split(model)
    ids = jax.random.randint(jax.random.key(0), (rows, length), 3, vocab, jnp.int32)
    mask = jnp.ones((rows, length), jnp.int32)
    options = trainer_pass_options(vocab)  # the trainer's own compile options for its passes
    compiled = compute_logprobs_fn(graphdef, compiler_options=options).lower(params, ids, mask).compile()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, ids, mask))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def mean_prompt_length(config, model_dir: str) -> float:
    """Mean prompt tokens over the run's training problems (`train.rollouts`: its data, its prompt template, the
    checkpoint's tokenizer); the loop draws its batches from them, and logs no prompt length."""
    from mathrl_jax.models.codec import TextCodec
    from mathrl_jax.train.rollouts import encode_prompts, load_data, prompt_settings

    problems = load_data(config)[0]
    return float(np.mean([len(ids) for ids in encode_prompts(prompt_settings(config), TextCodec(model_dir), problems)]))


def grpo_limits(model_dir: str, config, records, matmul_size=4096, copy_nbytes=GIB, repeats=5) -> dict:
    """The limits table of a GRPO run: the machine's limits (`machine_limits`), the loop's update and generation
    against them (`stage_fractions` over `records`, the `on_metrics` dicts of the measured iterations of the run
    `config` made on `model_dir`), and one log-prob pass timed here on the iteration's batch shape (the loop's own
    `perf/logprob_time` is ~0 when the sampler's log-probs serve as the old ones and there is no KL term)."""
    from mathrl_jax.models import load_config

    dtype = config.dtype
    counts = model_counts(load_config(model_dir), dtype)
    machine = machine_limits(matmul_size, copy_nbytes, repeats)
    rows = config.n_rollout_threads * config.group_size
    prompt = mean_prompt_length(config, model_dir)
    stages = stage_fractions(records, counts, machine, rows, prompt, config.ppo_epoch)
    length = max(2, round(prompt + statistics.median(r["rollout/response_length"] for r in records)))
    seconds = time_logprob_pass(model_dir, dtype, rows, length)
    flops = logprob_flops(counts["matmul_params"], np.full(rows, length), counts["layers"], counts["attention_width"])
    stages["logprob"] = {
        "flops_per_second": flops / seconds,
        "limit": machine["matmul_flops"][dtype],
        "rows": rows,
        "length": length,
        "loop_logprob_time": statistics.median(r["perf/logprob_time"] for r in records),
    }
    for stage in stages.values():
        stage["fraction"] = stage.get("flops_per_second", stage.get("bytes_per_second")) / stage["limit"]
    return {"machine": machine, "counts": counts, "rows": rows, "prompt_length": prompt, "stages": stages}


def limits_lines(limits: dict) -> list:
    """The printed table of `grpo_limits`' result: one row per stage, its rate, the limit it is measured against,
    the fraction."""
    m, c, s = limits["machine"], limits["counts"], limits["stages"]
    dtype = c["dtype"]
    lines = [
        f"Limits (measured in this run, a process of its own): matmul {m['matmul_size']}^3 float32 "
        f"{m['matmul_flops']['float32'] / 1e9:.1f} GFLOP/s, bfloat16 {m['matmul_flops']['bfloat16'] / 1e9:.1f} "
        f"GFLOP/s; copy of {m['copy_bytes'] / GIB:.2f} GiB {m['copy_bytes_per_second'] / 1e9:.1f} GB/s (read + "
        f"written); N = {c['matmul_params'] / 1e6:.1f}M matmul params, {limits['rows']} rows, prompts "
        f"{limits['prompt_length']:.1f} tokens on average",
        "| stage | work counted | rate | limit | fraction |",
        "|---|---|---|---|---|",
        f"| update | 6 N T + 12 L W sum l^2 per update_time | {s['update']['flops_per_second'] / 1e9:.1f} GFLOP/s | "
        f"{dtype} matmul {s['update']['limit'] / 1e9:.1f} GFLOP/s | {s['update']['fraction']:.2f} |",
        f"| generation | weights + KV so far per step, per (generate_time - grade_time) | "
        f"{s['generation']['bytes_per_second'] / 1e9:.2f} GB/s | copy {s['generation']['limit'] / 1e9:.1f} GB/s | "
        f"{s['generation']['fraction']:.3f} |",
        f"| generation | its FLOPs (prefill, then 2 N + 4 L W context per token) per (generate_time - grade_time) | "
        f"{s['generation_flops']['flops_per_second'] / 1e9:.1f} GFLOP/s | {dtype} matmul "
        f"{s['generation_flops']['limit'] / 1e9:.1f} GFLOP/s | {s['generation_flops']['fraction']:.2f} |",
        f"| log-prob pass | 2 N T + 4 L W sum l^2, timed here on [{s['logprob']['rows']}, {s['logprob']['length']}] "
        f"(the loop's: {s['logprob']['loop_logprob_time']:.3f} s) | {s['logprob']['flops_per_second'] / 1e9:.1f} "
        f"GFLOP/s | {dtype} matmul {s['logprob']['limit'] / 1e9:.1f} GFLOP/s | {s['logprob']['fraction']:.2f} |",
    ]
    return lines


def sampler_line(model_config, dtype: str, prompt_lengths, new_tokens: int, tokens_per_second: float, **sizes):
    """One line for scripts/bench_sampler.py: a generation's `decode_bytes` over its seconds (batch x new_tokens /
    `tokens_per_second`: the sampler never stops early there) as a fraction of `copy_bandwidth` measured now, and
    its `generation_flops` as a fraction of the `dtype` matmul rate measured now."""
    nbytes = decode_bytes(
        weight_bytes(model_config, dtype), kv_bytes_per_position(model_config, dtype), prompt_lengths, new_tokens
    )
    flops = generation_flops(
        matmul_params(model_config),
        model_config.num_hidden_layers,
        attention_width(model_config),
        prompt_lengths,
        new_tokens,
    )
    seconds = len(prompt_lengths) * new_tokens / tokens_per_second
    bandwidth = copy_bandwidth(**sizes)
    matmul = matmul_rate(dtype)
    return (
        f"JaxSampler greedy decoding: {nbytes / seconds / 1e9:.2f} GB/s of weights + KV cache read per step, "
        f"{nbytes / seconds / bandwidth:.3f} of the copy bandwidth measured now ({bandwidth / 1e9:.1f} GB/s, read + "
        f"written); {flops / seconds / 1e9:.1f} GFLOP/s, {flops / seconds / matmul:.2f} of the {dtype} matmul rate "
        f"measured now ({matmul / 1e9:.1f} GFLOP/s)"
    )
