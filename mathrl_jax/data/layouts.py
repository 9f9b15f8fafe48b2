"""The `Problem` record and the field layouts that make one from a data record.

`FieldMapping` names the fields (and the functions reading them) of one layout;
`LAYOUTS` holds the built-in ones (math500, math, gsm8k, areal_boba, verl, trl; see
`mathrl_jax.data.sources`) and `detect_layout` picks one from a record's fields.
`parse_fields` turns `--config.data.fields` ("question:problem,answer:gold") into a `FieldMapping`.
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
    question: the question's text; for a chat-message prompt, the last user message's content.
    answer: the gold final answer as a string, e.g. "\\\\frac{1}{2}" or "72".
    messages: a chat-message prompt kept whole (system and user turns, each {"role", "content"}), which the
      prompt renders with the tokenizer's chat template (`data.prompts.format_messages`); None for a text
      question.
    """

    uid: str
    question: str
    answer: str
    solution: str | None = None
    level: str | None = None
    subject: str | None = None
    messages: tuple[dict[str, str], ...] | None = dataclasses.field(default=None, hash=False)


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
    chat_messages: a question field holding chat messages is kept whole as `Problem.messages` (the question is
      then `question_fn`'s text of them); a string question gives no messages.
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
    chat_messages: bool = False

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


def chat_messages(prompt: Any) -> tuple[dict[str, str], ...] | None:
    """A chat-message prompt as `Problem.messages`: ({"role": str, "content": str}, ...) with a user turn; None for
    a string prompt. Other keys of a message are dropped; a message without a string role or content is refused."""
    if isinstance(prompt, str):
        return None
    messages = list(prompt) if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist") else None
    if not messages or not all(isinstance(m, Mapping) for m in messages):
        raise ValueError(f"expected chat messages [{{'role': ..., 'content': ...}}, ...], got {preview(prompt)}")
    for m in messages:
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"expected a message with a string 'role' and 'content', got {preview(m)}")
    if not any(m["role"] == "user" for m in messages):
        raise ValueError(f"no user message in {preview(prompt)}")
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)


def trl_answer(value: Any) -> str:
    """The gold answer of a TRL / open-r1 answer column (`answer`, `ground_truth` or `solution`).

    A GSM8K answer ("... #### 72") -> the text after the last "####" (`gsm8k_final_answer`); a worked solution
    with a `\\boxed{}` (open-r1's `solution`) -> its last boxed content; anything else is the answer as it is
    ("72", 72, "\\frac{1}{2}"), stripped.
    """
    text = as_text(value)
    if "####" in text:
        return gsm8k_final_answer(text)
    boxed = last_boxed(text)
    if boxed is not None:
        if not boxed.strip():
            raise ValueError(f"an empty \\boxed{{}} in {preview(text)}")
        return boxed.strip()
    return text.strip()


def trl_solution(value: Any) -> str:
    """The worked solution of a TRL answer column: a GSM8K answer's text before "####", a text with a
    `\\boxed{}` whole; "" (no solution) for a bare answer."""
    text = as_text(value)
    if "####" in text:
        return gsm8k_rationale(text)
    return text if last_boxed(text) is not None else ""


FIELD_ROLES = ("question", "answer", "solution", "uid", "level", "subject")
"""The roles of `--config.data.fields` (`parse_fields`): the `FieldMapping` field each names."""


def parse_fields(text: str) -> FieldMapping:
    """`--config.data.fields`: comma-separated "ROLE:FIELD" pairs -> a `FieldMapping` named "data.fields".

    "question:problem,answer:gold" reads the question from `problem` and the gold answer, as it is, from `gold`.
    ROLE is one of `FIELD_ROLES`, each at most once; question is required, and answer or solution (with no
    answer, the gold answer is the last `\\boxed{}` of the solution, as the `math` layout). A question field
    holding chat messages is kept whole (`Problem.messages`), as the `trl` layout's `prompt`.

    Raises:
      ValueError: a pair that is not ROLE:FIELD, an unknown or repeated role, no question, or neither an answer
        nor a solution; the message names `text` and the bad part.
    """
    expected = "comma-separated ROLE:FIELD pairs, e.g. 'question:problem,answer:gold'"
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"data.fields={text!r}: expected {expected}")
    roles: dict[str, str] = {}
    for pair in text.split(","):
        role, colon, field = (part.strip() for part in pair.partition(":"))
        if not colon or not role or not field:
            raise ValueError(f"data.fields={text!r}: {pair.strip()!r} is not ROLE:FIELD; expected {expected}")
        if role not in FIELD_ROLES:
            raise ValueError(f"data.fields={text!r}: unknown role {role!r}; expected one of {', '.join(FIELD_ROLES)}")
        if role in roles:
            raise ValueError(f"data.fields={text!r}: the role {role!r} is named twice")
        roles[role] = field
    if "question" not in roles:
        raise ValueError(f"data.fields={text!r}: no question field; add 'question:FIELD'")
    if "answer" not in roles and "solution" not in roles:
        raise ValueError(f"data.fields={text!r}: no answer field; add 'answer:FIELD' (or 'solution:FIELD')")
    return FieldMapping(
        question=roles["question"],
        question_fn=verl_question,
        answer=roles.get("answer"),
        solution=roles.get("solution"),
        level=roles.get("level"),
        subject=roles.get("subject"),
        uid=roles.get("uid"),
        name="data.fields",
        chat_messages=True,
    )


def _is_math_task(row: Mapping[str, Any]) -> bool:
    return row.get("task", "math") == "math"


TRL_ANSWERS = ("answer", "ground_truth", "solution")
"""The `trl` layout's gold-answer columns, the first present one read (`trl_answer`)."""


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
    "trl": FieldMapping(
        question="prompt",
        question_fn=verl_question,
        chat_messages=True,
        answer=TRL_ANSWERS,
        answer_fn=trl_answer,
        solution=("solution", "answer"),
        solution_fn=trl_solution,
        name="trl",
    ),
}
"""The built-in layouts by name (see the module table)."""


def detect_layout(fields: Iterable[str]) -> str | None:
    """The built-in layout a record with these fields has, or None.

    prompt + reward_model -> verl; prompt + solutions -> areal_boba; prompt + answer|ground_truth|solution -> trl;
    problem + answer|final_answer -> math500; problem + solution -> math; question + answer -> gsm8k.
    """
    keys = set(fields)
    if {"prompt", "reward_model"} <= keys:
        return "verl"
    if {"prompt", "solutions"} <= keys:
        return "areal_boba"
    if "prompt" in keys and keys & set(TRL_ANSWERS):
        return "trl"
    if "problem" in keys and keys & {"answer", "final_answer"}:
        return "math500"
    if {"problem", "solution"} <= keys:
        return "math"
    if {"question", "answer"} <= keys:
        return "gsm8k"
    return None
