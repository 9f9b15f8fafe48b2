"""The countdown task's rule-based process verifier: each step of a derivation scored good or not, where OpenR's
process reward model would score it.

A derivation (`data/countdown/rules.py`) is split at "," into steps, the last the boxed target:

    3,7,5->26:   7*3=21,21+5=26,\\boxed{26}     scores 1 1 1
                 3+7=10,10*5=50,\\boxed{50}     scores 0 0 0   (after 3+7=10, 26 cannot be reached from 10 and 5)
                 3*7=21,21+5=27,\\boxed{27}     scores 1 0 0   (21+5 is 26)

A step is good when it and every step before it keep the rules (right arithmetic, operands among the numbers
then available, each given number used once) and the target can still be reached from the numbers left, found by
exhaustive search (Math-Shepherd's label: a step from which the right answer is still reachable); the boxed step
is good when the derivation is complete and ends at the target. So the first step that is not good is the first
that breaks a rule or leads into a dead end, and every step after it is not good either (`rules.step_checks`).
Unlike the outcome verifier this tells which step went wrong: the teacher's wrong chains are marked at their first
step into a dead end, not only at the end.

`CountdownStepVerifier` has `ProcessRewardModel.step_scores`'s interface (one float32 `[n_steps]` array per
sample, here exactly 0 or 1), so the trainer uses it where it uses a PRM: `--config.prm_model_name_or_path=
countdown_steps` with `--config.step_separator=,` and a `reward_source` with "prm".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mathrl_jax.data.countdown import rules

NAME = "countdown_steps"  # the `prm_model_name_or_path` that selects this verifier
STEP_SEPARATOR = rules.SEPARATOR


class CountdownStepVerifier:
    """Scores each step of a countdown derivation (see the module docstring)."""

    def step_scores(self, questions: Sequence[str], steps: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """1.0 for each good step, else 0.0; one `[len(steps[i])]` float32 array per sample. `questions` are the
        problems' questions (`3,7,5->26:`); every step of a question that is not an instance scores 0."""
        if len(questions) != len(steps):
            raise ValueError(f"{len(questions)} questions but {len(steps)} step lists")
        scores = []
        for question, sample in zip(questions, steps):
            try:
                instance = rules.parse_instance(question)
            except ValueError:
                scores.append(np.zeros(len(sample), np.float32))
                continue
            checks = rules.step_checks(instance, sample)
            scores.append(np.asarray([check.good for check in checks], np.float32))
        return scores
