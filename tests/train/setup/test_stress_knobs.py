"""The testbed's stress knobs (docs/testbed.md): rollout staleness for every single-turn algorithm
(`max_head_offpolicyness`), injected sampler log-prob noise (`sampler_logprob_noise`), and the held-out pool a
generated task draws (`num_eval_problems` never silently cut)."""

import math

import numpy as np
import pytest

from mathrl_jax.errors import TrainingError
from mathrl_jax.sampling.base import Rollouts
from mathrl_jax.train.rollouts import _collect as collect
from mathrl_jax.train.setup import _sections as sections
from mathrl_jax.train.setup import _validation as validation
from tests.train.loop_fixtures import (  # noqa: F401  (the fixture)
    first_char_reward,
    model_dir,
    run_and_record,
    small_config,
)


def test_grpo_at_staleness_two_trains_on_rollouts_two_versions_old(model_dir, tmp_path):  # noqa: F811
    """Before, any algorithm but async_ppo ignored max_head_offpolicyness and trained on fresh rollouts."""
    config = small_config(model_dir, tmp_path / "stale", algorithm_name="grpo", max_head_offpolicyness=2)
    _, history = run_and_record(config)
    assert [m["async/staleness"] for _, m in history] == [min(i - 1, 2) for i, _ in history]
    assert [m["async/policy_version"] for _, m in history] == [max(0, i - 1 - 2) for i, _ in history]
    # "auto" recomputes the old log-probs: the stale sampler's differ from the learner's once the policy moved.
    diffs = [m["rollout/sampler_logprob_diff"] for i, m in history if i > 1]
    assert min(diffs) > 1e-4, diffs


def test_stale_or_noisy_sampler_log_probs_are_not_taken_as_the_trainers():
    base = dict(sampler="jax", tis_cap=None, temperature=1.0, decoupled=False, multi_turn=False)
    assert sections.old_logprobs_from_sampler("auto", **base)
    assert not sections.old_logprobs_from_sampler("auto", **base, stale=True)
    assert not sections.old_logprobs_from_sampler("auto", **base, logprob_noise=0.01)
    # Naive PPO asks for them: clipped around the behaviour policy.
    assert sections.old_logprobs_from_sampler("sampler", **base, stale=True, logprob_noise=0.07)


def _rollouts(lengths):
    return Rollouts(
        prompt_ids=[[1]] * len(lengths),
        completion_ids=[[2] * n for n in lengths],
        logprobs=[np.full(n, -1.0, np.float32) for n in lengths],
        policy_logprobs=[np.full(n, -2.0, np.float32) for n in lengths],
        finish_reasons=["stop"] * len(lengths),
        stop_reasons=[None] * len(lengths),
        prompt_indices=np.arange(len(lengths), dtype=np.int32),
        policy_version=0,
    )


def test_log_prob_noise_has_the_asked_spread_and_one_draw_per_token():
    rollouts = _rollouts([4000, 3000, 0, 5000])
    noisy = collect.with_logprob_noise(rollouts, 0.07, seed=5)
    sampled = np.concatenate([lp - (-1.0) for lp in noisy.logprobs])
    policy = np.concatenate([lp - (-2.0) for lp in noisy.policy_logprobs])
    np.testing.assert_allclose(sampled, policy, atol=1e-6)  # the same disagreement in both reports
    assert abs(sampled.mean()) < 4 * 0.07 / math.sqrt(sampled.size)
    assert abs(sampled.std() - 0.07) < 0.002
    again = collect.with_logprob_noise(rollouts, 0.07, seed=5)
    np.testing.assert_array_equal(np.concatenate(again.logprobs), np.concatenate(noisy.logprobs))
    other = collect.with_logprob_noise(rollouts, 0.07, seed=6)
    assert not np.array_equal(np.concatenate(other.logprobs), np.concatenate(noisy.logprobs))


def test_the_injected_noise_is_what_the_trainer_measures(model_dir, tmp_path):  # noqa: F811
    """With TIS the trainer recomputes the log-probs and compares: the mean |difference| it logs is the noise's
    mean absolute value, sigma * sqrt(2 / pi), not float rounding."""
    sigma = 0.2
    config = small_config(
        model_dir, tmp_path / "noise", algorithm_name="grpo", tis_cap=2.0, sampler_logprob_noise=sigma, num_iterations=3
    )
    _, history = run_and_record(config)
    measured = np.mean([m["rollout/sampler_logprob_diff"] for _, m in history])
    assert abs(measured - sigma * math.sqrt(2 / math.pi)) < 0.04, measured


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"sampler_logprob_noise": 0.07}, "sampler_logprob_noise=0.07 reaches nothing"),
        ({"sampler_logprob_noise": -0.1}, "sampler_logprob_noise=-0.1 is out of range"),
        ({"num_eval_problems": 9}, "num_eval_problems=9 is more than the 8 held-out problems arithmetic.num_eval"),
        (
            {"dataset_name": "countdown", "countdown.num_eval": 4, "num_eval_problems": 5},
            "num_eval_problems=5 is more than the 4 held-out problems countdown.num_eval",
        ),
    ],
)
def test_a_knob_that_would_do_nothing_or_too_little_is_refused(overrides, message, tmp_path):
    config = small_config("unused", tmp_path / "run", **overrides)
    with pytest.raises(TrainingError) as refused:
        validation.validate_settings(config)
    assert message in str(refused.value)


@pytest.mark.parametrize("knob", [{"max_head_offpolicyness": 2}, {"sampler_logprob_noise": 0.01}])
def test_the_knobs_refuse_multi_turn_episodes(knob, tmp_path):
    from mathrl_jax.configs import guess_number_tiny

    config = guess_number_tiny.get_config()
    config.run_dir = str(tmp_path / "run")
    config.update(knob)
    with pytest.raises(TrainingError) as refused:
        validation.validate_settings(config)
    assert "acts on single-turn rollouts" in str(refused.value)


def test_the_noise_reaches_naive_ppos_old_log_probs_and_async_ppos_behaviour(model_dir, tmp_path):  # noqa: F811
    """0.5 nats of noise: naive PPO's ratios against the noisy old log-probs leave the 0.2 clip band on most tokens
    (the clean run's barely do); async_ppo's behaviour weight pi_prox / pi_behaviour has mean E[exp(-e)] =
    exp(sigma^2 / 2) = 1.13 (1 without noise, at staleness 0)."""

    def mean_metric(name, key, **overrides):
        config = small_config(model_dir, tmp_path / name, num_iterations=2, **overrides)
        _, history = run_and_record(config)
        return float(np.mean([m[key] for _, m in history]))

    naive = dict(algorithm_name="grpo", old_logprobs="sampler")
    clean = mean_metric("clean", "train/clip_fraction", **naive)
    noisy = mean_metric("noisy", "train/clip_fraction", sampler_logprob_noise=0.5, **naive)
    assert noisy > clean + 0.1, (clean, noisy)
    weight = mean_metric("async", "train/behaviour_weight_mean", algorithm_name="async_ppo", sampler_logprob_noise=0.5)
    assert abs(weight - math.exp(0.5**2 / 2)) < 0.06, weight
