"""GEM-style text environments and the sandbox that runs model-written code.

    from mathrl_jax.envs import MathEnv, VectorEnv, run_episodes
    vec = VectorEnv([lambda: MathEnv(problems) for _ in range(8)])
    episodes = run_episodes(vec, policy, seeds=range(8), max_turns=1)

`Env` (`reset(seed) -> (obs, info)`, `step(action) -> (obs, reward, terminated,
truncated, info)`), `VectorEnv`, `run_episodes`, and the envs: `MathEnv`
(single-turn, graded), `StepwiseMathEnv` (OpenR: one reasoning step per action,
PRM or outcome rewards), `GuessTheNumberEnv` (GEM's multi-turn game),
`PythonToolEnv` (GEM's Python tool around any env, code run by `run_python`).
None of these import JAX; a PRM is passed in by the caller.
"""

from mathrl_jax.envs.base import TERMINAL_STATE, Env, Episode, Policy, VectorEnv, run_episodes
from mathrl_jax.envs.guess_number import GuessTheNumberEnv
from mathrl_jax.envs.math import MathEnv
from mathrl_jax.envs.python_tool import PythonToolEnv
from mathrl_jax.envs.sandbox import (
    STATUSES,
    Isolation,
    SandboxLimits,
    SandboxResult,
    detect_isolation,
    run_python,
)
from mathrl_jax.envs.stepwise_math import StepwiseMathEnv

MULTI_TURN_ENVS = {"guess_number": GuessTheNumberEnv}
"""The games a run plays by `env_name` (`train.rollouts`); their options are `config.<env_name>`."""

__all__ = [
    "STATUSES",
    "TERMINAL_STATE",
    "Env",
    "Episode",
    "GuessTheNumberEnv",
    "Isolation",
    "MULTI_TURN_ENVS",
    "MathEnv",
    "Policy",
    "PythonToolEnv",
    "SandboxLimits",
    "SandboxResult",
    "StepwiseMathEnv",
    "VectorEnv",
    "detect_isolation",
    "run_episodes",
    "run_python",
]
