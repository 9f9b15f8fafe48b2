"""Weights & Biases as an optional second sink of `MetricsLogger` (`config.report_to` including "wandb").

Offline by default (`mode="offline"`): the run is written under `<run_dir>/wandb/` and nothing leaves the machine
while training, as everything else in a run; `wandb sync <run_dir>/wandb/offline-run-*` uploads it later.
`mode="online"` logs live. The run's id is derived from the run directory's real path, so a resumed run continues
the same wandb run (`resume="allow"`); the steps it logs again after a resume carry the values of the
uninterrupted run (resume is exact), and wandb keeps one value per step.

`wandb` is an extra (`pip install -e '.[wandb]'`; `[dev]` installs it for the tests), imported only here.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Mapping

MODES = ("offline", "online")


def run_id(logdir: str) -> str:
    """The wandb run id of a run directory: stable across resumes, distinct between directories."""
    return "mathrl-" + hashlib.sha256(os.path.realpath(logdir).encode()).hexdigest()[:16]


class WandbWriter:
    """`log(step, {name: number})` into one wandb run; `close()` finishes it."""

    def __init__(self, logdir: str, *, project: str, mode: str = "offline", config: Mapping[str, Any] | None = None):
        if mode not in MODES:
            raise ValueError(f"wandb mode {mode!r}; expected one of {MODES}")
        import wandb

        self.run = wandb.init(
            project=project,
            name=os.path.basename(os.path.normpath(logdir)),
            id=run_id(logdir),
            dir=logdir,
            mode=mode,
            config=dict(config or {}),
            resume="allow",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, step: int, values: Mapping[str, int | float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self) -> None:
        self.run.finish()
