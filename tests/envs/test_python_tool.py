"""The Python tool: code in the action runs in the sandbox, its output is the next observation."""

import re

import pytest

from mathrl_jax.data.sources import Problem
from mathrl_jax.envs import GuessTheNumberEnv, MathEnv, PythonToolEnv, SandboxLimits, VectorEnv, run_episodes
from mathrl_jax.envs.python_tool import INSTRUCTION, MAX_CALLS_NOTE, parse_code
from mathrl_jax.rewards.math_grader import RewardValues

PROBLEMS = [
    Problem(uid="sq", question="What is 1234 * 5678?", answer=str(1234 * 5678)),
    Problem(
        uid="sum", question="What is the sum of the squares of 1..20?", answer=str(sum(i * i for i in range(1, 21)))
    ),
]
CODE = {"sq": "print(1234 * 5678)", "sum": "print(sum(i * i for i in range(1, 21)))"}
LIMITS = SandboxLimits(wall_time_s=5.0, cpu_time_s=2, memory_bytes=256 << 20)


def compute_then_answer(episodes):
    """Turn 1: ask the tool (as a <python> tag or a fence, by problem); turn 2: box the number it printed."""
    actions = []
    for episode in episodes:
        uid = episode.infos[0]["uid"]
        if episode.num_turns == 0:
            code = CODE[uid]
            actions.append(
                f"Let me compute.\n<python>\n{code}\n</python>" if uid == "sq" else f"```python\n{code}\n```"
            )
        else:
            printed = re.search(r"(?:<output>|```output)\n(-?\d+)\n", episode.observations[-1]).group(1)
            actions.append(f"The tool says {printed}, so the answer is \\boxed{{{printed}}}.")
    return actions


def test_tool_output_is_the_observation_and_the_answer_is_graded():
    values = RewardValues(correct=1.0, incorrect=-1.0)
    vec = VectorEnv([lambda: PythonToolEnv(MathEnv(PROBLEMS, reward_values=values), limits=LIMITS) for _ in range(2)])
    episodes = run_episodes(vec, compute_then_answer, [0, 1], max_turns=4)
    for episode, problem in zip(episodes, PROBLEMS):
        assert episode.observations[0].endswith("\n" + INSTRUCTION)
        assert episode.rewards == [0.0, 1.0] and episode.terminated
        wrapped = "\n<output>\n{}\n</output>\n" if problem.uid == "sq" else "\n```output\n{}\n```\n"
        assert episode.observations[1] == wrapped.format(problem.answer)  # computed in the sandbox
        assert episode.infos[1]["tool_used"] and episode.infos[1]["tool_status"] == "ok"
        assert not episode.infos[2]["tool_used"] and episode.infos[2]["correct"]


def test_tool_call_limit_and_rewards():
    env = PythonToolEnv(
        MathEnv(PROBLEMS[:1]), max_tool_calls=1, limits=LIMITS, tool_reward=0.1, tool_success_reward=0.2
    )
    env.reset(seed=0)
    observation, reward, terminated, _, info = env.step("<python>print('hi')</python>")
    assert observation == f"\n<output>\nhi\n</output>\n\n{MAX_CALLS_NOTE}" and reward == pytest.approx(0.3)
    assert not terminated and info["tool_calls"] == 1
    # Past the limit, code goes to the wrapped env, which grades it (no answer: 0).
    observation, reward, terminated, _, info = env.step("<python>print(7006652)</python>")
    assert terminated and not info["tool_used"] and info["grade"] == "no_answer" and reward == 0.0


def test_errors_and_limits_are_reported_in_the_observation():
    env = PythonToolEnv(GuessTheNumberEnv(), limits=LIMITS, tool_reward=0.5, tool_success_reward=1.0)
    env.reset(seed=0)
    observation, reward, *_ = env.step("<python>print('before')\nraise ValueError('bad input')</python>")
    assert observation == "\n<output>\nbefore\nValueError: bad input\n</output>\n"  # GEM: the error's last line
    assert reward == 0.5  # a call, not a successful one
    observation, _, _, _, info = env.step("```python\nimport socket\nsocket.create_connection(('1.1.1.1', 53))\n```")
    assert info["tool_status"] == "network" and "network access is not allowed" in observation
    observation, _, _, _, info = env.step("<python>open('/etc/passwd_copy', 'w')</python>")
    assert info["tool_status"] == "filesystem" and "writing outside the working directory" in observation
    # The game still runs: a guess goes to it.
    _, _, _, _, info = env.step("\\boxed{10}")
    assert not info["tool_used"] and info["guess"] == 10


def test_parse_code_takes_the_first_complete_block():
    assert parse_code("a <python>x = 1</python> b ```python\ny = 2\n```") == ("x = 1", "tag")
    assert parse_code("```python\ny = 2\n``` then <python>x = 1</python>") == ("y = 2", "fence")
    assert parse_code("<python>unclosed") is None and parse_code("no code") is None
    with pytest.raises(ValueError, match="max_tool_calls must be a non-negative int or None, got -1"):
        PythonToolEnv(GuessTheNumberEnv(), max_tool_calls=-1)
