"""Our `SamplingParams` as vLLM requests, and vLLM's completions as our `Rollouts`: one mapping for every engine.

The in-process engine and a server take the same request (vLLM's `SamplingParams` fields: an object in-process,
JSON over HTTP) and answer with the same facts per sample (token ids, the sampled tokens' log-probs, finish and stop
reasons, the weight versions that sampled it), so both samplers build their `Rollouts` here.

- One request a prompt, each with its own seeds: vLLM seeds sample j of a request with seed + j, so one shared seed
  would give sample j of every prompt the same noise. Prompt i's samples take seed + i n + j (`prompt_seed`).
- Greedy decoding with n > 1 asks once and repeats the completion (vLLM refuses n > 1 when greedy).
- Log-probs are vLLM's "processed_logprobs" (the distribution sampled from: repetition penalty, temperature, min-p,
  top-k, top-p applied); `policy_logprobs` are those at temperature 1 without top-k / top-p / min-p, the greedy
  step's under greedy decoding, either without a repetition penalty, and NaN otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from mathrl_jax.errors import MathRLError
from mathrl_jax.sampling.base import Rollouts, SamplingParams, decode_text

INCOMPLETE = "incomplete:"
"""Before the weight version an engine reports while a sync is under way or after one failed: `incomplete:<label>`."""


class VersionMismatchError(MathRLError, RuntimeError):
    """The engine sampled with weights other than those the sampler last synced (another client's, or a sync's
    that did not complete): a run stops on it (exit status 2) rather than train on another policy's rollouts."""


@dataclasses.dataclass
class Completion:
    """One sample as an engine returned it."""

    token_ids: List[int]
    logprobs: np.ndarray  # [len(token_ids)] float32, the sampled tokens' (processed) log-probs
    finish_reason: str
    stop_reason: Optional[Union[int, str]]
    versions: List[str]  # the weight versions that sampled its tokens (vLLM's spans), in order
    text: Optional[str] = None


def is_greedy(params: SamplingParams) -> bool:
    """vLLM decodes greedily below temperature 1e-5."""
    return params.temperature < 1e-5


def request_fields(params: SamplingParams, eos_token_ids: Sequence[int], seed: Optional[int]) -> Dict[str, Any]:
    """vLLM `SamplingParams` fields for one prompt's request: one log-prob per token (the sampled one's), the
    sampler's end-of-sequence ids as stop tokens (vLLM also stops at its tokenizer's and generation config's, which
    for a checkpoint and the `JaxSampler`'s `eos_token_ids` read from its tokenizer are the same), and stop strings
    that keep the tokens up to the one that completes them. Greedy: n = 1 (`generate` repeats it)."""
    return dict(
        n=1 if is_greedy(params) else params.n,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,
        min_p=params.min_p,
        repetition_penalty=params.repetition_penalty,
        max_tokens=params.max_new_tokens,
        stop_token_ids=sorted(set(params.stop_token_ids) | set(int(t) for t in eos_token_ids)),
        stop=list(params.stop),
        include_stop_str_in_output=True,
        skip_special_tokens=True,
        seed=seed,
        logprobs=0,
    )


def prompt_seed(params: SamplingParams, prompt_index: int) -> Optional[int]:
    """The seed of prompt `prompt_index`'s request (its samples j take this + j): distinct within a call."""
    return None if params.seed is None else params.seed + prompt_index * params.n


def version_label(version: int, tag: str) -> str:
    """The weight version an engine is told: the policy version and the syncing sampler's tag (`<v>@<tag>`), so that
    two runs on one server at the same step are told apart."""
    return f"{int(version)}@{tag}"


def expected_version(completions: Sequence[Sequence[Completion]], synced: str, where: str) -> None:
    """Raises `VersionMismatchError` unless every token of every completion was sampled with version `synced` (a
    completion with tokens and no stamps is refused too: the engine must say what sampled it)."""
    seen = sorted({v for per_prompt in completions for c in per_prompt for v in c.versions})
    unstamped = any(c.token_ids and not c.versions for per_prompt in completions for c in per_prompt)
    if unstamped or (seen and seen != [synced]):
        half = [v for v in seen if v.startswith(INCOMPLETE)]
        why = (
            "tokens without a version stamp"
            if unstamped
            else f"a weight sync that did not complete ({half[0]})"
            if half
            else "weights synced by another client"
        )
        raise VersionMismatchError(
            f"{where} sampled with weight version(s) {seen}, not {synced!r} (the version this sampler synced): {why}"
        )


def to_rollouts(
    prompt_ids: List[List[int]],
    completions: Sequence[Sequence[Completion]],
    params: SamplingParams,
    policy_version: int,
    tokenizer: Any = None,
) -> Rollouts:
    """`Rollouts` (row i n + j: sample j of prompt i) of each prompt's completions, in their sample order."""
    greedy = is_greedy(params)
    repeats = params.n if greedy else 1
    # The processed log-probs are the policy's only where nothing but a greedy argmax or nothing at all processed
    # the logits (vLLM penalizes before its greedy step too).
    plain = params.temperature == 1.0 and not params.filters and not params.penalizes
    ids, lps, plps, reasons, stops, texts = [], [], [], [], [], []
    for per_prompt in completions:
        for sample in [c for c in per_prompt for _ in range(repeats)]:
            lp = np.asarray(sample.logprobs, np.float32)
            ids.append(list(sample.token_ids))
            if greedy:  # a point mass was sampled from; the log-probs are the (penalized) policy's
                lps.append(np.zeros_like(lp))
                plps.append(np.full_like(lp, np.nan) if params.penalizes else lp)
            else:
                lps.append(lp)
                plps.append(lp.copy() if plain else np.full_like(lp, np.nan))
            reason = sample.finish_reason if sample.finish_reason in ("stop", "length", "abort") else "abort"
            stop = sample.stop_reason
            if reason == "stop" and stop is None and sample.token_ids:
                stop = int(sample.token_ids[-1])  # the model's own end-of-sequence token
            reasons.append(reason)
            stops.append(stop if reason == "stop" else None)
            texts.append(decode_text(tokenizer, sample.token_ids) if tokenizer is not None else sample.text)
    return Rollouts(
        prompt_ids=[p for p in prompt_ids for _ in range(params.n)],
        completion_ids=ids,
        logprobs=lps,
        policy_logprobs=plps,
        finish_reasons=reasons,
        stop_reasons=stops,
        prompt_indices=np.repeat(np.arange(len(prompt_ids), dtype=np.int32), params.n),
        policy_version=policy_version,
        texts=texts if all(t is not None for t in texts) else None,
    )
