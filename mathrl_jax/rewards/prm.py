"""Process reward model (PRM) scores of reasoning steps, as in OpenR and Math-Shepherd.

The response is split into steps and scored in one causal pass over

    f"{question} {step_1} {tag}\\n{step_2} {tag}\\n...\\n{step_n} {tag}"

(OpenR `prm/code/finetune_qwen.py` / Math-Shepherd, step tag "ки"). At the
position t_k of the k-th tag the PRM predicts a verdict token, and

    score_k = softmax(logits[t_k, candidates])[0]        candidates = (good, bad, ...)

is the probability of the "good" token among the candidates
(`models.value_head.prm_step_scores`). The reward of a response is the last step's
score (`reward_mode="last"`), the lowest (`"min"`), or every step's (`"steps"`).

The whole text is tokenized at once, as the PRM saw it in training; the step tag
must then be one token of the tokenizer and stay one token after a space (checked:
a mismatch raises an error that names the tag). Occurrences of the tag inside the
question or a step are removed. Sequences longer than `max_length` lose their
*first* tokens (the question before the steps), so the last steps keep their
scores; a step whose tag falls off gets NaN.

Batches run through one jitted forward with right padding, `batch_size` rows at a
time, lengths rounded up to a power of two (at least `min_bucket`, at most
`max_length`), so a run compiles once per length bucket, not once per call.
Only the candidate columns of the output projection are computed (`[B, T, K]`,
not the `[B, T, V]` logits of a 150k-token vocabulary).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tokenizers import Tokenizer

from mathrl_jax.models import hf
from mathrl_jax.models.qwen import QwenForCausalLM
from mathrl_jax.models.value_head import prm_step_scores

REWARD_MODES = ("last", "min", "steps")


@dataclasses.dataclass(frozen=True)
class PRMConfig:
    """How responses are turned into PRM inputs and step scores into rewards.

    Attributes:
      step_tag: the token after every step ("ки" for Math-Shepherd and OpenR's PRMs);
        one token of the PRM's tokenizer.
      candidate_tokens: (good, bad, ...) verdict tokens, each one token; the score is
        the first's probability renormalised over these.
      step_separator: where a response is split into steps.
      reward_mode: "last" (the last step's score), "min" (the lowest step score) or
        "steps" (every step's score).
      max_length: longest PRM input in tokens; longer inputs lose their first tokens.
      batch_size: rows per forward pass (a batch is padded to a multiple of it).
      min_bucket: shortest padded length; lengths are padded to powers of two from it.
    """

    step_tag: str = "ки"
    candidate_tokens: tuple[str, ...] = ("+", "-")
    step_separator: str = "\n\n"
    reward_mode: str = "last"
    max_length: int = 2048
    batch_size: int = 8
    min_bucket: int = 64

    def __post_init__(self):
        if not isinstance(self.step_tag, str) or not self.step_tag.strip():
            raise ValueError(f"step_tag must be a non-blank string, got {self.step_tag!r}")
        candidates = self.candidate_tokens
        if (
            isinstance(candidates, str)
            or not isinstance(candidates, (tuple, list))
            or len(candidates) < 2
            or not all(isinstance(c, str) and c for c in candidates)
            or len(set(candidates)) != len(candidates)
        ):
            raise ValueError(
                "candidate_tokens must be (good, bad, ...): at least two distinct non-empty strings, "
                f"got {candidates!r}"
            )
        object.__setattr__(self, "candidate_tokens", tuple(candidates))
        if not isinstance(self.step_separator, str) or not self.step_separator:
            raise ValueError(f"step_separator must be a non-empty string, got {self.step_separator!r}")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode={self.reward_mode!r}; expected one of {', '.join(REWARD_MODES)}")
        for name, low in (("max_length", 2), ("batch_size", 1), ("min_bucket", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


class _Tokenizer:
    """`encode` for a transformers tokenizer or a `tokenizers.Tokenizer`, with special tokens as OpenR's `encode`."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.is_raw = isinstance(tokenizer, Tokenizer)
        if not self.is_raw and not callable(getattr(tokenizer, "encode", None)):
            raise TypeError(
                f"tokenizer must be a transformers tokenizer or a tokenizers.Tokenizer, got {type(tokenizer).__name__}"
            )
        pad = None if self.is_raw else getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if isinstance(pad, int) else 0
        if self.is_raw:
            unk = getattr(tokenizer.model, "unk_token", None)
            self.unk_id = tokenizer.token_to_id(unk) if unk else None
        else:
            self.unk_id = getattr(tokenizer, "unk_token_id", None)

    def encode(self, text: str, special: bool) -> list[int]:
        if self.is_raw:
            return list(self.tokenizer.encode(text, add_special_tokens=special).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self.is_raw:
            return [list(e.ids) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=True)]
        return [list(ids) for ids in self.tokenizer(list(texts), add_special_tokens=True)["input_ids"]]

    def single_token(self, text: str, what: str) -> int:
        ids = self.encode(text, special=False)
        if len(ids) != 1:
            raise ValueError(f"{what} {text!r} is {len(ids)} tokens {ids} of the PRM's tokenizer; it must be one")
        if self.unk_id is not None and ids[0] == self.unk_id:
            raise ValueError(f"{what} {text!r} is the unknown token of the PRM's tokenizer (id {ids[0]}); pick another")
        return int(ids[0])


@functools.lru_cache(maxsize=32)
def _jitted_scores(graphdef: nnx.GraphDef, tag_id: int, candidate_ids: tuple[int, ...]):
    """The jitted `(state, input_ids [B, T], attention_mask [B, T]) -> (scores [B, T], tags [B, T])`.

    Cached by (architecture, tag, candidates), so PRMs of the same architecture share compilations.
    """

    def forward(state, input_ids, attention_mask):
        prm = nnx.merge(graphdef, state)
        hidden, _ = prm(input_ids, attention_mask=attention_mask, return_hidden=True)
        unembedding, layout = prm.unembedding()
        columns = jnp.asarray(candidate_ids)
        head = unembedding[:, columns] if layout == "dv" else unembedding[columns, :].T  # [D, K]
        logits = jnp.einsum("btd,dk->btk", hidden.astype(jnp.float32), head.astype(jnp.float32))
        scores, tags = prm_step_scores(logits, input_ids, tag_id, tuple(range(len(candidate_ids))))
        counted = tags * (attention_mask > 0)
        return scores * counted, counted

    return jax.jit(forward)


def _bucket(length: int, min_bucket: int, max_length: int) -> int:
    """Smallest min_bucket * 2^k >= length, capped at max_length."""
    size = min_bucket
    while size < length:
        size *= 2
    return min(size, max_length)


class ProcessRewardModel:
    """Scores reasoning steps with a PRM checkpoint (a causal LM); see the module docstring.

        prm = ProcessRewardModel.from_pretrained("/ckpt/math-shepherd-qwen", PRMConfig(reward_mode="min"))
        rewards = prm.rewards(questions, responses)  # one [1] array per response

    The scores use the model's weights at the time of the call.
    """

    def __init__(self, model: QwenForCausalLM, tokenizer, config: PRMConfig = PRMConfig()):
        if not isinstance(config, PRMConfig):
            raise TypeError(f"config must be a PRMConfig, got {type(config).__name__}: {config!r:.80}")
        if not isinstance(model, QwenForCausalLM):
            raise TypeError(f"model must be a models.QwenForCausalLM, got {type(model).__name__}")
        self.config = config
        self.model = model
        self._tokenizer = _Tokenizer(tokenizer)
        self.tokenizer = tokenizer
        vocab_size = model.config.vocab_size
        self.step_tag_id = self._tokenizer.single_token(config.step_tag, "step_tag")
        self.candidate_ids = tuple(self._tokenizer.single_token(c, "candidate token") for c in config.candidate_tokens)
        for name, token_id in [("step_tag", self.step_tag_id)] + [("candidate token", i) for i in self.candidate_ids]:
            if token_id >= vocab_size:
                raise ValueError(f"{name} id {token_id} is outside the PRM's vocabulary of {vocab_size}")
        if len(set(self.candidate_ids)) != len(self.candidate_ids):
            raise ValueError(f"candidate_tokens {config.candidate_tokens!r} map to the same ids {self.candidate_ids}")

    @classmethod
    def from_pretrained(cls, directory: str, config: PRMConfig = PRMConfig(), **model_overrides) -> ProcessRewardModel:
        """The PRM of a local Hugging Face checkpoint directory (`models.hf.load_model`) and its tokenizer.

        `model_overrides` are `load_model`'s (e.g. `param_dtype="bfloat16"`). Nothing is downloaded.
        """
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"PRM checkpoint directory {directory!r} does not exist")
        tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
        if not any(os.path.isfile(os.path.join(directory, name)) for name in tokenizer_files):
            raise ValueError(
                f"PRM checkpoint directory {directory!r} has no tokenizer files (expected one of "
                f"{', '.join(tokenizer_files)})"
            )
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ValueError(f"no usable tokenizer files in PRM checkpoint directory {directory!r}: {e}") from None
        return cls(hf.load_model(directory, **model_overrides), tokenizer, config)

    # ------------------------------------------------------------------ text

    def split_steps(self, response: str) -> list[str]:
        """The response's steps: split at `step_separator`, stripped, empty ones dropped; [""] for a blank response."""
        if not isinstance(response, str):
            raise TypeError(f"response must be a str, got {type(response).__name__}: {response!r:.80}")
        steps = [s.strip() for s in response.split(self.config.step_separator)]
        steps = [s for s in steps if s]
        return steps or [""]

    def format_input(self, question: str, steps: Sequence[str]) -> str:
        """OpenR's PRM input: f"{question} {step_1} {tag}\\n...\\n{step_n} {tag}" (tags in the text removed)."""
        tag = self.config.step_tag

        def clean(text: str) -> str:
            return text.replace(tag, "").strip()

        return clean(question) + " " + "\n".join(f"{clean(step)} {tag}" for step in steps)

    # ---------------------------------------------------------------- scores

    def step_scores(self, questions: Sequence[str], steps: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """P(good) of every step: one float32 `[len(steps[i])]` array per sample (NaN for truncated-away steps).

        Raises ValueError if the tags in a tokenized input are not one per step (the
        tag merged with its neighbours), naming the sample and the tag.
        """
        questions, steps = _check_batch(questions, steps, "steps")
        for i, sample in enumerate(steps):
            if isinstance(sample, str) or not all(isinstance(s, str) for s in sample):
                raise TypeError(f"steps[{i}] must be a sequence of strings, got {sample!r:.80}")
            if len(sample) == 0:
                raise ValueError(f"steps[{i}] is empty; every sample needs at least one step")
        n = len(questions)
        if n == 0:
            return []
        cfg = self.config
        encoded = self._tokenizer.encode_batch([self.format_input(q, s) for q, s in zip(questions, steps)])
        first_kept = []
        for i, ids in enumerate(encoded):
            n_tags = sum(1 for t in ids if t == self.step_tag_id)
            if n_tags != len(steps[i]):
                raise ValueError(
                    f"sample {i}: the PRM input has {n_tags} step tags {cfg.step_tag!r} (id {self.step_tag_id}) for "
                    f"{len(steps[i])} steps; the tag must stay one token after a space in this tokenizer"
                )
            first_kept.append(max(0, len(ids) - cfg.max_length))
        graphdef, state = nnx.split(self.model)  # the model's current weights
        forward = _jitted_scores(graphdef, self.step_tag_id, self.candidate_ids)
        order = sorted(range(n), key=lambda i: len(encoded[i]))  # similar lengths share a batch and a bucket
        results: list[np.ndarray | None] = [None] * n
        for start in range(0, n, cfg.batch_size):
            rows = order[start : start + cfg.batch_size]
            kept = [encoded[i][first_kept[i] :] for i in rows]
            length = _bucket(max(len(ids) for ids in kept), cfg.min_bucket, cfg.max_length)
            input_ids = np.full((cfg.batch_size, length), self._tokenizer.pad_id, np.int32)
            mask = np.zeros((cfg.batch_size, length), np.int32)
            for r, ids in enumerate(kept):
                input_ids[r, : len(ids)] = ids
                mask[r, : len(ids)] = 1
            scores, tags = forward(state, jnp.asarray(input_ids), jnp.asarray(mask))
            scores, tags = np.asarray(scores), np.asarray(tags) > 0
            for r, i in enumerate(rows):
                found = scores[r][tags[r]].astype(np.float32)
                lost = len(steps[i]) - len(found)  # tags cut off with the first tokens
                results[i] = np.concatenate([np.full(lost, np.nan, np.float32), found])
        return results  # type: ignore[return-value]

    def rewards(self, questions: Sequence[str], responses: Sequence[str]) -> list[np.ndarray]:
        """Rewards by `reward_mode`: `[1]` arrays for "last" / "min" (min ignores NaN), `[n_steps]` for "steps"."""
        questions, responses = _check_batch(questions, responses, "responses")
        steps = [self.split_steps(r) for r in responses]
        scores = self.step_scores(questions, steps)
        mode = self.config.reward_mode
        if mode == "steps":
            return scores
        if mode == "last":
            return [s[-1:].copy() for s in scores]
        return [np.asarray([np.nanmin(s) if np.isfinite(s).any() else np.nan], np.float32) for s in scores]


def _check_batch(questions, others, name: str):
    if isinstance(questions, str) or isinstance(others, str):
        raise TypeError(f"questions and {name} must be sequences (one entry per sample), not a single string")
    questions, others = list(questions), list(others)
    if len(questions) != len(others):
        raise ValueError(f"got {len(questions)} questions but {len(others)} {name}")
    for i, q in enumerate(questions):
        if not isinstance(q, str):
            raise TypeError(f"questions[{i}] must be a str, got {type(q).__name__}: {q!r:.80}")
    return questions, others
