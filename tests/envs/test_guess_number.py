"""GuessTheNumber played by scripted policies reaches GEM's rewards."""

import math
import re

import pytest

from mathrl_jax.envs import TERMINAL_STATE, GuessTheNumberEnv, VectorEnv, run_episodes
from mathrl_jax.envs.guess_number import (
    FORMAT_ERROR_REWARD,
    INTERNAL_STEP_REWARD,
    INVALID_ACTION_REWARD,
    SUCCESS_REWARD,
    parse_guess,
)


class BinarySearch:
    """Keeps [low, high] per episode from the hints in the observations; guesses the middle."""

    def __init__(self, low=1, high=20):
        self.low, self.high = low, high

    def __call__(self, episodes):
        actions = []
        for episode in episodes:
            low, high = self.low, self.high
            for guess, observation in zip(_guesses(episode.actions), episode.observations[1:]):
                if "higher" in observation:
                    low = guess + 1
                elif "lower" in observation:
                    high = guess - 1
            actions.append(f"The range is [{low}, {high}], so I guess \\boxed{{{(low + high) // 2}}}.")
        return actions


def _guesses(actions):
    return [int(re.findall(r"\\boxed\{(-?\d+)\}", a)[-1]) for a in actions]


def test_binary_search_wins_every_game_with_gem_rewards():
    seeds = list(range(12))
    vec = VectorEnv([GuessTheNumberEnv for _ in seeds])
    episodes = run_episodes(vec, BinarySearch(), seeds, max_turns=20)
    targets = [env.target for env in vec.envs]
    assert len(set(targets)) > 3  # the seeds draw different numbers
    for episode, target in zip(episodes, targets):
        assert episode.terminated and not episode.truncated
        assert _guesses(episode.actions)[-1] == target
        assert episode.rewards == [INTERNAL_STEP_REWARD] * (episode.num_turns - 1) + [SUCCESS_REWARD]
        assert episode.num_turns <= math.ceil(math.log2(20)) + 1
        assert "Congratulations" in episode.observations[-1]
        for observation, guess in zip(episode.observations[1:-1], _guesses(episode.actions)):
            assert ("higher" if guess < target else "lower") in observation


def test_same_seed_same_game_and_instructions_describe_the_game():
    env_a, env_b = GuessTheNumberEnv(), GuessTheNumberEnv()
    obs_a, info = env_a.reset(seed=7)
    env_b.reset(seed=7)
    assert env_a.target == env_b.target and 1 <= env_a.target <= 20
    assert "between 1 and 20" in obs_a and "within 20 turns" in obs_a and "\\boxed{" in obs_a
    assert info == {"min_number": 1, "max_number": 20, "max_turns": 20}


def test_invalid_repeated_and_format_error_actions():
    env = GuessTheNumberEnv()
    env.reset(seed=3)
    wrong = 1 if env.target != 1 else 2
    obs, reward, term, trunc, _ = env.step("\\boxed{0}")  # below the range
    assert (reward, term, trunc) == (INVALID_ACTION_REWARD, False, False) and "outside the range" in obs
    obs, reward, term, trunc, _ = env.step(f"\\boxed{{{wrong}}}")
    assert (reward, term) == (INTERNAL_STEP_REWARD, False)
    obs, reward, term, trunc, info = env.step(f"again \\boxed{{{wrong}}}")
    assert (reward, term, info["outcome"]) == (INVALID_ACTION_REWARD, False, "repeated")
    obs, reward, term, trunc, info = env.step("I think it is 12")  # no box
    assert (obs, reward, term, trunc, info["outcome"]) == (
        TERMINAL_STATE,
        FORMAT_ERROR_REWARD,
        True,
        False,
        "format_error",
    )
    with pytest.raises(RuntimeError, match="reset"):
        env.step("\\boxed{5}")


@pytest.mark.parametrize("offset", [0, 3, -5])
def test_last_turn_gives_partial_credit(offset):
    env = GuessTheNumberEnv(min_number=1, max_number=20, max_turns=2)
    env.reset(seed=11)
    target = env.target
    first = 20 if target != 20 else 19
    _, reward, term, trunc, _ = env.step(f"\\boxed{{{first}}}")
    assert (reward, term, trunc) == (INTERNAL_STEP_REWARD, False, False)
    guess = min(max(target + offset, 1), 20)
    _, reward, term, trunc, info = env.step(f"\\boxed{{{guess}}}")
    assert (term, trunc) == (True, True)
    assert reward == pytest.approx(1 - abs(guess - target) / 19)


def test_random_range_mode_draws_range_and_turns_as_gem():
    env = GuessTheNumberEnv(min_number=None, max_number=None)
    for seed in range(5):
        _, info = env.reset(seed=seed)
        assert info["min_number"] == 1 and 2 <= info["max_number"] <= 100
        assert info["max_turns"] == math.ceil(math.sqrt(info["max_number"] - 1)) + 1
        assert 1 <= env.target <= info["max_number"]


def test_parse_guess_and_bad_arguments():
    assert parse_guess("first \\boxed{3} then \\boxed{ 17 }") == 17
    assert parse_guess("\\boxed{3.5}") is None and parse_guess("17") is None
    with pytest.raises(ValueError, match="min_number \\(5\\) must be < max_number \\(5\\)"):
        GuessTheNumberEnv(5, 5)
    with pytest.raises(ValueError, match="max_turns must be a positive int, got 0"):
        GuessTheNumberEnv(max_turns=0)
    with pytest.raises(ValueError, match="seed must be None or a non-negative int, got -1"):
        GuessTheNumberEnv().reset(seed=-1)
