"""Training metrics: tensorboardX scalars, a JSONL log, optionally wandb, pass@k (the progress bar: `progress`).

`MetricsLogger(logdir).log(step, {"rollout/accuracy": 0.5, ...})` writes, on the
main process only (`mathrl_jax.sharding.distributed.is_main_process`):

- `<logdir>/events.out.tfevents.*`: one tensorboard scalar per metric, exactly as
  given (NaN and +-inf included);
- `<logdir>/metrics.jsonl`: one JSON object per `log` call,
  `{"step": 12, "time": <unix seconds>, "rollout/accuracy": 0.5, ...}`. Integers stay
  integers; a NaN or +-inf is written as `null` (strict JSON, which any reader
  parses). A logger opened with `resumed_from=k` (the training loop passes the
  iteration of the checkpoint it restored, 0 when it starts from scratch) first
  drops the records of steps after k, which the run logs again, so the file reads
  as one uninterrupted run; without it, records are appended, and a step logged
  twice reads as its later line.

Metric names are free strings; `_names.METRIC_NAMES` lists every name the training loop
logs (`mathrl_jax.train.loop`), named as in the reference systems (verl, OpenR,
AReaL) where they have one (and TRL's, in each meaning). A name with a `{k}` stands for a family
(`eval/pass@{k}`: `eval/pass@1`, `eval/pass@8`, ...); `documented_name` maps a
logged name to its entry. A custom `reward_fn`'s own `rollout/...` metrics are
logged too, under its names.

`log_completions(step, rows)` appends a completion table (`_dashboard.completion_rows`: TRL's `log_completions`) to
`<logdir>/completions.jsonl`, one JSON object per row, and sends it to the trackers: tensorboard as a text summary
(a Markdown table, tag `completions`), wandb as a `wandb.Table` (key `completions`). The file is strict JSON, as
metrics.jsonl: a NaN or +-inf reward or advantage is written as `null`, and a lone surrogate code point in a text
(a tokenizer's decode of a cut character, e.g. '\\ud800') as U+FFFD, the replacement character, in the file and
in the trackers alike (`printable_row`); neither stops the run.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import time
import warnings
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

import jax
import numpy as np

from mathrl_jax import files
from mathrl_jax.sharding.distributed import is_main_process
from mathrl_jax.train import run_directory

if TYPE_CHECKING:
    from typing import Self  # Python >= 3.11; annotations only

JSONL_NAME = run_directory.METRICS
COMPLETIONS_NAME = run_directory.COMPLETIONS
RESERVED_KEYS = ("step", "time")


_SURROGATE = re.compile("[\ud800-\udfff]")


def printable_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A completion-table row that strict JSON and UTF-8 writers take: each surrogate code point of a string
    (unpaired: a tokenizer's decode of a cut character; no valid UTF-8 holds one) replaced by U+FFFD."""
    return {k: _SURROGATE.sub("\ufffd", v) if isinstance(v, str) else v for k, v in row.items()}


def json_row(row: Mapping[str, Any]) -> str:
    """`row` as one line of strict JSON (`printable_row`'s strings; a NaN or +-inf float written as null)."""
    record = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in printable_row(row).items()}
    return json.dumps(record, allow_nan=False)


def check_step(step: Any, name: str = "step") -> int:
    if isinstance(step, bool) or not isinstance(step, (numbers.Integral, np.integer)) or step < 0:
        raise ValueError(f"{name}={step!r}: expected an int >= 0")
    return int(step)


def _host_scalar(name: str, value: Any) -> Any:
    """A metric value as a host NumPy scalar or Python number; one element or an error naming `name`."""
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        if not value.is_fully_replicated:
            raise ValueError(f"metric {name!r} is sharded across processes; reduce it to a replicated scalar first")
        value = value.addressable_data(0)
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.size != 1:
            raise ValueError(f"metric {name!r} has shape {array.shape}; a metric is one number")
        value = array.reshape(()).item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"metric {name!r} is a {type(value).__name__} ({value!r:.40}); expected a real number")


REPORT_TO = ("none", "tensorboard", "wandb")


