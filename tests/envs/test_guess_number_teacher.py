"""The game's teacher (envs/guess_number_teacher.py): binary search that wins every game in the turn budget, its
slips as stated, its win rate against an exact computation, and its turns as the RL's prompts would show them."""

from __future__ import annotations

import functools
import math
import re

import pytest

from mathrl_jax.envs import GuessTheNumberEnv, guess_number_teacher

ACTION = re.compile(r"^(\d+)-(\d+) \\boxed\{(\d+)\}$")


def parsed(action):
    low, high, guess = map(int, ACTION.match(action).groups())
    return low, high, guess


@pytest.mark.parametrize("low, high", [(1, 20), (1, 100), (5, 6)])
def test_binary_search_wins_every_game_within_log2_turns(low, high):
    turns = math.ceil(math.log2(high - low + 2))  # a midpoint guess leaves at most half the candidates
    episodes = guess_number_teacher.teacher_games(
        range(300), slip_rate=0.0, rng_seed=0, min_number=low, max_number=high, max_turns=turns
    )
    for episode in episodes:
        assert episode.infos[-1]["outcome"] == "success", episode.actions
        for action in episode.actions:
            a, b, guess = parsed(action)
            assert guess == (a + b) // 2


def test_each_action_names_the_candidates_the_hints_leave_and_the_target_is_among_them():
    env_targets = {}
    episodes = guess_number_teacher.teacher_games(range(200), slip_rate=0.5, rng_seed=3, max_turns=20)
    for seed, episode in zip(range(200), episodes):
        env = GuessTheNumberEnv(1, 20, 20)
        env.reset(seed)
        env_targets[seed] = env.target
        low, high = 1, 20
        for k, action in enumerate(episode.actions):
            a, b, guess = parsed(action)
            assert (a, b) == (low, high)  # the candidates as computed here from the hints, independently
            assert low <= env.target <= high and low <= guess <= high
            hint = episode.infos[k + 1]["outcome"]
            if hint == "higher":
                low = guess + 1
            elif hint == "lower":
                high = guess - 1
        assert episode.infos[-1]["outcome"] == "success"  # 20 turns: even linear search gets there


def test_a_slip_guesses_the_smallest_candidate():
    episodes = guess_number_teacher.teacher_games(range(100), slip_rate=1.0, rng_seed=0, max_turns=20)
    for episode in episodes:
        for action in episode.actions:
            low, _, guess = parsed(action)
            assert guess == low


def exact_win_rate(low, high, turns, slip):
    """P(the teacher wins) over a uniform target, by recursion over (candidates, turns left): independent of the
    env and of the teacher's code."""

    @functools.lru_cache(maxsize=None)
    def win(a, b, t, target):
        if t == 0:
            return 0.0
        total = 0.0
        for guess, p in (((a + b) // 2, 1 - slip), (a, slip)):
            if guess == target:
                total += p
            elif guess < target:
                total += p * win(guess + 1, b, t - 1, target)
            else:
                total += p * win(a, guess - 1, t - 1, target)
        return total

    return sum(win(low, high, turns, target) for target in range(low, high + 1)) / (high - low + 1)


@pytest.mark.parametrize("slip", [0.3, 0.7])
def test_the_teachers_win_rate_matches_the_exact_one(slip):
    games = 3000
    episodes = guess_number_teacher.teacher_games(range(games), slip_rate=slip, rng_seed=1, max_turns=5)
    rate = sum(e.infos[-1]["outcome"] == "success" for e in episodes) / games
    expected = exact_win_rate(1, 20, 5, slip)
    assert expected < 0.95  # the slips cost games: room for RL
    assert abs(rate - expected) < 4 * math.sqrt(expected * (1 - expected) / games), (rate, expected)


def test_turn_histories_show_each_turn_what_the_policy_saw():
    (episode,) = guess_number_teacher.teacher_games([7], slip_rate=0.0, rng_seed=0, max_turns=5)
    histories = guess_number_teacher.turn_histories(episode)
    assert [action for _, action in histories] == episode.actions
    for k, (seen, _) in enumerate(histories):
        assert seen.observations == episode.observations[: k + 1] and seen.actions == episode.actions[:k]


def test_a_slip_rate_out_of_range_is_refused():
    with pytest.raises(ValueError, match="1.5"):
        guess_number_teacher.teacher_games([0], slip_rate=1.5, rng_seed=0)
