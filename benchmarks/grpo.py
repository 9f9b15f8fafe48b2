"""One GRPO iteration of mathrl_jax against TRL's `GRPOTrainer` on the same warm-started tiny model, in one run.

The setting (the offline default's machinery at the issue's batch): the tiny Qwen-architecture model, first
warm-started by mathrl_jax on the bare boxed answers of the arithmetic problems (`warmstart.targets="answer"`,
written once as a Hugging Face checkpoint that both systems load); then GRPO on 32 prompts x 8 samples of at most
12 new tokens, 4 minibatches (optimizer steps) per iteration, lr 1e-5, no KL term (beta 0), temperature 1,
token-mean loss, clip 0.2, float32, the math verifier's reward. TRL's mapping: `per_device_train_batch_size=64`,
`steps_per_generation=4` (one generation of 256 completions feeds 4 optimizer steps), `num_iterations=1`,
`gradient_checkpointing=False` (TRL's default turns it on, which costs it ~25% here), `loss_type="dapo"`
(token-mean over the batch), `scale_rewards="group"`.

Printed: each system's first iteration (compiling, for mathrl_jax) and steady iteration (median and range
after `--warmup`), the ratio, and mathrl_jax's split of an iteration (`perf/*` metrics of the loop).
mathrl_jax runs twice: as configured by default, where the update leaves out the rows whose every advantage is
0 (`skip_zero_advantage`: a group whose 8 samples earned one reward trains nothing, and the parameters after
the update are those of training every row), and with `skip_zero_advantage=False`, every row trained as TRL
does (`--default-only` skips that run). The fraction of response tokens the update trained on is printed
beside them: the first speed-up depends on it.

At a real shape (`--shape qwen2.5-0.5b` or `qwen2.5-1.5b`: random weights of that architecture, its 151,936-token
vocabulary, the character tokenizer; no warm-start) the model earns no reward, so the update trains every row
(`skip_zero_advantage=False`, as TRL does) and only that run is made; float32 on both sides (`--set dtype=...`
changes mathrl_jax's compute). Each system runs in a process of its own, which reports its peak resident memory;
mathrl_jax's XLA compiles (count and seconds, from `jax.monitoring`) are reported too. At a real shape the run
ends with the limits table (`benchmarks/limits.py`, in a process of its own after the systems): the machine's
float32 and bfloat16 matmul rate and copy bandwidth, measured then, and as fractions of them the update's model
FLOP rate, the generation's weight-and-cache bytes per second, and a log-prob pass timed on the iteration's batch.

    pip install -e '.[bench]'            # trl; never needed by the tests
    python scripts/bench_grpo.py         # both systems, ~5 minutes on a 2-core CPU
    python scripts/bench_grpo.py --skip-trl --iterations 2 --warmup 1   # mathrl_jax alone
    python scripts/bench_grpo.py --shape qwen2.5-0.5b --prompts 8 --samples 4 --max-new-tokens 128 \
        --minibatches 2 --iterations 1 --warmup 1 --default-only     # the real shape, ~1 hour on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from benchmarks.limits import grpo_limits, limits_lines
from mathrl_jax.train import run_directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SPLIT = ("generate_time", "grade_time", "logprob_time", "update_time", "sync_time")
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def in_own_process(fn, *args):
    """`fn(*args)` in a fresh process (spawned: no JAX or torch state shared), so its peak memory is its own."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def random_model(directory: str, shape: str) -> str:
    """A random-weight checkpoint of `shape`'s architecture (benchmarks.shapes.SHAPES) with the character tokenizer."""
    from benchmarks.shapes import SHAPES
    from mathrl_jax.models import write_tiny_checkpoint

    path = os.path.join(directory, shape)
    write_tiny_checkpoint(path, seed=0, **SHAPES[shape])
    return path


def base_config(run_dir: str, args):
    from mathrl_jax.configs import default

    c = default.get_config()
    c.run_dir = run_dir
    c.algorithm_name = "grpo"
    c.n_rollout_threads = args.prompts
    c.group_size = args.samples
    c.max_new_tokens = args.max_new_tokens
    c.num_mini_batch = args.minibatches
    c.lr = args.lr
    c.arithmetic.num_train = 4096
    c.eval_interval = 0
    c.num_logged_samples = 0
    c.save_interval = 0
    c.export_final = False
    c.progress = False
    c.warmstart.targets = "answer"
    c.warmstart.steps = args.warmstart_steps
    return c


def warm_started_model(directory: str, args) -> str:
    """mathrl_jax's warm-start, written once as `<directory>/warm/warmstart_model` (an HF checkpoint + tokenizer)."""
    from mathrl_jax.train.loop import train

    c = base_config(os.path.join(directory, "warm"), args)
    c.num_iterations = 0
    train(c)
    return run_directory.path(c.run_dir, run_directory.WARMSTART_MODEL)


