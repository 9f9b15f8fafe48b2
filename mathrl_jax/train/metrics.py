"""Training metrics: tensorboardX scalars, a JSONL log, a console progress bar, pass@k.

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

Metric names are free strings; `METRIC_NAMES` lists every name the training loop
logs (`mathrl_jax.train.loop`), named as in the reference systems (verl, OpenR,
AReaL) where they have one. A name with a `{k}` stands for a family
(`eval/pass@{k}`: `eval/pass@1`, `eval/pass@8`, ...); `documented_name` maps a
logged name to its entry. A custom `reward_fn`'s own `rollout/...` metrics are
logged too, under its names.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

import jax
import numpy as np

from mathrl_jax import files
from mathrl_jax.sharding.distributed import is_main_process

if TYPE_CHECKING:
    from typing import Self  # Python >= 3.11; annotations only

JSONL_NAME = "metrics.jsonl"
RESERVED_KEYS = ("step", "time")

METRIC_NAMES: dict[str, str] = {
    # rollout: the batch of sampled responses (real rows only: not a multi-turn batch's padding)
    "rollout/rewards": "mean reward a response earned (verifier score plus PRM step scores)",
    "rollout/function/{name}": "mean score of reward function {name} (reward.functions), before its weight",
    "rollout/accuracy": (
        "fraction of responses the verifier grades correct (multi-turn: of episodes won; absent where nothing "
        "grades: reward functions alone, or a custom reward_fn that does not report `reward/accuracy`)"
    ),
    "rollout/response_length": "mean response length, in tokens",
    "rollout/truncated_fraction": "fraction of responses cut at max_new_tokens (verl `response_length/clip_ratio`)",
    "rollout/no_answer_rate": "fraction of responses with no final answer to grade (absent if the reward does not say)",
    "rollout/grader_timeouts": "responses whose grading ran past reward.timeout_s (graded incorrect)",
    "rollout/prm_reward": "mean sum of a response's PRM step scores (reward_source with 'prm')",
    "rollout/sampler_logprob_diff": (
        "mean |trainer - sampler| log-prob of the response tokens (sampler-trainer mismatch), when the trainer "
        "recomputes the old log-probs (old_logprobs) and the sampler filters no tokens (top_p 1, no top_k)"
    ),
    "rollout/sampler_ratio_outside": (
        "share of response tokens whose pi_trainer / pi_sampler is outside [0.5, 2] (as sampler_logprob_diff)"
    ),
    "rollout/sampler_kl_sampler_trainer": (
        "mean log pi_sampler - log pi_trainer over response tokens, a k1 estimate of KL(sampler || trainer)"
    ),
    "rollout/tis_weight_mean": "mean truncated importance weight min(pi_trainer / pi_sampler, tis_cap) (tis_cap)",
    "rollout/tis_truncated_fraction": "share of response tokens whose weight was cut to tis_cap (tis_cap)",
    "rollout/episode_return": "mean undiscounted return of an episode (multi-turn env_name)",
    "rollout/episode_turns": "mean turns per episode (multi-turn env_name)",
    "dapo/kept_fraction": "fraction of responses kept by DAPO's group filter (the others are masked out)",
    # async: how far the rollouts are behind the learner (every loop; 0 in the synchronous one)
    "async/staleness": "policy versions between the policy that sampled the batch and the one it updates (AReaL)",
    "async/policy_version": "version of the policy that sampled the batch (the oldest turn's, multi-turn)",
    # train: the update, averaged over the ppo_epoch x num_mini_batch minibatches (weighted by their tokens). The
    # per-token means are over the rows that train: with skip_zero_advantage, those with a non-zero advantage.
    "train/loss": "the policy objective differentiated: policy loss - entropy_coef x entropy + kl_coef x kl",
    "train/policy_loss": "policy-gradient loss (verl `actor/pg_loss`)",
    "train/entropy_loss": (
        "mean token entropy of the policy (OpenR's `entropy_loss`; a mean over actions with APPO's action ratio), "
        "not multiplied by entropy_coef"
    ),
    "train/kl": "KL(pi || pi_ref) to the reference policy, kl_kind estimator (with kl_coef > 0; verl `actor/kl_loss`)",
    "train/approx_kl": (
        "mean of (r - 1) - log r, r = pi / pi_old, over tokens (over actions for APPO): OpenR's KL skip, which "
        "compares it with target_kl"
    ),
    "train/ppo_kl": (
        "mean of log pi_old - log pi over tokens (verl `actor/ppo_kl`; pi_old is the proximal policy for "
        "async_ppo); not logged with APPO's action ratio"
    ),
    "train/clip_fraction": "fraction of tokens whose clipped term is the active one (verl `actor/pg_clipfrac`)",
    "train/clip_fraction_high": "fraction of tokens with A > 0 and a ratio above 1 + clip_high",
    "train/clip_fraction_low": "fraction of tokens with A < 0 and a ratio below 1 - clip_low",
    "train/dual_clip_fraction": "fraction of tokens bounded by the dual clip (clip_c; 0 without it)",
    "train/importance_weight": "mean ratio pi / pi_old over response tokens",
    "train/importance_weight_max": "largest ratio pi / pi_old of a response token",
    "train/trained_token_fraction": (
        "fraction of the response tokens in rows the update trained on (below 1 with skip_zero_advantage: rows "
        "whose every advantage is 0 are left out of its passes)"
    ),
    "train/grad_norm": "global L2 norm of the policy gradient before clipping",
    "train/applied_fraction": "fraction of minibatches whose policy step was taken (finite, approx-KL <= target_kl)",
    "train/kl_skipped_fraction": "fraction of minibatches whose approx-KL exceeded target_kl: no policy step (OpenR)",
    "train/skipped_updates": "minibatch steps skipped for a non-finite loss or gradient (policy or critic)",
    "train/update_step": (
        "updates of the policy so far (`TrainState.step`): one per iteration, each of ppo_epoch x num_mini_batch "
        "optimizer steps"
    ),
    "train/behaviour_weight_mean": "mean pi_prox / pi_behaviour of the tokens kept (async_ppo's decoupled loss)",
    "train/behaviour_kl": "mean log pi_prox - log pi_behaviour of the tokens kept (async_ppo)",
    "train/behaviour_capped_fraction": "fraction of tokens dropped by behaviour_weight_cap (async_ppo)",
    # train, critic (ppo, appo, tppo)
    "train/value_loss": "critic loss (verl `critic/vf_loss`)",
    "train/value_grad_norm": "global L2 norm of the critic gradient before clipping",
    "train/value_clip_fraction": "fraction of value entries whose clipped term is active (verl `critic/vf_clipfrac`)",
    "train/value_mean": "mean critic value over the entries it is trained on",
    "train/value_explained_variance": "1 - Var(returns - values) / Var(returns) of the critic",
    # eval: held-out problems, every eval_interval iterations and at the end
    "eval/accuracy": "fraction of evaluation problems answered correctly by greedy decoding",
    "eval/response_length": "mean greedy evaluation response length, in tokens",
    "eval/pass@{k}": (
        "unbiased pass@k (Chen et al. 2021) from eval_n_samples samples at the RL temperature, for k in 1, 4, 8 "
        "and eval_n_samples (k <= eval_n_samples), at the first and last evaluation; pass@1 is the sampled accuracy"
    ),
    # perf: throughput
    "perf/step_time": "seconds of the whole iteration (without the evaluation)",
    "perf/generate_time": "seconds the batch took to sample and grade (in the generator thread for async_ppo)",
    "perf/wait_time": "seconds the learner waited for its batch",
    "perf/grade_time": "seconds of perf/generate_time spent computing the rewards (verifier, or a custom reward_fn)",
    "perf/logprob_time": "seconds of the trainer's passes before the update: old (unless taken from the sampler, "
    "old_logprobs) / reference / proximal log-probs, critic values, advantages",
    "perf/update_time": "seconds of the jitted update (every minibatch's forward, backward and optimizer step)",
    "perf/sync_time": "seconds to hand the new weights to the sampler (Sampler.update_weights)",
    "perf/tokens_per_second": "response tokens of the batch per second of the iteration",
    # warmstart: the supervised warm-start before RL (logged at step 0, once)
    "warmstart/eval_accuracy_before": "greedy eval accuracy before the warm-start",
    "warmstart/eval_accuracy_after": "greedy eval accuracy after the warm-start",
    "warmstart/seconds": "seconds of the warm-start's training",
    "warmstart/steps": "optimizer steps of the warm-start",
}


_PLACEHOLDERS = {"{k}": "[1-9][0-9]*", "{name}": "[A-Za-z_][A-Za-z0-9_]*"}
_NAME_FAMILIES = {
    name: re.compile(
        re.escape(name)
        .replace(re.escape("{k}"), _PLACEHOLDERS["{k}"])
        .replace(re.escape("{name}"), _PLACEHOLDERS["{name}"])
    )
    for name in METRIC_NAMES
    if any(p in name for p in _PLACEHOLDERS)
}


def documented_name(name: str) -> str | None:
    """The `METRIC_NAMES` entry that documents the logged metric `name`: itself, its family
    (`"eval/pass@4"` -> `"eval/pass@{k}"`), or None for a name the loop does not log."""
    if name in METRIC_NAMES and name not in _NAME_FAMILIES:
        return name
    return next((family for family, pattern in _NAME_FAMILIES.items() if pattern.fullmatch(name)), None)


def _check_step(step: Any, name: str = "step") -> int:
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
      resumed_from: the step the run resumes from (the iteration of the restored
        checkpoint; 0 for a run that starts over). The records of later steps already
        in `metrics.jsonl` (logged by the interrupted run, and logged again by this one)
        are dropped before anything is written: the file is rewritten whole
        (`files.atomic_write`), so a crash leaves either the old file or the new one.
        A last line cut short by a crash is dropped too. The tensorboard event files
        are not rewritten: the new event file starts with a purge marker at step
        `resumed_from + 1` (tensorboardX `purge_step`), which makes TensorBoard hide
        the old files' scalars of those steps; a reader of the raw event files still
        sees them. None (the default): append, dropping nothing.

    Each `log` call is flushed to disk, so a crash loses no logged step.
    """

    def __init__(
        self,
        logdir: str,
        *,
        tensorboard: bool = True,
        jsonl: bool = True,
        main_process: bool | None = None,
        resumed_from: int | None = None,
    ) -> None:
        self.logdir = os.path.abspath(os.fspath(logdir))
        self.active = is_main_process() if main_process is None else bool(main_process)
        self.jsonl_path = os.path.join(self.logdir, JSONL_NAME) if jsonl else None
        self.resumed_from = None if resumed_from is None else _check_step(resumed_from, "resumed_from")
        self._writer = None
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
            self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = None if self.resumed_from is None else self.resumed_from + 1
            self._writer = SummaryWriter(logdir=self.logdir, purge_step=purge)

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


def drop_records_after(path: str, step: int) -> int:
    """Removes from the metrics file `path` the records of steps after `step`; returns how many it removed.

    The records of steps <= `step` keep their lines and their order. A last line cut
    short by a crash (no newline after it) goes too; any other line that is not a
    record is kept as it is (`read_jsonl_metrics` names it). The file is rewritten
    only if something changes, through `files.atomic_write`, so it is never half
    written. A missing file is left missing.
    """
    step = _check_step(step)
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
        step = _check_step(step)
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
