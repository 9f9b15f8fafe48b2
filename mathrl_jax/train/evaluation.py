"""Held-out evaluation: greedy accuracy, and pass@k from n samples per problem."""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import numpy as np

from mathrl_jax.rewards.math_grader import MathGrader, RewardValues, reward_value
from mathrl_jax.sampling.base import Sampler, SamplingParams
from mathrl_jax.train.metrics import pass_at_k


def evaluate(
    sampler: Sampler,
    prompts: Sequence[List[int]],
    golds: Sequence[str],
    grader: MathGrader,
    decode: Callable[[List[int]], str],
    *,
    max_new_tokens: int,
    n_samples: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    ks: Sequence[int] = (1, 4, 8),
    seed: int = 0,
    batch_size: int = 256,
) -> Dict[str, float]:
    """Greedy accuracy (`eval/accuracy`) and, with `n_samples > 0`, unbiased pass@k for each k in `ks` (and n) <= n.

    pass@k = 1 - C(n - c, k) / C(n, k) per problem, averaged (Chen et al. 2021).
    """
    if len(prompts) != len(golds):
        raise ValueError(f"{len(prompts)} prompts but {len(golds)} gold answers")
    metrics: Dict[str, float] = {}
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    correct, lengths = [], []
    for start in range(0, len(prompts), batch_size):
        rollouts = sampler.generate(prompts[start : start + batch_size], greedy)
        texts = rollouts.texts or [decode(c) for c in rollouts.completion_ids]
        results = grader.grade_batch(texts, golds[start : start + batch_size])
        correct += [r.correct for r in results]
        lengths += list(rollouts.completion_lengths)
    metrics["eval/accuracy"] = float(np.mean(correct))
    metrics["eval/response_length"] = float(np.mean(lengths))
    if n_samples > 0:
        params = SamplingParams(
            n=n_samples, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
        )
        per_problem = []
        step = max(1, batch_size // n_samples)
        for start in range(0, len(prompts), step):
            rollouts = sampler.generate(prompts[start : start + step], params)
            texts = rollouts.texts or [decode(c) for c in rollouts.completion_ids]
            group_golds = [g for g in golds[start : start + step] for _ in range(n_samples)]
            results = grader.grade_batch(texts, group_golds)
            hits = np.array([r.correct for r in results]).reshape(-1, n_samples).sum(axis=1)
            per_problem += list(hits)
        for k in sorted(set(ks) | {n_samples}):  # always pass@n, whatever ks says
            if k <= n_samples:
                metrics[f"eval/pass@{k}"] = float(np.mean([pass_at_k(n_samples, int(c), k) for c in per_problem]))
    return metrics


def completion_samples(
    sampler: Sampler,
    prompts: Sequence[List[int]],
    golds: Sequence[str],
    grader: MathGrader,
    decode: Callable[[List[int]], str],
    *,
    max_new_tokens: int,
    n_samples: int = 4,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    values: RewardValues = RewardValues(),
) -> List[Dict]:
    """What the policy writes for a few prompts: the greedy completion and `n_samples` sampled ones, graded.

    One record per completion: {"prompt", "gold", "decoding" ("greedy" or "T=<temperature>"), "sample"
    (0.. within the prompt), "completion", "extracted" (the graded answer), "reward", "correct",
    "finish_reason"}, the reward by `values`. The loop writes them to `run_dir/samples/` at each
    evaluation, so a person can read what RL changed (and see reward hacking, were there any).
    """
    if len(prompts) != len(golds):
        raise ValueError(f"{len(prompts)} prompts but {len(golds)} gold answers")
    records: List[Dict] = []
    decodings = [("greedy", SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))]
    if n_samples > 0:
        sampled = SamplingParams(
            n=n_samples, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
        )
        decodings.append((f"T={temperature:g}", sampled))
    for name, params in decodings:
        rollouts = sampler.generate(list(prompts), params)
        texts = rollouts.texts or [decode(c) for c in rollouts.completion_ids]
        row_golds = [g for g in golds for _ in range(params.n)]
        results = grader.grade_batch(texts, row_golds)
        for row, (text, result) in enumerate(zip(texts, results)):
            index = int(rollouts.prompt_indices[row])
            records.append(
                {
                    "prompt": decode(list(prompts[index])),
                    "gold": golds[index],
                    "decoding": name,
                    "sample": row % params.n,
                    "completion": text,
                    "extracted": result.extracted,
                    "reward": reward_value(result, values),
                    "correct": bool(result.correct),
                    "finish_reason": rollouts.finish_reasons[row],
                }
            )
    return records
