"""The asynchronous generator's batches survive a checkpoint bit for bit: their arrays as an Orbax item beside the
state (verified by checksums), the rest in its JSON metadata; a batch saved by the previous layout (base64 in the
JSON) still reads."""

import base64
import glob
import json
import os

import numpy as np
import pytest

from mathrl_jax.sampling.base import Rollouts
from mathrl_jax.train.checkpoint._checkpointer import Checkpointer
from mathrl_jax.train.checkpoint._errors import CorruptCheckpointError
from mathrl_jax.train.rollouts._async import pending_from_checkpoint, pending_to_checkpoint
from mathrl_jax.train.rollouts._collect import Collected


def awkward_batch():
    rng = np.random.default_rng(0)
    # float32 values JSON floats would not keep: -0.0, a subnormal, the smallest normal, NaN, 1/3
    special = np.array([-0.0, 1e-45, np.finfo(np.float32).tiny, np.nan, 1 / 3], np.float32)
    rollouts = Rollouts(
        prompt_ids=[[5, 6, 7], [5, 6, 7], [9]],
        completion_ids=[[1, 2, 3, 4, 151643], [], [8, 2**20]],
        logprobs=[special, np.zeros(0, np.float32), rng.standard_normal(2).astype(np.float32)],
        policy_logprobs=[special[::-1].copy(), np.zeros(0), rng.standard_normal(2).astype(np.float32)],
        finish_reasons=["stop", "length", "stop"],
        stop_reasons=[151643, None, "</answer>"],
        prompt_indices=np.array([0, 0, 1], np.int32),
        policy_version=7,
        texts=["12+3", "", "é\n\\boxed{1}"],
    )
    return Collected(
        rollouts,
        np.array([1.0, 0.0, np.nan], np.float32),
        {"reward/accuracy": 0.5, "reward/no_answer_rate": float("nan")},
        {"epoch": 1, "position": 3},
        0.25,
        action_rewards=rng.standard_normal((3, 2)).astype(np.float32),
        row_mask=np.array([1, 1, 0], np.float32),
    )


def through_a_checkpoint(directory, batches):
    """Saves `batches` as the loop does (`loop.save`) and reads them back as the build does."""
    arrays, records = pending_to_checkpoint(batches)
    with Checkpointer(str(directory), save_interval=1) as checkpointer:
        checkpointer.save(1, {"step": np.int32(1)}, {"pending_rollouts": records}, arrays=arrays)
    with Checkpointer(str(directory), save_interval=1) as checkpointer:
        _, metadata = checkpointer.restore({"step": np.int32(0)})
        records = json.loads(json.dumps(metadata["pending_rollouts"]))
        return pending_from_checkpoint(checkpointer.restore_arrays(checkpointer.restored_step), records)


def assert_same_batch(original, back):
    a, b = original.rollouts, back.rollouts
    assert b.prompt_ids == a.prompt_ids and b.completion_ids == a.completion_ids
    for x, y in zip(a.logprobs + a.policy_logprobs, b.logprobs + b.policy_logprobs):
        assert y.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(x, np.float32).view(np.uint32), y.view(np.uint32))
    assert (b.finish_reasons, b.stop_reasons, b.policy_version, b.texts) == (
        a.finish_reasons,
        a.stop_reasons,
        a.policy_version,
        a.texts,
    )
    np.testing.assert_array_equal(b.prompt_indices, a.prompt_indices)
    assert b.prompt_indices.dtype == a.prompt_indices.dtype
    for name in ("scores", "action_rewards", "row_mask"):
        np.testing.assert_array_equal(getattr(back, name).view(np.uint32), getattr(original, name).view(np.uint32))
    assert back.row_advantages is None
    assert back.data_state == original.data_state and back.generate_seconds == original.generate_seconds
    assert back.reward_metrics["reward/accuracy"] == 0.5 and np.isnan(back.reward_metrics["reward/no_answer_rate"])
    np.testing.assert_array_equal(back.rollouts.to_batch(0)["input_ids"], original.rollouts.to_batch(0)["input_ids"])


def test_a_batch_round_trips_through_a_checkpoint_bit_for_bit(tmp_path):
    original = awkward_batch()
    empty = Collected(
        Rollouts(
            [[3]],
            [[]],
            [np.zeros(0, np.float32)],
            [np.zeros(0, np.float32)],
            ["length"],
            [None],
            np.zeros(1, np.int32),
            2,
        ),
        np.zeros(1, np.float32),
        {},
        {"epoch": 0, "position": 1},
        0.0,
    )
    backs = through_a_checkpoint(tmp_path / "c", [original, empty])
    assert_same_batch(original, backs[0])
    assert backs[1].rollouts.completion_ids == [[]] and backs[1].rollouts.logprobs[0].dtype == np.float32
    assert os.path.isdir(tmp_path / "c" / "1" / "arrays")  # an Orbax item, not base64 in the JSON
    assert "bytes" not in json.dumps(json.load(open(glob.glob(str(tmp_path / "c" / "1" / "metadata" / "*"))[0])))


def test_a_damaged_pending_batch_is_refused_naming_it(tmp_path):
    arrays, records = pending_to_checkpoint([awkward_batch()])
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        checkpointer.save(1, {"step": np.int32(1)}, {"pending_rollouts": records}, arrays=arrays)
    files = [f for f in glob.glob(str(tmp_path / "1" / "arrays" / "**"), recursive=True) if os.path.isfile(f)]
    largest = max(files, key=os.path.getsize)
    data = bytearray(open(largest, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(largest, "wb").write(bytes(data))
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        with pytest.raises(CorruptCheckpointError, match="arrays"):
            checkpointer.restore_arrays(1)


def test_a_batch_saved_by_the_previous_layout_still_reads():
    """The previous version kept every array as base64 inside the JSON metadata (written here by hand)."""
    original = awkward_batch()
    r = original.rollouts

    def array(a):
        a = np.ascontiguousarray(a)
        return {"dtype": a.dtype.str, "shape": list(a.shape), "bytes": base64.b64encode(a.tobytes()).decode()}

    def ragged(rows, dtype):
        values = np.concatenate([np.asarray(x, dtype).ravel() for x in rows] + [np.zeros(0, dtype)])
        return {"values": array(values), "lengths": [len(x) for x in rows]}

    record = {
        "prompt_ids": ragged(r.prompt_ids, np.int64),
        "completion_ids": ragged(r.completion_ids, np.int64),
        "logprobs": ragged(r.logprobs, np.float32),
        "policy_logprobs": ragged(r.policy_logprobs, np.float32),
        "finish_reasons": list(r.finish_reasons),
        "stop_reasons": list(r.stop_reasons),
        "prompt_indices": array(r.prompt_indices),
        "policy_version": r.policy_version,
        "texts": r.texts,
        "scores": array(original.scores),
        "reward_metrics": original.reward_metrics,
        "data_state": original.data_state,
        "generate_seconds": original.generate_seconds,
        "action_rewards": array(original.action_rewards),
        "row_advantages": None,
        "row_mask": array(original.row_mask),
    }
    (back,) = pending_from_checkpoint({}, [json.loads(json.dumps(record))])
    assert_same_batch(original, back)
