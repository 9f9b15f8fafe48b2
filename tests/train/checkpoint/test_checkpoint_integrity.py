"""Checkpointer verifies what it restores: every leaf against the checksum saved with it. A damaged data file of
the latest step is refused and the newest intact step restored instead, with a warning naming both; every step
damaged is a CheckpointError naming them; rotation keeps the intact step; checksums do not depend on where an
array lives (host or device, any dtype)."""

import glob
import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mathrl_jax.train.checkpoint import _checksums as checksums
from mathrl_jax.train.checkpoint._checkpointer import Checkpointer
from mathrl_jax.train.checkpoint._errors import CheckpointError, CorruptCheckpointError, UnverifiedCheckpointError


def make_state(step):
    """Random (incompressible) params, so a flipped byte lands in array data, and the usual small leaves."""
    key = jax.random.key(step)
    return {
        "params": {"w": jax.random.normal(key, (64, 32)), "b": jnp.arange(16, dtype=jnp.bfloat16) + step},
        "step": jnp.int32(step),
        "rng": jax.random.key_data(key),
        "count": step,
    }


def save_steps(directory, steps, max_to_keep=3):
    with Checkpointer(directory, save_interval=2, max_to_keep=max_to_keep) as checkpointer:
        for step in steps:
            checkpointer.save(step, make_state(step), {"iteration": step})


def flip_a_byte(directory, step):
    """Flips one bit in the middle of the step's largest data file (Orbax's OCDBT data of the params)."""
    files = [
        f for f in glob.glob(os.path.join(directory, str(step), "state", "**"), recursive=True) if os.path.isfile(f)
    ]
    largest = max(files, key=os.path.getsize)
    data = bytearray(open(largest, "rb").read())
    data[len(data) // 2] ^= 0x01
    with open(largest, "wb") as f:
        f.write(bytes(data))


def assert_equal_state(got, want):
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves_with_path(want)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), jax.tree_util.keystr(path)


def test_a_flipped_byte_in_the_latest_step_restores_the_previous_step_and_says_so(tmp_path, caplog):
    save_steps(tmp_path, [2, 4])
    flip_a_byte(tmp_path, 4)
    with Checkpointer(tmp_path, save_interval=2) as checkpointer:
        with caplog.at_level(logging.WARNING, logger="mathrl_jax.train.checkpoint._checkpointer"):
            state, metadata = checkpointer.restore(make_state(0))
        assert metadata == {"iteration": 2}  # not the damaged step 4
        assert checkpointer.restored_step == 2
        assert_equal_state(state, make_state(2))
        assert "checkpoint step 4" in caplog.text and "restored step 2, the newest intact step" in caplog.text
        assert "params/w" in caplog.text  # the damaged leaf is named
        with pytest.raises(CorruptCheckpointError, match=r"/4 fails verification: the data of params/w differ"):
            checkpointer.restore(make_state(0), step=4)  # a step asked for by number is refused, not replaced


def test_a_partial_restore_verifies_the_part_it_reads(tmp_path):
    save_steps(tmp_path, [2])
    flip_a_byte(tmp_path, 2)
    with Checkpointer(tmp_path, save_interval=0, read_only=True) as checkpointer:
        with pytest.raises(CorruptCheckpointError, match=r"/2 fails verification: the data of params/w differ"):
            checkpointer.restore({"params": make_state(0)["params"]}, step=2, partial=True)
        state, _ = checkpointer.restore({"rng": make_state(0)["rng"]}, step=2, partial=True)  # not the damaged part
    np.testing.assert_array_equal(np.asarray(state["rng"]), np.asarray(make_state(2)["rng"]))


def test_edited_metadata_is_refused_too(tmp_path, caplog):
    save_steps(tmp_path, [2, 4])
    metadata_file = tmp_path / "4" / "metadata" / "metadata"
    metadata_file.write_text(metadata_file.read_text().replace("4", "5"))  # still JSON, another iteration
    with Checkpointer(tmp_path, save_interval=2) as checkpointer:
        with caplog.at_level(logging.WARNING, logger="mathrl_jax.train.checkpoint._checkpointer"):
            _, metadata = checkpointer.restore(make_state(0))
    assert metadata == {"iteration": 2} and "its metadata differ" in caplog.text


