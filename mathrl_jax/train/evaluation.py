"""Held-out evaluation: greedy accuracy, and pass@k from n samples per problem."""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import numpy as np

from mathrl_jax.rewards.math_grader import MathGrader
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
    """Greedy accuracy (`eval/accuracy`) and, with `n_samples > 0`, unbiased pass@k for each k <= n.

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
        for k in ks:
            if k <= n_samples:
                metrics[f"eval/pass@{k}"] = float(np.mean([pass_at_k(n_samples, int(c), k) for c in per_problem]))
    return metrics
