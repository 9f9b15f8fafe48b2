"""Training metrics: tensorboardX scalars, a JSONL log, a console progress bar, pass@k.

`MetricsLogger(logdir).log(step, {"rollout/accuracy": 0.5, ...})` writes, on the
main process only (`mathrl_jax.sharding.distributed.is_main_process`):

- `<logdir>/events.out.tfevents.*`: one tensorboard scalar per metric, exactly as
  given (NaN and +-inf included);
- `<logdir>/metrics.jsonl`: one JSON object per `log` call,
  `{"step": 12, "time": <unix seconds>, "rollout/accuracy": 0.5, ...}`. Integers stay
  integers; a NaN or +-inf is written as `null` (strict JSON, which any reader
  parses). A resumed run appends to the same file, so a step may appear twice:
  the later line is the newer value.

Metric names are free strings; `METRIC_NAMES` lists the standard ones, named as
in the reference systems (verl, OpenR, AReaL) so that their users find them.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

import jax
import numpy as np

from mathrl_jax.sharding.distributed import is_main_process

if TYPE_CHECKING:
    from typing import Self  # Python >= 3.11; annotations only

JSONL_NAME = "metrics.jsonl"
RESERVED_KEYS = ("step", "time")

METRIC_NAMES: dict[str, str] = {
    # rollout: the batch of sampled responses
    "rollout/rewards": "mean reward a response earned (verifier score plus PRM step scores), over real rows",
    "rollout/prm_reward": "mean sum of a response's PRM step scores (reward_source with 'prm')",
    "rollout/rewards_std": "standard deviation of the sequence rewards",
    "rollout/accuracy": "fraction of responses the verifier grades correct",
    "rollout/response_length": "mean response length, in tokens",
    "rollout/response_length_max": "longest response, in tokens",
    "rollout/prompt_length": "mean prompt length, in tokens",
    "rollout/truncated_fraction": "fraction of responses cut at the maximum length (verl `response_length/clip_ratio`)",
    "rollout/advantages": "mean advantage over response tokens",
    "rollout/returns": "mean return over response tokens",
    "rollout/values": "mean critic value over response tokens",
    "rollout/kept_groups": "prompt groups kept by dynamic filtering (DAPO)",
    "rollout/staleness": "policy versions between sampling and update (asynchronous PPO, AReaL)",
    # train: the update (means over the ppo_epoch x num_mini_batch minibatches)
    "train/loss": "total loss that was differentiated",
    "train/policy_loss": "clipped surrogate policy loss (verl `actor/pg_loss`)",
    "train/value_loss": "critic loss (verl `critic/vf_loss`)",
    "train/entropy_loss": "mean token entropy of the policy (OpenR `entropy_loss`)",
    "train/kl": "KL(pi || pi_ref) to the reference policy (verl `actor/kl_loss`)",
    "train/kl_coef": "coefficient of the KL term",
    "train/approx_kl": "mean of (r - 1) - log r, r = pi / pi_old, over tokens (over steps for APPO): OpenR's KL skip",
    "train/clip_fraction": "fraction of tokens whose ratio was clipped (verl `actor/pg_clipfrac`)",
    "train/value_clip_fraction": "fraction of tokens whose value was clipped (verl `critic/vf_clipfrac`)",
    "train/importance_weight": "mean ratio pi / pi_old over response tokens",
    "train/explained_variance": "1 - Var(returns - values) / Var(returns) of the critic",
    "train/grad_norm": "global L2 norm of the gradient before clipping",
    "train/kl_skipped_fraction": "fraction of minibatches whose approx-KL exceeded target_kl: no policy step (OpenR)",
    "train/learning_rate": "learning rate of the step",
    # eval: held-out problems
    "eval/accuracy": "fraction of evaluation problems answered correctly (greedy or one sample)",
    "eval/pass_at_k": "unbiased pass@k on the evaluation problems (Chen et al. 2021)",
    "eval/response_length": "mean evaluation response length, in tokens",
    # perf: throughput
    "perf/step_time": "seconds of the whole training step",
    "perf/rollout_time": "seconds spent sampling",
    "perf/update_time": "seconds spent in the update",
    "perf/tokens_per_second": "prompt + response tokens processed per second of the step",
}


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, (numbers.Integral, np.integer)) or step < 0:
        raise ValueError(f"step={step!r}: expected an int >= 0")
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
      main_process: whether this process writes; default `is_main_process()`. On
        the other processes `log` and `close` do nothing.

    Each `log` call is flushed to disk, so a crash loses no logged step.
    """

    def __init__(
        self, logdir: str, *, tensorboard: bool = True, jsonl: bool = True, main_process: bool | None = None
    ) -> None:
        self.logdir = os.path.abspath(os.fspath(logdir))
        self.active = is_main_process() if main_process is None else bool(main_process)
        self.jsonl_path = os.path.join(self.logdir, JSONL_NAME) if jsonl else None
        self._writer = None
        self._jsonl: IO[str] | None = None
        self._closed = False
        if not self.active:
            return
        if os.path.exists(self.logdir) and not os.path.isdir(self.logdir):
            raise ValueError(f"log directory {self.logdir!r} exists and is not a directory")
        os.makedirs(self.logdir, exist_ok=True)
        if jsonl:
            self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(logdir=self.logdir)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Records `metrics` (name -> real scalar: Python, NumPy or jax) at `step`."""
        if self._closed:
            raise RuntimeError(f"MetricsLogger({self.logdir!r}) is closed")
        if not self.active:
            return
        step = _check_step(step)
        values = scalar_metrics(metrics)
        if self._writer is not None:
            for name, value in values.items():
                self._writer.add_scalar(name, float(value), global_step=step)
            self._writer.flush()
        if self._jsonl is not None:
            record: dict[str, Any] = {"step": step, "time": time.time()}
            for name, value in values.items():
                record[name] = value if isinstance(value, int) or math.isfinite(value) else None
            self._jsonl.write(json.dumps(record, allow_nan=False) + "\n")
            self._jsonl.flush()

    def close(self) -> None:
        """Flushes and closes the files; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.close()
        if self._jsonl is not None:
            self._jsonl.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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


