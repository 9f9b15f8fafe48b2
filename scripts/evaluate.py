"""Accuracy and pass@k of a checkpoint on a problem source.

    python scripts/evaluate.py --model runs/default/warmstart_model --dataset arithmetic
    python scripts/evaluate.py --model /models/Qwen2.5-Math-1.5B-Instruct --dataset /data/math500_test.jsonl \
        --template chat --max-new-tokens 1024 --n-samples 8 --sampler vllm

Prints greedy accuracy (`eval/accuracy`), mean response length, and with
`--n-samples n` the unbiased pass@k for k in 1, 4, 8 (k <= n) at `--temperature`.
`--model` is a Hugging Face checkpoint directory (config.json and tokenizer), e.g. a run's
`final_model` or `warmstart_model`, not an Orbax step of `run_dir/checkpoints`.

Memory: with the JAX sampler, prompts are sorted by length and batched so that each generate
call's padded KV cache (rows x (prompt bucket + max-new-tokens bucket)) stays within
`--batch-tokens` slots; results come back in the original order and greedy ones do not depend
on the batching.

Bad input exits with status 2 and a message naming it, before anything is loaded: every numeric option
(`--temperature` finite and >= 0, `--seed` in [0, 2**32), counts and budgets >= 1, `--n-samples` >= 0,
`--levels` known arithmetic levels), the template, the model directory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def model_dir_problem(path: str) -> str | None:
    """Why `path` is not a loadable Hugging Face checkpoint directory, or None when it looks like one."""
    if not os.path.isdir(path):
        return f"--model {path!r} is not a local directory"
    names = set(os.listdir(path))
    missing = []
    if "config.json" not in names:
        missing.append("config.json")
    if not names & set(HF_TOKENIZER_FILES):
        missing.append(" or ".join(HF_TOKENIZER_FILES))
    if not missing:
        return None
    orbax_step = {"state", "metadata"} <= names or "_CHECKPOINT_METADATA" in names
    checkpoints_dir = any(name.isdigit() and os.path.isdir(os.path.join(path, name)) for name in names)
    if orbax_step:
        what = "an Orbax training checkpoint (a step of run_dir/checkpoints)"
    elif checkpoints_dir:
        what = "a directory of Orbax training checkpoints (run_dir/checkpoints)"
    else:
        what = "not a Hugging Face checkpoint directory"
    return (
        f"--model {path!r} is {what}: it has no {' and no '.join(missing)}. Pass a Hugging Face checkpoint "
        "directory (config.json, safetensors weights and a tokenizer), e.g. run_dir/final_model (written at the "
        "end of a run with config.export_final) or run_dir/warmstart_model; parameters saved with "
        "flax.serialization can be turned into one with scripts/export_hf.py."
    )


# 2**14 KV slots: e.g. 8 prompts of a 256-token bucket with 1024 new tokens (1 with --n-samples 8), or 4 of
# MATH-500's longest (a 2048-token bucket with a character tokenizer) with 40. This also bounds the prefill's
# [rows, heads, prompt, cache] attention scores: the tiny stand-in model evaluates MATH-500 in about 1.6 GB.
# On an accelerator with a real model, raise it (e.g. 1 << 18) for throughput.
DEFAULT_BATCH_TOKENS = 1 << 14


SEED_LIMIT = 2**32
"""Seeds below it: JAX's keys hold 32 bits (a larger seed gives a smaller one's samples, or fails past 2**64)."""


def option_problem(args) -> str | None:
    """The first numeric option out of its range, named with its value, or None: checked before anything is
    loaded (a `--temperature nan` would otherwise fail after the model loads)."""
    checks = [
        ("--num-problems", args.num_problems, args.num_problems >= 1, ">= 1"),
        ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens >= 1, ">= 1"),
        ("--n-samples", args.n_samples, args.n_samples >= 0, ">= 0 (0: greedy only)"),
        ("--temperature", args.temperature, math.isfinite(args.temperature) and args.temperature >= 0, "finite, >= 0"),
        ("--seed", args.seed, 0 <= args.seed < SEED_LIMIT, f"in [0, {SEED_LIMIT})"),
        ("--batch-tokens", args.batch_tokens, args.batch_tokens >= 1, ">= 1"),
    ]
    for option, value, ok, expected in checks:
        if not ok:
            return f"{option} {value}: expected {expected}"
    if args.dataset == "arithmetic":
        from mathrl_jax.data.arithmetic import LEVELS

        try:
            levels = [int(level) for level in args.levels.split(",")]
        except ValueError:
            levels = []
        if not levels or any(level not in LEVELS for level in levels):
            return f"--levels {args.levels!r}: expected comma-separated arithmetic levels among {sorted(LEVELS)}"
    return None


TRAINING_KEYS = {
    "--model": "model_name_or_path",
    "--template": "prompt_template",
    "--levels": "arithmetic.levels",
    "--question-format": "arithmetic.question_format",
    "--num-problems": "num_eval_problems",
    "--max-new-tokens": "max_new_tokens",
    "--n-samples": "eval_n_samples",
    "--temperature": "temperature",
    "--sampler": "sampler",
    "--seed": "seed",
    "--compilation-cache-dir": "compilation_cache_dir",
}
"""Each option that is also a training option, and its key in the training config: `--config.KEY=VALUE` sets it
as train.py's command line does (`--config.max_new_tokens=1024` is `--max-new-tokens 1024`)."""


