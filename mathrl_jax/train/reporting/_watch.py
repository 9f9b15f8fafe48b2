"""`TrainingWatch`: a run that trains nothing says so and stops (a `NothingTrainedError`, exit status 2 from
`scripts/train.py`), rather than ending with a summary of success."""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Tuple

from mathrl_jax.errors import TrainingError
from mathrl_jax.sharding import distributed

NOTHING_TRAINED_PATIENCE = 3
"""Iterations in a row that train nothing (every update step skipped as non-finite; or, with reward functions alone,
no response scored) after which a run stops (`TrainingWatch`)."""


class NothingTrainedError(TrainingError):
    """A run that trains nothing: every update step of its iterations skipped for a non-finite loss or gradient, or
    every response left unscored (None) by the reward functions that are its only reward. The message names the
    iterations and the cause; `scripts/train.py` exits with status 2."""


@dataclasses.dataclass
class TrainingWatch:
    """Watches what each iteration trained, so that a run that trains nothing says so and fails instead of ending
    with a summary of success.

    - Every update step of an iteration skipped for a non-finite loss or gradient (`train/skipped_updates` equal to
      `steps`, ppo_epoch x num_mini_batch): `NOTHING_TRAINED_PATIENCE` such iterations in a row, or a run whose
      every iteration was one, is a `NothingTrainedError`. Some steps skipped: one line at the end, with the count.
    - A reward function that scores no response of an iteration (None for each: TRL's "not scored") is said once,
      naming it. Where the reward functions are the only reward (`graded` false), an iteration that none of them
      scored has all-zero rewards and teaches nothing: the same patience, and a run that no function ever scored,
      are a `NothingTrainedError` naming them.

    Steps that train no token on purpose (`skip_zero_advantage`, DAPO's filter) are finite, not skipped: not counted.
    """

    steps: int
    functions: Tuple[str, ...] = ()
    graded: bool = True
    say: Callable[[str], None] = distributed.note
    iterations: int = 0
    skipped: int = 0
    skipped_run: List[int] = dataclasses.field(default_factory=list)  # the iterations in a row that skipped all
    unscored_run: List[int] = dataclasses.field(default_factory=list)  # ... that no reward function scored
    scored: set = dataclasses.field(default_factory=set)
    said: set = dataclasses.field(default_factory=set)

    def iteration(self, iteration: int, metrics: Dict[str, float], last: bool) -> None:
        """Takes the iteration's metrics; raises `NothingTrainedError` when the run trains nothing (before the
        iteration's checkpoint: a rerun does not find a finished run that trained nothing)."""
        self.iterations += 1
        skipped = int(round(metrics.get("train/skipped_updates", 0.0)))
        self.skipped += skipped
        self.skipped_run = self.skipped_run + [iteration] if skipped >= self.steps else []
        if len(self.skipped_run) >= NOTHING_TRAINED_PATIENCE or (last and len(self.skipped_run) == self.iterations):
            first, now = self.skipped_run[0], self.skipped_run[-1]
            span = f"iteration {now}" if first == now else f"iterations {first}-{now}"
            raise NothingTrainedError(
                f"{span}: every update step ({self.steps} per iteration) was skipped for a non-finite loss or "
                "gradient (train/skipped_updates), so the run trains nothing: look for a NaN or inf in the model's "
                "weights, the data or the rewards, or lower --config.lr; stopped before saving this iteration"
            )
        unscored = [name for name in self.functions if f"rollout/function/{name}" not in metrics]
        self.scored.update(name for name in self.functions if name not in unscored)
        for name in unscored:
            if name not in self.said:
                self.said.add(name)
                self.say(
                    f"train.py: warning: reward function {name!r} returned None for every response of iteration "
                    f"{iteration} (None: not scored, adds 0 to the reward)"
                )
        alone = bool(self.functions) and not self.graded and len(unscored) == len(self.functions)
        self.unscored_run = self.unscored_run + [iteration] if alone else []
        if len(self.unscored_run) >= NOTHING_TRAINED_PATIENCE or (last and len(self.unscored_run) == self.iterations):
            first, now = self.unscored_run[0], self.unscored_run[-1]
            span = f"iteration {now}" if first == now else f"iterations {first}-{now}"
            names = ", ".join(repr(name) for name in self.functions)
            raise NothingTrainedError(
                f"{span}: the reward function{'s' * (len(self.functions) > 1)} {names}, the run's only reward, "
                "returned None for every response (not scored), so every reward is 0 and the run trains nothing: "
                "return a number for the responses they score; stopped before saving this iteration"
            )

    def finish(self) -> None:
        """One line for the update steps skipped over the run, if any."""
        if self.skipped:
            self.say(
                f"train.py: warning: {self.skipped} of {self.steps * self.iterations} update steps of this run were "
                "skipped for a non-finite loss or gradient (train/skipped_updates)"
            )
