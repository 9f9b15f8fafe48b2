"""GuessTheNumber: GEM's multi-turn game (axon-rl/gem `gem/envs/textarena/guess_the_number.py`).

The env draws a number in [min_number, max_number]; each turn the policy guesses
with a number in `\\boxed{}` (the last box counts) and is told whether the target
is higher or lower. Rewards are GEM's `TextArenaGameReward` (gem/utils/constants.py):

| event                                             | reward                            | ends                  |
|---------------------------------------------------|-----------------------------------|-----------------------|
| correct guess                                     | 1.0 (`success_reward`)            | terminated            |
| wrong guess, in range, new                        | 0.0 (`internal_step_reward`)      |                       |
| out of range, or guessed before                   | -0.05 (`invalid_action_reward`)   |                       |
| no `\\boxed{}` integer (format error)             | -0.1 (`format_error_reward`)      | terminated (1)        |
| last turn (`turn == max_turns`), guess g in range | 1 - abs(g - target) / (max - min) | terminated, truncated |
| last turn, out-of-range guess                     | -0.05                             | terminated, truncated |

(1) and truncated too when it is the last turn. The last-turn rows take precedence
(GEM checks the turn count first): on the last turn even a correct guess is scored
by the partial-credit formula (which gives it 1.0).

Defaults are GEM's: 1..20 within 20 turns. With `min_number=None` or
`max_number=None` every reset draws the range as GEM does: 1..U(2, 100) with
ceil(sqrt(max - min)) + 1 turns.

One departure: GEM's check `if not player_guess` takes a guess of 0 for a format
error; here 0 is a number like any other (out of range unless the range holds it).
"""

from __future__ import annotations

import math
import random
from typing import Any

from mathrl_jax.envs.base import TERMINAL_STATE, Env, StepResult, check_action, check_seed
from mathrl_jax.rewards.extraction import extract_boxed

SUCCESS_REWARD = 1.0
INTERNAL_STEP_REWARD = 0.0
INVALID_ACTION_REWARD = -0.05
FORMAT_ERROR_REWARD = -0.1


def parse_guess(action: str) -> int | None:
    """The integer in the action's last `\\boxed{}`, or None (GEM: `int(extract_last_boxed_answer(action))`)."""
    boxed = extract_boxed(action)
    if boxed is None:
        return None
    try:
        return int(boxed.strip())
    except ValueError:
        return None


class GuessTheNumberEnv(Env):
    """GEM's GuessTheNumber; see the module docstring for the rewards.

    Attributes (after `reset`):
      target: the number to guess.
      turn: steps taken in this episode.
    """

    def __init__(self, min_number: int | None = 1, max_number: int | None = 20, max_turns: int = 20):
        self.is_random = min_number is None or max_number is None
        if not self.is_random:
            for name, value in (("min_number", min_number), ("max_number", max_number)):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"{name} must be an int or None, got {value!r}")
            if min_number >= max_number:
                raise ValueError(f"min_number ({min_number}) must be < max_number ({max_number})")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
        self.min_number, self.max_number, self.max_turns = min_number, max_number, max_turns
        self._rng = random.Random()
        self.target: int | None = None
        self.turn = 0
        self.previous_guesses: set[int] = set()
        self._done = True

    def instructions(self) -> str:
        low, high, turns = self.min_number, self.max_number, self.max_turns
        return (
            "You are playing Guess The Number.\n"
            f"Guess the number between {low} and {high} (inclusive) within {turns} turns.\n"
            "After each guess you are told whether the target number is higher or lower than your guess.\n"
            "Write your guess inside \\boxed{}, for example \\boxed{" + str((low + high) // 2) + "}; only the "
            "number in the last \\boxed{} counts.\n"
            "Your previous guesses and the hints are shown as the game goes on.\n"
            "Enter your first guess."
        )

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        seed = check_seed(seed)
        if seed is not None:
            self._rng = random.Random(seed)
        if self.is_random:
            self.min_number = 1
            self.max_number = self._rng.randint(self.min_number + 1, 100)
            self.max_turns = math.ceil(math.sqrt(self.max_number - self.min_number)) + 1
        self.target = self._rng.randint(self.min_number, self.max_number)
        self.turn = 0
        self.previous_guesses = set()
        self._done = False
        info = {"min_number": self.min_number, "max_number": self.max_number, "max_turns": self.max_turns}
        return self.instructions(), info

    def step(self, action: str) -> StepResult:
        check_action(action)
        if self._done:
            raise RuntimeError("GuessTheNumberEnv.step called without a running episode; call reset() first")
        self.turn += 1
        last_turn = self.turn >= self.max_turns
        guess = parse_guess(action)
        info: dict[str, Any] = {"guess": guess, "turn": self.turn}
        if guess is None:
            self._done = True
            info["outcome"] = "format_error"
            return TERMINAL_STATE, FORMAT_ERROR_REWARD, True, last_turn, info
        in_range = self.min_number <= guess <= self.max_number
        if last_turn:
            self._done = True
            if in_range:
                reward = 1.0 - abs(guess - self.target) / (self.max_number - self.min_number)
                info["outcome"] = "success" if guess == self.target else "partial_credit"
            else:
                reward = INVALID_ACTION_REWARD
                info["outcome"] = "invalid"
            return TERMINAL_STATE, reward, True, True, info
        if not in_range:
            observation = f"At turn {self.turn}, you guessed {guess}, which is outside the range."
            reward, terminated, info["outcome"] = INVALID_ACTION_REWARD, False, "invalid"
        elif guess in self.previous_guesses:
            observation = f"At turn {self.turn}, you guessed {guess}, which you already guessed."
            reward, terminated, info["outcome"] = INVALID_ACTION_REWARD, False, "repeated"
        else:
            self.previous_guesses.add(guess)
            if guess == self.target:
                observation = f"Congratulations! You guessed the number {self.target} in {self.turn} turns."
                reward, terminated, info["outcome"] = SUCCESS_REWARD, True, "success"
            else:
                hint = "lower" if guess > self.target else "higher"
                observation = f"At turn {self.turn}, you guessed {guess}; the target number is {hint} than {guess}."
                reward, terminated, info["outcome"] = INTERNAL_STEP_REWARD, False, hint
        if terminated:
            self._done = True
        else:
            observation += "\nEnter your next guess."
        return observation, reward, terminated, False, info
