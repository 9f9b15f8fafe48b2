"""A run resumed from a checkpoint directory whose latest step is damaged (one flipped bit in an Orbax data file)
restores the step before it, says so, and trains on exactly as the uninterrupted run: the damaged step is saved
anew, and rotation kept the intact step it resumed from."""

import logging
import math

import jax
import numpy as np

from mathrl_jax.train import loop
from mathrl_jax.train.checkpoint._checkpointer import Checkpointer
from tests.train.checkpoint.test_checkpoint_integrity import flip_a_byte
from tests.train.loop_fixtures import model_dir, small_config  # noqa: F401  (the fixture)


def trained(model_dir, run_dir, iterations):  # noqa: F811
    config = small_config(model_dir, run_dir, num_iterations=iterations, save_interval=2, max_to_keep=2)
    history = []
    summary = loop.train(config, on_metrics=lambda i, m: history.append((i, m)))
    return summary["state"], history


def test_a_resume_past_a_damaged_latest_step_trains_as_the_uninterrupted_run(model_dir, tmp_path, caplog):  # noqa: F811
    straight, _ = trained(model_dir, tmp_path / "a", 6)
    trained(model_dir, tmp_path / "b", 4)
    checkpoints = str(tmp_path / "b" / "checkpoints")
    assert Checkpointer(checkpoints, save_interval=2).all_steps() == [2, 4]
    flip_a_byte(checkpoints, 4)
    with caplog.at_level(logging.WARNING, logger="mathrl_jax.train.checkpoint._checkpointer"):
        resumed, history = trained(model_dir, tmp_path / "b", 6)
    assert "checkpoint step 4" in caplog.text and "restored step 2, the newest intact step" in caplog.text
    assert [i for i, _ in history] == [3, 4, 5, 6]  # from step 2 on
    assert all(math.isfinite(float(v)) for _, m in history for k, v in m.items() if np.ndim(v) == 0)
    for a, b in zip(jax.tree.leaves(jax.device_get(straight)), jax.tree.leaves(jax.device_get(resumed))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # 4 saved anew over the damaged one, 6 the newest; 2, verified at the resume, kept beyond max_to_keep=2.
    with Checkpointer(checkpoints, save_interval=2) as checkpointer:
        assert checkpointer.all_steps() == [2, 4, 6]
        checkpointer.restore(jax.device_get(resumed), step=4)  # intact now