def build_parser() -> argparse.ArgumentParser:
    """The command line: each option under its own name and, where training has it, as `--config.KEY`."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)

    def add(name, *args, **kwargs):
        aliases = [f"--config.{TRAINING_KEYS[name]}"] if name in TRAINING_KEYS else []
        parser.add_argument(name, *aliases, *args, **kwargs)

    add("--model", required=True, help="a local Hugging Face checkpoint directory")
    add("--dataset", default="arithmetic", help="'arithmetic' or a local JSONL/parquet/datasets path")
    add("--layout", default="auto", help="data layout: auto math500 gsm8k areal_boba")
    add("--levels", default="2", help="arithmetic levels (the offline default trains on 2)")
    add("--question-format", default="{expr}=", help="arithmetic question format")
    add("--template", default="plain", help="prompt template (see mathrl_jax.data.prompts)")
    add("--num-problems", type=int, default=500)
    add("--max-new-tokens", type=int, default=40, help="40 fits the worked solutions of the offline default")
    add("--n-samples", type=int, default=0)
    add("--temperature", type=float, default=1.0)
    add("--sampler", choices=["jax", "vllm"], default="jax")
    add("--seed", type=int, default=0)
    add(
        "--batch-tokens",
        type=int,
        default=DEFAULT_BATCH_TOKENS,
        help="JAX sampler: KV-cache slots (rows x padded prompt+completion length) per generate call "
        f"(default {DEFAULT_BATCH_TOKENS}); lower it to use less memory, raise it for throughput",
    )
    add("--out", default="", help="a JSONL file to write: one line per problem (its greedy completion, verdict, ...)")
    add("--no-progress", action="store_true", help="no progress bar on stderr")
    add(
        "--compilation-cache-dir",
        "--compilation_cache_dir",  # the key's spelling, as before
        default="auto",
        help="JAX's persistent compilation cache ('auto': under ~/.cache/mathrl_jax; '': off)",
    )
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = option_problem(args)
    if problem:
        parser.error(problem)
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        parser.error(f"--out {args.out!r}: its directory does not exist")

    from mathrl_jax.data.prompts import TEMPLATE_NAMES

    if args.template not in TEMPLATE_NAMES:
        parser.error(f"--template {args.template!r} is not a prompt template; choose from {', '.join(TEMPLATE_NAMES)}")
    from mathrl_jax.models.hub import HubModelError, resolve_model_dir

    try:  # a Hub id: its snapshot in the local Hugging Face cache, downloaded first unless HF_HUB_OFFLINE is set
        args.model = resolve_model_dir(args.model, "--model")
    except HubModelError as error:
        parser.error(str(error))
    problem = model_dir_problem(args.model)
    if problem:
        parser.error(problem)
    if args.sampler == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            from mathrl_jax.sampling.vllm import VLLM_MISSING

            parser.error(f"--sampler vllm: {VLLM_MISSING}; or use --sampler jax")

    from mathrl_jax.sharding import distributed

    try:  # one process of several (jax.distributed): join before any other JAX call
        several = distributed.initialize()
    except ValueError as error:
        parser.error(str(error))
    from mathrl_jax import compile_cache

    try:
        compile_cache.enable(args.compilation_cache_dir, option="--compilation-cache-dir")
    except ValueError as error:
        parser.error(str(error))

    import jax

    from mathrl_jax import sharding
    from mathrl_jax.data import arithmetic, load_problems, problem_prompt
    from mathrl_jax.data.sources import DataError
    from mathrl_jax.errors import TrainingError
    from mathrl_jax.evaluation import evaluate
    from mathrl_jax.models import hf
    from mathrl_jax.models.codec import TextCodec
    from mathrl_jax.rewards.math_grader import MathGrader
    from mathrl_jax.rewards.serial_grader import SerialGrader
    from mathrl_jax.sampling import JaxSampler

    try:
        codec = TextCodec(args.model)
        if args.dataset == "arithmetic":
            levels = tuple(int(x) for x in args.levels.split(","))
            _, problems = arithmetic.arithmetic_train_eval(
                1, args.num_problems, seed=args.seed, levels=levels, question_format=args.question_format
            )
        else:
            problems = load_problems(args.dataset, args.layout)[: args.num_problems]
    except (DataError, TrainingError, ValueError) as error:
        print(f"evaluate.py: error: {error}", file=sys.stderr)
        return 2
    model = hf.load_model(args.model)
    if args.sampler == "vllm":
        from mathrl_jax.sampling.vllm import VllmSampler

        sampler = VllmSampler(
            args.model,
            config=model.config,
            eos_token_ids=[codec.eos_token_id],
            tokenizer=codec,
            dtype=model.config.dtype,
        )
    else:
        # Several processes: one sampler mesh over all their devices, each decoding its share of the rows.
        mesh = sharding.make_mesh({"dp": -1, "fsdp": 1, "tp": 1}) if several else None
        sampler = JaxSampler(
            model, eos_token_ids=[codec.eos_token_id], pad_token_id=codec.pad_token_id, tokenizer=codec, mesh=mesh
        )
    # As training renders them: chat messages through the tokenizer's template, else the question under --template.
    texts = [problem_prompt(p, args.template, tokenizer=codec.tokenizer, source=args.model) for p in problems]
    prompts = [codec.encode(text) for text in texts]
    from tqdm import tqdm

    passes = 2 if args.n_samples else 1  # greedy, then the samples
    main_process = not several or jax.process_index() == 0
    quiet = args.no_progress or not main_process
    bar = tqdm(total=passes * len(prompts), unit="problem", desc="evaluate", disable=quiet)
    records = [] if args.out else None
    with MathGrader() as math_grader, bar:
        metrics = evaluate(
            sampler,
            prompts,
            [p.answer for p in problems],
            SerialGrader(math_grader),  # across processes: each grades its share, the verdicts are gathered
            codec.decode,
            max_new_tokens=args.max_new_tokens,
            n_samples=args.n_samples,
            temperature=args.temperature,
            seed=args.seed,
            # vLLM schedules its own memory: hand it the prompts in large batches, as before.
            batch_tokens=args.batch_tokens if args.sampler == "jax" else None,
            records=records,
            on_progress=bar.update,
        )
    metrics["problems"] = len(problems)
    if records is not None and main_process:
        with open(args.out, "w", encoding="utf-8") as f:
            for problem, text, record in zip(problems, texts, records):
                f.write(json.dumps({"uid": problem.uid, "question": problem.question, "prompt": text, **record}) + "\n")
    if not several or jax.process_index() == 0:  # accuracies to 4 places: 0.8218, not 0.8218000000000001
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