def test_every_step_damaged_is_a_checkpoint_error_naming_them(tmp_path):
    save_steps(tmp_path, [2, 4])
    flip_a_byte(tmp_path, 2)
    flip_a_byte(tmp_path, 4)
    with Checkpointer(tmp_path, save_interval=2) as checkpointer:
        with pytest.raises(CheckpointError, match=r"no intact checkpoint in .*step 4: .*params/w.*step 2: .*params/w"):
            checkpointer.restore(make_state(0))


def test_rotation_keeps_the_intact_step_and_the_damaged_one_is_saved_anew(tmp_path):
    save_steps(tmp_path, [2, 4])
    flip_a_byte(tmp_path, 4)
    with Checkpointer(tmp_path, save_interval=2, max_to_keep=1) as checkpointer:
        checkpointer.restore(make_state(0))  # step 2, verified
        assert checkpointer.should_save(4)  # the damaged step 4 does not count as saved
        assert checkpointer.save(4, make_state(4), {"iteration": 4})
        assert checkpointer.save(6, make_state(6), {"iteration": 6})
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [2, 6]  # max_to_keep=1 keeps 6; step 2 stays: the last verified one
    with Checkpointer(tmp_path, save_interval=2, max_to_keep=1) as checkpointer:
        _, metadata = checkpointer.restore(make_state(0))
        assert metadata == {"iteration": 6}


def remove_checksums(directory, step, *, from_metadata=False):
    """Deletes the step's checksums item; with `from_metadata`, also its entry in the step's Orbax metadata
    (`_CHECKPOINT_METADATA`, the items it was saved with): a step as a version before checksums left it."""
    shutil.rmtree(os.path.join(directory, str(step), "checksums"))
    if from_metadata:
        path = os.path.join(directory, str(step), "_CHECKPOINT_METADATA")
        with open(path) as f:
            metadata = json.load(f)
        del metadata["item_handlers"]["checksums"]
        with open(path, "w") as f:
            json.dump(metadata, f)


def test_a_step_whose_checksums_were_deleted_is_refused_as_damaged(tmp_path, caplog):
    """Issue 45: a flipped byte in 4/state plus a deleted 4/checksums restored step 4 unverified (another state,
    no message) and rotation then removed the intact step 2. Its metadata lists the checksums: refused as damaged,
    step 2 restored and named, kept by rotation, and 4 saved anew."""
    save_steps(tmp_path, [2, 4])
    flip_a_byte(tmp_path, 4)
    remove_checksums(tmp_path, 4)
    with Checkpointer(tmp_path, save_interval=2, max_to_keep=1) as checkpointer:
        with caplog.at_level(logging.WARNING, logger="mathrl_jax.train.checkpoint._checkpointer"):
            state, metadata = checkpointer.restore(make_state(0))
        assert metadata == {"iteration": 2} and checkpointer.restored_step == 2
        assert_equal_state(state, make_state(2))
        assert "checkpoint step 4" in caplog.text and "restored step 2, the newest intact step" in caplog.text
        assert "its checksums are missing (its metadata lists them" in caplog.text
        with pytest.raises(CorruptCheckpointError, match=r"/4 fails verification: its checksums are missing"):
            checkpointer.restore(make_state(0), step=4)
        assert checkpointer.should_save(4)  # the refused step does not count as saved
        assert checkpointer.save(4, make_state(4), {"iteration": 4})
        assert checkpointer.save(6, make_state(6), {"iteration": 6})
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [2, 6]  # max_to_keep=1 keeps 6; 2 stays: the last verified step


def test_a_step_without_checksums_after_one_with_them_is_refused_as_damaged(tmp_path, caplog):
    """The step's metadata edited too (checksums no longer listed): an older step has checksums, so this one was
    saved by a version that kept them; refused, not taken for a step of before checksums."""
    save_steps(tmp_path, [2, 4])
    remove_checksums(tmp_path, 4, from_metadata=True)
    with Checkpointer(tmp_path, save_interval=2, allow_unverified=True) as checkpointer:
        with caplog.at_level(logging.WARNING, logger="mathrl_jax.train.checkpoint._checkpointer"):
            _, metadata = checkpointer.restore(make_state(0))
    assert metadata == {"iteration": 2} and "the older step 2 has some" in caplog.text


