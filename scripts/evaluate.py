"""Accuracy and pass@k of a checkpoint on a problem source.

    python scripts/evaluate.py --model runs/default/warmstart_model --dataset arithmetic
    python scripts/evaluate.py --model /models/Qwen2.5-Math-1.5B-Instruct --dataset /data/math500_test.jsonl \
        --template chat --max-new-tokens 1024 --n-samples 8 --sampler vllm

Prints greedy accuracy (`eval/accuracy`), mean response length, and with
`--n-samples n` the unbiased pass@k for k in 1, 4, 8 (k <= n) at `--temperature`.
A checkpoint saved by `scripts/train.py` is exported first with `scripts/export_hf.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a local Hugging Face checkpoint directory")
    parser.add_argument("--dataset", default="arithmetic", help="'arithmetic' or a local JSONL/parquet/datasets path")
    parser.add_argument("--layout", default="auto", help="data layout: auto math500 gsm8k areal_boba")
    parser.add_argument("--levels", default="2", help="arithmetic levels (the offline default trains on 2)")
    parser.add_argument("--question-format", default="{expr}=", help="arithmetic question format")
    parser.add_argument("--template", default="plain", help="prompt template")
    parser.add_argument("--num-problems", type=int, default=500)
    parser.add_argument(
        "--max-new-tokens", type=int, default=40, help="40 fits the worked solutions of the offline default"
    )
    parser.add_argument("--n-samples", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--sampler", choices=["jax", "vllm"], default="jax")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.model):
        parser.error(f"--model {args.model!r} is not a local directory")

    from mathrl_jax.data import arithmetic, format_prompt, load_problems
    from mathrl_jax.data.sources import DataError
    from mathrl_jax.models import hf
    from mathrl_jax.rewards.math_grader import MathGrader
    from mathrl_jax.sampling import JaxSampler
    from mathrl_jax.train.evaluation import evaluate
    from mathrl_jax.train.loop import TextCodec, TrainingError

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
        from mathrl_jax.sampling.vllm_sampler import VllmSampler

        sampler = VllmSampler(args.model, config=model.config)
    else:
        sampler = JaxSampler(
            model, eos_token_ids=[codec.eos_token_id], pad_token_id=codec.pad_token_id, tokenizer=codec
        )
    prompts = [codec.encode(format_prompt(p.question, args.template, tokenizer=codec.tokenizer)) for p in problems]
    with MathGrader() as grader:
        metrics = evaluate(
            sampler,
            prompts,
            [p.answer for p in problems],
            grader,
            codec.decode,
            max_new_tokens=args.max_new_tokens,
            n_samples=args.n_samples,
            temperature=args.temperature,
            seed=args.seed,
        )
    metrics["problems"] = len(problems)
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
