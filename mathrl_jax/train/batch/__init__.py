"""Rollouts to an update batch: `BatchMaker` / `prepare_batch` (rewards shaped, advantages computed by each
algorithm's estimator, rows filtered, the minibatch order and packing plan drawn), with its `BatchSettings`.

Behind the door: `_prepare` (the batch), `_settings` (BatchSettings, DapoSettings), `_advantages` (each
estimator's call, on the host where the scores alone make them), `_control` (the control's shuffled rewards).
"""

from mathrl_jax.train.batch._advantages import compute_advantages
from mathrl_jax.train.batch._control import control_rewards, shuffled_rewards
from mathrl_jax.train.batch._prepare import (
    BatchMaker,
    action_indices,
    advantage_statistics,
    batch_metrics_on_host,
    mesh_context,
    prepare_batch,
)
from mathrl_jax.train.batch._settings import BatchSettings, DapoSettings

__all__ = [
    "BatchMaker",
    "BatchSettings",
    "DapoSettings",
    "action_indices",
    "advantage_statistics",
    "batch_metrics_on_host",
    "compute_advantages",
    "control_rewards",
    "shuffled_rewards",
    "mesh_context",
    "prepare_batch",
]
