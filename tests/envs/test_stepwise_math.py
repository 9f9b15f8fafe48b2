"""Step-wise math episodes: per-step rewards from a tiny random PRM, the outcome reward at the end."""

import jax
import numpy as np
import pytest
from flax import nnx

from mathrl_jax.data.prompts import format_prompt
from mathrl_jax.data.sources import Problem
from mathrl_jax.envs import StepwiseMathEnv, VectorEnv, run_episodes
from mathrl_jax.models.qwen import QwenForCausalLM
from mathrl_jax.models.tiny import tiny_config, write_tiny_checkpoint
from mathrl_jax.rewards.math_grader import RewardValues
from mathrl_jax.rewards.prm import PRMConfig, ProcessRewardModel

TAG = "@"
CONFIG = PRMConfig(step_tag=TAG, candidate_tokens=("+", "-"), batch_size=2, min_bucket=256, max_length=512)
PROBLEMS = [
    Problem(uid="a", question="What is (2+3)*2?", answer="10"),
    Problem(uid="b", question="What is 9-4?", answer="5"),
]
SOLVES = ["  First, 2 + 3 = 5.  ", "Then 5 * 2 = 10.", "The answer is \\boxed{10}."]  # answers at step 3
RAMBLES = ["9 is odd.", "4 is even.", "Odd minus even is odd.", "Still thinking.", "More.", "Even more."]
VALUES = RewardValues(correct=5.0, incorrect=-5.0, no_answer=-1.0)


SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)


def random_state(config, seed):
    """Random weights with O(1) logits, drawn with NumPy (eager Flax init is slow on a busy CPU)."""
    state = nnx.state(nnx.eval_shape(lambda: QwenForCausalLM(config, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        base = 1.0 if "norm" in jax.tree_util.keystr(path) else 0.0
        return (base + rng.normal(0.0, 0.3, leaf.shape)).astype(leaf.dtype)

    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(state)))
    return state


@pytest.fixture(scope="module")
def prm(tmp_path_factory):
    """A tiny random PRM: the project's tiny Qwen2 checkpoint (ASCII char tokenizer), smaller still."""
    directory = str(tmp_path_factory.mktemp("tiny_prm"))
    write_tiny_checkpoint(
        directory, state=random_state(tiny_config(head_dim=16, **SMALL), seed=3), head_dim=16, **SMALL
    )
    return ProcessRewardModel.from_pretrained(directory, CONFIG)


def script(episodes):
    """Env "a" gets the solution, env "b" rambles without ever answering."""
    return [(SOLVES if e.infos[0]["uid"] == "a" else RAMBLES)[e.num_turns] for e in episodes]


def test_prm_rewards_are_the_prms_step_scores(prm):
    max_steps = 4
    vec = VectorEnv([lambda: StepwiseMathEnv(PROBLEMS, prm=prm, max_steps=max_steps) for _ in range(2)])
    solved, rambled = run_episodes(vec, script, [0, 1], max_turns=10)

    assert solved.terminated and not solved.truncated and solved.num_turns == len(SOLVES)
    assert rambled.truncated and not rambled.terminated and rambled.num_turns == max_steps
    for episode, problem, steps in ((solved, PROBLEMS[0], SOLVES), (rambled, PROBLEMS[1], RAMBLES[:max_steps])):
        # The whole trajectory in one PRM pass: by causality, step t's score is what the env got after step t.
        (full,) = prm.step_scores([problem.question], [[s.strip() for s in steps]])
        np.testing.assert_allclose(episode.rewards, full, rtol=0, atol=1e-5)
        assert [info["prm_score"] for info in episode.infos[1:]] == episode.rewards
        assert np.ptp(episode.rewards) > 1e-6  # the scores tell the steps apart
        prompt = format_prompt(problem.question, "boxed")
        assert episode.observations[-1] == prompt + "".join(s.strip() + "\n\n" for s in steps)
    assert solved.infos[-1]["correct"] and solved.infos[-1]["grade"] == "correct"
    assert rambled.infos[-1]["grade"] == "no_answer"


def test_prm_plus_final_adds_the_outcome_at_the_last_step(prm):
    env = StepwiseMathEnv(PROBLEMS, prm=prm, reward="prm+final", reward_values=VALUES)
    env.reset(seed=0)
    rewards = [env.step(step)[1] for step in SOLVES]
    (full,) = prm.step_scores([PROBLEMS[0].question], [[s.strip() for s in SOLVES]])
    np.testing.assert_allclose(rewards, full + np.array([0.0, 0.0, VALUES.correct]), atol=1e-5)


def test_final_reward_without_a_prm():
    env = StepwiseMathEnv(PROBLEMS, reward_values=VALUES, max_steps=3)
    observation, info = env.reset(seed=0)
    assert observation == format_prompt(PROBLEMS[0].question, "boxed") and info["uid"] == "a"
    results = [env.step(step) for step in ["2+3=5", "5*2=11", "The answer is: 11"]]
    assert [r[1] for r in results] == [0.0, 0.0, VALUES.incorrect]
    assert [r[2] for r in results] == [False, False, True]  # "The answer is: ..." ends the episode
    env.reset(seed=1)
    results = [env.step(step) for step in RAMBLES[:3]]
    assert [r[1] for r in results] == [0.0, 0.0, VALUES.no_answer] and results[-1][3]  # truncated at max_steps
    with pytest.raises(RuntimeError, match="reset"):
        env.step("more")


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="reward='prm' needs a ProcessRewardModel"):
        StepwiseMathEnv(PROBLEMS, reward="prm")
    with pytest.raises(ValueError, match="reward must be one of prm, final, prm\\+final, got 'best'"):
        StepwiseMathEnv(PROBLEMS, reward="best")
    with pytest.raises(ValueError, match="max_steps must be a positive int, got 0"):
        StepwiseMathEnv(PROBLEMS, max_steps=0)
