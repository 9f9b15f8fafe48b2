"""One iteration's graded rollouts (`collect`, PRM step scores) and the synchronous rollout source."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import zlib
from typing import Any, Dict, List, Optional

import numpy as np

from mathrl_jax.rewards.functions import RewardFunctionError
from mathrl_jax.sampling import SamplingParams
from mathrl_jax.train.batch import action_indices
from mathrl_jax.train.problems import PromptSettings, encode_prompts
from mathrl_jax.train.validation import fail


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """How an iteration's rollouts are drawn and scored (one section of the run's settings, made by the build).

    prompts_per_iteration: prompts drawn each iteration (`n_rollout_threads`; environments, multi-turn).
    sampling: each prompt's `SamplingParams` (`n` = the group size), its seed drawn per iteration from `seed`.
    prompts: the prompt template and length limit (`problems.PromptSettings`).
    grade: the verifier scores the responses (not with reward functions alone).
    step_separator: where a completion's reasoning steps end (the PRM's steps).
    episode_length: turns per episode (multi-turn environments).
    """

    prompts_per_iteration: int
    sampling: SamplingParams
    seed: int
    prompts: PromptSettings
    grade: bool = True
    step_separator: str = "\n"
    episode_length: int = 1

    def __post_init__(self):
        if self.prompts_per_iteration < 1 or self.episode_length < 1:
            raise ValueError(
                f"prompts_per_iteration={self.prompts_per_iteration}, episode_length={self.episode_length}: must "
                "be >= 1"
            )

    def sampling_at(self, iteration: int) -> SamplingParams:
        """The iteration's `SamplingParams`: the seed a function of (seed, iteration), so a resumed run samples
        the same."""
        return dataclasses.replace(self.sampling, seed=iteration_seed(self.seed, iteration))


@dataclasses.dataclass
class RolloutMaker:
    """What makes graded rollouts: the settings, the sampler, the tokenizer, the problems, and the rewards (the
    grader, a custom `reward_fn(texts, golds)`, reward functions, a process reward model)."""

    settings: RolloutSettings
    sampler: Any
    codec: Any
    loader: Any
    grader: Any
    reward_fn: Any = None
    reward_functions: Any = None
    prm: Any = None


def iteration_seed(seed: int, iteration: int) -> int:
    """The sampling seed of an iteration: a function of (seed, iteration), so a resumed run samples the same."""
    return zlib.crc32(f"{seed}:{iteration}".encode()) & 0x7FFFFFFF


def collect(maker: RolloutMaker, iteration: int):
    """Samples and grades one iteration's rollouts; returns (rollouts, problems, scores, reward metrics)."""
    s = maker.settings
    problems = maker.loader.next_batch(s.prompts_per_iteration)
    prompt_ids = encode_prompts(s.prompts, maker.codec, problems)
    params = s.sampling_at(iteration)
    rollouts = maker.sampler.generate(prompt_ids, params)
    golds = [p.answer for p in problems for _ in range(params.n)]
    texts = rollouts.texts or [maker.codec.decode(ids) for ids in rollouts.completion_ids]
    start = time.perf_counter()
    if not s.grade:  # the user's functions alone: nothing is graded
        scores, reward_metrics = np.zeros(len(texts), np.float32), {}
    else:
        scores, reward_metrics = (maker.reward_fn or maker.grader.rewards)(texts, golds)
    if maker.reward_functions is not None:
        problems_per_row = [p for p in problems for _ in range(params.n)]
        prompt_texts = [maker.codec.decode(ids, skip_special_tokens=False) for ids in prompt_ids]
        prompt_texts = [t for t in prompt_texts for _ in range(params.n)]
        try:
            extra, function_metrics = maker.reward_functions(prompt_texts, texts, problems_per_row)
        except RewardFunctionError as error:
            fail(f"iteration {iteration}: {error}")
        scores = np.asarray(scores, np.float32) + extra
        reward_metrics = {**reward_metrics, **function_metrics}
    reward_metrics = {**reward_metrics, "perf/grade_time": time.perf_counter() - start}
    return rollouts, problems, np.asarray(scores, np.float32), reward_metrics


def prm_action_rewards(maker: RolloutMaker, rollouts, problems) -> Optional[np.ndarray]:
    """`[N, A]` PRM scores of each completion's reasoning steps (OpenR), or None without a PRM.

    Steps are the completion split at `step_separator`, as the PRM sees them; the
    trainer's actions are the same split in token space (`action_index_from_separators`).
    """
    if maker.prm is None:
        return None
    s = maker.settings
    questions = [p.question for p in problems for _ in range(s.sampling.n)]
    steps = []
    for ids, index in zip(rollouts.completion_ids, action_indices(maker.codec, rollouts, s.step_separator)):
        texts = [""] * (int(index.max()) + 1 if len(index) else 1)
        for token, action in zip(ids, index):
            texts[action] += maker.codec.token_text(token)
        steps.append([text.replace(s.step_separator, " ").strip() for text in texts])
    scores = maker.prm.step_scores(questions, steps)
    out = np.zeros((len(steps), max(len(row) for row in steps)), np.float32)
    for row, row_scores in enumerate(scores):
        row_scores = np.nan_to_num(np.asarray(row_scores, np.float32))
        out[row, : len(row_scores)] = row_scores
    return out


@dataclasses.dataclass
class Collected:
    """One iteration's graded rollouts, and the data position after drawing their prompts."""

    rollouts: Any
    scores: np.ndarray
    reward_metrics: Dict[str, float]
    data_state: Dict[str, int]
    generate_seconds: float
    action_rewards: Optional[np.ndarray] = None  # [N, A] PRM step scores (reward_source with "prm")
    row_advantages: Optional[np.ndarray] = None  # [N] per-row advantages made by the source (multi-turn ReBN)
    row_mask: Optional[np.ndarray] = None  # [N] 1 on rows that count


class SyncRollouts:
    """Rollouts made when asked, with the current weights: the synchronous loop.

    A rollout source (this, `multiturn.EnvRollouts`, `async_loop.AsyncRollouts`)
    makes each iteration's graded batch (`get`), hears of every update (`updated`),
    names the batches it made ahead of the learner for a checkpoint (`pending`) and
    lends the sampler, holding the current weights, to the evaluation (`current_weights`).
    """

    def __init__(self, maker: RolloutMaker):
        self.maker = maker

    def get(self, iteration: int) -> Collected:
        start = time.perf_counter()
        rollouts, problems, scores, reward_metrics = collect(self.maker, iteration)
        action_rewards = prm_action_rewards(self.maker, rollouts, problems)
        return Collected(
            rollouts, scores, reward_metrics, self.maker.loader.state(), time.perf_counter() - start, action_rewards
        )

    def updated(self, iteration: int, params: Any, version: int) -> None:
        self.maker.sampler.update_weights(params, version)

    def pending(self, iteration: int) -> List[Dict[str, Any]]:
        return []

    def current_weights(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        pass
