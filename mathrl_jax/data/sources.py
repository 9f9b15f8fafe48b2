"""Math problems from local files, and a resumable shuffled loader over them.

`load_problems(path, layout)` reads a local file or directory into a list of
`Problem`s (question, gold answer, optional solution / level / subject):

| path                                    | read with                                   | errors name  |
|-----------------------------------------|---------------------------------------------|--------------|
| `*.jsonl`, `*.json` (JSON lines)        | this module, line by line                   | line number  |
| `*.json` holding one JSON array         | `json`                                      | record index |
| `*.parquet`                             | `datasets.load_dataset("parquet", ...)`     | row index    |
| directory written by `save_to_disk`     | `datasets.load_from_disk`                   | row index    |
| any other directory (a dataset repo)    | `datasets.load_dataset(directory)`          | row index    |

Nothing is ever downloaded: every path is local.

Layouts (`LAYOUTS`, or a `FieldMapping` of your own):

| layout       | question   | gold answer                                     | solution   | level   | subject   | uid         |
|--------------|------------|-------------------------------------------------|------------|---------|-----------|-------------|
| `math500`    | `problem`  | `answer`, or `final_answer` (OpenR's copy)      | `solution` | `level` | `subject` | `unique_id` |
| `math`       | `problem`  | last `\\boxed{}` of `solution` (Hendrycks MATH) | `solution` | `level` | `type`    |             |
| `gsm8k`      | `question` | after the last `####` of `answer`, no commas    | before it  |         |           |             |
| `areal_boba` | `prompt`   | last `\\boxed{}` of the first of `solutions`    | that one   |         |           | `query_id`  |
| `verl`       | last user message of `prompt` (chat messages) | `reward_model.ground_truth` |  |  | `data_source` |  |

`areal_boba` keeps rows whose `task` is `"math"` (a missing `task` means math, as in
AReaL's `load_metadata`) and skips the `"code"` rows. `layout="auto"` picks the
layout from the fields of the first record. A problem's `uid` is the uid field
where the layout has one and the row has it, else `"<file stem>:<record index>"`
(0-based, counting records, not blank lines); uids must be unique in a file.

Levels are normalised to the bare level: MATH-500's copies store `2` or
`"Level 2"`; both load as `"2"`, and `levels=` filters accept 2, "2" or "Level 2".

`ProblemLoader` hands out batches of a shuffled list, epoch after epoch; its
position (`state()`, a small JSON-serialisable dict) can be saved with a
checkpoint and restored into a fresh loader, which then continues exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

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


MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
"""The seven subjects of MATH (Hendrycks et al. 2021), as OpenR's `--dataset_name` spells them."""


def subject_key(subject: str) -> str:
    """A subject as `MATH_SUBJECTS` spells it: "Counting & Probability" -> "counting_and_probability"."""
    return re.sub(r"[^a-z]+", "_", subject.lower().replace("&", "and")).strip("_")


def filter_by_subject(problems: Sequence[Problem], subject: str) -> list[Problem]:
    """The problems of one MATH subject (`subject_key` of their `subject` field)."""
    return [p for p in problems if p.subject is not None and subject_key(p.subject) == subject]


class DataError(ValueError):
    """A data file that cannot be read as problems: names the file, the line (or row) and the field."""

    def __init__(
        self,
        message: str,
        *,
        path: str,
        line: int | None = None,
        row: int | None = None,
        field: str | None = None,
    ):
        self.path = path
        self.line = line
        self.row = row
        self.field = field
        where = [str(path)]
        if line is not None:
            where.append(f"line {line}")
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{', '.join(where)}: {message}")


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


