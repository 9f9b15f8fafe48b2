"""One iteration's graded rollouts (`collect`, PRM step scores) and the synchronous rollout source."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import zlib
from typing import Any, Dict, List, Optional

import jax
import numpy as np

from mathrl_jax.rewards.functions import RewardFunctionError
from mathrl_jax.rewards.math_grader import GradeResult, MathGrader, batch_rewards
from mathrl_jax.sampling import SamplingParams
from mathrl_jax.sharding import distributed
from mathrl_jax.train.batch import action_indices
from mathrl_jax.train.problems import encode_prompts
from mathrl_jax.train.run import Run
from mathrl_jax.train.validation import fail


class SerialGrader:
    """A `MathGrader` shared by the generator thread and evaluation: one batch at a time.

    Across processes (`jax.distributed`) each process grades its contiguous share of the batch
    (`distributed.process_slice`) and the verdicts are gathered, so every process holds the whole batch's
    and the result is the one process's: a collective, called by every process on the same batch.
    """

    def __init__(self, grader: MathGrader):
        self.grader = grader
        self.lock = threading.Lock()

    def grade_batch(self, responses, golds):
        with self.lock:
            if jax.process_count() == 1:
                return self.grader.grade_batch(responses, golds)
            share = distributed.process_slice(len(responses))
            mine = self.grader.grade_batch(list(responses)[share], list(golds)[share])
            parts = distributed.allgather_objects([dataclasses.asdict(r) for r in mine])
            return [GradeResult(**r) for part in parts for r in part]

    def rewards(self, responses, golds):
        return batch_rewards(self.grade_batch(responses, golds), self.grader.values)

    def close(self):
        self.grader.close()


def iteration_seed(config, iteration: int) -> int:
    """The sampling seed of an iteration: a function of (seed, iteration), so a resumed run samples the same."""
    return zlib.crc32(f"{config.seed}:{iteration}".encode()) & 0x7FFFFFFF


def collect(run: Run, iteration: int):
    """Samples and grades one iteration's rollouts; returns (rollouts, problems, scores, reward metrics)."""
    c = run.config
    problems = run.loader.next_batch(c.n_rollout_threads)
    prompt_ids = encode_prompts(c, run.codec, problems)
    params = SamplingParams(
        n=c.group_size,
        temperature=c.temperature,
        top_p=c.top_p,
        top_k=c.top_k,
        max_new_tokens=c.max_new_tokens,
        seed=iteration_seed(c, iteration),
    )
    rollouts = run.sampler.generate(prompt_ids, params)
    golds = [p.answer for p in problems for _ in range(c.group_size)]
    texts = rollouts.texts or [run.codec.decode(ids) for ids in rollouts.completion_ids]
    start = time.perf_counter()
    if run.config.reward_source == "functions":  # the user's functions alone: nothing is graded
        scores, reward_metrics = np.zeros(len(texts), np.float32), {}
    else:
        scores, reward_metrics = (run.reward_fn or run.grader.rewards)(texts, golds)
    if run.reward_functions is not None:
        problems_per_row = [p for p in problems for _ in range(c.group_size)]
        prompt_texts = [run.codec.decode(ids, skip_special_tokens=False) for ids in prompt_ids]
        prompt_texts = [t for t in prompt_texts for _ in range(c.group_size)]
        try:
            extra, function_metrics = run.reward_functions(prompt_texts, texts, problems_per_row)
        except RewardFunctionError as error:
            fail(f"iteration {iteration}: {error}")
        scores = np.asarray(scores, np.float32) + extra
        reward_metrics = {**reward_metrics, **function_metrics}
    reward_metrics = {**reward_metrics, "perf/grade_time": time.perf_counter() - start}
    return rollouts, problems, np.asarray(scores, np.float32), reward_metrics


def prm_action_rewards(run: Run, rollouts, problems) -> Optional[np.ndarray]:
    """`[N, A]` PRM scores of each completion's reasoning steps (OpenR), or None without a PRM.

    Steps are the completion split at `step_separator`, as the PRM sees them; the
    trainer's actions are the same split in token space (`action_index_from_separators`).
    """
    if run.prm is None:
        return None
    c = run.config
    questions = [p.question for p in problems for _ in range(c.group_size)]
    steps = []
    for ids, index in zip(rollouts.completion_ids, action_indices(run, rollouts)):
        texts = [""] * (int(index.max()) + 1 if len(index) else 1)
        for token, action in zip(ids, index):
            texts[action] += run.codec.token_text(token)
        steps.append([text.replace(c.step_separator, " ").strip() for text in texts])
    scores = run.prm.step_scores(questions, steps)
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

    def __init__(self, run: "Run"):
        self.run = run

    def get(self, iteration: int) -> Collected:
        start = time.perf_counter()
        rollouts, problems, scores, reward_metrics = collect(self.run, iteration)
        action_rewards = prm_action_rewards(self.run, rollouts, problems)
        return Collected(
            rollouts, scores, reward_metrics, self.run.loader.state(), time.perf_counter() - start, action_rewards
        )

    def updated(self, iteration: int, params: Any, version: int) -> None:
        self.run.sampler.update_weights(params, version)

    def pending(self, iteration: int) -> List[Dict[str, Any]]:
        return []

    def current_weights(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        pass
