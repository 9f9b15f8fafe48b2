"""A Python tool around any env: code in the action runs in the sandbox and its output is the next observation.

GEM's conventions (axon-rl/gem `gem/tools/python_code_tool.py`, `gem/tools/tool_env_wrapper.py`):

- Code is the first complete `<python>...</python>` block or Markdown fence
  (```` ```python ... ``` ````) of the action, whichever closes first.
- An action with code is a tool call: the wrapped env is not stepped; the code's
  output is the observation, wrapped as the call was written:
  "\\n<output>\\n{output}\\n</output>\\n" after `<python>`, "\\n```output\\n{output}\\n```\\n"
  after a fence. The output is stdout, then (on failure) the last line of stderr,
  stripped (GEM's `return_traceback=False`); a sandbox limit is reported by name.
- At most `max_tool_calls` calls per episode (GEM's `max_tool_uses`, default 10);
  the observation of the last allowed call says so ("Reached the maximum number
  of tool use. Please output final answer directly."), and later actions go to
  the wrapped env even if they hold code.
- A tool call's reward is `tool_reward`, plus `tool_success_reward` when the code
  ran without error (GEM's defaults: 0 and 0).
- The reset observation gets the tool's instruction appended.

Every call runs `sandbox.run_python(code, limits, isolation=...)`.
"""

from __future__ import annotations

import re
from typing import Any

from mathrl_jax.envs.base import Env, StepResult, check_action
from mathrl_jax.envs.sandbox import Isolation, SandboxLimits, SandboxResult, require_isolation, run_python

GEM_MAX_TOOL_USES = 10
INSTRUCTION = (
    "You can execute Python code by wrapping it in <python>...</python> tags or using ```python...``` code blocks."
)
"""GEM's `PythonCodeTool.instruction_string`."""
MAX_CALLS_NOTE = "Reached the maximum number of tool use. Please output final answer directly."
"""GEM's `ToolEnvWrapper` note on the last allowed call."""

_CODE_PATTERNS = (re.compile(r"<python>(.*?)</python>", re.DOTALL), re.compile(r"```\n?python(.*?)```", re.DOTALL))


def parse_code(action: str) -> tuple[str, str] | None:
    """(code, style) of the action's first complete code block, style "tag" or "fence"; None without one."""
    best = None
    for style, pattern in zip(("tag", "fence"), _CODE_PATTERNS):
        match = pattern.search(action)
        if match and (best is None or match.end() < best[0]):
            best = (match.end(), match.group(1).strip(), style)
    return None if best is None else (best[1], best[2])


_LIMIT_MESSAGES = {
    "timeout": "Execution timed out (wall-clock limit).",
    "cpu_time": "Execution stopped: CPU time limit exceeded.",
    "memory": "Execution stopped: memory limit exceeded.",
    "file_size": "Execution stopped: file size limit exceeded.",
    "process_limit": "Execution stopped: creating processes is not allowed.",
    "network": "Execution stopped: network access is not allowed.",
    "filesystem": "Execution stopped: writing outside the working directory is not allowed.",
    "forbidden": "Execution stopped: operation not allowed.",
    "output_limit": "Execution stopped: too much output.",
    "sandbox_error": "The sandbox failed to run the code.",
}


def format_tool_output(result: SandboxResult) -> str:
    """stdout, then: on an error the last line of stderr (GEM), on a sandbox limit its name; stripped."""
    parts = [result.stdout.strip()]
    if result.stdout_truncated:
        parts.append("... (output truncated)")
    if result.status == "error":
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        parts.append(lines[-1].strip() if lines else f"Error (exit code {result.returncode}).")
    elif not result.ok:
        parts.append(_LIMIT_MESSAGES.get(result.status, f"Execution stopped ({result.status})."))
    return "\n".join(p for p in parts if p)


class PythonToolEnv(Env):
    """Wraps `env` with GEM's Python tool; see the module docstring.

    Args:
      env: the task env (e.g. `MathEnv`, `GuessTheNumberEnv`).
      max_tool_calls: tool calls allowed per episode (None: unlimited).
      limits: sandbox limits of every call.
      isolation: sandbox isolation ("auto", "namespace", "audit" or an `Isolation`); one that cannot contain
        the code (`Isolation.contains`) is refused here, unless `allow_not_a_sandbox`.
      allow_not_a_sandbox: run the code even so, under the audit hook alone: not a sandbox.
      tool_reward, tool_success_reward: reward of a call, and extra for one that ran without error.
      instruction: appended to the reset observation (None: nothing).
    """

    def __init__(
        self,
        env: Env,
        *,
        max_tool_calls: int | None = GEM_MAX_TOOL_USES,
        limits: SandboxLimits = SandboxLimits(),  # noqa: B008 - frozen, immutable
        isolation: str | Isolation = "auto",
        allow_not_a_sandbox: bool = False,
        tool_reward: float = 0.0,
        tool_success_reward: float = 0.0,
        instruction: str | None = INSTRUCTION,
    ):
        if not isinstance(env, Env):
            raise TypeError(f"env must be an Env, got {type(env).__name__}")
        if max_tool_calls is not None and (
            isinstance(max_tool_calls, bool) or not isinstance(max_tool_calls, int) or max_tool_calls < 0
        ):
            raise ValueError(f"max_tool_calls must be a non-negative int or None, got {max_tool_calls!r}")
        if not isinstance(limits, SandboxLimits):
            raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
        self.env = env
        self.max_tool_calls = max_tool_calls
        require_isolation(isolation, allow_not_a_sandbox)  # before any episode, not at the first tool call
        self.limits, self.isolation, self.allow_not_a_sandbox = limits, isolation, allow_not_a_sandbox
        self.tool_reward, self.tool_success_reward = float(tool_reward), float(tool_success_reward)
        self.instruction = instruction
        self.tool_calls = 0
        self.tool_successes = 0

    def reset(self, seed: int | None = None, **kwargs) -> tuple[str, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, **kwargs)
        self.tool_calls = self.tool_successes = 0
        if self.instruction:
            observation = f"{observation}\n{self.instruction}"
        info = dict(info, tool_calls=0, tool_successes=0, tool_used=False)
        return observation, info

    def step(self, action: str) -> StepResult:
        check_action(action)
        parsed = parse_code(action)
        calls_left = self.max_tool_calls is None or self.tool_calls < self.max_tool_calls
        if parsed is None or not calls_left:
            observation, reward, terminated, truncated, info = self.env.step(action)
            info = dict(info, tool_used=False, tool_calls=self.tool_calls, tool_successes=self.tool_successes)
            return observation, reward, terminated, truncated, info
        code, style = parsed
        result = run_python(code, self.limits, isolation=self.isolation, allow_not_a_sandbox=self.allow_not_a_sandbox)
        self.tool_calls += 1
        output = format_tool_output(result)
        if style == "tag":
            observation = f"\n<output>\n{output}\n</output>\n"
        else:
            observation = f"\n```output\n{output}\n```\n"
        if self.max_tool_calls is not None and self.tool_calls == self.max_tool_calls:
            observation = f"{observation}\n{MAX_CALLS_NOTE}"
        reward = self.tool_reward
        if result.ok:
            self.tool_successes += 1
            reward += self.tool_success_reward
        info = {
            "tool_used": True,
            "tool_status": result.status,
            "tool_calls": self.tool_calls,
            "tool_successes": self.tool_successes,
            "code": code,
            "violations": result.violations,
        }
        return observation, reward, False, False, info

    def close(self) -> None:
        self.env.close()
