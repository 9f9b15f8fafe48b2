"""The GPU report: what one lent GPU measures of mathrl_jax in one run, each step under its own time budget.

Steps, in order (`--only` picks some; each runs in a process of its own, see below):

1. `matmul`: the card's measured bfloat16 matmul rate, an n x n by n x n `jnp.dot` (2 n^3 FLOPs), jitted, timed
   over a run of calls after a warm-up; the best of three runs, in TFLOP/s. It is the denominator of the MFU: what
   this card, this JAX and this XLA reach on the op the model is made of, not the datasheet's peak.
2. `update`: the library's jitted update (`train.update.make_update_fn`, the trainer's AdamW with clipping) on a
   GRPO batch at the Qwen2.5-1.5B shape (random weights of the real architecture: vocabulary 151,936, hidden
   1536, 28 layers, tied embeddings; float32 master params, bfloat16 compute, remat on): compile time, seconds per
   step, and model FLOPs = 6 x parameters x tokens (forward 2 N T + backward 4 N T; attention's own FLOPs and
   remat's recomputed forward are not counted, as MFU conventionally does not), as TFLOP/s and as MFU: that rate
   over the `matmul` step's. It says how far the update is from the card's matmul speed.
3. `sampler`: `JaxSampler` tokens/s at batch 64 and 256 (256-token prompts, 512 new tokens, temperature 1, no
   end-of-sequence stop) at the 1.5B shape in bfloat16, against transformers `generate` (torch, the same random
   weights exported with `models.hf.export_checkpoint`) on the same GPU, measured in the same run.
4. `sync`: the JAX-to-torch weight hand-over of the vLLM sync (`sampling.vllm.torch_weights`: JAX params
   to torch tensors through DLPack; vLLM itself is not needed) at the 1.5B shape, for float32 master params cast
   to a bfloat16 engine (the trainer's sync) and for bfloat16 params: seconds per sync, and the extra device
   copies: the tensors whose torch view does not share memory with their parameter's JAX buffer (a transpose of a
   linear kernel, a cast), compared by address (`data_ptr` against `unsafe_buffer_pointer`), with their bytes.
5. `grpo`: one GRPO iteration of the training loop (`train.setup.build_run`, `train.loop.train_iteration`) at
   the Qwen2.5-0.5B shape (a random-weight checkpoint written with `models.write_tiny_checkpoint`, its character
   tokenizer; float32 params, bfloat16 compute, remat): 32 arithmetic prompts x 8 samples of 512 new tokens, 4
   minibatches, the math verifier, and the loop's own split of the iteration (`perf/*`: generate, of which grade,
   log-prob passes, update, weight sync), first iteration (compiling) and the median after it. Random weights
   earn no reward, so every advantage is 0: `skip_zero_advantage=False` makes the update compute every row, as
   it does when rewards differ. Needs the loop's pure-Python packages (docs/gpu.md says how to carry them).

Steps run only when `--only` names them (in `--only`'s order, `matmul` first), for a profile of the update, the
first iteration and TRL on the same card (docs/gpu.md, "The next GPU run"):

6. `update_sweep`: the `update` step for each of `update_variants` (`UPDATE_VARIANTS`: remat policies, no remat,
   scanned layers, twice the rows, XLA GPU compile options), one after the other in one process; per variant
   also XLA's own FLOP count of the program (remat's recomputation and attention included) over the matmul rate.
   The first variant's steps are then traced with `jax.profiler` and `benchmarks.trace_summary` splits their
   device time into matmuls, attention and the rest, and the device's idle time between ops.
7. `compile`: the `grpo` step's first iteration in fresh processes, layers unrolled and scanned, each with JAX's
   persistent compilation cache cold and then warm (a second process on the same directory): seconds, the
   loop's split, XLA's programs compiled or loaded and the cache's hits.
8. `trl`: TRL's `GRPOTrainer` (`benchmarks.grpo.bench_trl`) at the `grpo` step's shape and setting, on the same
   card: transformers `generate`, then `generate` with the static KV cache; seconds per iteration and peak memory.
   Needs TRL's wheels (`scripts/gpu_wheels.py --trl`).

`sampler` also measures the card's copy bandwidth (a donated in-place `x * 2`, `benchmarks.limits`) and gives each
batch's fraction of it: the least bytes its decoding reads (the weights once a step and the KV cache so far) over
its time. `--sampler-batches` sets its batches; above `sampler_torch_max_batch` there is no transformers baseline.

Each step runs as a child process (`--child STEP`) under its budget (`--budget-s`, else the profile's per step,
and never past `--total-budget-s` from the start): a step that raises, or runs over and is killed with its process
group, is recorded as failed with its error, and the next step runs. A child writes what it has measured to
`OUT/current_step.json` as it goes, so a killed step keeps its partial numbers; the report `OUT/bench_gpu.json` is
rewritten after every step (`"complete": false` and the step running until the end), so a run killed from outside
still leaves its results. At the end: `OUT/bench_gpu.json`, the table in `OUT/bench_gpu.md` and on stdout, each
step's output, one after the other, in `OUT/bench_gpu.log` (three files: the device tool brings back at most 8).
Exit status 0 when every step ran, 1 when one failed. Without `--smoke`, a step on a JAX that sees no GPU fails at
once, saying so.

XLA settings, set here before JAX is imported (the children inherit them; values already in the environment win)
and printed: `XLA_PYTHON_CLIENT_PREALLOCATE=false` (JAX takes GPU memory as it needs it rather than 75% at start,
so torch's generate and the DLPack views have room beside it) and `XLA_PYTHON_CLIENT_MEM_FRACTION=0.75` (the most
JAX's allocator may hold; the largest step, the 1.5B update, needs about half of an 80 GB card).

    python scripts/bench_gpu.py --out $OUT                 # on the lent GPU: one command, about 6-9 minutes
    python scripts/bench_gpu.py --smoke --out /tmp/bg      # CPU, tiny shapes, short lengths: well under a minute
    python scripts/bench_gpu.py --only matmul,update       # some steps
    python scripts/bench_gpu.py --only update_sweep,compile,trl,sampler --sampler-batches 256,1024 --out $OUT
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

# Set before jax is first imported (in the steps' processes, which inherit them); values already set win.
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench_gpu.py")
"""This benchmark's command line, which its child processes run."""

XLA_SETTINGS = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.75"}
for _key, _value in XLA_SETTINGS.items():
    os.environ.setdefault(_key, _value)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from benchmarks.grpo import SPLIT  # noqa: E402  (the loop's perf/* parts of an iteration)
from benchmarks.shapes import SHAPES  # noqa: E402

# The model-name table (MaxText-style): a name's architecture fields over `models.tiny_config` ("tiny" is the
# offline model itself). The Qwen shapes are bench_sampler.py's, so the two reports time the same models:
#   qwen2.5-0.5b: vocab 151936, hidden 896, intermediate 4864, 24 layers, 14 heads / 2 KV heads, tied
#   qwen2.5-1.5b: vocab 151936, hidden 1536, intermediate 8960, 28 layers, 12 heads / 2 KV heads, tied
MODELS = {name: SHAPES[name] for name in ("tiny", "qwen2.5-0.5b", "qwen2.5-1.5b")}