def run_config(model_dir: str, directory: str, args, settings=()):
    """The config of a mathrl_jax run on `model_dir`: `base_config`, then `--set`'s KEY=VALUE and `settings`'."""
    c = base_config(os.path.join(directory, "mathrl_" + "_".join(settings)), args)
    c.model_name_or_path = model_dir
    c.warmstart.steps = 0
    c.num_iterations = args.warmup + args.iterations
    for setting in list(args.set) + list(settings):  # e.g. packing=False
        key, value = setting.split("=", 1)
        c[key] = type(c[key])(value) if not isinstance(c[key], bool) else value.lower() in ("1", "true")
    return c


def bench_mathrl(model_dir: str, directory: str, args, settings=()):
    """Per-iteration metrics of `iterations + warmup` GRPO iterations of the training loop, with the config
    `settings` (KEY=VALUE) after `--set`'s."""
    from mathrl_jax import compile_cache
    from mathrl_jax.train.loop import train

    # In this process too (a spawned one): without it, a second run's first iteration recompiled everything.
    compile_cache.enable(os.environ.get("MATHRL_BENCH_CACHE", ""))
    c = run_config(model_dir, directory, args, settings)
    records = []
    compiles = []
    import jax

    listener = lambda event, seconds, **_: compiles.append(seconds) if event == COMPILE_EVENT else None  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    train(c, on_metrics=lambda i, m: records.append(dict(m)))
    jax.monitoring.unregister_event_duration_listener(listener)
    return {"records": records, "compiles": len(compiles), "compile_seconds": sum(compiles), "peak": peak_rss_bytes()}


