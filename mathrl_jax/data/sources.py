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

Nothing is downloaded here: every path is local. (The training build resolves a dataset's Hub id to its
snapshot in the local Hugging Face cache first, downloading it unless HF_HUB_OFFLINE is set:
`models.hub.resolve_dataset_path`.)

Layouts (`LAYOUTS`, or a `FieldMapping` of your own):

| layout       | question   | gold answer                                     | solution   | level   | subject   | uid         |
|--------------|------------|-------------------------------------------------|------------|---------|-----------|-------------|
| `math500`    | `problem`  | `answer`, or `final_answer` (OpenR's copy)      | `solution` | `level` | `subject` | `unique_id` |
| `math`       | `problem`  | last `\\boxed{}` of `solution` (Hendrycks MATH) | `solution` | `level` | `type`    |             |
| `gsm8k`      | `question` | after the last `####` of `answer`, no commas    | before it  |         |           |             |
| `areal_boba` | `prompt`   | last `\\boxed{}` of the first of `solutions`    | that one   |         |           | `query_id`  |
| `verl`       | last user message of `prompt` (chat messages) | `reward_model.ground_truth` |  |  | `data_source` |  |
| `trl`        | `prompt`: a string, or chat messages kept whole | `answer`, `ground_truth` or `solution` (`trl_answer`) | `solution`, or before `####` |  |  |  |

`trl` is TRL's and open-r1's layout (`prompt` + a gold-answer column). The first of `answer`, `ground_truth`,
`solution` a record has is read by `trl_answer`: a GSM8K answer ("... #### 72") gives the text after `####`;
a text with a `\\boxed{}` (open-r1's worked `solution`) gives its last boxed content, and is the worked
solution; anything else (a bare answer: "72", 72, "\\frac{1}{2}") is the answer as it is. A `prompt` of chat
messages (`[{"role": "system", ...}, {"role": "user", ...}]`) is kept whole as `Problem.messages`, the
question being the last user message's text; the prompt is then the tokenizer's chat template over them
(`data.prompts.format_messages`).

A layout of your own: a `FieldMapping`, or `parse_fields("question:problem,answer:gold")` (the training
program's `--config.data.fields`; roles question, answer, solution, uid, level, subject).

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

The code lives in one module per concept, all re-exported here: `readers` (records
of files and directories, `DataError`), `layouts` (`Problem`, `FieldMapping`,
`LAYOUTS`, `detect_layout`, `parse_fields`), `records` (records -> checked `Problem`s), `filters`
(`filter_problems`, MATH subjects), `loader` (`ProblemLoader`, `shuffled_order`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from mathrl_jax.data.filters import MATH_SUBJECTS, filter_by_subject, filter_problems, subject_key
from mathrl_jax.data.layouts import (
    LAYOUTS,
    FieldMapping,
    FieldName,
    Problem,
    boba_answer,
    chat_messages,
    detect_layout,
    gsm8k_final_answer,
    gsm8k_rationale,
    is_int,
    normalize_level,
    parse_fields,
    trl_answer,
    trl_solution,
    verl_ground_truth,
    verl_question,
)
from mathrl_jax.data.loader import ProblemLoader, shuffled_order
from mathrl_jax.data.readers import DataError, Record, read_records
from mathrl_jax.data.records import RowReader, resolve_layout
from mathrl_jax.rewards.extraction import last_boxed

__all__ = [
    "LAYOUTS",
    "MATH_SUBJECTS",
    "DataError",
    "FieldMapping",
    "FieldName",
    "Problem",
    "ProblemLoader",
    "boba_answer",
    "chat_messages",
    "detect_layout",
    "filter_by_subject",
    "filter_problems",
    "gsm8k_final_answer",
    "gsm8k_rationale",
    "last_boxed",
    "load_problems",
    "normalize_level",
    "parse_fields",
    "shuffled_order",
    "subject_key",
    "trl_answer",
    "trl_solution",
    "verl_ground_truth",
    "verl_question",
]


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
    if limit is not None and (not is_int(limit) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    records = read_records(path, split, cache_dir)
    first = next(records, None)
    if first is None:
        raise DataError("empty: no records", path=path)
    reader = RowReader(resolve_layout(layout, first, path), path)

    problems: list[Problem] = []
    seen: dict[str, Record] = {}
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


def _chain_first(first: Record, rest: Iterator[Record]) -> Iterator[Record]:
    yield first
    yield from rest