# The update sweep's variants (`update_sweep`), in the order they run: each is the `update` step's setting (remat
# with `--remat-policy`, "nothing_saveable" by default; `update_rows` x `update_length` tokens; layers unrolled
# unless `--scan-layers`; `--attention`; XLA's default compile options) with these changes. `compiler_options`
# are XLA debug options set on the update's program alone (`jax.jit(compiler_options=...)`); `rows_factor`
# multiplies the rows of the step.
UPDATE_VARIANTS = {
    "baseline": {},
    "save_projections": {"remat_policy": "dots_with_no_batch_dims_saveable"},
    "save_dots": {"remat_policy": "dots_saveable"},
    "no_remat": {"remat": False},
    "scanned": {"scan_layers": True},
    "double_rows": {"rows_factor": 2},
    "cublas_only": {"compiler_options": {"xla_gpu_enable_triton_gemm": False}},
    "latency_hiding": {"compiler_options": {"xla_gpu_enable_latency_hiding_scheduler": True}},
}


# What each step runs on: the GPU report, and the smoke run (CPU, tiny shapes, short lengths) the tests use.
PROFILES = {
    "gpu": dict(
        matmul_size=8192,
        matmul_calls=50,
        update_model="qwen2.5-1.5b",
        update_rows=8,
        update_prompt=256,
        update_length=1024,
        update_steps=5,
        # the four a first sweep most needs (save_dots keeps what save_projections does when attention is cuDNN's
        # custom call; twice the rows and the compile options come after): about 45 s each on an H100 by the
        # update's figures (35 s compile, 5 steps of 0.3 s, the first profiled)
        update_variants=("baseline", "save_projections", "no_remat", "scanned"),
        profile_steps=3,
        attention_model="qwen2.5-1.5b",
        attention_rows=8,
        attention_length=4096,
        attention_implementations=("blocked", "xla", "cudnn"),
        sampler_model="qwen2.5-1.5b",
        sampler_batches=(64, 256),
        sampler_torch_max_batch=256,
        sampler_prompt=256,
        sampler_new_tokens=512,
        sampler_repeats=1,
        bandwidth_bytes=4 * 2**30,
        sync_model="qwen2.5-1.5b",
        sync_repeats=3,
        grpo_model="qwen2.5-0.5b",
        grpo_prompts=32,
        grpo_samples=8,
        grpo_new_tokens=512,
        grpo_minibatches=4,
        grpo_iterations=3,  # the first compiles
        # the first iteration per (layers, cache) in a fresh process; "warm" after its layers' "cold" (the scanned warm
        # case is left out of the GPU run's budget: the unrolled pair says what the cache saves)
        compile_cases=(("unrolled", "cold"), ("unrolled", "warm"), ("scanned", "cold")),
        trl_iterations=1,  # after the first
        trl_static_cache=True,
        # measured on an H100 (2026-11-26): matmul 4 s, update 65, attention 58-62 (three compiles), sampler 159,
        # sync 18, grpo 114: 420 s in all. update_sweep, compile and trl are not yet measured on a GPU: their
        # budgets are estimates from those (a variant ~45 s; a process of the grpo step ~30 s of setup, then a cold
        # first iteration ~75 s, a warm one ~15 s, a scanned cold one ~45 s; a TRL round with eager generate ~40
        # s). matmul + update_sweep + compile fit one command (docs/gpu.md, "The next GPU run"); trl + sampler a
        # second.
        budget_s=dict(
            matmul=60,
            update=150,
            attention=100,
            sampler=220,
            sync=60,
            grpo=200,
            update_sweep=230,
            compile=270,
            trl=160,
        ),  # fmt: skip
        total_budget_s=540,  # under the device tool's 600 s a command
    ),
    "smoke": dict(
        matmul_size=256,
        matmul_calls=5,
        update_model="tiny",
        update_rows=4,
        update_prompt=8,
        update_length=32,
        update_steps=2,
        update_variants=tuple(UPDATE_VARIANTS),
        profile_steps=2,
        attention_model="tiny",
        attention_rows=2,
        attention_length=64,
        attention_implementations=("blocked", "xla"),
        sampler_model="tiny",
        sampler_batches=(2, 4),
        sampler_torch_max_batch=2,
        sampler_prompt=8,
        sampler_new_tokens=8,
        sampler_repeats=1,
        bandwidth_bytes=2**24,
        sync_model="tiny",
        sync_repeats=1,
        grpo_model="tiny",
        grpo_prompts=2,
        grpo_samples=2,
        grpo_new_tokens=4,
        grpo_minibatches=1,
        grpo_iterations=2,
        compile_cases=(("unrolled", "cold"), ("unrolled", "warm"), ("scanned", "cold"), ("scanned", "warm")),
        trl_iterations=1,
        trl_static_cache=False,  # torch.compile of generate on a CPU: minutes
        budget_s=dict(
            matmul=60,
            update=120,
            attention=60,
            sampler=120,
            sync=60,
            grpo=120,
            update_sweep=240,
            compile=240,
            trl=240,
        ),  # fmt: skip
        total_budget_s=400,
    ),
}
# models.attention.ATTENTION_IMPLEMENTATIONS, spelled out: the parent process must not import JAX (the XLA settings
# are set first); tests/scripts/test_bench_gpu.py checks the two agree.
ATTENTION_IMPLEMENTATIONS = ("auto", "blocked", "xla", "cudnn")
REMAT_POLICIES = ("nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable")  # models.qwen's
DEFAULT_STEPS = ("matmul", "update", "attention", "sampler", "sync", "grpo")  # the GPU report's
# Steps run only when `--only` names them: what a profile of the update, the first iteration and TRL on the same
# card take (docs/gpu.md, "The next GPU run").
EXTRA_STEPS = ("update_sweep", "compile", "trl")
STEPS = DEFAULT_STEPS + EXTRA_STEPS
MIN_STEP_S = 10  # a step with less of the total budget left is not started
STEP_FILE = "current_step.json"  # the running step's numbers so far (merged into the report when it ends)


# ---------------------------------------------------------------------------
# The steps (each runs in its own process; `record(**values)` saves what it has measured so far)
# ---------------------------------------------------------------------------


def device_info() -> dict:
    import jax

    device = jax.devices()[0]
    return {"backend": jax.default_backend(), "device": device.device_kind, "jax": jax.__version__}


