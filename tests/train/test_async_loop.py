"""The asynchronous generator's batches survive a checkpoint's JSON metadata bit for bit."""

import json

import numpy as np

from mathrl_jax.sampling.base import Rollouts
from mathrl_jax.train.async_loop import collected_from_json, collected_to_json
from mathrl_jax.train.collect import Collected


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


def test_a_batch_round_trips_through_json_bit_for_bit():
    original = awkward_batch()
    back = collected_from_json(json.loads(json.dumps(collected_to_json(original))))
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
