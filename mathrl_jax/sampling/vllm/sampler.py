"""What every vLLM sampler does alike, wherever its engine runs: the versions of a sync, and `generate`.

A sync tells the engine its weights are `incomplete:<v>` before it sends anything and `<v>` once every tensor has
landed; vLLM stamps each sampled token with the engine's version at that step (`WeightVersionSpan`). So:

- a sync that fails part-way leaves the engine saying `incomplete:<v>`, and this sampler refuses to sample until a
  sync completes (its own weights are unknown): no rollout is ever drawn from half-old weights;
- every `generate` checks that each token was sampled with the version this sampler synced last: weights changed
  by another client (a second trainer on one server), or a sync that landed mid-generation, raise
  `VersionMismatchError` instead of training on rollouts of another policy;
- `Rollouts.policy_version` is the version the engine itself reported.

Subclasses say how an engine is reached: `_send(state)` moves the weights, `_set_engine_version(text)` labels
them, `_complete(prompt_ids, requests)` runs one request per prompt.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, List, Optional, Sequence

from mathrl_jax.models.qwen import QwenConfig
from mathrl_jax.sampling.base import Rollouts, SamplingParams, prompt_token_ids
from mathrl_jax.sampling.vllm.requests import (
    INCOMPLETE,
    Completion,
    expected_version,
    prompt_seed,
    request_fields,
    to_rollouts,
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
        # The version whose weights the engine holds, as this sampler knows it; None: unknown (none synced yet to a
        # server, or the last sync failed part-way).
        self._synced: Optional[str] = None if synced_version is None else str(int(synced_version))
        self.last_sync_seconds = float("nan")

    # ------------------------------------------------------------------ weights

    def update_weights(self, state: Any, version: int) -> None:
        """Loads the JAX policy `state` into the engine as `version` (see the module docstring)."""
        start = time.perf_counter()
        self._synced = None
        with self._generation_held():
            self._set_engine_version(f"{INCOMPLETE}{int(version)}")
            self._send(state, int(version))
            self._set_engine_version(str(int(version)))
        self.expect_weights(version)
        self.last_sync_seconds = time.perf_counter() - start

    def expect_weights(self, version: int) -> None:
        """Records that the engine holds `version`, synced by another process of the run (a shared server)."""
        self._synced = str(int(version))
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

    def _complete(self, prompt_ids: List[List[int]], requests: List[Dict[str, Any]]) -> List[List[Completion]]:
        raise NotImplementedError