def peak_memory_bytes():
    """The JAX device's peak bytes in use since the process started (None where the backend does not say)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def torch_device() -> str:
    """torch on the GPU where JAX is on one, else the CPU (the smoke run)."""
    import jax
    import torch

    return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def step_matmul(p, record):
    """The bf16 matmul rate: 3 runs of `matmul_calls` back-to-back n x n jnp.dot calls after a warm-up (the calls
    queue on the device; a run ends when its last result is ready), 2 n^3 FLOPs each; the best run counts."""
    import jax
    import jax.numpy as jnp

    n, calls = p["matmul_size"], p["matmul_calls"]
    record(**device_info(), size=n, dtype="bfloat16")
    a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in range(2))
    matmul = jax.jit(jnp.dot)
    matmul(a, b).block_until_ready()
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            c = matmul(a, b)
        c.block_until_ready()
        seconds.append((time.perf_counter() - start) / calls)
    record(seconds_per_matmul=seconds, tflops=2 * n**3 / min(seconds) / 1e12)


def grpo_batch(rows: int, prompt: int, length: int, vocab: int, seed: int = 0) -> dict:
    """A GRPO batch `[rows, length]` with every token real: `prompt` prompt tokens, then the response; 0/1 rewards
    (each group mixed) turned into group-relative advantages over groups of up to 8 rows, old log-probs near -2."""
    import numpy as np

    from mathrl_jax import losses

    rng = np.random.default_rng(seed)
    group = min(rows, 8)
    response = np.zeros((rows, length), np.float32)
    response[:, prompt:] = 1.0
    scores = rng.integers(0, 2, rows).astype(np.float32)
    scores[::group], scores[1::group] = 1.0, 0.0
    advantages = losses.group_relative_advantages(scores, np.arange(rows) // group, num_groups=rows // group)
    return {
        "input_ids": rng.integers(3, vocab, (rows, length)).astype(np.int32),
        "attention_mask": np.ones((rows, length), np.int32),
        "response_mask": response,
        "old_logprobs": (-2.0 + 0.1 * rng.standard_normal((rows, length))).astype(np.float32) * response,
        "advantages": np.asarray(advantages)[:, None] * response,
    }


def cost_analysis(stage) -> dict:
    """XLA's cost analysis of a lowered or compiled program as a dict ({} where the backend gives none, or fails:
    a count is an extra, never a reason to lose the step's timing)."""
    try:
        cost = stage.cost_analysis()
    except Exception as error:  # recorded beside the numbers, not raised
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    return (cost[0] if isinstance(cost, list) else cost) or {}


