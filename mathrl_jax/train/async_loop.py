"""Asynchronous PPO (AReaL): generation runs ahead of training, with bounded staleness.

A generator thread produces iteration i's rollouts with whatever weights the
sampler holds (version v, recorded in `Rollouts.policy_version`) while the
learner trains on earlier ones. Before it starts batch i it waits until the
learner has made at least `i - 1 - max_head_offpolicyness` updates, so the
learner (at version i - 1 when it takes batch i) never trains on rollouts more
than `max_head_offpolicyness` versions old. With 0 the generator waits for
every update: exactly the synchronous loop. The learner uses the decoupled
loss: behaviour log-probs from the sampler, proximal log-probs recomputed with
its current weights (`loop.prepare_batch`). Source: Fu et al. 2025, "AReaL: A
Large-Scale Asynchronous Reinforcement Learning System for Language
Reasoning" (`max_head_offpolicyness`, decoupled PPO objective).
"""

from __future__ import annotations

import queue
import threading
import time

from mathrl_jax.train.loop import Collected, Run, collect, prm_action_rewards


class AsyncRollouts:
    """A rollout source whose generator thread runs up to `max_head_offpolicyness` versions ahead."""

    def __init__(self, run: Run):
        self.run = run
        self.max_offpolicyness = int(run.config.max_head_offpolicyness)
        self.learner_version = int(run.state.policy_version)
        self.condition = threading.Condition()
        self.results: "queue.Queue" = queue.Queue()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._generate, name="rollout-generator", daemon=True)
        self.thread.start()

    def _generate(self) -> None:
        try:
            for iteration in range(self.run.start_iteration + 1, self.run.total_iterations + 1):
                with self.condition:
                    # The learner takes batch i at version i - 1 (+ the resume offset); wait until that version is
                    # within the allowed staleness of the weights we would sample with.
                    needed = iteration - 1 - self.max_offpolicyness
                    self.condition.wait_for(lambda: self.learner_version >= needed or self.stopping.is_set())
                if self.stopping.is_set():
                    return
                start = time.perf_counter()
                rollouts, problems, scores, reward_metrics = collect(self.run, iteration)
                action_rewards = prm_action_rewards(self.run, rollouts, problems)
                seconds = time.perf_counter() - start
                self.results.put(
                    Collected(rollouts, scores, reward_metrics, self.run.loader.state(), seconds, action_rewards)
                )
        except BaseException as error:  # surfaced in the learner thread
            self.results.put(error)

    def get(self, iteration: int) -> Collected:
        item = self.results.get()
        if isinstance(item, BaseException):
            raise RuntimeError(f"the rollout generator failed before iteration {iteration}") from item
        return item

    def updated(self, version: int) -> None:
        with self.condition:
            self.learner_version = version
            self.condition.notify_all()

    def close(self) -> None:
        self.stopping.set()
        with self.condition:
            self.condition.notify_all()
        self.thread.join(timeout=60)
