"""Single-turn math episodes graded by math-verify, and the vectorised runner around them."""

import numpy as np
import pytest

from mathrl_jax.data.prompts import format_prompt
from mathrl_jax.data.sources import Problem
from mathrl_jax.envs import TERMINAL_STATE, Env, Episode, GuessTheNumberEnv, MathEnv, VectorEnv, run_episodes
from mathrl_jax.rewards.math_grader import RewardValues

PROBLEMS = [
    Problem(uid="p0", question="What is 3 + 4?", answer="7"),
    Problem(uid="p1", question="What is half of one?", answer="\\frac{1}{2}"),
    Problem(uid="p2", question="Solve x^2 = 9 for x > 0.", answer="3"),
    Problem(uid="p3", question="What is 6 * 7?", answer="42"),
]
VALUES = RewardValues(correct=5.0, incorrect=-5.0, no_answer=-2.0, format_reward=0.5)
# What the scripted policy answers for each problem, and the reward that must follow:
# a right boxed answer (in another form for p1) is correct + format, a wrong boxed one
# incorrect + format, prose without a box no_answer.
SCRIPT = {
    "p0": ("So the sum is \\boxed{7}.", 5.0 + 0.5),
    "p1": ("Half of one is \\boxed{0.5}.", 5.0 + 0.5),
    "p2": ("The root is \\boxed{-3}.", -5.0 + 0.5),
    "p3": ("I am not sure.", -2.0),
}


def scripted(episodes):
    return [SCRIPT[episode.infos[0]["uid"]][0] for episode in episodes]


def test_scripted_answers_get_the_graded_rewards():
    vec = VectorEnv([lambda: MathEnv(PROBLEMS, reward_values=VALUES) for _ in range(6)])
    seeds = [0, 1, 2, 3, 4, 6]
    episodes = run_episodes(vec, scripted, seeds, max_turns=3)
    for seed, episode in zip(seeds, episodes):
        problem = PROBLEMS[seed % len(PROBLEMS)]  # reset(seed) serves problems[seed % n]
        assert episode.infos[0]["uid"] == problem.uid
        assert episode.observations == [format_prompt(problem.question, "boxed"), TERMINAL_STATE]
        assert episode.rewards == [SCRIPT[problem.uid][1]]
        assert episode.terminated and not episode.truncated and episode.num_turns == 1
        assert episode.infos[1]["correct"] == (SCRIPT[problem.uid][1] > 0)


def test_reset_serves_explicit_seeded_and_sequential_problems():
    env = MathEnv(PROBLEMS, template="plain")
    assert [env.reset()[1]["uid"] for _ in range(5)] == ["p0", "p1", "p2", "p3", "p0"]
    assert env.reset(seed=6)[1]["uid"] == "p2"
    extra = Problem(uid="x", question="1+1?", answer="2")
    observation, info = env.reset(problem=extra)
    assert (observation, info["uid"]) == ("1+1?", "x")
    _, reward, terminated, truncated, info = env.step("\\boxed{2}")
    assert (reward, terminated, truncated, info["grade"]) == (1.0, True, False, "correct")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("\\boxed{2}")


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="non-empty sequence of Problem"):
        MathEnv([])
    with pytest.raises(TypeError, match=r"problems\[1\] must be a data.Problem"):
        MathEnv([PROBLEMS[0], {"question": "q"}])
    with pytest.raises(ValueError, match="unknown prompt template 'nope'"):
        MathEnv(PROBLEMS, template="nope")
    with pytest.raises(TypeError, match="an action must be a str"):
        env = MathEnv(PROBLEMS)
        env.reset(seed=0)
        env.step(None)


class Countdown(Env):
    """Ends after `length` steps; reward = the step's index; records what it was given."""

    def __init__(self, length):
        self.length, self.t, self.actions = length, 0, []

    def reset(self, seed=None):
        self.t, self.actions = 0, []
        return f"start {seed}", {"seed": seed}

    def step(self, action):
        self.actions.append(action)
        self.t += 1
        return f"t={self.t}", float(self.t), self.t >= self.length, False, {}


def test_vector_env_leaves_finished_envs_alone():
    vec = VectorEnv([lambda n=n: Countdown(n) for n in (1, 3, 2)])
    observations, infos = vec.reset([10, 11, 12])
    assert observations == ["start 10", "start 11", "start 12"] and [i["seed"] for i in infos] == [10, 11, 12]
    obs, rewards, terminated, truncated, _ = vec.step(["a", "a", "a"])
    np.testing.assert_array_equal(terminated, [True, False, False])
    with pytest.raises(ValueError, match="env 0 has no running episode"):
        vec.step(["b", "b", "b"])
    with pytest.raises(ValueError, match="env 1 is running and needs an action"):
        vec.step([None, None, "b"])
    obs, rewards, terminated, truncated, _ = vec.step([None, "b", "b"])
    assert obs[0] == "" and rewards.dtype == np.float64
    np.testing.assert_array_equal(rewards, [0.0, 2.0, 2.0])
    np.testing.assert_array_equal(terminated, [True, False, True])  # a finished env stays terminated
    assert [env.actions for env in vec.envs] == [["a"], ["a", "b"], ["a", "b"]]
    with pytest.raises(ValueError, match="actions has 2 entries for 3 envs"):
        vec.step([None, "c"])


def test_run_episodes_gives_the_policy_the_running_histories_and_truncates_at_max_turns():
    seen = []

    def policy(episodes):
        assert all(isinstance(e, Episode) and not e.done for e in episodes)
        seen.append([len(e.actions) for e in episodes])
        return [f"a{len(e.actions)}" for e in episodes]

    vec = VectorEnv([lambda n=n: Countdown(n) for n in (1, 5, 2)], max_workers=2)
    episodes = run_episodes(vec, policy, [None, None, None], max_turns=3)
    assert seen == [[0, 0, 0], [1, 1], [2]]
    assert [e.num_turns for e in episodes] == [1, 3, 2]
    assert [(e.terminated, e.truncated) for e in episodes] == [(True, False), (False, True), (True, False)]
    assert episodes[1].observations == ["start None", "t=1", "t=2", "t=3"]
    assert episodes[1].rewards == [1.0, 2.0, 3.0] and episodes[1].total_reward == 6.0
    assert len(episodes[1].infos) == 4


def test_mixed_env_classes_step_together_in_threads():
    vec = VectorEnv([lambda: Countdown(2), GuessTheNumberEnv], max_workers=2)
    episodes = run_episodes(vec, lambda eps: ["\\boxed{99}"] * len(eps), [0, 0], max_turns=2)
    assert episodes[0].rewards == [1.0, 2.0]
    assert episodes[1].rewards == [-0.05, -0.05] and episodes[1].truncated
