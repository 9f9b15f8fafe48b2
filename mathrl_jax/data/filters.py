"""Keeping some problems: by MATH subject, level, and question length in characters or tokens."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from mathrl_jax.data.layouts import Problem, as_text, is_int, normalize_level

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
        if value is not None and (not is_int(value) or value < 1):
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
    return as_text(subject).strip().casefold()


def _num_tokens(tokenizer: Any, text: str) -> int:
    encoded = tokenizer.encode(text, add_special_tokens=False)
    return len(getattr(encoded, "ids", encoded))
