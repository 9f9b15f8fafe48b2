"""Single-turn math: one problem, one response, one graded reward (GEM's `MathEnv`, a contextual bandit).

    observation = format_prompt(problem.question, template)          (reset)
    reward      = reward_value(grade(response, problem.answer), reward_values)   (step; then terminated)

As in GEM (`gem/envs/math_env.py`), the episode ends after the one step and the
next observation is `TERMINAL_STATE`; GEM reports that step as terminated *and*
truncated, here it is terminated only (the answer ends the task; no limit cut it).

Which problem `reset` serves: the one passed as `reset(problem=...)`, else
`problems[seed % len(problems)]` for a seed, else the next one in order
(cycling), so a run of seeded resets is reproducible and unseeded ones walk
through the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mathrl_jax.data.prompts import format_prompt
from mathrl_jax.data.sources import Problem
from mathrl_jax.envs.base import TERMINAL_STATE, Env, StepResult, check_action, check_seed
from mathrl_jax.rewards.math_grader import RewardValues, grade, reward_value


def check_problems(problems: Sequence[Problem]) -> list[Problem]:
    if isinstance(problems, Problem) or not isinstance(problems, Sequence) or len(problems) == 0:
        raise ValueError(f"problems must be a non-empty sequence of Problem, got {problems!r:.80}")
    for i, problem in enumerate(problems):
        if not isinstance(problem, Problem):
            raise TypeError(f"problems[{i}] must be a data.Problem, got {type(problem).__name__}: {problem!r:.80}")
    return list(problems)


class ProblemSelector:
    """The problem of an episode: an explicit one, `problems[seed % n]`, or the next in order."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = check_problems(problems)
        self._cursor = 0

    def select(self, seed: int | None, problem: Problem | None) -> Problem:
        if problem is not None:
            if not isinstance(problem, Problem):
                raise TypeError(f"problem must be a data.Problem, got {type(problem).__name__}: {problem!r:.80}")
            return problem
        seed = check_seed(seed)
        if seed is not None:
            return self.problems[seed % len(self.problems)]
        chosen = self.problems[self._cursor % len(self.problems)]
        self._cursor += 1
        return chosen


class MathEnv(Env):
    """One math problem per episode, graded by `rewards.math_grader`.

    Args:
      problems: the problems to serve (any source: `data.load_problems`, `data.arithmetic_problems`).
      template: prompt template of `data.format_prompt` ("boxed": Qwen2.5-Math's CoT instruction).
      tokenizer: for the chat templates.
      reward_values: reward of each grade (1 / 0 / 0 by default; RLinf uses +5 / -5).
      timeout_s: grading time limit per response.
      system: system message of the chat templates.
    """

    def __init__(
        self,
        problems: Sequence[Problem],
        *,
        template: str = "boxed",
        tokenizer: Any = None,
        reward_values: RewardValues = RewardValues(),  # noqa: B008 - frozen, immutable
        timeout_s: float = 5.0,
        system: str | None = None,
    ):
        if not isinstance(reward_values, RewardValues):
            raise TypeError(f"reward_values must be a RewardValues, got {type(reward_values).__name__}")
        self.selector = ProblemSelector(problems)
        self.template, self.tokenizer, self.system = template, tokenizer, system
        self.reward_values = reward_values
        self.timeout_s = timeout_s
        format_prompt(self.selector.problems[0].question, template, tokenizer=tokenizer, system=system)  # fail early
        self.problem: Problem | None = None
        self._done = True

    @property
    def problems(self) -> list[Problem]:
        return self.selector.problems

    def reset(self, seed: int | None = None, *, problem: Problem | None = None) -> tuple[str, dict[str, Any]]:
        self.problem = self.selector.select(seed, problem)
        self._done = False
        observation = format_prompt(self.problem.question, self.template, tokenizer=self.tokenizer, system=self.system)
        return observation, {"uid": self.problem.uid}

    def step(self, action: str) -> StepResult:
        check_action(action)
        if self._done:
            raise RuntimeError("MathEnv.step called without a running episode; call reset() first")
        self._done = True
        result = grade(action, self.problem.answer, timeout_s=self.timeout_s)
        info = {
            "uid": self.problem.uid,
            "grade": result.status,
            "correct": result.correct,
            "extracted": result.extracted,
            "formatted": result.formatted,
        }
        return TERMINAL_STATE, reward_value(result, self.reward_values), True, False, info