def measure_update(p, changes: dict, record, profile_dir: str = "") -> dict:
    """The jitted GRPO update at `update_model` with `changes` (an `UPDATE_VARIANTS` entry) over the step's
    settings: compile (lowered and compiled once; XLA's memory and cost analyses kept), then `update_steps`
    chained calls (the state is donated, as in training), median seconds per step. `record(**values)` saves what
    is measured as it goes. With `profile_dir`, `profile_steps` more steps run under `jax.profiler` and
    `benchmarks.trace_summary` says where their device time went."""
    import jax
    from flax import nnx

    from mathrl_jax.models import QwenForCausalLM, tiny_config
    from mathrl_jax.train.state import create_train_state, make_optimizer
    from mathrl_jax.train.update import UpdateConfig, make_update_fn

    name, length = p["update_model"], p["update_length"]
    rows = p["update_rows"] * changes.get("rows_factor", 1)
    remat = changes.get("remat", True)
    policy = changes.get("remat_policy", p["remat_policy"])
    config = tiny_config(
        **MODELS[name],
        param_dtype="float32",
        dtype="bfloat16",
        remat=remat,
        remat_policy=policy,
        attention=p["attention"],
        scan_layers=changes.get("scan_layers", p["scan_layers"]),
    )
    from mathrl_jax.models.attention import auto_attention

    graphdef, params = nnx.split(QwenForCausalLM(config, rngs=nnx.Rngs(0)))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    tokens = rows * length
    attention = 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * length
    device = jax.devices()[0]
    implementation = p["attention"]
    if implementation == "auto":
        capability = getattr(device, "compute_capability", None)
        implementation = auto_attention(jax.default_backend(), config.dtype, config.head_dim, capability)
    record(
        **device_info(),
        model=name,
        params=n_params,
        rows=rows,
        length=length,
        tokens=tokens,
        numerics="float32 params, bfloat16 compute" + (f", remat ({policy})" if remat else ", no remat"),
        attention=p["attention"],
        attention_implementation=implementation,
        scan_layers=config.scan_layers,
        compiler_options=changes.get("compiler_options", {}),
        flops_per_step=6 * n_params * tokens,
        flops_formula="6 x params x tokens (attention and remat's recomputation not counted)",
        attention_flops_not_counted=attention * tokens,
    )
    optimizer = make_optimizer(1e-6)
    state = create_train_state(params, optimizer, seed=0)
    batch = jax.device_put(grpo_batch(rows, p["update_prompt"], length, config.vocab_size))
    update = make_update_fn(
        graphdef,
        optimizer,
        UpdateConfig(num_mini_batch=1),
        donate=True,
        compiler_options=changes.get("compiler_options") or None,
    )
    start = time.perf_counter()
    lowered = update.lower(state, batch)
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost, lowered_cost = cost_analysis(compiled), cost_analysis(lowered)
    # The FLOPs the card runs a step: XLA's count of the program before its optimisations (every matmul, remat's
    # recomputed forward included; the compiled program's count can drop or merge them), plus cuDNN's attention,
    # a custom call XLA counts as 0: fwd 4 + bwd 8 (+ 4 recomputed under remat) x L H d x width a token, the full
    # square (an upper bound: the kernel may skip masked blocks). A scanned program's loop body counts once:
    # no count is given there.
    executed = None
    if lowered_cost.get("flops") and not config.scan_layers:
        per_token = (attention + (attention // 3 if remat else 0)) if implementation == "cudnn" else 0
        executed = lowered_cost["flops"] + per_token * tokens
    record(
        compile_seconds=seconds,
        xla_temp_bytes=getattr(memory, "temp_size_in_bytes", None),
        xla_flops_per_step=cost.get("flops"),
        lowered_flops_per_step=lowered_cost.get("flops"),
        executed_flops_per_step=executed,
        **{f"{k}_cost_error": c["error"] for k, c in (("xla", cost), ("lowered", lowered_cost)) if "error" in c},
    )
    start = time.perf_counter()
    state, metrics = jax.block_until_ready(compiled(state, batch))
    record(first_step_seconds=time.perf_counter() - start)
    seconds = []
    for _ in range(p["update_steps"]):
        start = time.perf_counter()
        state, metrics = jax.block_until_ready(compiled(state, batch))
        seconds.append(time.perf_counter() - start)
    step = statistics.median(seconds)
    result = dict(
        seconds_per_step=seconds,
        median_seconds=step,
        tflops=6 * n_params * tokens / step / 1e12,
        tokens_per_second=tokens / step,
        loss=float(metrics["loss"]),
        skipped_updates=int(state.skipped_updates),
    )
    if executed:
        result["executed_tflops"] = executed / step / 1e12
    record(**result)
    if profile_dir:
        start = time.perf_counter()
        with jax.profiler.trace(profile_dir, create_perfetto_trace=True):
            for _ in range(p["profile_steps"]):
                state, metrics = jax.block_until_ready(compiled(state, batch))
        traced = (time.perf_counter() - start) / p["profile_steps"]
        from benchmarks import trace_summary

        profile = trace_summary.summarize(profile_dir, jax.default_backend())
        # tracing may slow the steps (launches recorded one by one): their seconds beside the untraced median
        profile.update(steps=p["profile_steps"], traced_seconds_per_step=traced)
        record(profile=profile)
    return result


def step_update(p, record):
    """The update at the step's settings (`--attention`, `--scan-layers`, `--remat-policy`): `measure_update`."""
    measure_update(p, {}, record)
    record(peak_memory_bytes=peak_memory_bytes())


def step_update_sweep(p, record):
    """`measure_update` for each of `update_variants` in turn (`UPDATE_VARIANTS`; the first one profiled), each
    recorded as it ends; a variant that fails (out of memory, an option this XLA lacks) is recorded with its error
    and the next one runs. Compiled programs and states are dropped between variants."""
    import gc

    import jax

    variants = {}
    for i, name in enumerate(p["update_variants"]):
        numbers = {}

        def keep(**values):
            numbers.update(values)
            record(variants={**variants, name: numbers})

        profile_dir = tempfile.mkdtemp(prefix="bench_gpu_profile_") if i == 0 else ""
        try:
            measure_update(p, UPDATE_VARIANTS[name], keep, profile_dir)
        except Exception as error:  # recorded; the next variant runs
            numbers["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        finally:
            if profile_dir:
                shutil.rmtree(profile_dir, ignore_errors=True)
        variants[name] = numbers
        record(variants=variants)
        gc.collect()
        jax.clear_caches()
    record(peak_memory_bytes=peak_memory_bytes())


def step_sampler(p, record):
    """JaxSampler against transformers `generate` on the same random bf16 weights, batch by batch: each side's
    first call (JAX: compiling; torch: a 4-token warm-up), then `sampler_repeats` timed calls; tokens/s = tokens
    made / seconds (neither side stops early)."""
    import numpy as np
    import torch
    import transformers
    from flax import nnx

    from mathrl_jax.models import QwenForCausalLM, hf, tiny_config
    from mathrl_jax.sampling import JaxSampler, SamplingParams

    name, prompt, new = p["sampler_model"], p["sampler_prompt"], p["sampler_new_tokens"]
    config = tiny_config(**MODELS[name], param_dtype="bfloat16", dtype="bfloat16")
    model = QwenForCausalLM(config, rngs=nnx.Rngs(0))
    device = torch_device()
    directory = tempfile.mkdtemp(prefix="bench_gpu_sampler_")
    try:
        hf.export_checkpoint(nnx.state(model), config, directory)
        # Loaded in the checkpoint's layout, then placed and cast: the same on transformers 4 and 5.
        torch_model = transformers.AutoModelForCausalLM.from_pretrained(directory)
        torch_model = torch_model.to(device=device, dtype=torch.bfloat16).eval()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    record(
        **device_info(),
        model=name,
        dtype="bfloat16",
        prompt_tokens=prompt,
        new_tokens=new,
        torch=torch.__version__,
        transformers=transformers.__version__,
        torch_device=device,
        attention=getattr(torch_model.config, "_attn_implementation", None),
    )
    from benchmarks import limits

    bandwidth = limits.copy_bandwidth(p["bandwidth_bytes"])  # the card's, measured here: the decode's bound
    weights, kv = limits.weight_bytes(config, "bfloat16"), limits.kv_bytes_per_position(config, "bfloat16")
    record(copy_bandwidth_bytes_per_second=bandwidth)
    sampler = JaxSampler(model, pad_token_id=config.pad_token_id, eos_token_ids=())
    params = SamplingParams(temperature=1.0, max_new_tokens=new, seed=0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def generate_torch(ids, tokens):
        with torch.inference_mode():
            out = torch_model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                pad_token_id=config.pad_token_id,
                eos_token_id=None,
            )
        sync()
        return out.shape[0] * (out.shape[1] - ids.shape[1])

    rng = np.random.default_rng(0)
    results = {}
    for batch in p["sampler_batches"]:
        prompts = rng.integers(4, min(config.vocab_size, 5000), (batch, prompt))
        start = time.perf_counter()
        sampler.generate(prompts.tolist(), params)
        first = time.perf_counter() - start
        jax_rates = []
        for _ in range(p["sampler_repeats"]):
            start = time.perf_counter()
            out = sampler.generate(prompts.tolist(), params)
            jax_rates.append(sum(len(c) for c in out.completion_ids) / (time.perf_counter() - start))
        jax_tps = statistics.median(jax_rates)
        # the least bytes the generation reads (weights once a step, the KV cache so far), over its time
        read = limits.decode_bytes(weights, kv, [prompt] * batch, new)
        results[str(batch)] = dict(
            jax_first_call_seconds=first,
            jax_tokens_per_second=jax_tps,
            bandwidth_fraction=read / (batch * new / jax_tps) / bandwidth,
        )
        record(batches=results)
        if batch > p["sampler_torch_max_batch"]:  # transformers' eager generate: minutes at this batch
            continue
        ids = torch.as_tensor(prompts, device=device)
        generate_torch(ids, 4)
        torch_rates = []
        for _ in range(p["sampler_repeats"]):
            start = time.perf_counter()
            made = generate_torch(ids, new)
            torch_rates.append(made / (time.perf_counter() - start))
        torch_tps = statistics.median(torch_rates)
        results[str(batch)].update(transformers_tokens_per_second=torch_tps, ratio=jax_tps / torch_tps)
        record(batches=results)
    record(peak_memory_bytes=peak_memory_bytes())


def step_sync(p, record):
    """`torch_weights` (the vLLM sync's JAX-to-torch hand-over) at `sync_model`, to bfloat16 tensors, from float32
    and from bfloat16 params (kernels transposed by JAX, or as torch views: `transpose_in_torch`): seconds of a whole
    pass (the first, compiling the transposes and casts, apart), and which tensors are copies rather than views of
    their parameter's buffer."""
    import jax
    import jax.numpy as jnp
    import torch
    from flax import nnx

    from mathrl_jax.models import QwenForCausalLM, hf, tiny_config
    from mathrl_jax.sampling.vllm import torch_weights

    name = p["sync_model"]
    device = torch_device()
    record(**device_info(), model=name, torch=torch.__version__, target_dtype="bfloat16")
    cases = {}
    for case, param_dtype, in_torch in (
        ("float32 params -> bfloat16", "float32", False),
        ("bfloat16 params", "bfloat16", False),
        ("bfloat16 params, transposed in torch", "bfloat16", True),  # VllmSampler's default on a GPU
    ):
        config = tiny_config(**MODELS[name], param_dtype=param_dtype, dtype="bfloat16")
        state = nnx.state(QwenForCausalLM(config, rngs=nnx.Rngs(0)))
        table = hf.parameter_table(config)
        owner = {key: hf.get_path(state, spec.path).unsafe_buffer_pointer() for key, spec in table.items()}
        marker = jnp.zeros(())
        seconds = []
        for _ in range(p["sync_repeats"] + 1):
            start = time.perf_counter()
            count = copies = copied_bytes = largest = 0
            for key, tensor in torch_weights(state, config, dtype=jnp.bfloat16, transpose_in_torch=in_torch):
                count += 1
                if tensor.data_ptr() != owner[key]:
                    nbytes = tensor.numel() * tensor.element_size()
                    copies, copied_bytes, largest = copies + 1, copied_bytes + nbytes, max(largest, nbytes)
            if device == "cuda":
                torch.cuda.synchronize()
            jax.block_until_ready(marker + 1)  # after the transposes and casts queued before it
            seconds.append(time.perf_counter() - start)
        cases[case] = dict(
            first_seconds=seconds[0],
            seconds=seconds[1:],
            median_seconds=statistics.median(seconds[1:]),
            tensors=count,
            copies=copies,
            copied_bytes=copied_bytes,
            largest_copy_bytes=largest,
            param_bytes=sum(x.nbytes for x in jax.tree.leaves(state)),
        )
        record(cases=cases)
        del state


def step_grpo(p, record):
    """GRPO iterations of the training loop at `grpo_model`, on a random-weight checkpoint: each iteration's
    `perf/*` split as the loop measures it; the first compiles, the median is over the rest."""
    import jax

    from mathrl_jax import compile_cache
    from mathrl_jax.configs import default
    from mathrl_jax.models import write_tiny_checkpoint
    from mathrl_jax.train.loop import rollout_source, train_iteration
    from mathrl_jax.train.setup import build_run

    compile_cache.enable(p["compile_cache"])  # "" (the default): off, so the first iteration compiles everything
    compiles, cache = [], {"cache_hits": 0, "cache_misses": 0}

    def on_duration(event, seconds, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(seconds)

    def on_event(event, **_):
        key = event.rsplit("/", 1)[-1]
        if event.startswith("/jax/compilation_cache/") and key in cache:
            cache[key] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    name = p["grpo_model"]
    directory = tempfile.mkdtemp(prefix="bench_gpu_grpo_")
    try:
        model_dir = os.path.join(directory, "model")
        write_tiny_checkpoint(model_dir, seed=0, **MODELS[name])
        c = default.get_config()
        c.run_dir = os.path.join(directory, "run")
        c.model_name_or_path = model_dir
        c.param_dtype, c.dtype, c.remat = "float32", "bfloat16", True
        c.attention = p["attention"]
        c.scan_layers = p["scan_layers"]
        c.algorithm_name = "grpo"
        c.n_rollout_threads = p["grpo_prompts"]
        c.group_size = p["grpo_samples"]
        c.max_new_tokens = p["grpo_new_tokens"]
        c.num_mini_batch = p["grpo_minibatches"]
        c.num_iterations = p["grpo_iterations"]
        c.skip_zero_advantage = False  # random weights earn no reward: compute every row, as when rewards differ
        c.warmstart.steps = 0
        c.eval_interval = c.save_interval = c.num_logged_samples = 0
        c.export_final = c.progress = False
        record(
            **device_info(),
            model=name,
            prompts=c.n_rollout_threads,
            samples=c.group_size,
            new_tokens=c.max_new_tokens,
            minibatches=c.num_mini_batch,
            numerics="float32 params, bfloat16 compute, remat",
            attention=c.attention,
            scan_layers=c.scan_layers,
        )
        run = build_run(c)
        source = rollout_source(run)
        state, host = run.state, run.host
        iterations = []
        try:  # the loop's own iteration, without train()'s evaluation, checkpoint and export around it
            for i in range(1, c.num_iterations + 1):
                state, host, m = train_iteration(state, host, i, source, run.batches, run.update, run.settings)
                iterations.append({k: m[f"perf/{k}"] for k in ("step_time",) + SPLIT})
                iterations[-1]["response_tokens"] = m["rollout/response_length"] * c.n_rollout_threads * c.group_size
                iterations[-1].update(xla_compiles=len(compiles), xla_compile_seconds=sum(compiles), **cache)
                record(iterations=iterations)
        finally:
            source.close()
            run.checkpointer.close()
            run.logger.close()
            run.rollouts.grader.close()
        steady = iterations[1:] or iterations
        record(
            compile_cache=bool(p["compile_cache"]),
            first_iteration_seconds=iterations[0]["step_time"],
            median={k: statistics.median(it[k] for it in steady) for k in ("step_time",) + SPLIT},
            peak_memory_bytes=peak_memory_bytes(),
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def step_compile(p, record):
    """The first GRPO iteration (`grpo` at `grpo_model`, one iteration), each of `compile_cases` in a fresh process:
    layers unrolled or scanned, JAX's persistent compilation cache cold (an empty directory) or warm (a later
    process on the directory its layers' cold case filled). Per case: the first iteration's seconds and split,
    XLA's compiles (count and seconds, `jax.monitoring`) and the cache's hits and misses."""
    cases = {}
    root = tempfile.mkdtemp(prefix="bench_gpu_compile_")
    try:
        for layers, temperature in p["compile_cases"]:
            cache_dir = os.path.join(root, f"cache_{layers}")
            case, out = f"{layers}, {temperature}", os.path.join(root, f"{layers}_{temperature}")
            os.makedirs(out)
            command = [sys.executable, SCRIPT, "--child", "grpo", "--profile", p["profile"], "--out", out]
            command += ["--attention", p["attention"], "--grpo-iterations", "1", "--compile-cache", cache_dir]
            command += ["--scan-layers"] * (layers == "scanned")
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            print(done.stdout[-4000:] + done.stderr[-4000:], flush=True)
            try:
                with open(os.path.join(out, STEP_FILE)) as f:
                    child = json.load(f)
            except (OSError, ValueError):
                child = {}
            if done.returncode != 0 or "first_iteration_seconds" not in child:
                error = child.get("error") or f"exited with status {done.returncode}"
                cases[case] = {"error": error[:300], "process_seconds": seconds}
            else:
                first = child["iterations"][0]
                cases[case] = dict(
                    first_iteration_seconds=child["first_iteration_seconds"],
                    process_seconds=seconds,
                    **{k: first[k] for k in SPLIT + ("xla_compiles", "xla_compile_seconds")},
                    scan_layers=child.get("scan_layers"),
                    cache_hits=first["cache_hits"],
                    cache_misses=first["cache_misses"],
                )
            record(model=p["grpo_model"], cases=cases)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def step_trl(p, record):
    """TRL's `GRPOTrainer` (`benchmarks.grpo.bench_trl`) at `grpo_model` with the `grpo` step's setting: prompts,
    samples, new tokens, minibatches, lr; every row trained (TRL always does); on the GPU float32 master weights
    with bf16 autocast. Generation is transformers `generate` (no vLLM on the image), then, where
    `trl_static_cache` is set, `generate` with the static KV cache (which compiles its decoding step). Per
    variant: the first round (= iteration) and the median of the later ones, and the GPU's peak allocated bytes."""
    import gc
    import types

    import torch
    import transformers
    import trl

    from benchmarks.grpo import bench_trl
    from mathrl_jax.models import write_tiny_checkpoint

    device = torch_device()
    settings = types.SimpleNamespace(
        prompts=p["grpo_prompts"],
        samples=p["grpo_samples"],
        max_new_tokens=p["grpo_new_tokens"],
        minibatches=p["grpo_minibatches"],
        lr=1e-6,
        warmup=1,
        iterations=p["trl_iterations"],
    )
    record(
        model=p["grpo_model"],
        torch_device=device,
        trl=trl.__version__,
        transformers=transformers.__version__,
        torch=torch.__version__,
        prompts=settings.prompts,
        samples=settings.samples,
        new_tokens=settings.max_new_tokens,
        minibatches=settings.minibatches,
    )
    directory = tempfile.mkdtemp(prefix="bench_gpu_trl_")
    try:
        model_dir = os.path.join(directory, "model")
        write_tiny_checkpoint(model_dir, seed=0, **MODELS[p["grpo_model"]])
        variants = {}
        for label, cache in (("generate", None), ("generate, static cache", "static"))[: 1 + p["trl_static_cache"]]:
            if device == "cuda":  # the last variant's trainer gone before the peak is counted anew
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            run = bench_trl(
                model_dir,
                os.path.join(directory, label),
                settings,
                device=device,
                cache_implementation=cache,
                gradient_checkpointing=True,  # as the grpo step's remat
            )
            times = run["times"]
            variants[label] = dict(
                first_iteration_seconds=times[0],
                median_seconds=statistics.median(times[1:] or times),
                iterations=times,
                peak_memory_bytes=run["peak"],
            )
            record(variants=variants)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def step_attention(p, record):
    """The training passes' attention (`models.attention.full_attention`, config.attention) forward + backward at the
    model's heads, `attention_rows` packed rows of `attention_length` tokens holding sequences of 512 (the
    segment mask of packing), bfloat16, per implementation: "blocked" (the CPU default), "xla" and "cudnn" (the
    fused kernel, the GPU default: whether it accepts this mask here, and its speed). A failing implementation
    is recorded with its error; the others still run."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from mathrl_jax.models import attention, tiny_config

    config = tiny_config(**MODELS[p["attention_model"]])
    rows, length = p["attention_rows"], p["attention_length"]
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (rows, length, heads, dim), jnp.bfloat16)
    k, v = (jax.random.normal(key, (rows, length, kv_heads, dim), jnp.bfloat16) for key in keys[1:])
    segments = jnp.asarray(1 + np.arange(length) // min(512, length))[None].repeat(rows, 0)
    positions = jnp.asarray(np.arange(length) % min(512, length))[None].repeat(rows, 0)
    _, allowed = attention.full_sequence_attention(segments, positions=positions, segment_ids=segments)
    record(**device_info(), model=p["attention_model"], rows=rows, length=length, heads=heads, kv_heads=kv_heads)
    results = {}
    for implementation in p["attention_implementations"]:
        try:
            loss = lambda q, k, v, i=implementation: jnp.sum(
                attention.full_attention(q, k, v, allowed, i).astype(jnp.float32)
            )  # noqa: E731
            grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            start = time.perf_counter()
            jax.block_until_ready(grad(q, k, v))
            first = time.perf_counter() - start
            seconds = []
            for _ in range(5):
                start = time.perf_counter()
                jax.block_until_ready(grad(q, k, v))
                seconds.append(time.perf_counter() - start)
            results[implementation] = dict(first_seconds=first, median_seconds=statistics.median(seconds))
        except Exception as error:  # recorded: an implementation this device does not run
            results[implementation] = dict(error=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
        record(implementations=results)


STEP_FUNCTIONS = {
    "matmul": step_matmul,
    "update": step_update,
    "attention": step_attention,
    "sampler": step_sampler,
    "sync": step_sync,
    "grpo": step_grpo,
    "update_sweep": step_update_sweep,
    "compile": step_compile,
    "trl": step_trl,
}


# ---------------------------------------------------------------------------
# A step's process, and the run of them
# ---------------------------------------------------------------------------


def write_json(path: str, value) -> None:
    """Writes `value` as JSON, so a reader never sees half of it (`mathrl_jax.files`)."""
    from mathrl_jax import files

    files.write_json(path, value, indent=2)


def run_child(name: str, args) -> int:
    """The body of `--child NAME`: runs the step, saving its numbers to OUT/current_step.json as it goes; an error
    is saved there too (type, message, traceback) and the exit status is 1."""
    p = dict(
        PROFILES[args.profile],
        profile=args.profile,
        attention=args.attention,
        scan_layers=args.scan_layers,
        remat_policy=args.remat_policy,
        compile_cache=args.compile_cache,
    )
    p["update_variants"] = tuple(args.variants.split(",")) if args.variants else p["update_variants"]
    p["sampler_batches"] = (
        tuple(int(b) for b in args.sampler_batches.split(",")) if args.sampler_batches else (p["sampler_batches"])
    )
    p["grpo_iterations"] = args.grpo_iterations or p["grpo_iterations"]
    path = os.path.join(args.out, STEP_FILE)
    result = {}

    def record(**values):
        result.update(values)
        write_json(path, result)

    record(started=True)
    try:
        if name == args.hang_step:  # tests: a step that runs over its budget
            time.sleep(p["budget_s"][name] + 600)
        if name == args.fail_step:  # tests: a step that raises
            raise RuntimeError(f"made to fail by --fail-step {name}")
        if args.profile == "gpu":  # fail fast rather than run the 1.5B shapes on a CPU until the budget ends
            import jax

            if jax.default_backend() != "gpu":
                raise RuntimeError(
                    f"JAX's backend is {jax.default_backend()!r}, not a GPU (JAX_PLATFORMS="
                    f"{os.environ.get('JAX_PLATFORMS', '')!r}; is JAX's CUDA build installed?): use --smoke on a CPU"
                )
        STEP_FUNCTIONS[name](p, record)
    except Exception as error:
        traceback.print_exc()
        record(error=f"{type(error).__name__}: {error}"[:2000], traceback=traceback.format_exc()[-4000:])
        return 1
    return 0


def kill_group(child: subprocess.Popen) -> None:
    """SIGKILL to a step's process group: the step and anything it started (the grader's workers)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


def run_step(name: str, budget: float, args, child_flags, on_start) -> dict:
    """Runs step `name` in a child process (its own process group, output appended to OUT/bench_gpu.log) for at most
    `budget` seconds, calling `on_start(pid)` once it runs; returns its record: its numbers, status "ok" or
    "failed", the error and the seconds."""
    step_file = os.path.join(args.out, STEP_FILE)
    if os.path.exists(step_file):
        os.remove(step_file)
    command = [
        sys.executable,
        SCRIPT,
        "--child",
        name,
        "--out",
        args.out,
        *child_flags,
    ]
    start = time.perf_counter()
    with open(os.path.join(args.out, "bench_gpu.log"), "a") as log:
        log.write(f"\n===== {name} (budget {budget:.0f} s) =====\n")
        log.flush()
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            on_start(child.pid)
            code, error = child.wait(timeout=budget), None
        except subprocess.TimeoutExpired:
            kill_group(child)
            code, error = None, f"ran over its budget of {budget:.0f} s (killed)"
        except BaseException:  # the run itself stopped (SIGTERM, Ctrl-C): the step goes with it
            kill_group(child)
            raise
    seconds = time.perf_counter() - start
    try:
        with open(step_file) as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = {}
    if os.path.exists(step_file):  # from here on in the report
        os.remove(step_file)
    result.pop("started", None)
    result.pop("traceback", None)  # in the log
    if error is None and code != 0:
        error = result.pop("error", None) or f"exited with status {code} (see bench_gpu.log)"
    result.pop("error", None)
    status = "ok" if error is None else "failed"
    return {"status": status, "error": error, "seconds": seconds, "budget_s": budget, **result}


def add_mfu(report: dict) -> None:
    """The updates' MFU: model TFLOP/s (6 x params x tokens) over the matmul step's measured bf16 rate (both from
    this run); and `hfu`, the FLOPs XLA counts in the program (remat's recomputation included) over that rate."""
    matmul = report["steps"].get("matmul", {})
    if not matmul.get("tflops"):
        return
    updates = [report["steps"].get("update", {})]
    updates += list(report["steps"].get("update_sweep", {}).get("variants", {}).values())
    for update in updates:
        if update.get("tflops"):
            update["mfu"] = update["tflops"] / matmul["tflops"]
            update["mfu_against"] = f"the matmul step's measured {matmul['tflops']:.1f} TFLOP/s"
        if update.get("executed_tflops"):
            update["hfu"] = update["executed_tflops"] / matmul["tflops"]
        profile = update.get("profile") or {}
        matmul_seconds = profile.get("seconds_by_class", {}).get("matmul")
        if matmul_seconds and update.get("lowered_flops_per_step"):
            # the matmul kernels' own rate: the program's FLOPs (nearly all in matmuls) over their time a step
            rate = update["lowered_flops_per_step"] / (matmul_seconds / profile["steps"]) / 1e12
            profile["matmul_kernel_fraction"] = rate / matmul["tflops"]


def human_bytes(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes / 2**10:.1f} KiB"


def summary(name: str, r: dict) -> str:
    """One table cell of a step's numbers (what it measured before failing, for a failed one)."""
    if name == "matmul" and "tflops" in r:
        return f"{r['tflops']:.3g} TFLOP/s ({r['size']}^3 bf16, {min(r['seconds_per_matmul']) * 1e3:.2f} ms)"
    if name == "update" and "median_seconds" in r:
        mfu = f"MFU {100 * r['mfu']:.1f}%" if "mfu" in r else "no MFU (no matmul rate in this run)"
        return (
            f"{r['model']}, {r['rows']} x {r['length']} tokens: {r['median_seconds']:.3f} s/step, "
            f"{r['tflops']:.3g} TFLOP/s (6 x {r['params'] / 1e9:.3g}B params x tokens), {mfu}; "
            f"compile {r['compile_seconds']:.0f} s"
        )
    if name == "attention" and r.get("implementations"):
        parts = [
            f"{i}: " + (f"{x['median_seconds'] * 1e3:.1f} ms" if "median_seconds" in x else "failed")
            for i, x in r["implementations"].items()
        ]
        return f"{r['model']} heads, {r['rows']} x {r['length']} packed, fwd+bwd bf16: " + ", ".join(parts)
    if name == "sampler" and r.get("batches"):
        parts = []
        for b, x in r["batches"].items():
            part = f"batch {b}: {x['jax_tokens_per_second']:.0f} tok/s ({x['bandwidth_fraction']:.2f} of bandwidth)"
            if "ratio" in x:
                part += f" vs {x['transformers_tokens_per_second']:.0f} ({x['ratio']:.2f}x)"
            parts.append(part)
        bandwidth = r.get("copy_bandwidth_bytes_per_second", 0) / 1e9
        return f"{r['model']}, JaxSampler vs transformers, copy bandwidth {bandwidth:.0f} GB/s: " + "; ".join(parts)
    if name == "update_sweep" and r.get("variants"):
        parts = []
        for v, x in r["variants"].items():
            if "median_seconds" not in x:
                parts.append(f"{v}: failed ({x.get('error', 'not finished')})")
                continue
            mfu = f", MFU {100 * x['mfu']:.1f}%" if "mfu" in x else ""
            hfu = f", executed {100 * x['hfu']:.1f}%" if "hfu" in x else ""
            error = f" (then: {x['error']})" if "error" in x else ""
            parts.append(f"{v}: {x['median_seconds']:.3f} s{mfu}{hfu}, compile {x['compile_seconds']:.0f} s{error}")
        profile = next((x["profile"] for x in r["variants"].values() if "profile" in x), None)
        if profile:
            share = ", ".join(f"{k} {v:.0%}" for k, v in profile["share_by_class"].items())
            kernels = profile.get("matmul_kernel_fraction")
            kernels = f", matmul kernels at {kernels:.0%} of the matmul rate" if kernels else ""
            parts.append(f"profile of the first: {share} of kernel time, idle {profile['idle_fraction']:.0%}{kernels}")
        return "; ".join(parts)
    if name == "compile" and r.get("cases"):
        parts = [
            f"{case}: "
            + (
                f"{x['first_iteration_seconds']:.1f} s ({x['xla_compiles']} programs, {x['xla_compile_seconds']:.1f} "
                f"s compiling or loading them; {x['cache_hits']} cache hits)"
                if "error" not in x
                else "failed"
            )
            for case, x in r["cases"].items()
        ]
        return f"{r['model']} first iteration: " + "; ".join(parts)
    if name == "trl" and r.get("variants"):
        parts = [
            f"{v}: {x['median_seconds']:.2f} s/iteration (first {x['first_iteration_seconds']:.1f} s), "
            f"peak {human_bytes(x['peak_memory_bytes'])}"
            for v, x in r["variants"].items()
        ]
        return f"TRL {r['trl']} GRPOTrainer, {r['model']}: " + "; ".join(parts)
    if name == "sync" and r.get("cases"):
        parts = [
            f"{case}: {x['median_seconds']:.3f} s, {x['copies']}/{x['tensors']} copies "
            f"({human_bytes(x['copied_bytes'])})"
            for case, x in r["cases"].items()
        ]
        return f"{r['model']}: " + "; ".join(parts)
    if name == "grpo" and r.get("median"):
        m = r["median"]
        parts = ", ".join(f"{k[:-5]} {m[k]:.2f}" for k in SPLIT)
        return (
            f"{r['model']}, {r['prompts']} x {r['samples']}, {r['new_tokens']} new: {m['step_time']:.2f} s/iteration "
            f"({parts}); first {r['first_iteration_seconds']:.1f} s"
        )
    return ""


def table(report: dict) -> str:
    lines = [
        f"bench_gpu ({report['profile']}), {report['date']}, {report.get('device', '?')}",
        "| step | status | seconds | result |",
        "|---|---|---:|---|",
    ]
    for name, r in report["steps"].items():
        result = summary(name, r)
        if r["status"] != "ok":
            result = (result + "; " if result else "") + f"error: {r['error']}"
        lines.append(f"| {name} | {r['status']} | {r['seconds']:.1f} | {result} |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_gpu"), help="the JSON, table and logs")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, short lengths, on the CPU")
    parser.add_argument("--only", default="", help=f"comma-separated steps of {','.join(STEPS)}")
    parser.add_argument("--budget-s", type=float, default=None, help="each step's budget (default: per step)")
    parser.add_argument("--total-budget-s", type=float, default=None, help="the whole run's (default: the profile's)")
    parser.add_argument(
        "--attention", default="auto", choices=ATTENTION_IMPLEMENTATIONS, help="config.attention of update and grpo"
    )
    parser.add_argument(
        "--scan-layers", action="store_true", help="config.scan_layers of update and grpo (one layer compiled)"
    )
    parser.add_argument(
        "--remat-policy", default="nothing_saveable", choices=REMAT_POLICIES, help="config.remat_policy of update"
    )
    parser.add_argument(
        "--variants", default="", help=f"update_sweep's variants, comma-separated, of {','.join(UPDATE_VARIANTS)}"
    )
    parser.add_argument("--sampler-batches", default="", help="the sampler step's batch sizes, e.g. 256,1024")
    parser.add_argument("--fail-step", default="", choices=("",) + STEPS, help="tests: make this step raise")
    parser.add_argument("--hang-step", default="", choices=("",) + STEPS, help="tests: make this step run over")
    parser.add_argument("--child", default="", choices=("",) + STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--profile", default="", choices=("",) + tuple(PROFILES), help=argparse.SUPPRESS)
    parser.add_argument("--compile-cache", default="", help=argparse.SUPPRESS)  # grpo: the persistent cache's dir
    parser.add_argument("--grpo-iterations", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = os.path.abspath(args.out)
    args.profile = args.profile or ("smoke" if args.smoke else "gpu")
    steps = list(dict.fromkeys(s for s in args.only.split(",") if s)) or list(DEFAULT_STEPS)
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        parser.error(f"--only={args.only}: {unknown} not among the steps {','.join(STEPS)}")
    # --only's order is the run's, so the steps that matter most run first; the matmul rate (the MFU's
    # denominator) always first, and added where an update step needs it
    if "matmul" not in steps and {"update", "update_sweep"} & set(steps):
        steps.insert(0, "matmul")
    args.steps = sorted(steps, key=lambda s: s != "matmul")
    bad = [v for v in args.variants.split(",") if v and v not in UPDATE_VARIANTS]
    if bad:
        parser.error(f"--variants={args.variants}: {bad} not among {','.join(UPDATE_VARIANTS)}")
    try:
        batches = [int(b) for b in args.sampler_batches.split(",") if b]
    except ValueError:
        batches = [0]
    if any(b < 1 for b in batches):
        parser.error(f"--sampler-batches={args.sampler_batches}: expected positive integers, e.g. 256,1024")
    for flag in ("budget_s", "total_budget_s"):
        if getattr(args, flag) is not None and not getattr(args, flag) > 0:
            parser.error(f"--{flag.replace('_', '-')}={getattr(args, flag)}: must be > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax is imported, here or in a child
    if args.child:
        return run_child(args.child, args)
    p = PROFILES[args.profile]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_gpu.log"), "w"):
        pass
    total = args.total_budget_s or p["total_budget_s"]
    child_flags = ["--profile", args.profile, "--attention", args.attention, "--remat-policy", args.remat_policy]
    child_flags += ["--scan-layers"] * args.scan_layers
    for flag in ("variants", "sampler_batches"):
        if getattr(args, flag):
            child_flags += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    for flag in ("fail_step", "hang_step"):
        if getattr(args, flag):
            child_flags += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    settings = {k: os.environ[k] for k in (*XLA_SETTINGS, "XLA_FLAGS", "JAX_PLATFORMS") if k in os.environ}
    print(
        f"# bench_gpu: profile {args.profile}, steps {','.join(args.steps)}, total budget {total:.0f} s, out {args.out}"
    )
    print(
        "XLA settings (set before jax is imported; the steps inherit them): "
        + " ".join(f"{k}={v}" for k, v in settings.items()),
        flush=True,
    )
    report = {
        "date": datetime.date.today().isoformat(),
        "profile": args.profile,
        "host": f"{platform.node()}, {os.cpu_count()} cores, python {platform.python_version()}",
        "xla_settings": settings,
        "models": {name: MODELS[name] for name in sorted({p[f"{s}_model"] for s in STEPS if f"{s}_model" in p})},
        "complete": False,
        "running": None,
        "steps": {},
    }
    json_path = os.path.join(args.out, "bench_gpu.json")

    def stop(signum, frame):  # a run stopped from outside: its step goes with it, the JSON stays
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    deadline = time.perf_counter() + total
    try:
        for i, name in enumerate(args.steps, 1):
            left = deadline - time.perf_counter()
            budget = min(args.budget_s or p["budget_s"][name], left)
            if left < MIN_STEP_S:
                error = f"not started: {left:.0f} s left of the total budget of {total:.0f} s"
                report["steps"][name] = {"status": "failed", "error": error, "seconds": 0.0, "budget_s": 0.0}
            else:
                print(f"[{i}/{len(args.steps)}] {name}: started, budget {budget:.0f} s", flush=True)

                def started(pid, name=name):  # the JSON names the running step (and its process group)
                    report["running"] = {"step": name, "pid": pid}
                    write_json(json_path, report)

                report["steps"][name] = run_step(name, budget, args, child_flags, started)
                report["running"] = None
            r = report["steps"][name]
            report["device"] = report.get("device") or r.get("device")
            if name in ("update", "update_sweep"):
                add_mfu(report)
            write_json(json_path, report)
            line = f"[{i}/{len(args.steps)}] {name}: {r['status']} in {r['seconds']:.1f} s"
            print(line + (f": {r['error']}" if r["error"] else f": {summary(name, r)}"), flush=True)
        report["complete"] = True
    finally:
        write_json(json_path, report)
    text = table(report)
    with open(os.path.join(args.out, "bench_gpu.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text)
    print(f"\nwrote {json_path} and bench_gpu.md")
    return 0 if all(r["status"] == "ok" for r in report["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