# ---------------------------------------------------------------------------
# Answer extraction


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces matched; None if none.

    "a \\boxed{1} b \\boxed{\\frac{1}{2}}" -> "\\frac{1}{2}". An unclosed last box gives None.
    """
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    start = starts[-1]
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def gsm8k_final_answer(answer: str) -> str:
    """GSM8K's gold answer: the text after the last "####", stripped, thousands commas dropped.

    "... so 48+24 = 72 clips.\\n#### 72" -> "72"; "#### 1,080" -> "1080" (as verl's gsm8k preprocessing).
    """
    if not isinstance(answer, str) or "####" not in answer:
        raise ValueError(f"expected a string with '#### <answer>', got {_preview(answer)}")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise ValueError(f"nothing after '####' in {_preview(answer)}")
    return final


def gsm8k_rationale(answer: str) -> str:
    """GSM8K's worked solution: the text before the last "####", stripped."""
    if not isinstance(answer, str) or "####" not in answer:
        raise ValueError(f"expected a string with '#### <answer>', got {_preview(answer)}")
    return answer.rsplit("####", 1)[0].strip()


def _first_solution(solutions: Any) -> str:
    if not isinstance(solutions, (list, tuple)) or not solutions:
        raise ValueError(f"expected a non-empty list of solution strings, got {_preview(solutions)}")
    if not isinstance(solutions[0], str):
        raise ValueError(f"expected solution strings, got {_preview(solutions[0])}")  # noqa: TRY004
    return solutions[0]


def boba_answer(solutions: Any) -> str:
    """AReaL-boba's gold answer: the last `\\boxed{}` of the first solution."""
    boxed = last_boxed(_first_solution(solutions))
    if boxed is None or not boxed.strip():
        raise ValueError(f"no \\boxed{{...}} answer in the first solution {_preview(solutions[0])}")
    return boxed.strip()


def verl_question(prompt: Any) -> str:
    """verl's question: the content of the last user message of `prompt` (chat messages), or `prompt` itself
    if it is a string."""
    if isinstance(prompt, str):
        return prompt
    messages = list(prompt) if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist") else None
    if not messages or not all(isinstance(m, Mapping) for m in messages):
        raise ValueError(f"expected chat messages [{{'role': ..., 'content': ...}}, ...], got {_preview(prompt)}")
    users = [m for m in messages if m.get("role") == "user"]
    if not users or not isinstance(users[-1].get("content"), str):
        raise ValueError(f"no user message with text content in {_preview(prompt)}")
    return users[-1]["content"]


def verl_ground_truth(reward_model: Any) -> str:
    """verl's gold answer: `reward_model["ground_truth"]` (a string or a number)."""
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise ValueError(f"expected {{'ground_truth': ..., 'style': ...}}, got {_preview(reward_model)}")
    return _as_text(reward_model["ground_truth"])


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


# ---------------------------------------------------------------------------
# Reading records


@dataclasses.dataclass(frozen=True)
class _Record:
    index: int  # 0-based among records
    line: int | None  # 1-based line of a JSON lines file
    value: Any


_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def _is_int(value: Any) -> bool:
    """An int and not a bool (True is an int to Python, not a count or a seed to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _preview(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_json_file(path: str) -> Iterator[_Record]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if path.endswith(".json") and stripped.startswith("["):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path=path, line=e.lineno) from None
        for i, value in enumerate(values):
            yield _Record(index=i, line=None, value=value)
        return
    index = 0
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path=path, line=line_number) from None
        yield _Record(index=index, line=line_number, value=value)
        index += 1


def _is_saved_dataset(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, name)) for name in ("dataset_dict.json", "state.json"))


def _pick_split(dataset: Any, split: str | None, path: str) -> Any:
    import datasets

    if isinstance(dataset, datasets.DatasetDict):
        names = sorted(dataset)
        if split is None:
            if len(names) != 1:
                raise DataError(f"several splits {names}: pass split= one of them", path=path)
            split = names[0]
        if split not in dataset:
            raise DataError(f"no split {split!r}; the splits are {names}", path=path)
        return dataset[split]
    if split is not None:
        raise DataError(f"split={split!r} given, but this dataset has no splits", path=path)
    return dataset


def _read_with_datasets(path: str, split: str | None, cache_dir: str | None) -> Iterator[_Record]:
    import datasets

    try:
        if os.path.isdir(path) and _is_saved_dataset(path):
            dataset = datasets.load_from_disk(path)
        elif os.path.isdir(path):
            dataset = datasets.load_dataset(path, cache_dir=cache_dir)
        else:
            dataset = datasets.load_dataset("parquet", data_files=path, cache_dir=cache_dir, split="train")
    except DataError:
        raise
    except Exception as e:  # datasets raises many types; keep its message, name the path
        raise DataError(f"cannot be read with `datasets`: {type(e).__name__}: {e}", path=path) from e
    dataset = _pick_split(dataset, split, path)
    for i, value in enumerate(dataset):
        yield _Record(index=i, line=None, value=value)


def _read_records(path: str, split: str | None, cache_dir: str | None) -> Iterator[_Record]:
    if not os.path.exists(path):
        raise DataError("no such file or directory", path=path)
    if os.path.isdir(path):
        return _read_with_datasets(path, split, cache_dir)
    if not path.endswith(_FILE_SUFFIXES):
        raise DataError(
            f"unsupported file type; expected a file ending in {', '.join(_FILE_SUFFIXES)} or a `datasets` directory",
            path=path,
        )
    if split is not None:
        raise DataError(f"split={split!r} given, but a single file has no splits", path=path)
    if path.endswith(".parquet"):
        return _read_with_datasets(path, None, cache_dir)
    return _read_json_file(path)


# ---------------------------------------------------------------------------
# Records -> problems


def _alternatives(field: FieldName) -> tuple[str, ...]:
    return (field,) if isinstance(field, str) else tuple(field)


def _lookup(row: Mapping[str, Any], field: FieldName | None) -> tuple[str | None, Any]:
    """(the field found, its value), or (None, None) when the row has none of the alternatives."""
    if field is None:
        return None, None
    for name in _alternatives(field):
        if name in row and row[name] is not None:
            return name, row[name]
    return None, None


def _field_label(field: FieldName) -> str:
    return " or ".join(_alternatives(field))


# Bad values raise ValueError in the helpers above and below; `_RowReader` re-raises
# them as a DataError naming the file, the line or row, and the field.


def _as_text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a string or a number, got {_preview(value)}")  # noqa: TRY004
    return value if isinstance(value, str) else str(value)


def normalize_level(level: Any) -> str | None:
    """2, "2", "Level 2" -> "2"; None -> None; any other text is kept stripped (e.g. "Level ?")."""
    if level is None:
        return None
    text = _as_text(level).strip()
    match = re.fullmatch(r"(?:level\s*)?(\d+)", text, flags=re.IGNORECASE)
    return str(int(match.group(1))) if match else text


class _RowReader:
    def __init__(self, mapping: FieldMapping, path: str):
        self.mapping = mapping
        self.path = path
        self.stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]

    def error(self, record: _Record, message: str, field: str | None = None) -> DataError:
        row = record.index if record.line is None else None
        return DataError(message, path=self.path, line=record.line, row=row, field=field)

    def required(self, record: _Record, field: FieldName) -> tuple[str, Any]:
        name, value = _lookup(record.value, field)
        if name is None:
            nulls = [n for n in _alternatives(field) if n in record.value]
            if nulls:
                raise self.error(record, "null", nulls[0])
            present = ", ".join(sorted(map(str, record.value))) or "none"
            raise self.error(record, f"missing (the record's fields: {present})", _field_label(field))
        return name, value

    def convert(self, record: _Record, name: str, value: Any, fn: Callable[[Any], str] | None) -> str:
        """The field's text; a required field must not be blank."""
        text = self.text(record, name, value, fn)
        if not text.strip():
            raise self.error(record, "empty", name)
        return text

    def text(self, record: _Record, name: str, value: Any, fn: Callable[[Any], str] | None) -> str:
        try:
            text = fn(value) if fn is not None else _as_text(value)
            if not isinstance(text, str):
                raise ValueError(f"the field's function returned {_preview(text)}, not a string")  # noqa: TRY004
        except ValueError as e:
            raise self.error(record, str(e), name) from None
        except Exception as e:  # a user's answer_fn / solution_fn failing otherwise: still name the record
            raise self.error(record, f"{type(e).__name__}: {e}", name) from e
        return text

    def optional(self, record: _Record, field: FieldName | None, fn=None) -> str | None:
        """The field's text, or None when the record lacks the field or it is blank."""
        name, value = _lookup(record.value, field)
        if name is None:
            return None
        text = self.text(record, name, value, fn)
        return text if text.strip() else None

    def problem(self, record: _Record) -> Problem | None:
        m = self.mapping
        if not isinstance(record.value, Mapping):
            raise self.error(record, f"expected a JSON object (a record), got {_preview(record.value)}")
        if m.keep_row is not None and not m.keep_row(record.value):
            return None
        name, value = self.required(record, m.question)
        question = self.convert(record, name, value, m.question_fn)
        solution = self.optional(record, m.solution, m.solution_fn)
        if m.answer is not None:
            name, value = self.required(record, m.answer)
            answer = self.convert(record, name, value, m.answer_fn)
        else:
            name, _ = self.required(record, m.solution)
            boxed = last_boxed(solution or "")
            if boxed is None or not boxed.strip():
                raise self.error(record, "no \\boxed{...} answer in the solution", name)
            answer = boxed.strip()
        level_name, level_value = _lookup(record.value, m.level)
        try:
            level = normalize_level(level_value)
        except ValueError as e:
            raise self.error(record, str(e), level_name) from None
        uid = self.optional(record, m.uid) or f"{self.stem}:{record.index}"
        subject = self.optional(record, m.subject)
        return Problem(uid=uid, question=question, answer=answer, solution=solution, level=level, subject=subject)


def _resolve_layout(layout: str | FieldMapping, first: _Record, path: str) -> FieldMapping:
    if isinstance(layout, FieldMapping):
        return layout
    if layout == "auto":
        if not isinstance(first.value, Mapping):
            raise DataError(
                f"expected a JSON object (a record), got {_preview(first.value)}",
                path=path,
                line=first.line,
                row=first.index if first.line is None else None,
            )
        name = detect_layout(first.value)
        if name is None:
            raise DataError(
                f"cannot detect the layout from the fields {sorted(map(str, first.value))}; "
                f"name the layout, one of {sorted(LAYOUTS)} (scripts/train.py: --config.dataset_name=...; "
                "Python: layout=..., or a FieldMapping of your own)",
                path=path,
            )
        return LAYOUTS[name]
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected 'auto', one of {sorted(LAYOUTS)}, or a FieldMapping")
    return LAYOUTS[layout]


def load_problems(
    path: str | os.PathLike,
    layout: str | FieldMapping = "auto",
    *,
    split: str | None = None,
    subjects: Iterable[str] | None = None,
    levels: Iterable[int | str] | None = None,
    max_question_chars: int | None = None,
    limit: int | None = None,
    cache_dir: str | None = None,
) -> list[Problem]:
    """Problems of a local file or `datasets` directory, in file order (see the module docstring).

    Args:
      path: a .jsonl / .json / .parquet file, or a local `datasets` directory
        (`save_to_disk` output, or a dataset repository folder).
      layout: "auto" (detected from the first record's fields), a name in `LAYOUTS`,
        or a `FieldMapping`.
      split: the split of a directory holding several; None if it holds one.
      subjects, levels, max_question_chars: keep only these problems (`filter_problems`).
      limit: keep the first `limit` problems left after filtering.
      cache_dir: `datasets`' cache for .parquet files and repository folders
        (default: its usual cache).

    Raises:
      DataError: an unreadable, empty or malformed file, a record missing a field,
        a field of the wrong type, duplicate uids, or no problem left after filtering;
        the message names the file, the line (JSON lines) or row, and the field.
    """
    path = os.fspath(path)
    if limit is not None and (not _is_int(limit) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    records = _read_records(path, split, cache_dir)
    first = next(records, None)
    if first is None:
        raise DataError("empty: no records", path=path)
    reader = _RowReader(_resolve_layout(layout, first, path), path)

    problems: list[Problem] = []
    seen: dict[str, _Record] = {}
    for record in _chain_first(first, records):
        problem = reader.problem(record)
        if problem is None:
            continue
        if problem.uid in seen:
            other = seen[problem.uid]
            where = f"line {other.line}" if other.line is not None else f"row {other.index}"
            raise reader.error(record, f"duplicate uid {problem.uid!r} (first at {where})")
        seen[problem.uid] = record
        problems.append(problem)
    if not problems:
        raise DataError(f"no problems: every record was skipped by layout {reader.mapping.name!r}", path=path)

    kept = filter_problems(problems, subjects=subjects, levels=levels, max_question_chars=max_question_chars)
    if not kept:
        raise DataError(
            f"no problem of {len(problems)} left after filtering with subjects={subjects!r}, "
            f"levels={levels!r}, max_question_chars={max_question_chars!r}",
            path=path,
        )
    return kept[:limit] if limit is not None else kept


def _chain_first(first: _Record, rest: Iterator[_Record]) -> Iterator[_Record]:
    yield first
    yield from rest


def filter_problems(
    problems: Iterable[Problem],
    *,
    subjects: Iterable[str] | None = None,
    levels: Iterable[int | str] | None = None,
    max_question_chars: int | None = None,
    max_question_tokens: int | None = None,
    tokenizer: Any = None,
) -> list[Problem]:
    """The problems (in order) whose subject, level and question length pass every given filter.

    subjects: subject names, compared case-insensitively; problems without a subject fail.
    levels: 2, "2" or "Level 2" (normalised as `normalize_level`); problems without a level fail.
    max_question_chars: len(question) <= this.
    max_question_tokens: the question's token count <= this, counted with
      `tokenizer.encode(question, add_special_tokens=False)` (a transformers tokenizer,
      or a `tokenizers.Tokenizer`).
    """
    subject_set = None if subjects is None else {_casefold_subject(s) for s in _as_collection(subjects, "subjects")}
    level_set = None if levels is None else {normalize_level(v) for v in _as_collection(levels, "levels")}
    for name, value in (("max_question_chars", max_question_chars), ("max_question_tokens", max_question_tokens)):
        if value is not None and (not _is_int(value) or value < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    if max_question_tokens is not None and tokenizer is None:
        raise ValueError("max_question_tokens needs a tokenizer")

    kept = []
    for p in problems:
        if subject_set is not None and (p.subject is None or _casefold_subject(p.subject) not in subject_set):
            continue
        if level_set is not None and (p.level is None or normalize_level(p.level) not in level_set):
            continue
        if max_question_chars is not None and len(p.question) > max_question_chars:
            continue
        if max_question_tokens is not None and _num_tokens(tokenizer, p.question) > max_question_tokens:
            continue
        kept.append(p)
    return kept


def _as_collection(values: Any, name: str) -> list[Any]:
    if isinstance(values, (str, int)):  # a single value where a collection was meant: accept it
        return [values]
    try:
        return list(values)
    except TypeError:
        raise ValueError(f"{name} must be a collection of values, got {values!r}") from None


def _casefold_subject(subject: Any) -> str:
    return _as_text(subject).strip().casefold()


def _num_tokens(tokenizer: Any, text: str) -> int:
    encoded = tokenizer.encode(text, add_special_tokens=False)
    return len(getattr(encoded, "ids", encoded))


# ---------------------------------------------------------------------------
# Shuffled, resumable batches


def shuffled_order(num_items: int, seed: int, epoch: int) -> list[int]:
    """The permutation of range(num_items) for (seed, epoch): indices sorted by BLAKE2b(seed, epoch, index).

    A hash rather than a library RNG, so the order is the same on every platform and
    every numpy / Python version: a checkpoint taken on one machine resumes on another.
    """
    prefix = f"{seed}:{epoch}:".encode()

    def key(i: int) -> bytes:
        return hashlib.blake2b(prefix + str(i).encode(), digest_size=8).digest()

    return sorted(range(num_items), key=key)


class ProblemLoader:
    """Deterministic shuffled epochs over a sequence of problems, resumable from a small state.

    Epoch e visits every problem once, in `shuffled_order(len(problems), seed, e)` (or in
    order if shuffle=False). `next_batch(n)` continues where the last batch stopped and
    wraps into the next epoch. `state()` is {"epoch", "position", "seed", "num_problems"}
    (JSON-serialisable); `restore(state)` on a loader over the same problems with the
    same seed continues exactly as the loader that produced it.
    """

    def __init__(self, problems: Sequence[Problem], *, seed: int, shuffle: bool = True):
        if len(problems) == 0:
            raise ValueError("ProblemLoader needs at least one problem, got an empty sequence")
        if not _is_int(seed):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self._problems = problems
        self._seed = seed
        self._shuffle = bool(shuffle)
        self._epoch = 0
        self._position = 0
        self._order_cache: tuple[int, list[int]] = (-1, [])

    def __len__(self) -> int:
        return len(self._problems)

    @property
    def epoch(self) -> int:
        return self._epoch

    def epoch_order(self, epoch: int) -> list[int]:
        """Indices into the problems, in the order epoch `epoch` visits them."""
        if self._order_cache[0] != epoch:
            n = len(self._problems)
            order = shuffled_order(n, self._seed, epoch) if self._shuffle else list(range(n))
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def next_batch(self, n: int) -> list[Problem]:
        """The next `n` problems; crosses into the next epoch (reshuffled) when this one ends."""
        if not _is_int(n) or n < 1:
            raise ValueError(f"batch size must be a positive integer, got {n!r}")
        batch: list[Problem] = []
        size = len(self._problems)
        while len(batch) < n:
            order = self.epoch_order(self._epoch)
            take = min(n - len(batch), size - self._position)
            batch.extend(self._problems[i] for i in order[self._position : self._position + take])
            self._position += take
            if self._position == size:
                self._epoch += 1
                self._position = 0
        return batch

    def state(self) -> dict[str, int]:
        """{"epoch", "position", "seed", "num_problems"}: plain ints, for a JSON checkpoint."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "seed": self._seed,
            "num_problems": len(self._problems),
        }

    def restore(self, state: Mapping[str, int]) -> None:
        """Continue from `state` (from `state()`). "seed" and "num_problems" are optional, checked if present."""
        if not isinstance(state, Mapping):
            raise TypeError(f"loader state must be a mapping, got {state!r}")
        values = {}
        for key in ("epoch", "position"):
            if key not in state:
                raise ValueError(f"loader state {dict(state)!r} has no {key!r}")
            value = state[key]
            if not _is_int(value) or value < 0:
                raise ValueError(f"loader state {key!r} must be a non-negative integer, got {value!r}")
            values[key] = value
        size = len(self._problems)
        if values["position"] >= size:
            raise ValueError(f"loader state position {values['position']} is not below the {size} problems")
        if "num_problems" in state and state["num_problems"] != size:
            raise ValueError(
                f"loader state is for {state['num_problems']!r} problems, this loader has {size}: "
                "restore into a loader over the same problems"
            )
        if "seed" in state and state["seed"] != self._seed:
            raise ValueError(f"loader state has seed {state['seed']!r}, this loader has seed {self._seed}")
        self._epoch = values["epoch"]
        self._position = values["position"]
