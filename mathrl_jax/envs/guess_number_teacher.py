"""A teacher for GuessTheNumber: binary search, written out, with slips (the multi-turn warm-start's games).

The offline default's warm-start imitates an arithmetic teacher that drops carries; this is the game's
counterpart, so that a tiny model starts RL able to play, with room to play better. Each action names the
candidates left and a guess in them:

    1-20 \\boxed{10}        (turn 1: the range from the instructions, its midpoint)
    11-20 \\boxed{15}       (after "higher than 10": the range is cut above the guess)

so a policy needs only its last action and the hint after it to play the next turn (it can play with a short
context window). With probability `slip_rate` a turn's guess is the smallest candidate instead of the midpoint
(a linear search's step): still a legal, new guess, but within GEM's default turn budget of 5 turns for 1..20 the
teacher then wins less often (slip_rate 0.7: about 45% of games; binary search: every game). RL has to find the
midpoint and keep it. Standard library only, no JAX (as the envs).
"""

from __future__ import annotations

import random
from typing import List, Sequence, Tuple

from mathrl_jax.envs.base import Episode, VectorEnv, run_episodes
from mathrl_jax.envs.guess_number import GuessTheNumberEnv


def teacher_action(low: int, high: int, guess: int) -> str:
    """The teacher's action text: the candidates left, then the guess in `\\boxed{}`."""
    return f"{low}-{high} \\boxed{{{guess}}}"


def candidates(episode: Episode) -> Tuple[int, int]:
    """The smallest and largest number not ruled out by the episode's hints so far (its reset info gives the range;
    each "higher" / "lower" step info cuts it at the guess)."""
    low, high = episode.infos[0]["min_number"], episode.infos[0]["max_number"]
    for info in episode.infos[1:]:
        if info.get("outcome") == "higher":
            low = max(low, info["guess"] + 1)
        elif info.get("outcome") == "lower":
            high = min(high, info["guess"] - 1)
    return low, high


def teacher_games(
    seeds: Sequence[int],
    *,
    slip_rate: float,
    rng_seed: int,
    min_number: int = 1,
    max_number: int = 20,
    max_turns: int = 20,
) -> List[Episode]:
    """One game per seed (the env's target drawn from it), played by the teacher to its end."""
    if not 0.0 <= slip_rate <= 1.0:
        raise ValueError(f"slip_rate={slip_rate}: expected a probability in [0, 1]")
    rng = random.Random(rng_seed)

    def policy(episodes: List[Episode]) -> List[str]:
        actions = []
        for episode in episodes:
            low, high = candidates(episode)
            guess = low if rng.random() < slip_rate else (low + high) // 2
            actions.append(teacher_action(low, high, guess))
        return actions

    vector_env = VectorEnv([lambda: GuessTheNumberEnv(min_number, max_number, max_turns) for _ in seeds])
    return run_episodes(vector_env, policy, list(seeds), max_turns)


def turn_histories(episode: Episode) -> List[Tuple[Episode, str]]:
    """(the episode as the policy saw it before turn k, the action of turn k) for every turn k."""
    return [
        (Episode(observations=episode.observations[: k + 1], actions=episode.actions[:k]), episode.actions[k])
        for k in range(len(episode.actions))
    ]
