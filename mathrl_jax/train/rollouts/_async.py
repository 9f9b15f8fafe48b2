"""Asynchronous PPO (AReaL): generation runs ahead of training, with bounded staleness.

A generator thread produces iteration i's rollouts while the learner trains on
earlier ones. The learner takes batch i at policy version i - 1 (the params
after iteration i - 1) and must never train on rollouts more than
`max_head_offpolicyness` (eta) versions old, so the generator starts batch i as
soon as the params after iteration i - 1 - eta exist. It samples batch i with
exactly those params, however far the learner has got meanwhile:

    iteration i is sampled with the params after iteration max(0, i - 1 - eta)

With eta = 0 the generator waits for every update: exactly the synchronous loop.
The learner uses the decoupled loss: behaviour log-probs from the sampler,
proximal log-probs recomputed with its current weights (`batch.prepare_batch`).
Source: Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement
Learning System for Language Reasoning" (`max_head_offpolicyness`, decoupled
PPO objective).

Why a fixed schedule, where AReaL samples with the newest weights it holds: the
pipeline's overlap is the same (the generator waits for the same update before
it starts a batch), but which weights sampled a batch no longer depends on
thread timing. Two runs of one config train the same model, and a checkpoint can
hold everything the generator had in flight: after iteration k, the batches
k+1 .. k+eta (sampled with params k-eta .. k-1) are saved with it as "pending
rollouts", so a killed and resumed run continues bit for bit as an uninterrupted
one would. The cost: the learner keeps the eta + 1 newest params alive (the
update does not donate them), and a save waits until those batches are made.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from mathrl_jax.errors import TrainingError
from mathrl_jax.sampling.base import Rollouts
from mathrl_jax.train.rollouts._collect import Collected, RolloutMaker, collect


class AsyncRollouts:
    """A rollout source whose generator thread samples iteration i with the params after iteration
    max(0, i - 1 - max_head_offpolicyness) (see the module docstring)."""

    def __init__(
        self,
        maker: RolloutMaker,
        *,
        max_head_offpolicyness: int,
        start_iteration: int,
        total_iterations: int,
        params: Any,
        policy_version: int,
        pending_rollouts: Sequence[Collected] = (),
    ):
        """`params` (of `policy_version`): the learner's after `start_iteration`; `pending_rollouts`: the batches
        a checkpoint saved (`pending`), made before the run was interrupted."""
        self.maker = maker
        self.eta = int(max_head_offpolicyness)
        self.start_iteration, self.total_iterations = start_iteration, total_iterations
        self.condition = threading.Condition()
        self.sampler_lock = threading.Lock()  # the generator's and the evaluation's weights take turns
        self.params: Dict[int, tuple] = {start_iteration: (params, int(policy_version))}
        self.latest = (params, int(policy_version))  # the learner's newest, for the evaluation
        self.ready: Dict[int, Collected] = {}
        self.error: Optional[BaseException] = None
        self.stopping = False
        # Batches made before the run was interrupted. A run resumed with a smaller eta drops those that would now
        # be too stale (and draws their prompts again); one resumed with a larger eta, or from a checkpoint without
        # them (the end of a run it extends), samples its next batches with the restored params.
        version = int(policy_version)
        for offset, made in enumerate(pending_rollouts):
            if version + offset - made.rollouts.policy_version > self.eta:
                break
            self.ready[start_iteration + 1 + offset] = made
        if self.ready:
            maker.loader.restore(self.ready[max(self.ready)].data_state)
        self.first = start_iteration + 1 + len(self.ready)
        self.thread = threading.Thread(target=self._generate, name="rollout-generator", daemon=True)
        self.thread.start()

    def _generate(self) -> None:
        try:
            for iteration in range(self.first, self.total_iterations + 1):
                source = max(self.start_iteration, iteration - 1 - self.eta)
                with self.condition:
                    self.condition.wait_for(lambda: source in self.params or self.stopping)
                    if self.stopping:
                        return
                    params, version = self.params[source]
                    for old in [k for k in self.params if k < source]:  # no later batch samples with these
                        del self.params[old]
                start = time.perf_counter()
                with self.sampler_lock:
                    self.maker.sampler.update_weights(params, version)
                    rollouts, _, rewarded = collect(self.maker, iteration)
                made = Collected(
                    rollouts,
                    rewarded.scores,
                    rewarded.metrics,
                    self.maker.loader.state(),
                    time.perf_counter() - start,
                    rewarded.step_rewards,
                    correct=rewarded.correct,
                )
                with self.condition:
                    self.ready[iteration] = made
                    self.condition.notify_all()
        except BaseException as error:  # surfaced in the learner thread
            with self.condition:
                self.error = error
                self.condition.notify_all()

    def _wait_for(self, iteration: int) -> None:
        """Blocks (holding the condition) until batch `iteration` is made; raises the generator's error."""
        self.condition.wait_for(lambda: iteration in self.ready or self.error is not None)
        if iteration not in self.ready:
            if isinstance(self.error, TrainingError):  # bad input (a reward function's output): its own message
                raise self.error
            raise RuntimeError(f"the rollout generator failed before iteration {iteration}") from self.error

    def get(self, iteration: int) -> Collected:
        with self.condition:
            self._wait_for(iteration)
            return self.ready.pop(iteration)

    def updated(self, iteration: int, params: Any, version: int) -> None:
        """The learner's params after `iteration` (policy version `version`): the generator samples with them
        from batch iteration + 1 + eta on."""
        with self.condition:
            self.params[iteration] = (params, int(version))
            self.latest = (params, int(version))
            self.condition.notify_all()

    def pending(self, iteration: int) -> List[Collected]:
        """The batches after `iteration` that the generator makes before the learner's next update (iterations
        iteration + 1 .. iteration + eta), for the checkpoint; waits until they are made."""
        last = min(iteration + self.eta, self.total_iterations)
        with self.condition:
            for later in range(iteration + 1, last + 1):
                self._wait_for(later)
            return [self.ready[later] for later in range(iteration + 1, last + 1)]

    @contextlib.contextmanager
    def current_weights(self) -> Iterator[None]:
        """The sampler holds the learner's current params inside the block (for evaluation); the generator
        waits meanwhile and puts its own back before its next batch."""
        with self.sampler_lock:
            self.maker.sampler.update_weights(*self.latest)
            yield

    def close(self) -> None:
        with self.condition:
            self.stopping = True
            self.condition.notify_all()
        self.thread.join(timeout=60)


