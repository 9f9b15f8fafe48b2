"""Reading the records of a local data file or `datasets` directory, and the `DataError` naming where one is bad.

`read_records(path, split, cache_dir)` yields `Record`s (index, JSON-lines line, value)
from `*.jsonl` / `*.json` (JSON lines or one JSON array), `*.parquet`, a `save_to_disk`
directory or a dataset repository folder; nothing is downloaded.

A JSON file is read as `datasets`' json loader reads it (lines end at "\\n" alone: a U+2028 inside a string
is part of the string; a UTF-8 byte order mark at the start is skipped), and what Python's `json` takes
silently but a data file cannot have meant is refused, each a `DataError` naming the file and line: a key
given twice in one object, `NaN` / `Infinity` / a number beyond a float (1e400), a lone surrogate escape
("\\ud800", text no tokenizer encodes), a line over `MAX_LINE_BYTES`. A path that is neither a regular file
nor a directory (a FIFO, whose opening waits for a writer; a device) is refused before it is opened.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from collections.abc import Iterator
from typing import Any

from mathrl_jax.errors import MathRLError


def _preview(value: Any, limit: int = 60) -> str:
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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

MAX_LINE_BYTES = 64 * 2**20
"""The longest line of a JSON lines file read here (64 MiB): a longer one is refused, naming its line, before it
is read whole (a record that size is no problem's; reading it would take the memory and time of a file)."""

_BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte order mark: an editor's mark at the start of a file, skipped (as `datasets` skips it)."""


class _NotJsonNumber(ValueError):
    """`NaN`, `Infinity`, `-Infinity`, or a number beyond float's range (1e400) in a JSON file: Python's `json`
    accepts them, JSON has no such numbers."""


class _DuplicateKey(ValueError):
    """An object naming one key twice: Python's `json` keeps the last silently, `datasets` another."""


def _refuse_constant(name: str):
    raise _NotJsonNumber(f"{name} is not a JSON number (a missing or broken value?)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJsonNumber(f"{text} is beyond the range of a (64-bit) number")
    return value


def _object_without_duplicates(pairs: list) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(f"duplicate key {key!r} in one object")
            seen.add(key)
    return value


def _lone_surrogate(value: Any) -> str | None:
    """The first string (or key) of `value` that is not Unicode text (a lone surrogate, from a \\ud800 escape)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def _parse(text: str, path: str, line: int | None):
    try:
        value = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            object_pairs_hook=_object_without_duplicates,
        )
    except json.JSONDecodeError as e:
        raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path=path, line=line or e.lineno) from None
    except (_NotJsonNumber, _DuplicateKey) as e:
        raise DataError(str(e), path=path, line=line) from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise DataError(f"malformed JSON: {e}", path=path, line=line) from None
    except RecursionError:
        raise DataError("malformed JSON: nested too deeply", path=path, line=line) from None
    if "\\u" in text:  # only an escape makes a lone surrogate: the text itself decoded from UTF-8
        bad = _lone_surrogate(value)
        if bad is not None:
            raise DataError(
                f"a string with a lone surrogate escape (not Unicode text): {_preview(bad)}", path=path, line=line
            )
    return value


def _decode(data: bytes, path: str, line: int | None) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = line if line is not None else data[: e.start].count(b"\n") + 1
        raise DataError(f"not UTF-8 text: byte 0x{data[e.start]:02x} cannot be decoded", path=path, line=line) from None


def _read_json_file(path: str) -> Iterator[Record]:
    """The records of a JSON lines file, or of a `.json` file holding one array.

    Lines end at "\\n" alone, as `datasets`' json loader reads them (a U+2028 inside a string is a character of
    the string, not a line break); a UTF-8 byte order mark at the start is skipped; no line is read past
    `MAX_LINE_BYTES`."""
    with open(path, "rb") as f:
        head = f.read(len(_BOM))
        if head != _BOM:
            f.seek(0)
        start = f.tell()
        first = b""
        while not first:  # the first byte that is not whitespace (b"" at the end of the file)
            chunk = f.read(1 << 16)
            first = chunk.lstrip()[:1]
            if not chunk:
                break
        f.seek(start)
        if path.endswith(".json") and first == b"[":
            for i, value in enumerate(_parse(_decode(f.read(), path, None), path, None)):
                yield Record(index=i, line=None, value=value)
            return
        index = 0
        line_number = 0
        while True:
            data = f.readline(MAX_LINE_BYTES + 1)
            if not data:
                return
            line_number += 1
            if len(data) > MAX_LINE_BYTES and not data.endswith(b"\n"):
                raise DataError(
                    f"a line of more than {MAX_LINE_BYTES} bytes (the limit: MAX_LINE_BYTES in "
                    "mathrl_jax/data/readers.py); a record that long is no problem's",
                    path=path,
                    line=line_number,
                )
            text = _decode(data, path, line_number)
            if not text.strip():
                continue
            yield Record(index=index, line=line_number, value=_parse(text, path, line_number))
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


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))
    kinds += ((stat.S_ISSOCK, "socket"),)
    return next((name for test, name in kinds if test(mode)), "special file")


def read_records(path: str, split: str | None, cache_dir: str | None) -> Iterator[Record]:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DataError("no such file or directory", path=path) from None
    except OSError as e:
        raise DataError(f"cannot be read: {e.strerror or e}", path=path) from None
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):  # opening a FIFO waits for a writer; a device never ends
        raise DataError(f"not a regular file or directory (a {_file_kind(mode)}): expected a data file", path=path)
    if stat.S_ISDIR(mode):
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
