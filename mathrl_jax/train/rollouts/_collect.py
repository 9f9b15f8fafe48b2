"""One iteration's graded rollouts (`collect`, PRM step scores) and the synchronous rollout source."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import zlib
from typing import Any, Dict, List, Optional

import numpy as np

from mathrl_jax.errors import fail
from mathrl_jax.rewards.functions import RewardFunctionError
from mathrl_jax.rewards.math_grader import batch_rewards
from mathrl_jax.sampling import SamplingParams
from mathrl_jax.train.batch import action_indices
from mathrl_jax.train.rollouts._problems import PromptSettings, encode_prompts


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """How an iteration's rollouts are drawn and scored (one section of the run's settings, made by the build).

    prompts_per_iteration: prompts drawn each iteration (`n_rollout_threads`; environments, multi-turn).
    sampling: each prompt's `SamplingParams` (`n` = the group size), its seed drawn per iteration from `seed`.
    prompts: the prompt template and length limit (`_problems.PromptSettings`).
    grade: the verifier scores the responses (not with reward functions alone).
    step_separator: where a completion's reasoning steps end (the PRM's steps).
    episode_length: turns per episode (multi-turn environments).
    logprob_noise: nats (standard deviation) of Gaussian noise added to the sampler's log-prob of every sampled
      token (`with_logprob_noise`); 0: none.
    """

    prompts_per_iteration: int
    sampling: SamplingParams
    seed: int
    prompts: PromptSettings
    grade: bool = True
    step_separator: str = "\n"
    episode_length: int = 1
    logprob_noise: float = 0.0

    def __post_init__(self):
        if self.prompts_per_iteration < 1 or self.episode_length < 1:
            raise ValueError(
                f"prompts_per_iteration={self.prompts_per_iteration}, episode_length={self.episode_length}: must "
                "be >= 1"
            )
        if not self.logprob_noise >= 0:
            raise ValueError(f"logprob_noise={self.logprob_noise}: must be >= 0 (nats)")

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


@dataclasses.dataclass
class Rewarded:
    """What the rewards make of a batch of responses: `[N]` scores, the verifier's `[N]` verdicts (`correct`;
    None where nothing graded: reward functions alone, or a custom `reward_fn`), a PRM's `[N, A]` step scores
    (`step_rewards`, None without one) and the metrics."""

    scores: np.ndarray
    correct: Optional[np.ndarray]
    metrics: Dict[str, float]
    step_rewards: Optional[np.ndarray] = None


def reward(maker: RolloutMaker, rollouts, prompt_ids, problems, n: int, iteration: int) -> Rewarded:
    """The batch's rewards: the verifier's (or `reward_fn`'s) scores plus the reward functions', with the
    verifier's own verdicts, and a PRM's step scores; `n` responses per problem, in order."""
    texts = rollouts.texts or [maker.codec.decode(ids) for ids in rollouts.completion_ids]
    golds = [p.answer for p in problems for _ in range(n)]
    start = time.perf_counter()
    correct = None
    if not maker.settings.grade:  # the user's functions alone: nothing is graded
        scores, metrics = np.zeros(len(texts), np.float32), {}
    elif maker.reward_fn is not None:
        scores, metrics = maker.reward_fn(texts, golds)
    else:
        results = maker.grader.grade_batch(texts, golds)
        scores, metrics = batch_rewards(results, maker.grader.grader.values)
        correct = np.asarray([r.status == "correct" for r in results])
    if maker.reward_functions is not None:
        problems_per_row = [p for p in problems for _ in range(n)]
        prompt_texts = [maker.codec.decode(ids, skip_special_tokens=False) for ids in prompt_ids]
        prompt_texts = [t for t in prompt_texts for _ in range(n)]
        try:  # TRL's completion_ids and trainer_state: the updates done before this batch, the epochs read
            extra, function_metrics = maker.reward_functions(
                prompt_texts,
                texts,
                problems_per_row,
                completion_ids=rollouts.completion_ids,
                global_step=iteration - 1,
                epoch=epochs_read(maker.loader, problems),
            )
        except RewardFunctionError as error:
            fail(f"iteration {iteration}: {error}")
        scores = np.asarray(scores, np.float32) + extra
        metrics = {**metrics, **function_metrics}
    metrics = {**metrics, "perf/grade_time": time.perf_counter() - start}
    step_rewards = prm_action_rewards(maker, rollouts, problems)
    return Rewarded(np.asarray(scores, np.float32), correct, metrics, step_rewards)


def epochs_read(loader, problems) -> float:
    """The passes over the training problems done before this batch (`TrainerState.epoch`): the loader's epoch and
    position after it, less the batch's problems; 0 for a loader that says neither."""
    state = getattr(loader, "state", None)
    state = state() if callable(state) else None
    if not state or not state.get("num_problems"):
        return 0.0
    return max(0.0, state["epoch"] + (state["position"] - len(problems)) / state["num_problems"])


def collect(maker: RolloutMaker, iteration: int):
    """Samples and grades one iteration's rollouts; returns (rollouts, problems, `Rewarded`)."""
    s = maker.settings
    problems = maker.loader.next_batch(s.prompts_per_iteration)
    prompt_ids = encode_prompts(s.prompts, maker.codec, problems)
    params = s.sampling_at(iteration)
    rollouts = maker.sampler.generate(prompt_ids, params)
    if s.logprob_noise:
        rollouts = with_logprob_noise(rollouts, s.logprob_noise, seed=params.seed)
    return rollouts, problems, reward(maker, rollouts, prompt_ids, problems, params.n, iteration)


def with_logprob_noise(rollouts, nats: float, *, seed: int):
    """The rollouts with N(0, nats^2) added to the sampler's log-prob of every sampled token (`logprobs` and
    `policy_logprobs` alike: one disagreement per token, as a sampler whose kernels differ from the trainer's
    would report). The testbed's stress knob (`sampler_logprob_noise`): what trusts the sampler's numbers (naive
    PPO's old log-probs, TIS, the decoupled loss's behaviour) sees the noise; a recomputing trainer does not. The
    draw is a function of the iteration's sampling seed, so a resumed run adds the same noise."""
    rng = np.random.default_rng(seed)
    noise = [rng.normal(0.0, nats, len(ids)).astype(np.float32) for ids in rollouts.completion_ids]
    return dataclasses.replace(
        rollouts,
        logprobs=[np.asarray(lp, np.float32) + e for lp, e in zip(rollouts.logprobs, noise)],
        policy_logprobs=[np.asarray(lp, np.float32) + e for lp, e in zip(rollouts.policy_logprobs, noise)],
    )


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
    correct: Optional[np.ndarray] = None  # [N] the verifier's verdicts (`Rewarded.correct`)


class SyncRollouts:
    """Rollouts made when asked, with the current weights: the synchronous loop.

    A rollout source (this, `_multiturn.EnvRollouts`, `_async.AsyncRollouts`)
    makes each iteration's graded batch (`get`), hears of every update (`updated`),
    names the batches it made ahead of the learner for a checkpoint (`pending`) and
    lends the sampler, holding the current weights, to the evaluation (`current_weights`).
    """

    def __init__(self, maker: RolloutMaker):
        self.maker = maker

    def get(self, iteration: int) -> Collected:
        start = time.perf_counter()
        rollouts, _, rewarded = collect(self.maker, iteration)
        seconds = time.perf_counter() - start
        return Collected(
            rollouts,
            rewarded.scores,
            rewarded.metrics,
            self.maker.loader.state(),
            seconds,
            rewarded.step_rewards,
            correct=rewarded.correct,
        )

    def updated(self, iteration: int, params: Any, version: int) -> None:
        self.maker.sampler.update_weights(params, version)

    def pending(self, iteration: int) -> List["Collected"]:
        return []

    def current_weights(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        pass
