"""The batch step between rollouts and the update (`mathrl_jax.train.batch`, and the settings it reads from `sections`):
the rewards, advantages and old log-probs it prepares equal their reference computations, and its update plan trains
exactly the rows that carry signal."""

import dataclasses

import numpy as np
import pytest

from mathrl_jax.train.batch import _advantages as advantages_lib
from mathrl_jax.train.batch import _prepare as batch
from mathrl_jax.train.batch import control_rewards, shuffled_rewards
from mathrl_jax.train.rollouts import _collect as collect
from mathrl_jax.train.setup import _build as build
from mathrl_jax.train.setup import _sections as sections
from tests.train.loop_fixtures import model_dir, small_config  # noqa: F401  (the fixture)


def test_shuffled_rewards_are_a_seeded_permutation_within_the_batch():
    scores = np.arange(64, dtype=np.float32)
    shuffled = shuffled_rewards(scores, seed=0, iteration=3)
    np.testing.assert_array_equal(np.sort(shuffled), scores)  # the same rewards, so the same distribution
    assert np.mean(shuffled == scores) < 0.2  # ... on other responses
    np.testing.assert_array_equal(shuffled, shuffled_rewards(scores, seed=0, iteration=3))
    assert not np.array_equal(shuffled, shuffled_rewards(scores, seed=0, iteration=4))
    assert not np.array_equal(shuffled, shuffled_rewards(scores, seed=1, iteration=3))


@pytest.mark.parametrize("temperature, expected", [(1.0, True), (0.7, False)])
def test_old_logprobs_auto_takes_the_samplers_only_where_they_are_the_trainers(
    temperature,
    expected,
    model_dir,  # noqa: F811
    tmp_path,
):
    config = small_config(model_dir, tmp_path / "run", temperature=temperature)
    assert sections.uses_sampler_logprobs(config) is expected
    for overrides in ({"algorithm_name": "async_ppo"}, {"sampler": "vllm"}, {"old_logprobs": "trainer"}):
        assert not sections.uses_sampler_logprobs(small_config(model_dir, tmp_path / "run", **overrides))
    assert sections.uses_sampler_logprobs(small_config(model_dir, tmp_path / "run", old_logprobs="sampler"))
    # A LoRA policy merged into bfloat16 kernels is rounded as a whole: not the trainer's numbers, so recomputed
    lora = {"lora.rank": 4, "temperature": temperature}
    merged_bf16 = small_config(model_dir, tmp_path / "run", dtype="bfloat16", **lora)
    assert not sections.uses_sampler_logprobs(merged_bf16)
    for overrides in ({"dtype": "float32"}, {"dtype": "bfloat16", "jax_sampler.lora_sync": "adapter"}):
        config = small_config(model_dir, tmp_path / "run", **lora, **overrides)
        assert sections.uses_sampler_logprobs(config) is expected


def test_the_samplers_old_logprobs_are_the_trainers_recomputed_ones(model_dir, tmp_path):  # noqa: F811
    """The forward pass `old_logprobs="auto"` skips gives what the sampler reported: the same update follows."""
    config = small_config(model_dir, tmp_path / "run", num_iterations=1, old_logprobs="trainer")
    run = build.build_run(config)
    try:
        rollouts, _, rewarded = collect.collect(run.rollouts, 1)
        scores = rewarded.scores
        recomputed, metrics, _ = batch.prepare_batch(run.batches, run.state, rollouts, scores)
        run.batches.settings = dataclasses.replace(run.batches.settings, old_logprobs_from_sampler=True)
        reported, _, _ = batch.prepare_batch(run.batches, run.state, rollouts, scores)
    finally:
        run.rollouts.grader.close()
        run.checkpointer.close()
        run.logger.close()
    mask = np.asarray(recomputed["response_mask"]) > 0
    old, new = np.asarray(recomputed["old_logprobs"]), np.asarray(reported["old_logprobs"])
    assert mask.sum() > 0 and np.all(old[mask] < 0)  # real log-probs where the completions are
    np.testing.assert_allclose(new, old, atol=1e-5)
    assert np.all(new[~mask] == 0) and metrics["rollout/sampler_logprob_diff"] < 1e-5
    for key in recomputed:
        if key not in ("old_logprobs", batch.update.PACKED):
            np.testing.assert_allclose(np.asarray(reported[key]), np.asarray(recomputed[key]), atol=1e-5, err_msg=key)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({}, True),
        ({"algorithm_name": "async_ppo"}, True),
        ({"algorithm_name": "reinforce_rebn"}, True),
        ({"skip_zero_advantage": False}, False),
        ({"kl_coef": 0.01}, False),
        ({"entropy_coef": 0.01}, False),
        ({"algorithm_name": "ppo"}, False),  # the critic trains on every row
        ({"algorithm_name": "tppo", "advantage_whitening": "openr"}, False),
    ],
)
def test_zero_advantage_rows_are_left_out_only_where_they_train_nothing(overrides, expected, model_dir, tmp_path):  # noqa: F811
    assert (
        sections.update_config(small_config(model_dir, tmp_path / "run", **overrides)).skip_zero_advantage is expected
    )


