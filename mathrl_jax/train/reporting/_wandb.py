"""Weights & Biases as an optional second sink of `MetricsLogger` (`config.report_to` including "wandb").

Offline by default (`mode="offline"`): the run is written under `<run_dir>/wandb/` and nothing leaves the machine
while training, as everything else in a run; `wandb sync <run_dir>/wandb/offline-run-*` uploads it later.
`mode="online"` logs live. A run that starts from scratch gets a new wandb run id, kept in `<run_dir>/wandb/run_id`;
a resumed run reads it there and continues that wandb run (`resume="allow"`). wandb keeps the first value logged at
a step: the steps a resumed run logs again (after its checkpoint, before the crash) keep the interrupted run's
values, which equal the resumed run's (resume is exact) except the timings.

`wandb` is an extra (`pip install -e '.[wandb]'`; `[dev]` installs it for the tests), imported only here.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Mapping

from mathrl_jax import files
from mathrl_jax.train import run_directory

MODES = ("offline", "online")


def run_id(logdir: str, resumed: bool) -> str:
    """The wandb run id of a run directory: the one saved there when `resumed`, else a new one (saved)."""
    path = os.path.join(logdir, run_directory.WANDB, "run_id")
    if resumed and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    new = "mathrl-" + uuid.uuid4().hex[:16]
    with files.atomic_write(path) as f:
        f.write(new)
    return new


class WandbWriter:
    """`log(step, {name: number})` into one wandb run; `close()` finishes it."""

    def __init__(
        self,
        logdir: str,
        *,
        project: str,
        mode: str = "offline",
        recorded: Mapping[str, Any] | None = None,
        resumed: bool = False,
    ):
        """`recorded`: the run's settings as a plain mapping (the whole config), shown beside the run's metrics."""
        if mode not in MODES:
            raise ValueError(f"wandb mode {mode!r}; expected one of {MODES}")
        import wandb

        self.run = wandb.init(
            project=project,
            name=os.path.basename(os.path.normpath(logdir)),
            id=run_id(logdir, resumed),
            dir=logdir,
            mode=mode,
            config=dict(recorded or {}),
            resume="allow",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, step: int, values: Mapping[str, int | float]) -> None:
        self.run.log(dict(values), step=step)

    def log_table(self, step: int, key: str, columns, data) -> None:
        """A `wandb.Table` of `columns` and rows `data` at `step`, under `key` (the completion table)."""
        import wandb

        self.run.log({key: wandb.Table(columns=list(columns), data=[list(row) for row in data])}, step=step)

    def close(self) -> None:
        self.run.finish()
