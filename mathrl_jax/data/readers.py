"""Reading the records of a local data file or `datasets` directory, and the `DataError` naming where one is bad.

`read_records(path, split, cache_dir)` yields `Record`s (index, JSON-lines line, value)
from `*.jsonl` / `*.json` (JSON lines or one JSON array), `*.parquet`, a `save_to_disk`
directory or a dataset repository folder; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

from mathrl_jax.errors import MathRLError


class DataError(MathRLError, ValueError):
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
class Record:
    index: int  # 0-based among records
    line: int | None  # 1-based line of a JSON lines file
    value: Any


_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


class _NotJsonNumber(ValueError):
    """`NaN`, `Infinity` or `-Infinity` in a JSON file: Python's `json` accepts them, JSON does not."""


def _refuse_constant(name: str):
    raise _NotJsonNumber(name)


def _parse(text: str, path: str, line: int | None):
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path=path, line=line or e.lineno) from None
    except _NotJsonNumber as e:
        raise DataError(f"{e} is not a JSON number (a missing or broken value?)", path=path, line=line) from None


def _read_json_file(path: str) -> Iterator[Record]:
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"not UTF-8 text: byte 0x{data[e.start]:02x} cannot be decoded", path=path, line=line) from None
    stripped = text.lstrip()
    if path.endswith(".json") and stripped.startswith("["):
        for i, value in enumerate(_parse(text, path, None)):
            yield Record(index=i, line=None, value=value)
        return
    index = 0
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        yield Record(index=index, line=line_number, value=_parse(line, path, line_number))
        index += 1


def _is_saved_dataset(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, name)) for name in ("dataset_dict.json", "state.json"))


def _pick_split(dataset: Any, split: str | None, path: str) -> Any:
    import datasets

    if isinstance(dataset, datasets.DatasetDict):
        names = sorted(dataset)
        if split is None:
            if len(names) != 1:
                raise DataError(
                    f"several splits {names}: pass split= one of them (train.py: --config.dataset_split, "
                    "--config.eval_dataset_split)",
                    path=path,
                )
            split = names[0]
        if split not in dataset:
            raise DataError(f"no split {split!r}; the splits are {names}", path=path)
        return dataset[split]
    if split is not None:
        raise DataError(f"split={split!r} given, but this dataset has no splits", path=path)
    return dataset


def _read_with_datasets(path: str, split: str | None, cache_dir: str | None) -> Iterator[Record]:
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
        yield Record(index=i, line=None, value=value)


def read_records(path: str, split: str | None, cache_dir: str | None) -> Iterator[Record]:
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