class Progress:
    """A console progress bar (tqdm) over training steps, showing the key figures.

    Args:
      total_steps: the last step of the run.
      initial_step: where the bar starts (the resumed step).
      keys: the metrics shown after the bar, by their last name component
        ("rollout/accuracy" -> "accuracy"), when present in `update`'s metrics.
      disable: no output; also off on every process but the main one.
      file: where the bar is drawn (default stderr).
    """

    def __init__(
        self,
        total_steps: int,
        *,
        initial_step: int = 0,
        keys: Sequence[str] = ("rollout/accuracy", "rollout/rewards", "train/policy_loss"),
        disable: bool = False,
        file: IO[str] | None = None,
    ) -> None:
        from tqdm import tqdm

        total_steps = _check_step(total_steps)
        initial_step = _check_step(initial_step)
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
        )

    @property
    def step(self) -> int:
        return int(self._bar.n)

    def figures(self, metrics: Mapping[str, Any]) -> dict[str, str]:
        """{label: formatted value} of the key figures present in `metrics`."""
        present = {k: metrics[k] for k in self.keys if k in metrics}
        return {self._labels[k]: f"{v:.4g}" for k, v in scalar_metrics(present).items()}

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Moves the bar to `step` and shows the key figures of `metrics`."""
        step = _check_step(step)
        if self._bar.disable:
            return
        self._bar.set_postfix(self.figures(metrics), refresh=False)
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


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k from `num_correct` correct answers among `num_samples` samples of one problem.

        pass@k = 1 - C(n - c, k) / C(n, k)

    the probability that a random k-subset of the n samples holds a correct one
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1).
    Computed in exact integer arithmetic, (C(n, k) - C(n - c, k)) / C(n, k), so the
    result is the exact value rounded once to a float. Average it over problems for
    a data set's pass@k.
    """
    for name, value in (("num_samples", num_samples), ("num_correct", num_correct), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
            raise TypeError(f"{name}={value!r}: expected an int")
    n, c, k = int(num_samples), int(num_correct), int(k)
    if n < 1:
        raise ValueError(f"num_samples={n}: expected >= 1")
    if not 0 <= c <= n:
        raise ValueError(f"num_correct={c}: expected 0 <= num_correct <= num_samples={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: expected 1 <= k <= num_samples={n}")
    total = math.comb(n, k)
    return (total - math.comb(n - c, k)) / total  # int / int: correctly rounded
