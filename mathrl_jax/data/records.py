"""Records -> problems: a layout's fields looked up in each record, checked, and made a `Problem`.

Bad values raise `DataError` naming the file, the line (JSON lines) or row, and the field.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from mathrl_jax.data.layouts import (
    LAYOUTS,
    FieldMapping,
    FieldName,
    Problem,
    as_text,
    chat_messages,
    detect_layout,
    normalize_level,
    preview,
)
from mathrl_jax.data.readers import DataError, Record
from mathrl_jax.rewards.extraction import last_boxed

MAX_PROMPT_CHARS = 4 * 2**20
"""The longest prompt (question, or chat messages' contents together) read as a problem: 4 Mi characters, a
million tokens and more, over any model's context. A longer one is refused where it is read, before a tokenizer
spends minutes on it to find it too long."""


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


# Bad values raise ValueError in the layouts' field functions and in `as_text` / `normalize_level`;
# `RowReader` re-raises them as a DataError naming the file, the line or row, and the field.


class RowReader:
    def __init__(self, mapping: FieldMapping, path: str):
        self.mapping = mapping
        self.path = path
        self.stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]

    def error(self, record: Record, message: str, field: str | None = None) -> DataError:
        row = record.index if record.line is None else None
        return DataError(message, path=self.path, line=record.line, row=row, field=field)

    def required(self, record: Record, field: FieldName) -> tuple[str, Any]:
        name, value = _lookup(record.value, field)
        if name is None:
            nulls = [n for n in _alternatives(field) if n in record.value]
            if nulls:
                raise self.error(record, "null", nulls[0])
            present = ", ".join(sorted(map(str, record.value))) or "none"
            raise self.error(record, f"missing (the record's fields: {present})", _field_label(field))
        return name, value

    def convert(self, record: Record, name: str, value: Any, fn: Callable[[Any], str] | None) -> str:
        """The field's text; a required field must not be blank."""
        text = self.text(record, name, value, fn)
        if not text.strip():
            raise self.error(record, "empty", name)
        return text

    def text(self, record: Record, name: str, value: Any, fn: Callable[[Any], str] | None) -> str:
        try:
            text = fn(value) if fn is not None else as_text(value)
            if not isinstance(text, str):
                raise ValueError(f"the field's function returned {preview(text)}, not a string")  # noqa: TRY004
        except ValueError as e:
            raise self.error(record, str(e), name) from None
        except Exception as e:  # a user's answer_fn / solution_fn failing otherwise: still name the record
            raise self.error(record, f"{type(e).__name__}: {e}", name) from e
        return text

    def optional(self, record: Record, field: FieldName | None, fn=None) -> str | None:
        """The field's text, or None when the record lacks the field or it is blank."""
        name, value = _lookup(record.value, field)
        if name is None:
            return None
        text = self.text(record, name, value, fn)
        return text if text.strip() else None

    def problem(self, record: Record) -> Problem | None:
        m = self.mapping
        if not isinstance(record.value, Mapping):
            raise self.error(record, f"expected a JSON object (a record), got {preview(record.value)}")
        if m.keep_row is not None and not m.keep_row(record.value):
            return None
        name, value = self.required(record, m.question)
        question = self.convert(record, name, value, m.question_fn)
        messages = None
        if m.chat_messages:  # chat messages are kept whole for the chat template (the question read them already)
            try:
                messages = chat_messages(value)
            except ValueError as e:
                raise self.error(record, str(e), name) from None
        size = len(question) if messages is None else sum(len(message["content"]) for message in messages)
        if size > MAX_PROMPT_CHARS:
            raise self.error(
                record,
                f"a prompt of {size} characters, over the limit of {MAX_PROMPT_CHARS} (MAX_PROMPT_CHARS in "
                "mathrl_jax/data/records.py: more than any model's context holds)",
                name,
            )
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
        return Problem(
            uid=uid,
            question=question,
            answer=answer,
            solution=solution,
            level=level,
            subject=subject,
            messages=messages,
        )


def resolve_layout(layout: str | FieldMapping, first: Record, path: str) -> FieldMapping:
    if isinstance(layout, FieldMapping):
        return layout
    if layout == "auto":
        if not isinstance(first.value, Mapping):
            raise DataError(
                f"expected a JSON object (a record), got {preview(first.value)}",
                path=path,
                line=first.line,
                row=first.index if first.line is None else None,
            )
        name = detect_layout(first.value)
        if name is None:
            raise DataError(
                f"cannot detect the layout from the fields {sorted(map(str, first.value))}; "
                f"name the layout, one of {sorted(LAYOUTS)} (scripts/train.py: --config.dataset_name=...), or "
                "map its fields (scripts/train.py: --config.data.fields=question:FIELD,answer:FIELD; Python: "
                "layout=FieldMapping(...) or data.layouts.parse_fields(...))",
                path=path,
            )
        return LAYOUTS[name]
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected 'auto', one of {sorted(LAYOUTS)}, or a FieldMapping")
    return LAYOUTS[layout]