def report_sinks(report_to: str) -> tuple[str, ...]:
    """The names in a `report_to` value ("tensorboard,wandb"), lower-cased; checked by `train.setup`'s validation."""
    return tuple(n.strip().lower() for n in str(report_to).split(",") if n.strip())


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, int | float]:
    """{name: int or float} of `metrics` (Python, NumPy or jax scalars, one device transfer).

    Raises ValueError / TypeError naming the metric that is not one real number,
    or whose name is not a non-empty string or is reserved ("step", "time").
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping of name -> number, got {type(metrics).__name__}")
    for name in metrics:
        if not isinstance(name, str) or not name:
            raise ValueError(f"metric name {name!r}: expected a non-empty string")
        if name in RESERVED_KEYS:
            raise ValueError(f"metric name {name!r} is reserved for the JSONL record; rename it")
    local = {k: v for k, v in metrics.items() if not (isinstance(v, jax.Array) and not v.is_fully_addressable)}
    fetched = jax.device_get(local)  # one transfer for every addressable device scalar
    return {k: _host_scalar(k, fetched.get(k, v)) for k, v in metrics.items()}


class MetricsLogger:
    """Writes scalar metrics to tensorboard event files and `<logdir>/metrics.jsonl`.

    Args:
      logdir: the run directory (created).
      tensorboard: write tensorboardX event files.
      jsonl: append to `<logdir>/metrics.jsonl`.
      wandb: None, or the `_wandb.WandbWriter` settings (`project`, `mode`, `recorded`): log the same
        values to a wandb run too (offline by default).
      main_process: whether this process writes; default `is_main_process()`. On
        the other processes `log` and `close` do nothing.
      resumed_from: the step the run resumes from (the iteration of the restored
        checkpoint; 0 for a run that starts over). The records of later steps already
        in `metrics.jsonl` (logged by the interrupted run, and logged again by this one)
        are dropped before anything is written: the file is rewritten whole
        (`files.atomic_write`), so a crash leaves either the old file or the new one.
        A last line cut short by a crash is dropped too. The tensorboard event files
        are not rewritten: the new event file starts with a purge marker at step
        `resumed_from + 1` (tensorboardX `purge_step`), which makes TensorBoard hide
        the old files' scalars of those steps; a reader of the raw event files still
        sees them. Each writer's event file name ends in the step it resumed from and
        its pid, so a writer opened within the second of another never overwrites its
        file, and TensorBoard reads them in order. None (the default): append,
        dropping nothing.

    Each `log` call is flushed to disk, so a crash loses no logged step.
    """

    def __init__(
        self,
        logdir: str,
        *,
        tensorboard: bool = True,
        jsonl: bool = True,
        wandb: Mapping[str, Any] | None = None,
        main_process: bool | None = None,
        resumed_from: int | None = None,
    ) -> None:
        self.logdir = os.path.abspath(os.fspath(logdir))
        self.active = is_main_process() if main_process is None else bool(main_process)
        self.jsonl_path = os.path.join(self.logdir, JSONL_NAME) if jsonl else None
        self.completions_path = os.path.join(self.logdir, COMPLETIONS_NAME) if jsonl else None
        self.resumed_from = None if resumed_from is None else check_step(resumed_from, "resumed_from")
        self._writer = None
        self._wandb = None
        self._jsonl: IO[str] | None = None
        self._closed = False
        if not self.active:
            return
        if os.path.exists(self.logdir) and not os.path.isdir(self.logdir):
            raise ValueError(f"log directory {self.logdir!r} exists and is not a directory")
        os.makedirs(self.logdir, exist_ok=True)
        if jsonl:
            if self.resumed_from is not None:
                drop_records_after(self.jsonl_path, self.resumed_from)
                drop_records_after(self.completions_path, self.resumed_from)  # its rows hold their step too
            self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = None if self.resumed_from is None else self.resumed_from + 1
            # tensorboardX names the file by the second and the host only: a second writer within that second
            # truncated the first's file (a resume right after a crash lost the whole run's scalars).
            suffix = f".r{self.resumed_from or 0:09d}.{os.getpid()}"
            self._writer = SummaryWriter(logdir=self.logdir, purge_step=purge, filename_suffix=suffix)
        if wandb is not None:
            from mathrl_jax.train.reporting._wandb import WandbWriter

            self._wandb = WandbWriter(self.logdir, resumed=bool(self.resumed_from), **wandb)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Records `metrics` (name -> real scalar: Python, NumPy or jax) at `step`."""
        if self._closed:
            raise RuntimeError(f"MetricsLogger({self.logdir!r}) is closed")
        if not self.active:
            return
        step = check_step(step)
        values = scalar_metrics(metrics)
        if self._writer is not None:
            for name, value in values.items():
                self._writer.add_scalar(name, float(value), global_step=step)
            self._writer.flush()
        if self._wandb is not None:
            self._wandb.log(step, values)
        if self._jsonl is not None:
            record: dict[str, Any] = {"step": step, "time": time.time()}
            for name, value in values.items():
                record[name] = value if isinstance(value, int) or math.isfinite(value) else None
            self._jsonl.write(json.dumps(record, allow_nan=False) + "\n")
            self._jsonl.flush()

    def log_completions(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Records a completion table at `step` (see the module docstring): `rows`, dicts of the columns of
        `_dashboard.TABLE_COLUMNS` (each with its "step"), appended to completions.jsonl and flushed."""
        from mathrl_jax.train.reporting._dashboard import TABLE_COLUMNS, markdown_table

        if self._closed:
            raise RuntimeError(f"MetricsLogger({self.logdir!r}) is closed")
        if not self.active or not rows:
            return
        step = check_step(step)
        rows = [printable_row(row) for row in rows]
        if self.completions_path is not None:
            with open(self.completions_path, "a", encoding="utf-8") as f:
                f.write("".join(json_row(row) + "\n" for row in rows))
        if self._writer is not None:
            self._writer.add_text("completions", markdown_table(rows), global_step=step)
            self._writer.flush()
        if self._wandb is not None:
            self._wandb.log_table(step, "completions", TABLE_COLUMNS, [[row[c] for c in TABLE_COLUMNS] for row in rows])

    def close(self) -> None:
        """Flushes and closes the files; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.close()
        if self._wandb is not None:
            self._wandb.close()
        if self._jsonl is not None:
            self._jsonl.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def drop_records_after(path: str, step: int) -> int:
    """Removes from the metrics file `path` the records of steps after `step`; returns how many it removed.

    The records of steps <= `step` keep their lines and their order. A last line cut
    short by a crash (no newline after it) goes too; any other line that is not a
    record is kept as it is (`read_jsonl_metrics` names it). The file is rewritten
    only if something changes, through `files.atomic_write`, so it is never half
    written. A missing file is left missing.
    """
    step = check_step(step)
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    kept, dropped = [], 0
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) - 1:  # no newline after it: a write that a crash interrupted
                dropped += 1
                continue
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > step:
            dropped += 1
            continue
        kept.append(line + "\n")
    if not dropped and "".join(kept) == text:
        return 0
    with files.atomic_write(path) as f:
        f.write("".join(kept))
    return dropped


def read_jsonl_metrics(path_or_run_dir: str) -> list[dict[str, Any]]:
    """The records of a `metrics.jsonl` (a file, or a run directory holding one), in file order.

    `null` values (non-finite at logging time) come back as None. A last line cut
    short by a crash is skipped with a warning; any other unreadable line is an
    error naming the file and line.
    """
    path = os.fspath(path_or_run_dir)
    if os.path.isdir(path) or not (os.path.exists(path) or path.endswith(".jsonl")):
        path = os.path.join(path, JSONL_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no metrics file at {path!r} (MetricsLogger writes <logdir>/{JSONL_NAME})")
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):  # no newline after it: a write that a crash interrupted
                warnings.warn(f"{path}:{number}: skipped an incomplete last line ({e})", stacklevel=2)
                continue
            raise ValueError(f"{path}:{number} is not a JSON object: {e}") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(  # noqa: TRY004 - bad file content, not a bad argument
                f"{path}:{number} is not a metrics record (a JSON object with an integer 'step')"
            )
        records.append(record)
    return records
