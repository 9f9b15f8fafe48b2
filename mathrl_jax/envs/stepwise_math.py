"""Step-wise math: every action is one reasoning step (OpenR's language-augmented MDP).

OpenR (openreasoner/openr `envs/base_env.py` `CoTEnv`, `train/mat/envs/math/math_env.py`)
turns a math problem into an MDP whose state is the prompt followed by the steps
so far and whose action is the next step:

    s_0 = prompt
    s_{t+1} = s_t + a_t + separator                separator = "\\n\\n" (OpenR's MATH `SEP`)

The episode ends (terminated) when a step contains an answer (`extract_answer`
finds a `\\boxed{}` or "The answer is: ..."; OpenR's training env stops on a step
mentioning "answer", its CoTEnv on "The answer is: "), or is truncated after
`max_steps` steps (OpenR's training env: 10).

Rewards (`reward`):

  "prm":        r_t = PRM score of step t given the question and steps 0..t
                (OpenR's `ProcessRM.get_reward`: the score at the last step tag),
  "final":      r_t = 0 for t < T, r_T = reward_value(grade(s_T, answer)) (the outcome reward),
  "prm+final":  both (the PRM score of every step plus the outcome at the end).

The PRM sees the problem's question (not the prompt template) and the steps, as
`rewards.prm.ProcessRewardModel.format_input` builds them. `StepwiseMathEnv.step_many`
scores all envs' new steps in one PRM call, so a `VectorEnv` of these envs runs
one batched PRM forward per turn, as OpenR's runner does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mathrl_jax.data.prompts import format_prompt
from mathrl_jax.data.sources import Problem
from mathrl_jax.envs.base import Env, StepResult, check_action
from mathrl_jax.envs.math import ProblemSelector
from mathrl_jax.rewards.math_grader import RewardValues, extract_answer, grade, reward_value

if TYPE_CHECKING:  # the PRM brings in JAX; the env itself does not need it
    from mathrl_jax.rewards.prm import ProcessRewardModel

REWARDS = ("prm", "final", "prm+final")
OPENR_MAX_STEPS = 10
"""OpenR's training env (`MathEnv.max_step`)."""
OPENR_SEPARATOR = "\n\n"
"""OpenR's MATH step separator (`envs/MATH/prompt.py` `SEP`)."""


class StepwiseMathEnv(Env):
    """One problem per episode, one reasoning step per action; see the module docstring.

    Args:
      problems: the problems (served as `MathEnv` serves them: explicit, `seed % n`, or in order).
      prm: the process reward model (required for "prm" rewards).
      reward: "prm", "final" or "prm+final"; default "prm" with a PRM, else "final".
      max_steps: steps before truncation.
      separator: appended after every step in the observation.
      template, tokenizer, system: the prompt (`data.format_prompt`).
      reward_values, timeout_s: the final grade (`rewards.math_grader`).
    """

    def __init__(
        self,
        problems: Sequence[Problem],
        *,
        prm: ProcessRewardModel | None = None,
        reward: str | None = None,
        max_steps: int = OPENR_MAX_STEPS,
        separator: str = OPENR_SEPARATOR,
        template: str = "boxed",
        tokenizer: Any = None,
        system: str | None = None,
        reward_values: RewardValues = RewardValues(),  # noqa: B008 - frozen, immutable
        timeout_s: float = 5.0,
    ):
        reward = reward if reward is not None else ("prm" if prm is not None else "final")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {reward!r}")
        if "prm" in reward and prm is None:
            raise ValueError(f"reward={reward!r} needs a ProcessRewardModel, got prm=None")
        if prm is not None and not callable(getattr(prm, "step_scores", None)):
            raise TypeError(f"prm must be a rewards.prm.ProcessRewardModel, got {type(prm).__name__}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
        if not isinstance(separator, str) or not separator:
            raise ValueError(f"separator must be a non-empty string, got {separator!r}")
        if not isinstance(reward_values, RewardValues):
            raise TypeError(f"reward_values must be a RewardValues, got {type(reward_values).__name__}")
        self.selector = ProblemSelector(problems)
        self.prm, self.reward = prm, reward
        self.max_steps, self.separator = max_steps, separator
        self.template, self.tokenizer, self.system = template, tokenizer, system
        self.reward_values, self.timeout_s = reward_values, timeout_s
        format_prompt(self.selector.problems[0].question, template, tokenizer=tokenizer, system=system)  # fail early
        self.problem: Problem | None = None
        self.prompt = ""
        self.steps: list[str] = []
        self._done = True

    @property
    def problems(self) -> list[Problem]:
        return self.selector.problems

    def state(self) -> str:
        """s_t = prompt + (step + separator) for every step so far."""
        return self.prompt + "".join(step + self.separator for step in self.steps)

    def reset(self, seed: int | None = None, *, problem: Problem | None = None) -> tuple[str, dict[str, Any]]:
        self.problem = self.selector.select(seed, problem)
        self.prompt = format_prompt(self.problem.question, self.template, tokenizer=self.tokenizer, system=self.system)
        self.steps = []
        self._done = False
        return self.state(), {"uid": self.problem.uid}

    def step(self, action: str) -> StepResult:
        return type(self).step_many([self], [action])[0]

    @classmethod
    def step_many(cls, envs: Sequence[StepwiseMathEnv], actions: Sequence[str]) -> list[StepResult]:
        """Steps several envs, scoring their new steps in one call per PRM."""
        for env, action in zip(envs, actions):
            check_action(action)
            if env._done:
                raise RuntimeError("StepwiseMathEnv.step called without a running episode; call reset() first")
            env.steps.append(action.strip())
        prm_scores: dict[int, float] = {}
        by_prm: dict[int, list[int]] = {}
        for k, env in enumerate(envs):
            if "prm" in env.reward:
                by_prm.setdefault(id(env.prm), []).append(k)
        for indices in by_prm.values():
            prm = envs[indices[0]].prm
            scores = prm.step_scores([envs[k].problem.question for k in indices], [envs[k].steps for k in indices])
            for k, score in zip(indices, scores):
                prm_scores[k] = float(score[-1])
        results = []
        for k, env in enumerate(envs):
            step = env.steps[-1]
            terminated = extract_answer(step) is not None
            truncated = not terminated and len(env.steps) >= env.max_steps
            info: dict[str, Any] = {"uid": env.problem.uid, "step_index": len(env.steps) - 1}
            reward = 0.0
            if k in prm_scores:
                info["prm_score"] = prm_scores[k]
                reward += prm_scores[k]
            if terminated or truncated:
                env._done = True
                result = grade(env.separator.join(env.steps), env.problem.answer, timeout_s=env.timeout_s)
                info.update(grade=result.status, correct=result.correct, extracted=result.extracted)
                if "final" in env.reward:
                    outcome = reward_value(result, env.reward_values)
                    info["outcome_reward"] = outcome
                    reward += outcome
            results.append((env.state(), reward, terminated, truncated, info))
        return results
