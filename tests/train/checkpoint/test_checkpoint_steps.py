"""A checkpoint step is restored under its own name only, and no save is skipped silently (issue 60): a step
directory renamed (4 -> 9) is refused, naming it, where it resumed at the wrong step and skipped the saves up to
its name without a word."""

import logging
import os

import jax.numpy as jnp
import pytest

from mathrl_jax.train.checkpoint import Checkpointer, CheckpointError, MisnamedCheckpointError
from tests.train.checkpoint.test_checkpoint_integrity import make_state, save_steps

LOGGER = "mathrl_jax.train.checkpoint._checkpointer"


def test_a_renamed_step_directory_is_refused_naming_it(tmp_path):
    save_steps(tmp_path, [2, 4])
    os.rename(tmp_path / "4", tmp_path / "9")
    with Checkpointer(tmp_path, save_interval=2) as checkpointer:
        with pytest.raises(MisnamedCheckpointError, match=rf"checkpoint {tmp_path}/9 was saved as step 4, not 9"):
            checkpointer.restore(make_state(0))  # no older step in its place: the name is wrong, not the data
        with pytest.raises(MisnamedCheckpointError, match="rename it back to 4"):
            checkpointer.restore(make_state(0), step=9)
        _, metadata = checkpointer.restore(make_state(0), step=2)
    assert metadata == {"iteration": 2}
    assert issubclass(MisnamedCheckpointError, CheckpointError)  # exit 2 from train.py, in one line


def test_a_save_that_is_skipped_is_said(tmp_path, caplog):
    """Before: a step on the interval not newer than the latest, or a step that exists, was skipped silently (an
    info log)."""
    save_steps(tmp_path, [2, 4])
    with Checkpointer(tmp_path, save_interval=2) as checkpointer:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert not checkpointer.should_save(2)
            assert not checkpointer.save(4, {"x": jnp.zeros(2)}, {}, force=True)
            assert checkpointer.should_save(6)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"checkpoint step 2 is not saved: {tmp_path} already holds step 4 (steps [2, 4])" in said[0], said
    assert f"checkpoint step 4 already exists in {tmp_path}; not saved again" in said[1], said
    assert len(said) == 2, said
