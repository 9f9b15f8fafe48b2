"""The `Problem` record and the field layouts that make one from a data record.

`FieldMapping` names the fields (and the functions reading them) of one layout;
`LAYOUTS` holds the built-in ones (math500, math, gsm8k, areal_boba, verl; see
`mathrl_jax.data.sources`) and `detect_layout` picks one from a record's fields.
`normalize_level` turns 2, "2" or "Level 2" into "2".
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mathrl_jax.rewards.extraction import last_boxed

FieldName = str | tuple[str, ...]
"""A field of a record, or alternative fields: the first one the record has is read."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """One math problem with its gold final answer.

    uid: stable id (the source's id field, or "<file stem>:<record index>").
    answer: the gold final answer as a string, e.g. "\\\\frac{1}{2}" or "72".
    """

    uid: str
    question: str
    answer: str
    solution: str | None = None
    level: str | None = None
    subject: str | None = None


@dataclasses.dataclass(frozen=True)
class FieldMapping:
    """Which record fields make a `Problem`, and how.

    question, answer, solution, level, subject, uid: field names (or tuples of
      alternatives, the first present one is read). `question` is required in
      every record; `answer` too unless it is None, in which case the gold answer
      is the last `\\boxed{}` of the solution. Optional fields missing from a
      record give None (uid: "<file stem>:<record index>").
    answer_fn: maps the raw answer value to the gold answer string (e.g. GSM8K's
      text after "####"); raise ValueError for a value it cannot read.
    solution_fn: likewise for the raw solution value.
    question_fn: likewise for the raw question value (e.g. verl's chat messages).
    keep_row: a predicate over the raw record; rows for which it is False are
      skipped (e.g. AReaL-boba's code tasks).
    """

    question: FieldName
    answer: FieldName | None
    solution: FieldName | None = None
    level: FieldName | None = None
    subject: FieldName | None = None
    uid: FieldName | None = None
    answer_fn: Callable[[Any], str] | None = None
    solution_fn: Callable[[Any], str] | None = None
    question_fn: Callable[[Any], str] | None = None
    keep_row: Callable[[Mapping[str, Any]], bool] | None = None
    name: str = "custom"

    def __post_init__(self):
        if self.answer is None and self.solution is None:
            raise ValueError(f"FieldMapping {self.name!r}: answer is None, so a solution field is required")


def is_int(value: Any) -> bool:
    """An int and not a bool (True is an int to Python, not a count or a seed to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def preview(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a string or a number, got {preview(value)}")  # noqa: TRY004
    return value if isinstance(value, str) else str(value)


def normalize_level(level: Any) -> str | None:
    """2, "2", "Level 2" -> "2"; None -> None; any other text is kept stripped (e.g. "Level ?")."""
    if level is None:
        return None
    text = as_text(level).strip()
    match = re.fullmatch(r"(?:level\s*)?(\d+)", text, flags=re.IGNORECASE)
    return str(int(match.group(1))) if match else text


def gsm8k_final_answer(answer: str) -> str:
    """GSM8K's gold answer: the text after the last "####", stripped, thousands commas dropped.

    "... so 48+24 = 72 clips.\\n#### 72" -> "72"; "#### 1,080" -> "1080" (as verl's gsm8k preprocessing).
    """
    if not isinstance(answer, str) or "####" not in answer:
        raise ValueError(f"expected a string with '#### <answer>', got {preview(answer)}")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise ValueError(f"nothing after '####' in {preview(answer)}")
    return final


def gsm8k_rationale(answer: str) -> str:
    """GSM8K's worked solution: the text before the last "####", stripped."""
    if not isinstance(answer, str) or "####" not in answer:
        raise ValueError(f"expected a string with '#### <answer>', got {preview(answer)}")
    return answer.rsplit("####", 1)[0].strip()


def _first_solution(solutions: Any) -> str:
    if not isinstance(solutions, (list, tuple)) or not solutions:
        raise ValueError(f"expected a non-empty list of solution strings, got {preview(solutions)}")
    if not isinstance(solutions[0], str):
        raise ValueError(f"expected solution strings, got {preview(solutions[0])}")  # noqa: TRY004
    return solutions[0]


def boba_answer(solutions: Any) -> str:
    """AReaL-boba's gold answer: the last `\\boxed{}` of the first solution."""
    boxed = last_boxed(_first_solution(solutions))
    if boxed is None or not boxed.strip():
        raise ValueError(f"no \\boxed{{...}} answer in the first solution {preview(solutions[0])}")
    return boxed.strip()


def verl_question(prompt: Any) -> str:
    """verl's question: the content of the last user message of `prompt` (chat messages), or `prompt` itself
    if it is a string."""
    if isinstance(prompt, str):
        return prompt
    messages = list(prompt) if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist") else None
    if not messages or not all(isinstance(m, Mapping) for m in messages):
        raise ValueError(f"expected chat messages [{{'role': ..., 'content': ...}}, ...], got {preview(prompt)}")
    users = [m for m in messages if m.get("role") == "user"]
    if not users or not isinstance(users[-1].get("content"), str):
        raise ValueError(f"no user message with text content in {preview(prompt)}")
    return users[-1]["content"]


def verl_ground_truth(reward_model: Any) -> str:
    """verl's gold answer: `reward_model["ground_truth"]` (a string or a number)."""
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise ValueError(f"expected {{'ground_truth': ..., 'style': ...}}, got {preview(reward_model)}")
    return as_text(reward_model["ground_truth"])


def _is_math_task(row: Mapping[str, Any]) -> bool:
    return row.get("task", "math") == "math"


LAYOUTS: dict[str, FieldMapping] = {
    "math500": FieldMapping(
        question="problem",
        answer=("answer", "final_answer"),
        solution="solution",
        level="level",
        subject="subject",
        uid="unique_id",
        name="math500",
    ),
    "math": FieldMapping(
        question="problem", answer=None, solution="solution", level="level", subject="type", name="math"
    ),
    "gsm8k": FieldMapping(
        question="question",
        answer="answer",
        solution="answer",
        answer_fn=gsm8k_final_answer,
        solution_fn=gsm8k_rationale,
        name="gsm8k",
    ),
    "areal_boba": FieldMapping(
        question="prompt",
        answer="solutions",
        solution="solutions",
        uid="query_id",
        answer_fn=boba_answer,
        solution_fn=_first_solution,
        keep_row=_is_math_task,
        name="areal_boba",
    ),
    "verl": FieldMapping(
        question="prompt",
        question_fn=verl_question,
        answer="reward_model",
        answer_fn=verl_ground_truth,
        subject="data_source",
        name="verl",
    ),
}
"""The built-in layouts by name (see the module table)."""


def detect_layout(fields: Iterable[str]) -> str | None:
    """The built-in layout a record with these fields has, or None.

    prompt + reward_model -> verl; prompt + solutions -> areal_boba; problem + answer|final_answer -> math500;
    problem + solution -> math; question + answer -> gsm8k.
    """
    keys = set(fields)
    if {"prompt", "reward_model"} <= keys:
        return "verl"
    if {"prompt", "solutions"} <= keys:
        return "areal_boba"
    if "problem" in keys and keys & {"answer", "final_answer"}:
        return "math500"
    if {"problem", "solution"} <= keys:
        return "math"
    if {"question", "answer"} <= keys:
        return "gsm8k"
    return None
