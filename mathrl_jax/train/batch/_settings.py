"""How rollouts become the update's batch: `BatchSettings` (a section of the run's settings) and DAPO's shaping."""

from __future__ import annotations

import dataclasses
from typing import Optional

from mathrl_jax.train import algorithms
from mathrl_jax.train.update import UpdateConfig


@dataclasses.dataclass(frozen=True)
class DapoSettings:
    """DAPO's reward shaping (Yu et al. 2025): the group filter on success rates strictly inside (lb, ub), a
    response counted a success when its score is at least `correct_score` (above 0 with None), and the soft
    overlong penalty of a response within `overlong_buffer_len` tokens of `max_new_tokens`."""

    max_new_tokens: int
    success_rate_lb: float = 0.0
    success_rate_ub: float = 1.0
    overlong_buffer_len: int = 0
    overlong_penalty_factor: float = 1.0
    correct_score: Optional[float] = None

    def __post_init__(self):
        if not 0.0 <= self.success_rate_lb <= self.success_rate_ub <= 1.0:
            raise ValueError(
                f"dapo.success_rate_lb={self.success_rate_lb}, dapo.success_rate_ub={self.success_rate_ub}: expected "
                "0 <= lb <= ub <= 1"
            )
        if self.overlong_buffer_len < 0 or self.overlong_penalty_factor < 0:
            raise ValueError(
                f"dapo.overlong_buffer_len={self.overlong_buffer_len}, dapo.overlong_penalty_factor="
                f"{self.overlong_penalty_factor}: must be >= 0"
            )


@dataclasses.dataclass(frozen=True)
class BatchSettings:
    """How rollouts become the update's batch (one section of the run's settings, made by the build).

    algorithm: the record whose estimator makes the advantages (`algorithms.ALGORITHMS`).
    max_length: the widest row, `max_prompt_length + max_new_tokens`.
    whiten: standardise a critic's advantages over the batch's tokens (`advantage_whitening="batch"`).
    old_logprobs_from_sampler: PPO's old log-probs are the sampler's (the build's `old_logprobs` rule), not
      recomputed.
    step_separator: where a completion's reasoning steps end (the actions of `Algorithm.actions`, the PRM's steps).
    pack_length: tokens per packed row of the passes and the update; None trains on padded rows.
    update: the update's settings (`UpdateConfig`: its epochs, minibatches, micro-batches and the rows it skips),
      which the batch's plan follows: shared with the update, not copied.
    tis_cap: truncated importance weights min(pi_trainer / pi_sampler, C) on the advantages; None: off.
    sampler_filters: the sampler filters tokens (top_p < 1 or top_k > 0): its log-probs are not the policy's.
    dapo: DAPO's shaping, with an algorithm of `dynamic_sampling`.
    mask_truncated_completions: a completion cut at `max_new_tokens` (finish reason "length", no EOS) leaves the
      loss (its response mask zeroed) after the advantages are made with it in its group (TRL's option).
    """

    algorithm: algorithms.Algorithm
    max_length: int
    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True
    kl_reward_coef: float = 0.0
    old_logprobs_from_sampler: bool = False
    step_separator: str = "\n"
    pack_length: Optional[int] = None
    update: UpdateConfig = UpdateConfig()
    tis_cap: Optional[float] = None
    sampler_filters: bool = False
    dapo: Optional[DapoSettings] = None
    mask_truncated_completions: bool = False

    def __post_init__(self):
        if self.algorithm.dynamic_sampling != (self.dapo is not None):
            raise ValueError(f"dapo settings are for an algorithm of dynamic sampling (got {self.algorithm})")
        if self.max_length < 2:
            raise ValueError(f"max_length={self.max_length}: a row holds a prompt token and a completion token")
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ValueError(f"tis_cap={self.tis_cap} must be > 0, or None")
