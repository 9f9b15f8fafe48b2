"""Rule-based math answer grading: the last `\\boxed{}` answer, checked against the gold with math-verify.

    reward = values.correct    if verify(parse(gold), parse(answer))   (gold first, math-verify's order)
             values.incorrect  if the answer differs, or its grading timed out or crashed
             values.no_answer  if the response has no answer at all
           + values.format_reward  if the response has a non-empty \\boxed{} answer

The answer is the content of the **last** `\\boxed{...}` / `\\fbox{...}` (braces matched,
as verl's `last_boxed_only_string`), else the text after the last "answer is" /
"Answer:" (Minerva's "Final Answer: The final answer is X. I hope it is correct.",
Math-Shepherd's "The answer is: X") or GSM8K's "#### X" on the rest of its line
(`extraction`).

Plain integers. When the answer and the gold are both plain integer literals ("42",
"-7"; `_plain_integer_verdict`), math-verify's verdict is computed in the calling
process, without a worker: "correct" if they are equal as strings, else "incorrect".
Everything else goes to math-verify.

Timeouts. math-verify runs in persistent worker processes with its own
`signal.alarm` timeout disabled, and the caller waits for the answer on a socket with
a deadline: a worker that runs past `timeout_s`, crashes or dies is killed and
replaced (`worker_pool`). Nothing depends on signals or on being the main thread, and
it works inside daemonic processes (such as `multiprocessing.Pool` workers). The
workers run under a memory limit (`RLIMIT_AS`), so an answer like `10^{10^{10}}`
cannot take the machine's memory either. The grading code is POSIX-only (fork, Unix
sockets).

A timeout or a crash of the grader is never raised: it is the status "timeout" /
"error" (worth `values.incorrect`) and is counted in the metrics. Only misuse
raises: a response or gold that is not a string, an empty gold, a bad timeout (and a
RuntimeError if the worker processes cannot start at all, e.g. math-verify is missing).

The code lives in one module per concept: `extraction` (the final answer of a text,
`extract_boxed`, `extract_answer`), `worker_pool` (math-verify in killable worker
processes) and this one (verdicts, rewards, `grade`, `MathGrader`); the names of the
first two that callers use are re-exported here.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import os
import re
import threading
from collections.abc import Sequence

import numpy as np

from mathrl_jax.rewards.extraction import (
    clean_answer,
    extract_answer,
    extract_boxed,
    gold_answer,
    require_str,
)
from mathrl_jax.rewards.worker_pool import DEFAULT_MEMORY_LIMIT_BYTES, DEFAULT_STARTUP_TIMEOUT_S, WorkerPool

__all__ = [
    "DEFAULT_MEMORY_LIMIT_BYTES",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "STATUSES",
    "GradeResult",
    "MathGrader",
    "RewardValues",
    "extract_answer",
    "extract_boxed",
    "grade",
    "grade_metrics",
    "reward_value",
    "shutdown_workers",
]

STATUSES = ("correct", "incorrect", "no_answer", "timeout", "error")
"""Every `GradeResult.status`."""


@dataclasses.dataclass(frozen=True)
class GradeResult:
    """The verdict on one response.

    Attributes:
      status: "correct" | "incorrect" | "no_answer" | "timeout" | "error".
      extracted: the extracted answer string, None when none was found.
      formatted: the response has the required format, a non-empty `\\boxed{}` answer.
      detail: why the status is "error" or "timeout" (for logs), else None.
    """

    status: str
    extracted: str | None
    formatted: bool
    detail: str | None = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown grade status {self.status!r}; expected one of {', '.join(STATUSES)}")

    @property
    def correct(self) -> bool:
        return self.status == "correct"


@dataclasses.dataclass(frozen=True)
class RewardValues:
    """Reward of each outcome: 1 / 0 / 0 by default; RLinf's math reward is correct=5, incorrect=no_answer=-5.

    `format_reward` is added to the outcome's value when the response has a `\\boxed{}` answer.
    A "timeout" or "error" is worth `incorrect`.
    """

    correct: float = 1.0
    incorrect: float = 0.0
    no_answer: float = 0.0
    format_reward: float = 0.0


def reward_value(result: GradeResult, values: RewardValues) -> float:
    """values.{correct, no_answer, incorrect}[outcome] + values.format_reward * result.formatted."""
    if result.status == "correct":
        base = values.correct
    elif result.status == "no_answer":
        base = values.no_answer
    else:  # incorrect, timeout, error
        base = values.incorrect
    return float(base) + (float(values.format_reward) if result.formatted else 0.0)


def _check_timeout(timeout_s) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    return float(timeout_s)


_PLAIN_INTEGER = re.compile(r"0|-?[1-9][0-9]{0,99}")
"""A plain integer literal: "0", or an optional "-" and 1 to 100 ASCII digits without a leading zero."""


def _plain_integer_verdict(gold_answer: str, answer: str) -> str | None:
    """math-verify's verdict on two plain integers, without math-verify: "correct" | "incorrect" | None.

    Accepts a gold and an answer (as the worker would get them) that both fully match
    `_PLAIN_INTEGER`, and returns "correct" when the strings are equal, else
    "incorrect"; None (ask math-verify) for anything else: "+5", "05", "-0", "1,000",
    "5.", "5.0", "50\\%", "2^{10}", spaces, non-ASCII digits, more than 100 digits.

    The verdict is math-verify's: such a literal is the only way of writing its
    number, so two are equal as numbers iff equal as strings; and math-verify parses
    each to `[Integer(n), "n"]` (sympy's exact integer, then the string) and compares
    two Integers exactly (its float rounding applies only when one side is a Float;
    `sympy_numeric_eq`), two strings as strings, an Integer and a string never. So it
    finds a match iff the integers are equal. The bound on digits keeps pathological
    answers (a megabyte of digits; Python parses at most 4300 digits to an int by
    default) on the worker, with its time and memory limits. Property-tested against
    the workers (tests/rewards/test_math_grader.py).
    """
    if _PLAIN_INTEGER.fullmatch(gold_answer) and _PLAIN_INTEGER.fullmatch(answer):
        return "correct" if answer == gold_answer else "incorrect"
    return None


def _grade_without_worker(response: str, gold_answer: str) -> tuple[GradeResult | None, str, bool]:
    """(the verdict if no worker is needed, else None; the answer; formatted): no answer, or plain integers."""
    require_str(response, "response")
    boxed = extract_boxed(response)
    formatted = boxed is not None and bool(boxed.strip())
    answer = extract_answer(response)
    if answer is None:
        return GradeResult("no_answer", None, formatted), answer, formatted
    status = _plain_integer_verdict(gold_answer, clean_answer(answer))
    return (None if status is None else GradeResult(status, answer, formatted)), answer, formatted


def _grade_with(pool: WorkerPool, response: str, gold_answer: str, timeout_s: float) -> GradeResult:
    result, answer, formatted = _grade_without_worker(response, gold_answer)
    if result is not None:
        return result
    status, detail = pool.run(gold_answer, clean_answer(answer), timeout_s)
    return GradeResult(status, answer, formatted, detail)


_DEFAULT_POOL: WorkerPool | None = None
_DEFAULT_POOL_LOCK = threading.Lock()


def _default_pool() -> WorkerPool:
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = WorkerPool(DEFAULT_MEMORY_LIMIT_BYTES, DEFAULT_STARTUP_TIMEOUT_S)
        return _DEFAULT_POOL


def shutdown_workers() -> None:
    """Stops the worker processes that `grade` started (they are restarted on the next call; also run at exit)."""
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        pool, _DEFAULT_POOL = _DEFAULT_POOL, None
    if pool is not None:
        pool.close()


def _forget_default_pool_in_child() -> None:
    global _DEFAULT_POOL, _DEFAULT_POOL_LOCK
    _DEFAULT_POOL, _DEFAULT_POOL_LOCK = None, threading.Lock()


atexit.register(shutdown_workers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_default_pool_in_child)


def grade(response: str, gold: str, *, timeout_s: float = 5.0) -> GradeResult:
    """Grades one response against the gold answer; never raises for bad model output.

    Args:
      response: the model's full response text.
      gold: the reference answer ("\\frac{1}{2}", "[1, 2)") or a solution with a `\\boxed{}` answer.
      timeout_s: wall-clock limit on grading this answer in a worker process. Past it the
        worker is killed and the status is "timeout". The first call in a process also
        waits for the workers to start (about a second, not counted).

    Returns:
      GradeResult: "correct" / "incorrect" (math-verify's verdict, gold parsed first),
      "no_answer" (nothing extracted, see `extract_answer`), "timeout", or "error"
      (math-verify crashed on this answer, or the worker died).

    Raises:
      TypeError / ValueError for a non-string response or gold, an empty gold, or a
      non-positive timeout: mistakes of the caller, not of the model.
    """
    timeout_s = _check_timeout(timeout_s)
    gold_text = gold_answer(gold)
    return _grade_with(_default_pool(), response, gold_text, timeout_s)


class MathGrader:
    """Grades batches of responses in parallel worker processes, in order; see the module docstring.

        with MathGrader(RewardValues(correct=5.0, incorrect=-5.0, no_answer=-5.0), num_workers=4) as grader:
            rewards, metrics = grader.rewards(responses, golds)

    Each response gets `timeout_s` seconds of grading; a timed-out or crashed worker is
    killed and replaced and the response counts as incorrect (status "timeout" /
    "error"), reported in the metrics. `close()` (or leaving the `with` block) stops
    the worker processes.
    """

    def __init__(
        self,
        values: RewardValues = RewardValues(),
        *,
        timeout_s: float = 5.0,
        num_workers: int = 2,
        memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    ):
        if not isinstance(values, RewardValues):
            raise TypeError(f"values must be a RewardValues, got {type(values).__name__}: {values!r:.80}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        if memory_limit_bytes is not None and (not isinstance(memory_limit_bytes, int) or memory_limit_bytes < 0):
            raise ValueError(f"memory_limit_bytes must be a non-negative int or None, got {memory_limit_bytes!r}")
        self.values = values
        self.timeout_s = _check_timeout(timeout_s)
        self.num_workers = num_workers
        self._pool = WorkerPool(memory_limit_bytes, _check_timeout(startup_timeout_s))
        self._pool.start()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = concurrent.futures.ThreadPoolExecutor(
            num_workers, thread_name_prefix="math-grader"
        )

    def grade_batch(self, responses: Sequence[str], golds: Sequence[str]) -> list[GradeResult]:
        """`grade` of every (response, gold) pair, `num_workers` at a time; results in input order."""
        if self._executor is None:
            raise RuntimeError("MathGrader.grade_batch called after close()")
        if isinstance(responses, str) or isinstance(golds, str):
            raise TypeError("responses and golds must be sequences of strings, not a single string")
        responses, golds = list(responses), list(golds)
        if len(responses) != len(golds):
            raise ValueError(f"got {len(responses)} responses but {len(golds)} gold answers")
        for i, response in enumerate(responses):
            require_str(response, f"responses[{i}]")
        gold_answers = []
        for i, gold in enumerate(golds):
            try:
                gold_answers.append(gold_answer(gold))
            except (TypeError, ValueError) as e:
                raise type(e)(f"golds[{i}]: {e}") from None
        # Verdicts that need no worker (no answer, plain integers) are taken here: a thread hop costs more.
        results: list = [_grade_without_worker(r, g)[0] for r, g in zip(responses, gold_answers)]
        futures = {
            i: self._executor.submit(_grade_with, self._pool, responses[i], gold_answers[i], self.timeout_s)
            for i, result in enumerate(results)
            if result is None
        }
        for i, future in futures.items():
            results[i] = future.result()
        return results

    def rewards(self, responses: Sequence[str], golds: Sequence[str]) -> tuple[np.ndarray, dict[str, float]]:
        """(`[N]` float32 rewards, metrics) of a batch.

        Metrics: "reward/mean", "reward/accuracy" (fraction correct), "reward/no_answer_rate",
        "reward/format_rate" (fraction with a boxed answer), "reward/timeout_count",
        "reward/error_count".
        """
        return batch_rewards(self.grade_batch(responses, golds), self.values)

    def close(self) -> None:
        """Stops the worker threads and processes; idempotent."""
        executor, self._executor = getattr(self, "_executor", None), None
        if executor is not None:
            executor.shutdown(wait=True)
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()

    def __enter__(self) -> MathGrader:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110  best effort at garbage collection
            pass


def batch_rewards(results: Sequence[GradeResult], values: RewardValues) -> tuple[np.ndarray, dict[str, float]]:
    """(`[N]` float32 rewards, `grade_metrics`) of a batch's verdicts."""
    rewards = np.asarray([reward_value(r, values) for r in results], np.float32)
    return rewards, grade_metrics(results, rewards)


def grade_metrics(results: Sequence[GradeResult], rewards: np.ndarray | None = None) -> dict[str, float]:
    """Batch metrics of grade results (see `MathGrader.rewards`); fractions are 0 for an empty batch."""
    n = max(len(results), 1)
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    metrics = {
        "reward/accuracy": counts["correct"] / n,
        "reward/no_answer_rate": counts["no_answer"] / n,
        "reward/format_rate": sum(r.formatted for r in results) / n,
        "reward/timeout_count": float(counts["timeout"]),
        "reward/error_count": float(counts["error"]),
    }
    if rewards is not None:
        metrics["reward/mean"] = float(np.mean(rewards)) if len(results) else 0.0
    return metrics