def test_an_iterations_update_plan_leaves_out_the_groups_that_earned_one_reward(model_dir, tmp_path):  # noqa: F811
    config = small_config(model_dir, tmp_path / "run", num_iterations=1)
    run = build.build_run(config)
    try:
        rollouts, _, rewarded = collect.collect(run.rollouts, 1)
        scores = rewarded.scores
        scores = np.where(rollouts.prompt_indices % 2 == 0, 1.0, scores).astype(np.float32)  # even groups all right
        scores[rollouts.prompt_indices == 1] = [1.0, 0.0, 0.0, 0.0]  # one group that learns
        prepared, _, _ = batch.prepare_batch(run.batches, run.state, rollouts, scores)
    finally:
        run.rollouts.grader.close()
        run.checkpointer.close()
        run.logger.close()
    trained = set(np.asarray(prepared[batch.update.PACKED]["rows"]).ravel().tolist()) - {len(rollouts)}
    advantages = np.asarray(prepared["advantages"])
    assert trained == set(np.flatnonzero((advantages != 0).any(axis=1)).tolist())
    assert trained >= set(np.flatnonzero(rollouts.prompt_indices == 1).tolist())
    assert not trained & set(np.flatnonzero(rollouts.prompt_indices % 2 == 0).tolist())


@pytest.mark.parametrize("algorithm_name", ["grpo", "rloo"])
def test_advantages_from_scores_are_made_on_the_host_and_nothing_comes_back(
    algorithm_name,
    model_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """The default GRPO batch (the sampler's old log-probs, packing, rows of zero advantage left out) fetches
    nothing from the device: its advantages are made on the host, the device's numbers bit for bit, and the update's
    plan reads them there. (They were made on the device and fetched back for the plan.)"""
    import jax.numpy as jnp

    config = small_config(model_dir, tmp_path / "run", num_iterations=1, algorithm_name=algorithm_name)
    run = build.build_run(config)
    fetched = []
    fetch = batch.distributed.fetch
    monkeypatch.setattr(batch.distributed, "fetch", lambda tree: fetched.append(sorted(tree)) or fetch(tree))
    try:
        rollouts, _, rewarded = collect.collect(run.rollouts, 1)
        scores = rewarded.scores
        prepared, _, floors = batch.prepare_batch(run.batches, run.state, rollouts, scores)
    finally:
        run.rollouts.grader.close()
        run.checkpointer.close()
        run.logger.close()
    assert batch.update.PACKED in prepared and fetched == []
    on_device = advantages_lib.compute_advantages(
        algorithm_name,
        {"response_mask": jnp.asarray(rollouts.to_batch(0, max_length=floors["width"])["response_mask"])},
        jnp.asarray(scores),
        group_ids=jnp.asarray(rollouts.prompt_indices),
        num_groups=int(rollouts.prompt_indices.max()) + 1,
    )
    np.testing.assert_array_equal(np.asarray(prepared["advantages"]), np.asarray(on_device["advantages"]))
    np.testing.assert_array_equal(np.asarray(prepared["response_mask"]), np.asarray(on_device["response_mask"]))
    assert floors["width"] == prepared["input_ids"].shape[1]  # the floors returned are the batch's shapes


def test_rloo_and_reinforce_pp_advantages_are_verls_formulas():
    """The two estimators the record adds, through the loop's dispatch, against the formulas written out here
    (verl `compute_rloo_outcome_advantage`, `compute_reinforce_plus_plus_baseline_outcome_advantage`)."""
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 2, 12).astype(np.float32) + rng.normal(0, 0.1, 12).astype(np.float32)
    group_ids = np.repeat(np.arange(3), 4)
    mask = (np.arange(6)[None, :] < rng.integers(1, 7, 12)[:, None]).astype(np.float32)
    batch = {"response_mask": mask}
    means = np.array([scores[group_ids == g].mean() for g in group_ids])
    rloo = advantages_lib.compute_advantages("rloo", batch, scores, group_ids=group_ids, num_groups=3)["advantages"]
    expected = (scores - (means * 4 - scores) / 3)[:, None] * mask  # s_i minus the mean of the other three
    np.testing.assert_allclose(np.asarray(rloo), expected, atol=1e-5)
    pp = advantages_lib.compute_advantages("reinforce_pp", batch, scores, group_ids=group_ids, num_groups=3)[
        "advantages"
    ]
    centred = (scores - means)[:, None] * mask
    token_mean = centred.sum() / mask.sum()
    token_var = (((centred - token_mean) * mask) ** 2).sum() / (mask.sum() - 1)  # unbiased, as verl's masked_whiten
    expected = (centred - token_mean) / np.sqrt(token_var + 1e-8) * mask
    np.testing.assert_allclose(np.asarray(pp) * mask, expected, atol=1e-4)