# ------------------------------------------------------------------ pending batches in a checkpoint
#
# A batch made ahead of the learner is saved with the checkpoint: its arrays as an Orbax item beside the state
# (`Checkpointer.save(..., arrays=)`, verified by checksums), the rest (lengths, strings, the data position) as JSON
# in the metadata. Orbax refuses zero-size arrays: those are rebuilt from the dtype and shape the JSON keeps.

_RAGGED = {"prompt_ids": np.int64, "completion_ids": np.int64, "logprobs": np.float32, "policy_logprobs": np.float32}
_OPTIONAL = ("action_rewards", "row_advantages", "row_mask", "correct")


def collected_to_item(collected: Collected) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """(the batch's arrays, a JSON record): what `collected_from_item` turns back into an equal batch (arrays bit
    for bit; token ids as int64, log-probs as float32)."""
    r = collected.rollouts
    arrays = {
        name: np.concatenate([np.asarray(row, dtype).ravel() for row in getattr(r, name)] + [np.zeros(0, dtype)])
        for name, dtype in _RAGGED.items()
    }
    arrays.update(prompt_indices=np.asarray(r.prompt_indices), scores=np.asarray(collected.scores))
    arrays.update({k: np.asarray(getattr(collected, k)) for k in _OPTIONAL if getattr(collected, k) is not None})
    record = {
        "lengths": {name: [len(row) for row in getattr(r, name)] for name in _RAGGED},
        "arrays": {name: {"dtype": a.dtype.str, "shape": list(a.shape)} for name, a in arrays.items()},
        "finish_reasons": list(r.finish_reasons),
        "stop_reasons": [s if s is None or isinstance(s, str) else int(s) for s in r.stop_reasons],
        "policy_version": int(r.policy_version),
        "texts": None if r.texts is None else list(r.texts),
        "reward_metrics": {k: float(v) for k, v in collected.reward_metrics.items()},
        "data_state": collected.data_state,
        "generate_seconds": float(collected.generate_seconds),
    }
    return {name: a for name, a in arrays.items() if a.size}, record