def test_a_step_saved_before_checksums_restores_only_when_allowed(tmp_path, caplog):
    save_steps(tmp_path, [2])
    remove_checksums(tmp_path, 2, from_metadata=True)  # as a version before checksums saved it
    with Checkpointer(tmp_path, save_interval=2) as checkpointer:
        with pytest.raises(UnverifiedCheckpointError, match=r"/2 \(step 2\) has no checksums .*allow_unverified=True"):
            checkpointer.restore(make_state(0))
        with pytest.raises(UnverifiedCheckpointError):
            checkpointer.restore(make_state(0), step=2)
    with Checkpointer(tmp_path, save_interval=2, allow_unverified=True) as checkpointer:
        with caplog.at_level(logging.WARNING, logger="mathrl_jax.train.checkpoint._checkpointer"):
            state, metadata = checkpointer.restore(make_state(0))
    assert metadata == {"iteration": 2} and "restored unverified" in caplog.text
    assert_equal_state(state, make_state(2))


def test_a_cast_on_restore_is_verified_before_the_cast(tmp_path):
    save_steps(tmp_path, [2])
    target = make_state(0)
    target["params"]["w"] = jax.ShapeDtypeStruct((64, 32), jnp.bfloat16)  # saved as float32
    target["params"]["b"] = np.zeros(16, np.float32)  # saved as bfloat16
    with Checkpointer(tmp_path, save_interval=2) as checkpointer:
        state, _ = checkpointer.restore(target)
    assert state["params"]["w"].dtype == jnp.bfloat16 and state["params"]["b"].dtype == np.float32
    want = make_state(2)["params"]
    np.testing.assert_array_equal(np.asarray(state["params"]["w"]), np.asarray(want["w"].astype(jnp.bfloat16)))
    np.testing.assert_array_equal(state["params"]["b"], np.asarray(want["b"], np.float32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int32", "uint32", "int8", "uint8", "bool"])
def test_a_checksum_is_the_same_on_host_and_device_and_catches_one_flipped_bit(dtype):
    rng = np.random.default_rng(0)
    host = rng.normal(size=(5, 7)) * 100
    host = (host > 0) if dtype == "bool" else host.astype(jnp.dtype(dtype))
    dtype = np.asarray(host).dtype
    device = jax.device_put(host)
    sums = checksums.leaf_checksums({"host": host, "device": device}, {"host": dtype, "device": dtype})
    assert sums["host"] == sums["device"] is not None
    flipped = np.array(host).reshape(-1).view(np.uint8).copy()
    flipped[9] ^= 0x04
    flipped = flipped.view(dtype).reshape(host.shape)
    assert checksums.leaf_checksums({"x": flipped}, {"x": dtype})["x"] != sums["host"]


def test_device_checksums_run_in_programs_of_bounded_memory(monkeypatch):
    """The leaves are summed in groups of at most GROUP_BYTES (a larger leaf alone): the same checksums as one
    program over all of them, and no group's program holds more than ~2x its group's bytes in temporaries (one
    program over a whole 4 GiB state held 8.3 GiB: a checkpoint doubled the run's memory)."""
    leaves = {f"w{i}": jax.random.normal(jax.random.key(i), (32, 1024 + 64 * i)) for i in range(6)}  # 128-168 KiB
    leaves["big"] = jax.random.normal(jax.random.key(9), (512, 1024))
    dtypes = {name: np.dtype(leaf.dtype) for name, leaf in leaves.items()}
    whole = checksums.leaf_checksums(leaves, dtypes)
    monkeypatch.setattr(checksums, "GROUP_BYTES", 2**19)  # 512 KiB: the 2 MiB leaf alone, the others in threes
    groups = checksums._groups(list(leaves.values()))
    assert [len(g) for g in groups] == [3, 3, 1] and groups[-1][0] is leaves["big"]
    assert checksums.leaf_checksums(leaves, dtypes) == whole
    for group in groups:
        temporaries = checksums._device_checksums.lower(group).compile().memory_analysis().temp_size_in_bytes
        largest = max(checksums.GROUP_BYTES, max(leaf.nbytes for leaf in group))
        assert temporaries <= 2.2 * largest