def bench_trl(
    model_dir: str,
    directory: str,
    args,
    device: str = "cpu",
    cache_implementation=None,
    gradient_checkpointing: bool = False,
):
    """Wall time of each generation round (= `minibatches` optimizer steps) of TRL's GRPOTrainer, and its peak
    memory. On `device="cuda"`: float32 master weights with bf16 autocast (`bf16=True`, the mixed precision of
    mathrl_jax's `param_dtype="float32", dtype="bfloat16"`) and the GPU's peak allocated bytes; else float32 on the
    CPU and the process's peak resident memory. `cache_implementation="static"`: transformers' static KV cache,
    with which `generate` compiles its decoding step (`torch.compile`, on CUDA). `gradient_checkpointing`: TRL's
    default (True) matches mathrl_jax's remat; False (this CPU benchmark's) is ~25% faster here."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mathrl_jax.data import arithmetic
    from mathrl_jax.data.prompts import format_prompt
    from mathrl_jax.rewards.math_grader import MathGrader

    torch.set_num_threads(os.cpu_count() or 1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    rounds = args.warmup + args.iterations
    problems, _ = arithmetic.arithmetic_train_eval(
        args.prompts * rounds, 1, seed=0, levels=(2,), question_format="{expr}="
    )
    data = Dataset.from_list(
        [{"prompt": format_prompt(p.question, "plain", tokenizer=tokenizer), "answer": p.answer} for p in problems]
    )
    grader = MathGrader()

    def verifier(prompts, completions, answer, **_):
        return [float(r) for r in grader.rewards(list(completions), list(answer))[0]]

    marks = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            marks.append(time.perf_counter())

    config = GRPOConfig(
        output_dir=os.path.join(directory, "trl"),
        per_device_train_batch_size=args.prompts * args.samples // args.minibatches,
        gradient_accumulation_steps=1,
        steps_per_generation=args.minibatches,
        num_generations=args.samples,
        num_iterations=1,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        gradient_checkpointing=gradient_checkpointing,
        bf16=device == "cuda",
        use_cpu=device == "cpu",
        cache_implementation=cache_implementation,
        max_steps=rounds * args.minibatches,
        logging_steps=10**6,
        report_to="none",
        save_strategy="no",
        shuffle_dataset=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=verifier, args=config, train_dataset=data, processing_class=tokenizer
    )
    if cache_implementation == "static" and hasattr(trainer, "generation_config"):
        # TRL builds its GenerationConfig with disable_compile=True (trl 1.16, grpo_trainer.py), which would run the
        # static cache eagerly: compiling is the point of it
        trainer.generation_config.disable_compile = False
    trainer.add_callback(Clock())
    trainer.train()
    grader.close()
    ends = marks[:: args.minibatches]  # train start, then the end of each round's last step
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else peak_rss_bytes()
    return {"times": [b - a for a, b in zip(ends, ends[1:])], "peak": peak}


def summary(times):
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def mathrl_result(run, args):
    records = run["records"]
    steady = records[args.warmup :]
    return {
        "compiles": run["compiles"],
        "compile_seconds": run["compile_seconds"],
        "peak_memory_gib": run["peak"] / 2**30,
        "first_iteration": records[0]["perf/step_time"],
        "steady": summary([r["perf/step_time"] for r in steady]),
        "split": {k: statistics.median(r[f"perf/{k}"] for r in steady) for k in SPLIT},
        "trained_token_fraction": statistics.mean(r["train/trained_token_fraction"] for r in steady),
        "tokens_per_second": statistics.median(r["perf/tokens_per_second"] for r in steady),
        "response_length": statistics.mean(r["rollout/response_length"] for r in records),
        "accuracy": statistics.mean(r["rollout/accuracy"] for r in records),
        "iterations": [{k: r[f"perf/{k}"] for k in ("step_time",) + SPLIT} for r in records],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=10, help="steady iterations measured")
    parser.add_argument("--warmup", type=int, default=3, help="iterations before them (the first one compiles)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--warmstart-steps", type=int, default=300)
    parser.add_argument("--skip-trl", action="store_true", help="mathrl_jax alone (no trl needed)")
    parser.add_argument("--set", action="append", default=[], help="a mathrl_jax config override, KEY=VALUE")
    parser.add_argument(
        "--default-only", action="store_true", help="no second mathrl_jax run with skip_zero_advantage=False"
    )
    parser.add_argument("--json", default="", help="write the numbers here")
    parser.add_argument(
        "--shape", default="tiny", help="tiny (warm-started), qwen2.5-0.5b or qwen2.5-1.5b (random weights)"
    )
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 1:
        parser.error("--iterations and --warmup must be >= 1 (the first iteration compiles)")

    from mathrl_jax import compile_cache

    compile_cache.enable(os.environ.get("MATHRL_BENCH_CACHE", ""))  # off by default: the first iteration compiles
    # (label, key in the JSON, config settings) of each mathrl_jax run
    from benchmarks.shapes import SHAPES

    if args.shape not in SHAPES:
        parser.error(f"--shape {args.shape!r}: expected one of {sorted(SHAPES)}")
    real = args.shape != "tiny"
    variants = [("mathrl_jax", "mathrl_jax", ("skip_zero_advantage=False",) if real else ())]
    if not args.default_only and not real:
        variants.append(("mathrl_jax, every row trained", "mathrl_jax_every_row", ("skip_zero_advantage=False",)))
    with tempfile.TemporaryDirectory(prefix="bench_grpo_") as directory:
        model_dir = random_model(directory, args.shape) if real else warm_started_model(directory, args)
        runs = {key: in_own_process(bench_mathrl, model_dir, directory, args, s) for _, key, s in variants}
        # After the systems, in a process of its own: the machine's matmul rate and bandwidth, the stages' fractions.
        limits = None
        if real:
            config = run_config(model_dir, directory, args, variants[0][2])
            steady = runs["mathrl_jax"]["records"][args.warmup :]
            limits = in_own_process(grpo_limits, model_dir, config, steady)
        trl = None if args.skip_trl else in_own_process(bench_trl, model_dir, directory, args)
    trl_times = None if trl is None else trl["times"]

    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "setting": {
            k: getattr(args, k) for k in ("shape", "prompts", "samples", "max_new_tokens", "minibatches", "lr")
        },
    }
    for _, key, _ in variants:
        result[key] = mathrl_result(runs[key], args)
    if trl_times is not None:
        result["trl"] = {
            "first_iteration": trl_times[0],
            "steady": summary(trl_times[args.warmup :]),
            "peak_memory_gib": trl["peak"] / 2**30,
        }
        for _, key, _ in variants:
            result[key]["speedup_over_trl"] = result["trl"]["steady"]["median"] / result[key]["steady"]["median"]
        result["speedup"] = result["mathrl_jax"]["speedup_over_trl"]

    print(
        f"GRPO iteration at the {args.shape} shape, {args.prompts} prompts x {args.samples} samples, "
        f"<= {args.max_new_tokens} new tokens, {args.minibatches} minibatches; {result['date']}, {result['machine']}"
    )
    print(
        "| system | first iteration (s) | steady iteration (s), median (min-max) | tokens trained | peak memory "
        "(GiB) | speed-up |"
    )
    print("|---|---|---|---|---|---|")
    for name, key, _ in variants:
        m = result[key]
        speedup = f"{m['speedup_over_trl']:.2f}x" if trl_times is not None else ""
        print(
            f"| {name} | {m['first_iteration']:.2f} | {m['steady']['median']:.3f} "
            f"({m['steady']['min']:.3f}-{m['steady']['max']:.3f}) | {m['trained_token_fraction']:.2f} | "
            f"{m['peak_memory_gib']:.2f} | {speedup} |"
        )
    if trl_times is not None:
        t = result["trl"]
        print(
            f"| TRL GRPOTrainer | {t['first_iteration']:.2f} | {t['steady']['median']:.3f} "
            f"({t['steady']['min']:.3f}-{t['steady']['max']:.3f}) | 1.00 | {t['peak_memory_gib']:.2f} | 1.00x |"
        )
    for name, key, _ in variants:
        m = result[key]
        print(
            f"{name} split (median s): "
            + ", ".join(f"{k[:-5]} {v:.3f}" for k, v in m["split"].items())
            + f"; accuracy {m['accuracy']:.2f}, mean response {m['response_length']:.1f} tokens; "
            + f"{m['compiles']} XLA compiles, {m['compile_seconds']:.1f} s"
        )
    if limits is not None:
        result["limits"] = limits
        print("\n".join(limits_lines(limits)))
    else:
        print("Limits: measured at the real shapes only (--shape qwen2.5-0.5b or qwen2.5-1.5b)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
