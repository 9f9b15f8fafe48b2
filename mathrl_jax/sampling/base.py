"""The sampling protocol: `SamplingParams`, `Rollouts`, and `Sampler`.

Every sampler (the pure-JAX one, vLLM) takes token-id prompts and returns
`Rollouts` in one layout, so the training loop never knows which one ran.
Sample `j` of prompt `i` is row `i * n + j` of a `Rollouts` (vLLM's order).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

import numpy as np

FINISH_REASONS = ("stop", "length", "abort")

LORA_SYNCS = ("merged", "adapter")
"""How a sampler takes a LoRA policy's weights at each sync: its adapters merged into their kernels, or applied as
adapters (each sampler's `lora_sync` argument says what that means for it)."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample completions (the fields and defaults of vLLM's `SamplingParams`).

    Attributes:
      n: completions per prompt (the group size of GRPO-style methods).
      temperature: softmax temperature; 0 means greedy decoding.
      top_p: nucleus sampling: keep the smallest set of tokens whose probability
        reaches `top_p` (1.0 keeps all).
      top_k: keep the `top_k` most likely tokens (0 or -1 keeps all).
      min_p: keep only tokens whose probability (after temperature) is at least
        `min_p` times the most likely token's (vLLM's `apply_min_p`; 0.0 keeps all).
      repetition_penalty: every token id already in the prompt or the completion
        so far has its raw logit divided by it where positive, multiplied by it
        where not (vLLM's `apply_penalties`, transformers'
        `RepetitionPenaltyLogitsProcessor`); 1.0 is off. Greedy decoding too.
      max_new_tokens: completion length limit; a completion cut here finishes
        with reason "length".
      stop_token_ids: tokens that end a completion (in addition to the
        sampler's end-of-sequence ids); the stop token is kept in the completion.
      stop: strings that end a completion; the completion keeps the tokens up to
        and including the one that completes the string.
      seed: with a seed, generation is reproducible (and each sample's draw does
        not depend on the batch it was run in); None draws a fresh seed.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 256
    stop_token_ids: Tuple[int, ...] = ()
    stop: Tuple[str, ...] = ()
    seed: Optional[int] = None

    def __post_init__(self):
        checks = [
            ("n", self.n, self.n >= 1, ">= 1"),
            ("temperature", self.temperature, self.temperature >= 0.0, ">= 0"),
            ("top_p", self.top_p, 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("top_k", self.top_k, self.top_k >= -1, ">= -1 (0 or -1: off)"),
            ("min_p", self.min_p, 0.0 <= self.min_p <= 1.0, "in [0, 1] (0: off)"),
            ("repetition_penalty", self.repetition_penalty, self.repetition_penalty > 0.0, "> 0 (1: off)"),
            ("max_new_tokens", self.max_new_tokens, self.max_new_tokens >= 1, ">= 1"),
        ]
        for name, value, ok, expected in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name}={value!r}: expected {expected}")
        # Lists are accepted for convenience; tuples keep the params hashable.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        if any(not s for s in self.stop):
            raise ValueError(f"SamplingParams.stop={self.stop!r}: stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def filters(self) -> bool:
        """Whether tokens are filtered after temperature (top-k, top-p, min-p)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def penalizes(self) -> bool:
        """Whether the repetition penalty changes the logits."""
        return self.repetition_penalty != 1.0


@dataclasses.dataclass
class Rollouts:
    """Completions of a batch of prompts; row `i * n + j` is sample `j` of prompt `i`.

    Attributes:
      prompt_ids: per sample, the prompt's token ids.
      completion_ids: per sample, the generated token ids (a stop token included).
      logprobs: per sample, `[len(completion)]` float32 log-probs of the sampled
        tokens under the distribution actually sampled from (repetition penalty,
        temperature, min-p, top-k, top-p applied: vLLM's "processed_logprobs";
        0.0 for greedy decoding, a point mass).
      policy_logprobs: the same tokens under the untempered, unfiltered, unpenalized policy:
        the "old log-probs" of PPO when sampler and trainer agree.
      finish_reasons: per sample, "stop", "length" or "abort".
      stop_reasons: per sample, the stop token id or stop string that ended it,
        else None.
      prompt_indices: `[N]` int32, the prompt each sample answers (group ids).
      policy_version: the `update_weights` version of the weights that sampled.
      texts: per sample, the decoded completion when the sampler has a tokenizer.
    """

    prompt_ids: List[List[int]]
    completion_ids: List[List[int]]
    logprobs: List[np.ndarray]
    policy_logprobs: List[np.ndarray]
    finish_reasons: List[str]
    stop_reasons: List[Optional[Union[int, str]]]
    prompt_indices: np.ndarray
    policy_version: int
    texts: Optional[List[str]] = None

    def __post_init__(self):
        n = len(self.completion_ids)
        for name in ("prompt_ids", "logprobs", "policy_logprobs", "finish_reasons", "stop_reasons", "prompt_indices"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Rollouts.{name} has {len(getattr(self, name))} entries, expected {n}")
        bad = [r for r in self.finish_reasons if r not in FINISH_REASONS]
        if bad:
            raise ValueError(
                f"Rollouts.finish_reasons: unknown reason(s) {sorted(set(bad))}, expected {FINISH_REASONS}"
            )

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def completion_lengths(self) -> np.ndarray:
        return np.array([len(c) for c in self.completion_ids], np.int32)

    def to_batch(self, pad_id: int, max_length: Optional[int] = None) -> Dict[str, np.ndarray]:
        """Padded arrays for the trainer: prompts left-padded, completions right-padded (`pad_prompt_completion`).

        Row layout: `[pad ... prompt | completion ... pad]`, prompts ending at the
        same column `P` so that completion token `t` sits at column `P + t`.

        Returns a dict of:
          input_ids `[N, L]` int32, attention_mask `[N, L]` int32 (1 on real tokens),
          response_mask `[N, L]` float32 (1 on completion tokens),
          old_logprobs / sampler_logprobs `[N, L]` float32 (policy / sampling
          log-probs at completion tokens, 0 elsewhere), prompt_length `P`.
          Shift by one for next-token prediction: the log-prob of the token at
          column c comes from the logits at column c - 1.
        """
        return pad_prompt_completion(
            self.prompt_ids,
            self.completion_ids,
            pad_id,
            max_length=max_length,
            completion_values={"old_logprobs": self.policy_logprobs, "sampler_logprobs": self.logprobs},
            caller="to_batch",
        )


def pad_prompt_completion(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    pad_id: int,
    *,
    prompt_length: Optional[int] = None,
    max_length: Optional[int] = None,
    completion_values: Optional[Mapping[str, Sequence[Any]]] = None,
    caller: str = "pad_prompt_completion",
) -> Dict[str, np.ndarray]:
    """The trainer's row layout of (prompt, completion) pairs: `[pad ... prompt | completion ... pad]`.

    Every prompt ends at column `P` (`prompt_length`, default the longest prompt),
    so completion token `t` of every row sits at column `P + t`; the width is
    `max_length` (default `P` + the longest completion, at least `P + 1`). Used by
    `Rollouts.to_batch` and by the supervised warm-start's batches (`train/warmstart/_sft.py`'s `sft_batch`).

    Args:
      prompt_ids, completion_ids: N token-id sequences each.
      pad_id: the id that fills padding (its masks are 0).
      prompt_length: the common prompt column `P` (>= the longest prompt).
      max_length: the row width `L` (>= the columns the rows need).
      completion_values: name -> N per-token value sequences (one per completion token),
        each returned as a `[N, L]` float32 array holding them at the completion's columns, 0 elsewhere.
      caller: the name error messages start with.

    Returns:
      input_ids `[N, L]` int32, attention_mask `[N, L]` int32 (1 on prompt and
      completion tokens), response_mask `[N, L]` float32 (1 on completion tokens),
      the `completion_values` arrays, prompt_length `P` (an int32 scalar).
    """
    values = dict(completion_values or {})
    longest_prompt = max(len(p) for p in prompt_ids)
    if prompt_length is None:
        prompt_length = longest_prompt
    elif prompt_length < longest_prompt:
        raise ValueError(f"{caller}(prompt_length={prompt_length}): the longest prompt has {longest_prompt} tokens")
    length = prompt_length + max([len(c) for c in completion_ids] + [1])
    if max_length is not None:
        if max_length < length:
            raise ValueError(f"{caller}(max_length={max_length}): the rows need {length} columns")
        length = max_length
    n = len(completion_ids)
    input_ids = np.full((n, length), pad_id, np.int32)
    attention_mask = np.zeros((n, length), np.int32)
    response_mask = np.zeros((n, length), np.float32)
    arrays = {name: np.zeros((n, length), np.float32) for name in values}
    for i, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids)):
        start = prompt_length - len(prompt)
        end = prompt_length + len(completion)
        input_ids[i, start:prompt_length] = prompt
        input_ids[i, prompt_length:end] = completion
        attention_mask[i, start:end] = 1
        response_mask[i, prompt_length:end] = 1.0
        for name, per_row in values.items():
            arrays[name][i, prompt_length:end] = per_row[i]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "response_mask": response_mask,
        **arrays,
        "prompt_length": np.int32(prompt_length),
    }


class Sampler(Protocol):
    """What the training loop needs of a sampler."""

    policy_version: int

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        """Samples `params.n` completions for each token-id prompt."""

    def update_weights(self, state: Any, version: int) -> None:
        """Makes the sampler use the policy `state` (an NNX state of the model) from now on."""


def first_stop_string(text_of: Any, tokens: Sequence[int], stops: Sequence[str]) -> Optional[Tuple[int, str]]:
    """(number of tokens to keep, string) for the first stop string in the decoded tokens, or None.

    `text_of(tokens)` decodes token ids. The kept prefix is the shortest whose
    text contains a stop string (so the token that completes it is kept).
    """
    if not stops or not tokens:
        return None
    full = text_of(list(tokens))
    if not any(s in full for s in stops):
        return None
    # Binary search for the shortest prefix that contains a stop string: containment is monotone in the prefix.
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in text_of(list(tokens[:mid])) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    text = text_of(list(tokens[:lo]))
    found = min((text.find(s), s) for s in stops if s in text)
    return lo, found[1]


def prompt_token_ids(prompts: Sequence[Union[str, Sequence[int]]], tokenizer: Any, vocab_size: int) -> List[List[int]]:
    """Each prompt as token ids: a string encoded by `tokenizer`, ids checked to lie in `[0, vocab_size)`.

    Raises ValueError naming the prompt: a string without a tokenizer, an empty prompt, ids outside the vocabulary."""
    out = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError(f"prompt {i} is a string but the sampler has no tokenizer; pass token ids")
            ids = tokenizer.encode(prompt)
            ids = getattr(ids, "ids", ids)  # a `tokenizers.Tokenizer` returns an Encoding
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"prompt {i} is empty")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size}): {bad[:5]}")
        out.append(list(ids))
    return out


def decode_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """`ids` as text, special tokens left out: a Hugging Face tokenizer's `decode(ids, skip_special_tokens=True)`,
    or a `tokenizers.Tokenizer`'s `decode(ids)` (which skips them by default)."""
    try:
        return tokenizer.decode(list(ids), skip_special_tokens=True)
    except TypeError:  # a `tokenizers.Tokenizer`
        return tokenizer.decode(list(ids))
