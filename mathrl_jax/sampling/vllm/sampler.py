"""What every vLLM sampler does alike, wherever its engine runs: the versions of a sync, and `generate`.

A sync labels the engine's weights `incomplete:<v>@<tag>` before it sends anything and `<v>@<tag>` once every
tensor has landed (`<tag>`: this sampler's, random, shared by the processes of one run), and vLLM stamps each
sampled token with the label the engine held at that step (`WeightVersionSpan`). So:

- a sync that fails part-way leaves the engine saying `incomplete:...`, and this sampler refuses to sample until a
  sync completes (its own weights are unknown): no rollout is ever drawn from half-old weights;
- every `generate` checks that each token was sampled with the label this sampler synced last: weights changed by
  another client (a second trainer on one server, even at the same step), or a sync that landed mid-generation,
  raise `VersionMismatchError` instead of training on rollouts of another policy;
- before it labels a finished sync, the sampler checks the engine still says its own `incomplete:...`: another
  client that synced meanwhile raises `VersionMismatchError` rather than a mixture of both labelled as one;
- `Rollouts.policy_version` is the version synced, which the engine's stamps on every token were checked to be.

Subclasses say how an engine is reached: `_send(state)` moves the weights, `_set_engine_version(text)` labels
them, `_engine_version()` reads the label, `_complete(prompt_ids, requests)` runs one request per prompt.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from typing import Any, Dict, List, Optional, Sequence

from mathrl_jax.models.qwen import QwenConfig
from mathrl_jax.sampling.base import Rollouts, SamplingParams, prompt_token_ids
from mathrl_jax.sampling.vllm.requests import (
    INCOMPLETE,
    Completion,
    VersionMismatchError,
    expected_version,
    prompt_seed,
    request_fields,
    to_rollouts,
    version_label,
)

ENGINE_DTYPES = ("float32", "bfloat16", "float16")


class EngineSampler:
    """The `Sampler` protocol over a vLLM engine reached by a subclass (in-process, a server)."""

    where = "the vLLM engine"  # how errors name the engine

    def __init__(
        self,
        config: QwenConfig,
        *,
        eos_token_ids: Sequence[int],
        tokenizer: Any,
        dtype: str,
        synced_version: Optional[int],
    ):
        if dtype not in ENGINE_DTYPES:
            raise ValueError(f"{type(self).__name__}: dtype={dtype!r}, expected one of {ENGINE_DTYPES}")
        self.config = config
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.policy_version = int(synced_version or 0)
        self.tag = secrets.token_hex(4)  # this sampler's part of every label (the processes of a run share one)
        # The label of the weights the engine holds, as this sampler knows it; None: unknown (none synced yet to a
        # server, or the last sync failed part-way).
        self._synced: Optional[str] = None if synced_version is None else version_label(synced_version, self.tag)
        self.last_sync_seconds = float("nan")

    # ------------------------------------------------------------------ weights

    def update_weights(self, state: Any, version: int) -> None:
        """Loads the JAX policy `state` into the engine as `version` (see the module docstring)."""
        start = time.perf_counter()
        self._synced = None
        label = version_label(version, self.tag)
        with self._generation_held():
            self._set_engine_version(INCOMPLETE + label)
            self._send(state, int(version))
            found = self._engine_version()
            if found != INCOMPLETE + label:
                raise VersionMismatchError(
                    f"{self.where} was synced by another client during this sync of version {int(version)} (its "
                    f"weights are labelled {found!r}, not {INCOMPLETE + label!r}): one trainer syncs an engine"
                )
            self._set_engine_version(label)
        self.expect_weights(version)
        self.last_sync_seconds = time.perf_counter() - start

    def expect_weights(self, version: int) -> None:
        """Records that the engine holds `version` under this sampler's tag, synced by another process of the run
        (a shared server, whose process 0 gave every process its tag)."""
        self._synced = version_label(version, self.tag)
        self.policy_version = int(version)

    # ------------------------------------------------------------------ sampling

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        if not prompts:
            raise ValueError("generate() got no prompts")
        if self._synced is None:
            raise RuntimeError(
                f"{type(self).__name__}: {self.where} holds no weights this sampler synced (none yet, or the last "
                "sync failed part-way): update_weights first"
            )
        prompt_ids = prompt_token_ids(prompts, self.tokenizer, self.config.vocab_size)
        requests = [request_fields(params, self.eos_token_ids, prompt_seed(params, i)) for i in range(len(prompt_ids))]
        completions = self._complete(prompt_ids, requests)
        expected_version(completions, self._synced, self.where)
        return to_rollouts(prompt_ids, completions, params, self.policy_version, self.tokenizer)

    # ------------------------------------------------------------------ reaching the engine

    def _generation_held(self):
        """A context in which the engine schedules no generation (an engine others also sample from: a server);
        by default nothing (this process alone drives it, one call at a time)."""
        return contextlib.nullcontext()

    def _send(self, state: Any, version: int) -> None:
        raise NotImplementedError

    def _set_engine_version(self, text: str) -> None:
        raise NotImplementedError

    def _engine_version(self) -> str:
        raise NotImplementedError

    def _complete(self, prompt_ids: List[List[int]], requests: List[Dict[str, Any]]) -> List[List[Completion]]:
        raise NotImplementedError
