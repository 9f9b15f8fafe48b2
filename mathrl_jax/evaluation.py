"""Held-out evaluation: greedy accuracy, and pass@k from n samples per problem."""

from __future__ import annotations

import dataclasses
import math
import numbers
import zlib
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mathrl_jax.rewards.math_grader import MathGrader, RewardValues, reward_value
from mathrl_jax.sampling.base import Sampler, SamplingParams
from mathrl_jax.sampling.jax_sampler import bucket


def token_batches(
    prompt_lengths: Sequence[int],
    *,
    max_new_tokens: int,
    batch_tokens: int,
    n: int = 1,
    max_prompts: Optional[int] = None,
    min_prompt_bucket: int = 16,
    min_generation_bucket: int = 16,
) -> List[List[int]]:
    """Prompt indices in batches whose padded KV cache fits `batch_tokens`, shortest prompts first.

    A JaxSampler pads a `generate` call to `bucket(prompts) * n` rows of
    `bucket(longest prompt) + bucket(max_new_tokens)` cache slots (powers of
    two), so a batch is grown, in order of prompt length, while that product
    stays within `batch_tokens` (and the batch within `max_prompts`). A prompt
    too long for the budget on its own gets a batch to itself. Every index
    appears exactly once; callers put the results back in the original order.
    """
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens={batch_tokens}: expected >= 1")
    generation = bucket(max_new_tokens, min_generation_bucket)
    order = sorted(range(len(prompt_lengths)), key=lambda i: (prompt_lengths[i], i))
    batches: List[List[int]] = []
    current: List[int] = []
    for index in order:
        candidate = current + [index]
        rows = bucket(len(candidate), 1) * n
        cost = rows * (bucket(prompt_lengths[index], min_prompt_bucket) + generation)
        too_many = max_prompts is not None and len(candidate) > max_prompts
        if current and (cost > batch_tokens or too_many):
            batches.append(current)
            candidate = [index]
        current = candidate
    if current:
        batches.append(current)
    return batches


def _batches(sampler, prompts, *, n, max_new_tokens, batch_tokens, max_prompts) -> List[List[int]]:
    """`batch_tokens=None`: consecutive runs of `max_prompts` prompts (the old behaviour); else `token_batches`."""
    if batch_tokens is None:
        return [list(range(s, min(s + max_prompts, len(prompts)))) for s in range(0, len(prompts), max_prompts)]
    return token_batches(
        [len(p) for p in prompts],
        max_new_tokens=max_new_tokens,
        batch_tokens=batch_tokens,
        n=n,
        max_prompts=max_prompts,
        min_prompt_bucket=getattr(sampler, "min_prompt_bucket", 16),
        min_generation_bucket=getattr(sampler, "min_generation_bucket", 16),
    )