def collected_from_item(arrays: Dict[str, np.ndarray], record: Dict[str, Any]) -> Collected:
    """The inverse of `collected_to_item`."""
    full = {
        name: np.asarray(arrays[name]) if name in arrays else np.zeros(spec["shape"], np.dtype(spec["dtype"]))
        for name, spec in record["arrays"].items()
    }
    rows = {}
    for name in _RAGGED:
        ends = np.cumsum(record["lengths"][name], dtype=np.int64)
        rows[name] = [full[name][end - length : end] for end, length in zip(ends, record["lengths"][name])]
    rollouts = Rollouts(
        prompt_ids=[[int(t) for t in row] for row in rows["prompt_ids"]],
        completion_ids=[[int(t) for t in row] for row in rows["completion_ids"]],
        logprobs=rows["logprobs"],
        policy_logprobs=rows["policy_logprobs"],
        finish_reasons=list(record["finish_reasons"]),
        stop_reasons=list(record["stop_reasons"]),
        prompt_indices=full["prompt_indices"],
        policy_version=int(record["policy_version"]),
        texts=record["texts"],
    )
    return Collected(
        rollouts,
        full["scores"],
        dict(record["reward_metrics"]),
        dict(record["data_state"]),
        float(record["generate_seconds"]),
        **{k: full.get(k) for k in _OPTIONAL},
    )


def pending_to_checkpoint(batches: List[Collected]) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(the arrays item, the metadata's records) of the batches a generator made ahead (`AsyncRollouts.pending`)."""
    items = [collected_to_item(batch) for batch in batches]
    return {f"batch_{i}": arrays for i, (arrays, _) in enumerate(items) if arrays}, [record for _, record in items]


def pending_from_checkpoint(arrays: Dict[str, Any], records: List[Dict[str, Any]]) -> List[Collected]:
    """The inverse of `pending_to_checkpoint`; also reads the records of the previous layout (every array as
    base64 inside the JSON), so a run checkpointed by the previous version resumes."""
    return [
        collected_from_item(arrays.get(f"batch_{i}", {}), record) if "lengths" in record else _from_base64(record)
        for i, record in enumerate(records)
    ]


def _from_base64(record: Dict[str, Any]) -> Collected:
    """A batch of the previous layout: each array as {"dtype", "shape", "bytes": base64}, ragged ones as
    {"values": array, "lengths": [...]}."""

    def array(r):
        return np.frombuffer(base64.b64decode(r["bytes"]), np.dtype(r["dtype"])).reshape(r["shape"]).copy()

    arrays = {name: array(record[name]["values"]) for name in _RAGGED}
    arrays.update(prompt_indices=array(record["prompt_indices"]), scores=array(record["scores"]))
    arrays.update({k: array(record[k]) for k in _OPTIONAL if record.get(k) is not None})
    layout = {name: {"dtype": a.dtype.str, "shape": list(a.shape)} for name, a in arrays.items()}
    return collected_from_item(arrays, dict(record, lengths={n: record[n]["lengths"] for n in _RAGGED}, arrays=layout))
