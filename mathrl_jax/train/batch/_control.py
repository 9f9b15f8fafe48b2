"""The control run's rewards: the batch's own, each given to another response by one seeded permutation."""

from __future__ import annotations

from typing import Optional

import numpy as np


def shuffled_rewards(scores: np.ndarray, seed: int, iteration: int) -> np.ndarray:
    """The control run's rewards: the batch's own `[N]` scores in a random order (a function of seed and
    iteration, so a resumed control shuffles as an uninterrupted one).

    Same reward distribution, no information about which response earned which:
    whatever a policy learns from these, it does not learn from the verifier.
    """
    order = np.random.default_rng([seed, iteration, 0x5EED]).permutation(len(scores))
    return np.asarray(scores)[order]


def control_rewards(
    scores: np.ndarray,
    correct: Optional[np.ndarray],
    seed: int,
    iteration: int,
    step_rewards: Optional[np.ndarray] = None,
):
    """The control run's (scores, verdicts, step rewards): each response's, given to another response of the
    batch, all by one random permutation (`shuffled_rewards`): DAPO's successes and a process reward model's step
    scores (`[N, A]` rows) tell no more than the scores do. A row's step scores past its own steps are ignored."""

    def shuffled(values):
        return None if values is None else shuffled_rewards(values, seed, iteration)

    return shuffled_rewards(scores, seed, iteration), shuffled(correct), shuffled(step_rewards)
