"""`SerialGrader`: one `MathGrader` shared by threads and, across processes, by every process of a run."""

from __future__ import annotations

import dataclasses
import threading

import jax

from mathrl_jax.rewards.math_grader import GradeResult, MathGrader, batch_rewards
from mathrl_jax.sharding import distributed


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