def test_dapo_counts_the_verifiers_verdicts_not_the_scores():
    """With reward functions added to the verifier's score, a wrong response can score as high as a right one:
    DAPO's filter counts the grader's verdicts. Before, it rebuilt success from the scores (score >= correct)."""
    from types import SimpleNamespace

    dapo = batch.DapoSettings(max_new_tokens=8, correct_score=1.0)
    rollouts = SimpleNamespace(completion_lengths=np.full(4, 3), prompt_indices=np.array([0, 0, 1, 1]))
    scores = np.array([1.0, 1.2, 1.5, 0.0], np.float32)  # group 0: all score >= 1; row 1 was wrong (+ a bonus)
    verdicts = np.array([True, False, True, False])
    _, kept, _ = batch.dapo_shaping(dapo, rollouts, scores, verdicts)
    np.testing.assert_array_equal(kept, [1, 1, 1, 1])  # each group half right: both kept
    _, by_score, _ = batch.dapo_shaping(dapo, rollouts, scores)  # no verdicts (a custom reward_fn)
    np.testing.assert_array_equal(by_score, [0, 0, 1, 1])  # group 0 looks all right by its scores


def test_the_controls_verdicts_and_step_rewards_move_with_its_scores():
    """`shuffle_rewards` (the control) carries no information about which response earned what: DAPO's verdicts
    and a PRM's step scores are shuffled with the scores, by the same permutation (each score keeps its verdict
    and its steps). Before, the verdicts reached DAPO's filter unshuffled, and a PRM run had no control."""
    scores = np.arange(16, dtype=np.float32)
    steps = np.stack([scores, -scores], axis=1)
    shuffled, moved, moved_steps = control_rewards(scores, scores % 3 == 0, 0, 5, steps)
    assert not np.array_equal(shuffled, scores)
    np.testing.assert_array_equal(moved, shuffled % 3 == 0)
    np.testing.assert_array_equal(moved_steps, np.stack([shuffled, -shuffled], axis=1))
    assert control_rewards(scores, None, 0, 5)[1:] == (None, None)


def test_mask_truncated_completions_zeroes_cut_rows_after_their_group_statistics():
    """TRL's mask_truncated_completions: the advantages are made with every completion in its group (mean and
    unbiased std, eps 1e-6, computed here in NumPy), then the rows cut at max_new_tokens (finish reason "length")
    leave the loss: their response mask and advantages are 0, the others' untouched. Off, every row trains."""
    from mathrl_jax.train import algorithms
    from mathrl_jax.train.batch import BatchSettings

    scores = np.asarray([1.0, 0.0, 0.0, 1.0, 2.0, 0.5], np.float32)
    groups = np.asarray([0, 0, 0, 1, 1, 1], np.int32)
    reasons = ["stop", "length", "stop", "length", "length", "stop"]
    mask = np.zeros((6, 5), np.float32)
    for row, length in enumerate([2, 5, 3, 5, 5, 1]):
        mask[row, :length] = 1.0
    rollouts = type("Rollouts", (), {"finish_reasons": reasons, "__len__": lambda self: len(reasons)})()
    settings = BatchSettings(algorithm=algorithms.algorithm("grpo"), max_length=8, mask_truncated_completions=True)
    trains = batch.rows_that_train(settings, rollouts)
    np.testing.assert_array_equal(trains, [1, 0, 1, 0, 0, 1])
    made = advantages_lib.host_score_advantages(
        "grpo", mask, scores, group_ids=groups, num_groups=2, row_mask=np.ones(6, np.float32)
    )
    out = batch.without_truncated(made, trains)
    want = np.zeros(6)
    for g in (0, 1):
        s = scores[groups == g].astype(np.float64)
        want[groups == g] = (s - s.mean()) / (s.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(out["advantages"], want[:, None] * mask * trains[:, None], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["response_mask"], mask * trains[:, None])
    off = dataclasses.replace(settings, mask_truncated_completions=False)
    np.testing.assert_array_equal(batch.rows_that_train(off, rollouts), 1.0)
