"""Rollouts to an update batch: `BatchMaker` / `prepare_batch` (rewards shaped, advantages computed by each
algorithm's estimator, rows filtered, the minibatch order and packing plan drawn), with its `BatchSettings`.

Behind the door: `_prepare` (the batch), `_advantages` (each estimator's call).
"""

from mathrl_jax.train.batch._advantages import compute_advantages
from mathrl_jax.train.batch._prepare import (
    BatchMaker,
    BatchSettings,
    DapoSettings,
    action_indices,
    control_rewards,
    mesh_context,
    prepare_batch,
)

__all__ = [
    "BatchMaker",
    "BatchSettings",
    "DapoSettings",
    "action_indices",
    "compute_advantages",
    "control_rewards",
    "mesh_context",
    "prepare_batch",
]