def _generate_and_grade(sampler, grader, decode, prompts, golds, batch: List[int], params: SamplingParams):
    """(rollouts, grade results) of `params.n` completions of each prompt in `batch` (row `j * n + k` is sample
    k of `batch[j]`)."""
    rollouts = sampler.generate([prompts[i] for i in batch], params)
    texts = rollouts.texts or [decode(c) for c in rollouts.completion_ids]
    return rollouts, grader.grade_batch(texts, [golds[i] for i in batch for _ in range(params.n)])


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
    batch_tokens: Optional[int] = None,
    records: Optional[List[Dict]] = None,
    on_progress: Optional[Callable[[int], None]] = None,
) -> Dict[str, float]:
    """Greedy accuracy (`eval/accuracy`) and, with `n_samples > 0`, unbiased pass@k for each k in `ks` (and n) <= n.

    pass@k = 1 - C(n - c, k) / C(n, k) per problem, averaged (Chen et al. 2021).

    Batching: at most `batch_size` prompts per greedy `generate` call (`batch_size // n_samples`
    when sampling). With `batch_tokens`, prompts are also sorted by length and batched so that each
    call's padded KV cache (rows x (prompt bucket + max_new_tokens bucket), see `token_batches`)
    stays within `batch_tokens` slots; this bounds memory on long prompts (MATH-500). Results are
    put back in the original order. `records`, if given, receives one dict per problem in order (its greedy
    completion, extracted answer, verdict, finish reason and, with sampling, its count of correct samples);
    `on_progress(n)` is called as each call's n prompts are done. Greedy results do not depend on the
    batching; sampled ones are drawn from the same distribution, but a JaxSampler's per-row keys come from
    the row's position in its call, so individual samples (and so pass@k) can differ with the batching.
    """
    if len(prompts) != len(golds):
        raise ValueError(f"{len(prompts)} prompts but {len(golds)} gold answers")
    metrics: Dict[str, float] = {}
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    correct: List[bool] = [False] * len(prompts)
    lengths: List[int] = [0] * len(prompts)
    plan = _batches(
        sampler, prompts, n=1, max_new_tokens=max_new_tokens, batch_tokens=batch_tokens, max_prompts=batch_size
    )
    kept: Dict[int, Dict] = {}
    for batch in plan:
        rollouts, results = _generate_and_grade(sampler, grader, decode, prompts, golds, batch, greedy)
        for i, result, length in zip(batch, results, rollouts.completion_lengths):
            correct[i], lengths[i] = result.correct, int(length)
        if records is not None:
            texts = rollouts.texts or [decode(c) for c in rollouts.completion_ids]
            for row, (i, result) in enumerate(zip(batch, results)):
                kept[i] = {
                    "index": i,
                    "gold": golds[i],
                    "completion": texts[row],
                    "extracted": result.extracted,
                    "correct": bool(result.correct),
                    "finish_reason": rollouts.finish_reasons[row],
                }
        if on_progress is not None:
            on_progress(len(batch))
    metrics["eval/accuracy"] = float(np.mean(correct))
    metrics["eval/response_length"] = float(np.mean(lengths))
    if n_samples > 0:
        params = SamplingParams(
            n=n_samples, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
        )
        per_problem = [0] * len(prompts)
        plan = _batches(
            sampler,
            prompts,
            n=n_samples,
            max_new_tokens=max_new_tokens,
            batch_tokens=batch_tokens,
            max_prompts=max(1, batch_size // n_samples),
        )
        for batch in plan:
            _, results = _generate_and_grade(sampler, grader, decode, prompts, golds, batch, params)
            hits = np.array([r.correct for r in results]).reshape(-1, n_samples).sum(axis=1)
            for i, c in zip(batch, hits):
                per_problem[i] = int(c)
            if on_progress is not None:
                on_progress(len(batch))
        for k in sorted(set(ks) | {n_samples}):  # always pass@n, whatever ks says
            if k <= n_samples:
                metrics[f"eval/pass@{k}"] = float(np.mean([pass_at_k(n_samples, int(c), k) for c in per_problem]))
        for i, record in kept.items():
            record[f"correct_of_{n_samples}_samples"] = per_problem[i]
    if records is not None:
        records.extend(kept[i] for i in sorted(kept))
    return metrics


def completion_samples(
    sampler: Sampler,
    prompts: Sequence[List[int]],
    golds: Sequence[str],
    grader: MathGrader,
    decode: Callable[[List[int]], str],
    decodings: Sequence[SamplingParams],
    *,
    values: RewardValues = RewardValues(),
) -> List[Dict]:
    """What the policy writes for a few prompts under each of `decodings` (e.g. greedy and a few samples), graded.

    One record per completion: {"prompt", "gold", "decoding" ("greedy" or "T=<temperature>"), "sample"
    (0.. within the prompt), "completion", "extracted" (the graded answer), "reward", "correct",
    "finish_reason"}, the reward by `values`. The loop writes them to `run_dir/samples/` at each
    evaluation, so a person can read what RL changed (and see reward hacking, were there any).
    """
    if len(prompts) != len(golds):
        raise ValueError(f"{len(prompts)} prompts but {len(golds)} gold answers")
    records: List[Dict] = []
    everything = list(range(len(prompts)))
    for params in decodings:
        name = "greedy" if params.temperature == 0.0 else f"T={params.temperature:g}"
        rollouts, results = _generate_and_grade(sampler, grader, decode, prompts, golds, everything, params)
        texts = rollouts.texts or [decode(c) for c in rollouts.completion_ids]
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


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """The loop's held-out evaluation (a section of the run's settings, made by the build): greedy accuracy, and
    at the first and last evaluation pass@k from `n_samples` samples at the RL `temperature` and `top_p`;
    `num_logged_samples` prompts written with their completions (`loop.write_samples`)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    n_samples: int = 0
    num_logged_samples: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1 or self.n_samples < 0 or self.num_logged_samples < 0:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens}, eval_n_samples={self.n_samples}, num_logged_samples="
                f"{self.num_logged_samples}: out of range"
            )

    def logged_sampling(self, iteration: int) -> List[SamplingParams]:
        """The greedy and sampled (4 at the RL temperature) `SamplingParams` of the logged completions; the
        sampled seed is not the training rollouts'."""
        sampled = SamplingParams(
            n=4,
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            seed=zlib.crc32(f"samples:{self.seed}:{iteration}".encode()) & 0x7FFFFFFF,
        )
        return [SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens), sampled]


def held_out_accuracy(
    settings: EvalSettings, sampler, codec, grader, eval_prompts, eval_golds, n_samples: int = 0
) -> Dict[str, float]:
    """`evaluate` at the run's settings: greedy accuracy, with `n_samples` also pass@k."""
    return evaluate(
        sampler,
        eval_prompts,
        eval_golds,
        grader,
        codec.decode,
        max_new_tokens=settings.max_new_tokens,
        n_samples=n_samples,
        temperature=settings.temperature,
        top_p=settings.top_p,
        seed=settings.seed,
    )


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k from `num_correct` correct answers among `num_samples` samples of one problem.

        pass@k = 1 - C(n - c, k) / C(n, k)

    the probability that a random k-subset of the n samples holds a correct one
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1).
    Computed in exact integer arithmetic, (C(n, k) - C(n - c, k)) / C(n, k), so the
    result is the exact value rounded once to a float. Average it over problems for
    a data set's pass@k.
    """
    for name, value in (("num_samples", num_samples), ("num_correct", num_correct), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
            raise TypeError(f"{name}={value!r}: expected an int")
    n, c, k = int(num_samples), int(num_correct), int(k)
    if n < 1:
        raise ValueError(f"num_samples={n}: expected >= 1")
    if not 0 <= c <= n:
        raise ValueError(f"num_correct={c}: expected 0 <= num_correct <= num_samples={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: expected 1 <= k <= num_samples={n}")
    total = math.comb(n, k)
    return (total - math.comb(n - c, k)) / total  # int / int: correctly rounded
