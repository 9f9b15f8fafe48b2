"""`ProcessSplitSampler`: a sampler of one process (a vLLM engine, a server's client) shared out over the processes
of a `jax.distributed` run, as the `JaxSampler`'s rows are.

Every process of a run calls `generate` on the same batch (the same program on the same data). Each generates its
contiguous share of the prompts (`distributed.process_slice`) with its own sampler, the seeds those prompts would
have had in one process (prompt i's samples take seed + i n + j, whichever process draws them), and the shares are
gathered, so every process holds the whole batch's rollouts and they are the one-process run's draws. Weights:
every process gathers the full params to its host (`distributed.fetch`, a collective) and syncs its own engine
(`sends=True`: each host's engine samples its share, the sync stays on the host), or one process syncs a server
they share and the others wait for it and expect its version (`sends` True on process 0 only).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence

import numpy as np

from mathrl_jax.errors import MathRLError
from mathrl_jax.sampling.base import Rollouts, SamplingParams
from mathrl_jax.sharding import distributed


class ProcessSplitSampler:
    """`sampler`, shared out over the run's processes (module docstring). `sends`: whether this process syncs it.

    Built by every process at the same point (a collective: the processes take process 0's version tag, so that a
    shared server's labels are the run's, not one process's). A sync or a generation that fails on any process
    fails on every process with that process's message (they exchange how it went instead of waiting for a peer
    that stopped): a bad-input error (`MathRLError`: a server gone, another client's weights) stays one, so every
    process exits with status 2 and the same line."""

    def __init__(self, sampler: Any, sends: bool):
        self.sampler = sampler
        self.sends = bool(sends)
        if hasattr(sampler, "tag"):
            sampler.tag = distributed.allgather_objects(sampler.tag)[0]

    def __getattr__(self, name: str) -> Any:  # what the loop reads of a sampler (last_sync_seconds, ...)
        return getattr(self.sampler, name)

    def update_weights(self, state: Any, version: int) -> None:
        host = distributed.fetch(state)  # every process takes part in gathering the shards
        failure = None
        if self.sends:
            try:
                self.sampler.update_weights(host, version)
            except Exception as error:  # every process hears of it (_raise_any)
                failure = error
        _raise_any(distributed.allgather_objects(_described(failure)), failure)  # the engines hold it, or all stop
        if not self.sends:
            self.sampler.expect_weights(version)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        share = distributed.process_slice(len(prompts))
        mine, failure = None, None
        if share.stop > share.start:
            seed = None if params.seed is None else params.seed + share.start * params.n
            try:
                mine = self.sampler.generate(list(prompts)[share], dataclasses.replace(params, seed=seed))
            except Exception as error:  # every process hears of it (_raise_any)
                failure = error
        parts = distributed.allgather_objects(
            {"failure": _described(failure), "rollouts": None if mine is None else _to_json(mine)}
        )
        _raise_any([part["failure"] for part in parts], failure)
        return _joined([part["rollouts"] for part in parts if part["rollouts"] is not None])


def _described(error: Optional[BaseException]) -> Optional[dict]:
    if error is None:
        return None
    return {"message": str(error), "bad_input": isinstance(error, MathRLError), "type": type(error).__name__}


def _raise_any(failures: List[Optional[dict]], own: Optional[BaseException]) -> None:
    """Raises this process's own error, else the first other process's, on every process alike."""
    if own is not None:
        raise own
    for index, failure in enumerate(failures):
        if failure is not None:
            text = f"process {index}'s sampler: {failure['message']}"
            raise (PeerSamplerError(text) if failure["bad_input"] else RuntimeError(f"{text} ({failure['type']})"))


class PeerSamplerError(MathRLError, RuntimeError):
    """Another process's sampler met bad input (a server gone, another client's weights): this one stops with it."""


def _to_json(rollouts: Rollouts) -> dict:
    return {
        "prompt_ids": rollouts.prompt_ids,
        "completion_ids": rollouts.completion_ids,
        "logprobs": [lp.tolist() for lp in rollouts.logprobs],
        "policy_logprobs": [lp.tolist() for lp in rollouts.policy_logprobs],
        "finish_reasons": rollouts.finish_reasons,
        "stop_reasons": rollouts.stop_reasons,
        "prompt_indices": rollouts.prompt_indices.tolist(),
        "policy_version": int(rollouts.policy_version),
        "texts": rollouts.texts,
    }


def _joined(parts: list) -> Rollouts:
    """One `Rollouts` of the processes' shares, in process order (prompt indices shifted to the whole batch's)."""
    versions = sorted({part["policy_version"] for part in parts})
    if len(versions) != 1:
        raise RuntimeError(f"the processes' samplers hold different weight versions {versions}")
    offset, indices = 0, []
    for part in parts:
        indices.extend(i + offset for i in part["prompt_indices"])
        offset += (max(part["prompt_indices"]) + 1) if part["prompt_indices"] else 0
    texts = [t for part in parts for t in part["texts"]] if all(part["texts"] is not None for part in parts) else None
    return Rollouts(
        prompt_ids=[p for part in parts for p in part["prompt_ids"]],
        completion_ids=[c for part in parts for c in part["completion_ids"]],
        logprobs=[np.asarray(lp, np.float32) for part in parts for lp in part["logprobs"]],
        policy_logprobs=[np.asarray(lp, np.float32) for part in parts for lp in part["policy_logprobs"]],
        finish_reasons=[r for part in parts for r in part["finish_reasons"]],
        stop_reasons=[r for part in parts for r in part["stop_reasons"]],
        prompt_indices=np.asarray(indices, np.int32),
        policy_version=versions[0],
        texts=texts,
    )
