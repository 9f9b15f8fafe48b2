"""The console progress bar of a training run (tqdm): the step, the rate without the first step's compilation, and
the key figures of the latest metrics; drawn on the main process only."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from mathrl_jax.sharding.distributed import is_main_process
from mathrl_jax.train.reporting._metrics import check_step, scalar_metrics

if TYPE_CHECKING:
    from typing import Self  # Python >= 3.11; annotations only


class Progress:
    """A console progress bar (tqdm) over training steps, showing the key figures.

    Args:
      total_steps: the last step of the run.
      initial_step: where the bar starts (the resumed step).
      keys: the metrics shown after the bar, by their last name component
        ("rollout/accuracy" -> "accuracy"), when present in `update`'s metrics.
      disable: no output; also off on every process but the main one.
      file: where the bar is drawn (default stderr).
      desc: the bar's label. Until the first `update` it reads "compiling" (the first step compiles its
        programs), and the first step is left out of the rate: the ETA is the steps', not the compiler's.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        initial_step: int = 0,
        keys: Sequence[str] = ("rollout/accuracy", "rollout/rewards", "train/policy_loss"),
        disable: bool = False,
        file: IO[str] | None = None,
        desc: str = "",
    ) -> None:
        from tqdm import tqdm

        total_steps = check_step(total_steps)
        initial_step = check_step(initial_step)
        if initial_step > total_steps:
            raise ValueError(f"initial_step={initial_step} is after total_steps={total_steps}")
        if isinstance(keys, str):
            raise TypeError(f"keys={keys!r}: expected a sequence of metric names, not one string")
        self.keys = tuple(keys)
        short = [k.rsplit("/", 1)[-1] for k in self.keys]
        self._labels = {k: (s if short.count(s) == 1 else k) for k, s in zip(self.keys, short)}
        self._bar = tqdm(
            total=total_steps,
            initial=initial_step,
            disable=disable or not is_main_process(),
            file=file if file is not None else sys.stderr,
            unit="step",
            dynamic_ncols=True,
            desc=f"{desc} (compiling)" if desc else "compiling",
        )
        self._desc = desc
        self._compiled = False

    @property
    def step(self) -> int:
        return int(self._bar.n)

    def figures(self, metrics: Mapping[str, Any]) -> dict[str, str]:
        """{label: formatted value} of the key figures present in `metrics`."""
        present = {k: metrics[k] for k in self.keys if k in metrics}
        return {self._labels[k]: f"{v:.4g}" for k, v in scalar_metrics(present).items()}

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Moves the bar to `step` and shows the key figures of `metrics`."""
        step = check_step(step)
        if self._bar.disable:
            return
        self._bar.set_postfix(self.figures(metrics), refresh=False)
        if not self._compiled:  # the first step compiled: measure the rate from here
            self._compiled = True
            self._bar.reset(total=self._bar.total)
            self._bar.initial = self._bar.n = step
            self._bar.set_description(self._desc, refresh=False)
            self._bar.set_postfix(self.figures(metrics), refresh=False)
            self._bar.refresh()
            return
        if step > self._bar.n:
            self._bar.update(step - self._bar.n)
        else:
            self._bar.refresh()

    def write(self, message: str) -> None:
        """Prints a line above the bar without breaking it."""
        if not self._bar.disable:
            self._bar.write(message, file=self._bar.fp)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
