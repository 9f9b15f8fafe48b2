"""Learning curves over seeds: the RL run and its control (shuffled rewards), as a PNG and a markdown table.

    python scripts/learning_curves.py [--seeds 0 1 2] [--out runs/curves] [--config PATH] [--no-control]
                                      [--algorithms all | NAME ...] [--eval-interval N] [--xla-flags "..."]
                                      [-- --config.key=value ...]

For each seed k it runs `scripts/train.py` (the offline default, or `--config`) into `<out>/seed<k>`, then the
control into `<out>/control<k>`: the same command with `--config.shuffle_rewards=True` (the verifier's rewards
shuffled within each batch), started from the seed's warm-start model, which is copied into the control's run
directory first so that both RL phases start from the same policy. Everything after `--` goes to every
train.py call; `--xla-flags` replaces XLA_FLAGS in their environment, e.g. XLA:CPU's Eigen matmuls instead of
YNNPACK's, `--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_xnnpack=false`, to check that the result
survives another rounding (with jaxlib 0.10, `--xla_cpu_use_onednn=true` changes no bit). The runs share a
JAX compilation cache (`<out>/jax_cache`, unless JAX_COMPILATION_CACHE_DIR is set), so a control does not
compile again what its seed run compiled. A run already finished by the same command is read, not run again
(`<out>/runs.json`); before each run a line says where the sweep is (`[3/26] grpo/seed1: 12.0 min so far, about
70 min left`), and while a run trains, its iterations. `--eval-interval N` evaluates every N RL iterations
(`--config.eval_interval=N` in every run): the default config evaluates every 10 of its 40 iterations, 5 points,
the fewest a fit of 4 parameters takes; `--eval-interval 2` gives 21.

Writes `<out>/curves.png` (greedy held-out accuracy against the RL iteration: a solid line per seed, a dashed
one per control), `<out>/mean_curves.png` (the mean curve of the seeds and of the controls, each with a band: the
95% bootstrap interval of the mean at each evaluation) and `<out>/curves.md` (printed too): one row per seed,
then the mean and min..max of the gains over the seeds; then the statistics below.

Statistics (`mathrl_jax.stats`), in the markdown and in `<out>/statistics.json`: per run, ScaleRL's sigmoid
R_0 + (A - R_0) / (1 + (C_mid / C)^B) fitted to its greedy held-out curve against the RL iteration C (asymptote
A, efficiency B and C_mid, RMSE, or the reason there is no fit: too few evaluations, a flat curve, a rise over
before the first evaluation), pass@1 and pass@k at its first and last evaluation, its token entropy
(train/entropy) and response length (sampled during RL / greedy on held-out problems) at the end; over
seeds, mean and 95% percentile bootstrap interval of the final greedy accuracy, the RL gain, the RL gain minus
its control's (paired by seed), and the fitted A, B and C_mid.

With `--algorithms NAME ...` (or `all`) it makes one table for several algorithms instead: each row is an
algorithm at the settings of `ALGORITHM_ROWS` (the offline default plus its own flags; `async_ppo` twice, with
staleness 1 and 2; `reinforce_rebn` on the offline game, `configs/guess_number_tiny.py`, its accuracy the greedy
success rate of held-out games), run over the seeds with their controls into `<out>/<row>/seed<k>` and
`<out>/<row>/control<k>`. Every arithmetic row of a seed starts from the same warm-start (trained by the first,
copied by the others, as a control copies its seed's). It writes `<out>/algorithms.md` (one line per row: the RL
gain and the control's, mean and min..max over the seeds, their difference, the wall time of an RL phase) and
`<out>/algorithms.png` (one panel per row, seeds solid, controls dashed), the statistics above for every row,
and a figure per task, `<out>/mean_curves_<task>.png` (`default`, the arithmetic rows; `guess_number_tiny`, the
game): each row's mean curve over the seeds with its 95% bootstrap band.

Reading it: "RL gain" is the greedy held-out accuracy at the last RL iteration minus that at iteration 0 (the
warm-started policy). The control gets the same updates with rewards that carry no information, so its gain is
what the RL phase does without learning from the verifier (drift, noise of the evaluation). RL works when the
RL gains sit above the control gains by more than their spread over seeds; the evaluation's own noise is at
most 0.5/sqrt(held-out problems), one standard deviation (500 problems: +-2.2 points).
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional, Tuple

from mathrl_jax import files, stats
from mathrl_jax.train import run_directory
from mathrl_jax.train.reporting import read_jsonl_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_SCRIPT = os.path.join(ROOT, "scripts", "train.py")
# Set per run by this script: an override of them would mix up the runs.
OWN_KEYS = ("run_dir", "seed", "shuffle_rewards")
# What the control copies from its seed's run directory: the same starting model, and no warm-start of its own.
SHARED_MODELS = (run_directory.INITIAL_MODEL, run_directory.WARMSTART_MODEL)
STDERR_TAIL_LINES = 40
GAME_CONFIG = os.path.join(ROOT, "mathrl_jax", "configs", "guess_number_tiny.py")
PROCESS_VERIFIER = "{process_verifier}"  # in a row's flags: the task's rule-based process verifier (below)
PROCESS_REWARDS = (
    f"--config.prm_model_name_or_path={PROCESS_VERIFIER}",  # where OpenR's PRM sits
    "--config.reward_source=prm+verifier",
    "--config.step_separator=,",
)
# Each offline task's rule-based process verifier (its `prm_model_name_or_path`), by `dataset_name`.
PROCESS_VERIFIERS = {"arithmetic": "arithmetic_steps", "countdown": "countdown_steps"}


STALE8 = ("--config.algorithm_name=grpo", "--config.max_head_offpolicyness=8")
NOISE07 = ("--config.algorithm_name=grpo", "--config.sampler_logprob_noise=0.07")
LORA = ("--config.lora.rank=16", "--config.lora.alpha=32", "--config.lora.targets=all-linear", "--config.lr=3e-4")


class AlgorithmRow(NamedTuple):
    """One row of the algorithms table: train.py with `config` (None: the offline default) and `flags`."""

    name: str
    flags: Tuple[str, ...]
    config: Optional[str] = None

    @property
    def shares_warmstart(self) -> bool:
        """The offline default's arithmetic warm-start (every such row of a seed starts from the same model)."""
        return self.config is None


ROWS = (
    AlgorithmRow("grpo", ("--config.algorithm_name=grpo",)),
    AlgorithmRow("drgrpo", ("--config.algorithm_name=drgrpo", "--config.loss_agg_mode=seq-mean-token-sum-norm")),
    # DAPO's clip-higher, its group filter (the record's), and its soft overlong punishment over the last 4 of 40
    # tokens (the teacher's solutions take up to 33 with EOS).
    AlgorithmRow(
        "dapo", ("--config.algorithm_name=dapo", "--config.clip_high=0.28", "--config.dapo.overlong_buffer_len=4")
    ),
    AlgorithmRow("rloo", ("--config.algorithm_name=rloo",)),
    # GSPO at its paper's clip range on the sequence ratio (3e-4 / 4e-4) and its sequence-mean aggregation
    AlgorithmRow(
        "gspo",
        (
            "--config.algorithm_name=gspo",
            "--config.clip_low=3e-4",
            "--config.clip_high=4e-4",
            "--config.loss_agg_mode=seq-mean-token-mean",
        ),
    ),
    AlgorithmRow("reinforce_pp", ("--config.algorithm_name=reinforce_pp",)),
    AlgorithmRow("ppo", ("--config.algorithm_name=ppo",)),
    AlgorithmRow("appo", ("--config.algorithm_name=appo", *PROCESS_REWARDS)),
    AlgorithmRow("tppo", ("--config.algorithm_name=tppo", *PROCESS_REWARDS)),
    AlgorithmRow("async_ppo_staleness1", ("--config.algorithm_name=async_ppo", "--config.max_head_offpolicyness=1")),
    AlgorithmRow("async_ppo_staleness2", ("--config.algorithm_name=async_ppo", "--config.max_head_offpolicyness=2")),
    AlgorithmRow("reinforce_rebn", ("--config.algorithm_name=reinforce_rebn",), config=GAME_CONFIG),
    # GRPO training LoRA adapters alone (the base frozen): rank 16 on every projection of the tiny model, at 10x
    # the full fine-tuning learning rate (LoRA's usual ratio; 1e-3 was worse, 3e-4 matched full training)
    AlgorithmRow("grpo_lora", ("--config.algorithm_name=grpo", *LORA)),
    # OpenR's setting of APPO: the LoRA policy above, the critic its frozen base under OpenR's MLP head
    AlgorithmRow(
        "appo_lora", ("--config.algorithm_name=appo", *PROCESS_REWARDS, *LORA, "--config.lora.share_critic_base=True")
    ),
    # The testbed's stress knobs (docs/testbed.md): rollouts 8 versions stale, trained by AReaL's decoupled loss,
    # by naive PPO (clipped around the behaviour policy, whose log-probs the sampler reported) or by GRPO with
    # truncated importance sampling; and sampler log-probs off by 0.07 nats a token, under naive PPO or TIS.
    AlgorithmRow("async_ppo_staleness8", ("--config.algorithm_name=async_ppo", "--config.max_head_offpolicyness=8")),
    AlgorithmRow("stale8_naive", (*STALE8, "--config.old_logprobs=sampler")),
    AlgorithmRow("stale8_tis", (*STALE8, "--config.tis_cap=2.0")),
    AlgorithmRow("noise07_naive", (*NOISE07, "--config.old_logprobs=sampler")),
    AlgorithmRow("noise07_tis", (*NOISE07, "--config.tis_cap=2.0")),
)
ALGORITHM_ROWS = {
    "grpo": ("grpo",),
    "drgrpo": ("drgrpo",),
    "dapo": ("dapo",),
    "rloo": ("rloo",),
    "gspo": ("gspo",),
    "reinforce_pp": ("reinforce_pp",),
    "ppo": ("ppo",),
    "appo": ("appo",),
    "tppo": ("tppo",),
    "async_ppo": ("async_ppo_staleness1", "async_ppo_staleness2"),
    "reinforce_rebn": ("reinforce_rebn",),
}
"""An algorithm's rows (`--algorithms NAME`): each of `mathrl_jax.train.algorithms.NAMES` has at least one."""
VARIANT_ROWS = ("grpo_lora", "appo_lora")
"""Rows beyond the algorithms' own (`--algorithms all` or by row name): an algorithm under another setting."""
STRESS_ROWS = ("async_ppo_staleness8", "stale8_naive", "stale8_tis", "noise07_naive", "noise07_tis")
"""The testbed's stress rows (`--algorithms stress` or by row name; not in `all`): staleness and log-prob noise."""
ROW_BY_NAME = {row.name: row for row in ROWS}


def fail(message: str) -> None:
    print(f"learning_curves.py: error: {message}", file=sys.stderr)
    sys.exit(1)


# ----------------------------------------------------------------------------- reading runs


def read_config(run_dir: str) -> dict[str, Any]:
    """The run's `config.json` (written by train.py), or {} before it exists."""
    path = run_directory.path(run_dir, run_directory.CONFIG)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def final_iteration(config: dict[str, Any]) -> int | None:
    """The last RL iteration of a run with this config (as mathrl_jax.train.loop.num_iterations)."""
    if not config:
        return None
    if config.get("num_env_steps"):
        per_iteration = config["n_rollout_threads"] * config["group_size"] * config["episode_length"]
        return max(1, math.ceil(config["num_env_steps"] / per_iteration))
    return int(config["num_iterations"])


def read_run(run_dir: str) -> dict[str, Any]:
    """A summary of a run directory's metrics.jsonl and config.json.

    Keys: `curve` [(iteration, greedy held-out accuracy)]; `rl_start`, `rl_end`, `rl_gain` (greedy, first and
    last evaluation); `sampled_start`, `sampled_end` (eval/pass@1: accuracy of one sample at the RL
    temperature); `pass_k` and `pass_at_k_start`, `pass_at_k_end` (k = the config's eval_n_samples);
    `turns_start`, `turns_end` (a multi-turn run's turns per held-out game); `fit` (`stats.fit_saturating_curve`
    of the curve, C = the RL iteration; None without a curve); `entropy_end` (train/entropy),
    `response_length_end` (rollout/response_length, sampled) at the last iteration that logged them,
    `eval_response_length_end` (eval/response_length, greedy) at the last evaluation; `hard_start`, `hard_end`,
    `hard_pass_at_k_end` (the harder held-out split's eval_hard/*, where the config has one); `warmstart_before`,
    `warmstart_after`, `warmstart_seconds`; `num_eval_problems`, `temperature`,
    `shuffle_rewards`, `final_iteration`, `finished` (the last iteration was evaluated). A value the run did not
    log is None.
    """
    config = read_config(run_dir)
    by_step: dict[int, dict[str, Any]] = {}
    for record in read_jsonl_metrics(run_dir):
        # Several lines per step (warm-start, then eval, at step 0); a resumed run logs a step again: later wins.
        by_step.setdefault(record["step"], {}).update(record)
    evaluated = sorted(step for step, record in by_step.items() if record.get("eval/accuracy") is not None)
    curve = [(step, float(by_step[step]["eval/accuracy"])) for step in evaluated]
    k = config.get("eval_n_samples")
    if k is None:  # no config.json: the largest k logged
        ks = [int(key.split("@")[1]) for record in by_step.values() for key in record if key.startswith("eval/pass@")]
        k = max(ks) if ks else None
    first = by_step[evaluated[0]] if evaluated else {}
    last = by_step[evaluated[-1]] if evaluated else {}
    warm = next((r for s, r in sorted(by_step.items()) if "warmstart/eval_accuracy_after" in r), {})
    final = final_iteration(config)

    def last_logged(name: str) -> float | None:
        return next((by_step[s][name] for s in sorted(by_step, reverse=True) if name in by_step[s]), None)

    return {
        "run_dir": run_dir,
        "curve": curve,
        "rl_start": curve[0][1] if curve else None,
        "rl_end": curve[-1][1] if curve else None,
        "rl_gain": curve[-1][1] - curve[0][1] if curve else None,
        "sampled_start": first.get("eval/pass@1"),
        "sampled_end": last.get("eval/pass@1"),
        "pass_k": k,
        "pass_at_k_start": first.get(f"eval/pass@{k}"),
        "pass_at_k_end": last.get(f"eval/pass@{k}"),
        "turns_start": first.get("eval/episode_turns"),  # multi-turn runs: turns per held-out game
        "turns_end": last.get("eval/episode_turns"),
        "fit": stats.fit_saturating_curve(*zip(*curve)) if curve else None,
        "entropy_end": last_logged("train/entropy"),
        "response_length_end": last_logged("rollout/response_length"),
        "eval_response_length_end": last.get("eval/response_length"),
        "hard_start": first.get("eval_hard/accuracy"),  # the harder held-out split (eval_digits), greedy
        "hard_end": last.get("eval_hard/accuracy"),
        "hard_pass_at_k_end": last.get(f"eval_hard/pass@{k}"),
        "warmstart_before": warm.get("warmstart/eval_accuracy_before"),
        "warmstart_after": warm.get("warmstart/eval_accuracy_after"),
        "warmstart_seconds": warm.get("warmstart/seconds"),
        "num_eval_problems": config.get("num_eval_problems"),
        "temperature": config.get("temperature"),
        "shuffle_rewards": config.get("shuffle_rewards"),
        "final_iteration": final,
        "finished": final is not None and bool(curve) and curve[-1][0] == final,
    }


# ----------------------------------------------------------------------------- table and plot


def _acc(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _gain(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _start_end(start: float | None, end: float | None) -> str:
    return "-" if start is None and end is None else f"{_acc(start)} -> {_acc(end)}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _spread(values: Sequence[float]) -> str:
    """Mean (min..max) of signed values, or "-"."""
    if not values:
        return "-"
    return f"{_gain(_mean(values))} ({_gain(min(values))}..{_gain(max(values))})"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The markdown table of `rows`: {"seed": int, "run": read_run(...), "control": read_run(...) or None}, each
    summary optionally with "wall_seconds". The control's warm-start is its seed's (the control reuses it).
    Last, a row with the mean of the accuracies and the mean (min..max) of the gains over the seeds."""
    runs = [row["run"] for row in rows]
    ks = {run["pass_k"] for run in runs if run["pass_k"] is not None}
    temperatures = {run["temperature"] for run in runs if run["temperature"] is not None}
    pass_name = f"pass@{ks.pop()}" if len(ks) == 1 else "pass@k"
    sampled_name = f"T={temperatures.pop():g} acc" if len(temperatures) == 1 else "sampled acc"
    header = [
        "seed",
        "warm-start acc (greedy, after SFT)",
        "RL start (greedy)",
        "RL end (greedy)",
        "RL gain",
        "control end (greedy)",
        "control gain",
        f"{sampled_name} start -> end",
        f"{pass_name} start -> end",
        "wall time (s): run / control",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        run, control = row["run"], row.get("control") or {}
        cells = [
            str(row["seed"]),
            _acc(run["warmstart_after"]),
            _acc(run["rl_start"]),
            _acc(run["rl_end"]),
            _gain(run["rl_gain"]),
            _acc(control.get("rl_end")),
            _gain(control.get("rl_gain")),
            _start_end(run["sampled_start"], run["sampled_end"]),
            _start_end(run["pass_at_k_start"], run["pass_at_k_end"]),
            f"{_seconds(run.get('wall_seconds'))} / {_seconds(control.get('wall_seconds'))}",
        ]
        lines.append("| " + " | ".join(cells) + " |")

    def present(values):
        return [v for v in values if v is not None]

    controls = [row.get("control") or {} for row in rows]
    summary = [
        "mean (min..max)",
        _acc(_mean(present(run["warmstart_after"] for run in runs))),
        _acc(_mean(present(run["rl_start"] for run in runs))),
        _acc(_mean(present(run["rl_end"] for run in runs))),
        _spread(present(run["rl_gain"] for run in runs)),
        _acc(_mean(present(c.get("rl_end") for c in controls))),
        _spread(present(c.get("rl_gain") for c in controls)),
        "",
        "",
        "",
    ]
    lines.append("| " + " | ".join(summary) + " |")
    return "\n".join(lines) + "\n"


def _fit_cells(fit: Optional[stats.SigmoidFit]) -> list[str]:
    """R_0, A, B, C_mid, RMSE and "ok" or the failure's reason, of a run's fitted sigmoid."""
    if fit is None:
        return ["-"] * 5 + ["no curve"]
    if not fit.ok:
        return ["-"] * 5 + [fit.reason.replace("|", "\\|")]
    return [_acc(fit.start), _acc(fit.asymptote), f"{fit.exponent:.2f}", f"{fit.midpoint:.1f}", f"{fit.rmse:.3f}", "ok"]


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def runs_table(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """One line per run (`runs`: (label, read_run(...))): its evaluations, ScaleRL's sigmoid fitted to its greedy
    curve (R_0, A, B, C_mid, RMSE, or why not), pass@1 and pass@k at its first and last evaluation, and at its end
    the policy's token entropy and the response length (sampled during RL / greedy on the held-out problems)."""
    ks = {run["pass_k"] for _, run in runs if run["pass_k"] is not None}
    pass_name = f"pass@{ks.pop()}" if len(ks) == 1 else "pass@k"
    header = [
        "run",
        "evaluations",
        "fit R_0",
        "fit A (asymptote)",
        "fit B",
        "fit C_mid (iteration)",
        "fit RMSE",
        "fit",
        "pass@1 start -> end",
        f"{pass_name} start -> end",
        "entropy (end)",
        "response length, sampled / greedy (end)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for label, run in runs:
        lengths = (run["response_length_end"], run["eval_response_length_end"])
        cells = [
            label,
            str(len(run["curve"])),
            *_fit_cells(run["fit"]),
            _start_end(run["sampled_start"], run["sampled_end"]),
            _start_end(run["pass_at_k_start"], run["pass_at_k_end"]),
            _number(run["entropy_end"]),
            "-" if lengths == (None, None) else " / ".join(_number(x, 1) for x in lengths),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _paired_gaps(seeds: Sequence[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """The RL gains and their controls' gains of the seeds that have both, in seed order (pairs by seed)."""
    pairs = [
        (r["run"]["rl_gain"], r["control"]["rl_gain"])
        for r in seeds
        if r.get("control") and r["control"]["rl_gain"] is not None and r["run"]["rl_gain"] is not None
    ]
    return [g for g, _ in pairs], [c for _, c in pairs]


def t_interval(values: Sequence[float]) -> Optional[stats.Interval]:
    """The Student-t 95% interval of the mean of `values` (None below 2): beside the bootstrap's, which is too
    narrow at 5 seeds. Of the paired gaps, it is the paired t interval of RL minus control."""
    return stats.t_mean_interval(values) if len(values) >= 2 else None


def interval_cell(interval: Optional[stats.Interval], values: Sequence[float], fmt: str) -> str:
    """`estimate [low, high; t low, high]` (the bootstrap interval, then the Student-t one); with one value the
    value alone; with none "-"."""
    if interval is not None:
        t = t_interval(values)
        return (
            f"{interval.estimate:{fmt}} [{interval.low:{fmt}}, {interval.high:{fmt}}; t {t.low:{fmt}}, {t.high:{fmt}}]"
        )
    return f"{values[0]:{fmt}}" if values else "-"


def seed_statistics(seeds: Sequence[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """Mean and 95% percentile bootstrap interval over the seeds (`stats.bootstrap_*`, resampling seeded by
    `seed`): {name: (Interval or None below 2 values, the values)} for the final greedy accuracy, the RL gain, the
    RL gain minus its control's (paired by seed), and the fitted A, B and C_mid (runs whose fit is ok)."""

    def mean_of(values: list[float]) -> tuple[Optional[stats.Interval], list[float]]:
        return (stats.bootstrap_mean_interval(values, seed=seed) if len(values) >= 2 else None), values

    runs = [r["run"] for r in seeds]
    fits = [run["fit"] for run in runs if run["fit"] is not None and run["fit"].ok]
    gains, control_gains = _paired_gaps(seeds)
    gaps = [g - c for g, c in zip(gains, control_gains)]
    paired = (
        stats.bootstrap_difference_interval(gains, control_gains, paired=True, seed=seed) if len(gaps) >= 2 else None
    )
    return {
        "final accuracy": mean_of([run["rl_end"] for run in runs if run["rl_end"] is not None]),
        "RL gain": mean_of([run["rl_gain"] for run in runs if run["rl_gain"] is not None]),
        "RL - control gain": (paired, gaps),
        "A": mean_of([fit.asymptote for fit in fits]),
        "B": mean_of([fit.exponent for fit in fits]),
        "C_mid": mean_of([fit.midpoint for fit in fits]),
    }


def summary_table(results: Sequence[tuple[str, Sequence[dict[str, Any]]]], seed: int = 0) -> str:
    """One line per row (`results`: (name, its seeds' rows)): `seed_statistics` as "mean [95% interval]" (a
    single value alone, none "-"), and how many of the seed runs' fits are ok."""
    header = [
        "row",
        "seeds",
        "final greedy acc",
        "RL gain",
        "RL - control gain (paired)",
        "fits ok",
        "asymptote A",
        "B",
        "C_mid (iteration)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, seeds in results:
        statistics = seed_statistics(seeds, seed)
        fitted = [r["run"]["fit"] for r in seeds if r["run"]["fit"] is not None]
        cells = [
            name,
            str(len(seeds)),
            interval_cell(*statistics["final accuracy"], ".3f"),
            interval_cell(*statistics["RL gain"], "+.3f"),
            interval_cell(*statistics["RL - control gain"], "+.3f"),
            f"{sum(fit.ok for fit in fitted)}/{len(seeds)}",
            interval_cell(*statistics["A"], ".3f"),
            interval_cell(*statistics["B"], ".2f"),
            interval_cell(*statistics["C_mid"], ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


STATISTICS_NOTE = (
    "Over seeds: mean [95% percentile bootstrap interval; t: the Student-t 95% interval] (10,000 resamples; "
    "with few seeds the bootstrap interval is too narrow, about 84% coverage at 5: mathrl_jax/stats/bootstrap.py; "
    'the t interval covers 95% for normal values); "RL - control gain" is paired by seed. The '
    "fit is ScaleRL's R_0 + (A - R_0) / (1 + (C_mid / C)^B) (Khatri et al. 2025) to a run's greedy held-out "
    "curve against the RL iteration C; A, B and C_mid are averaged over the runs whose fit is ok (a failed fit "
    "says why in the per-run table: too few evaluations, a flat curve, a rise over before the first evaluation)."
)


def _json_safe(value: Any) -> Any:
    """`value` with fits as dicts and NaN as None (plain JSON)."""
    if isinstance(value, stats.SigmoidFit | stats.Interval):
        return _json_safe(value._asdict())
    if isinstance(value, dict):
        return {key: _json_safe(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_statistics(path: str, results: Sequence[tuple[str, Sequence[dict[str, Any]]]], seed: int = 0) -> str:
    """`<out>/statistics.json`: per row its `seed_statistics` ({name: {"interval", "t_interval", "values"}}) and
    its seeds' rows (each run's `read_run` summary: curve, fit, pass@k, entropy, lengths); for tables of one's own."""
    record = {
        "rows": [
            {
                "name": name,
                "statistics": {
                    key: {"interval": interval, "t_interval": t_interval(values), "values": values}
                    for key, (interval, values) in seed_statistics(seeds, seed).items()
                },
                "seeds": list(seeds),
            }
            for name, seeds in results
        ]
    }
    files.write_json(path, _json_safe(record), indent=1)
    return path


def plot_curves(rows: Sequence[dict[str, Any]], path: str) -> str:
    """Greedy held-out accuracy against the RL iteration: solid blues for the seeds, dashed oranges for the
    controls. Saves a PNG at `path` and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    # Shades from light to dark, so that seed k and control k have the same rank in their families.
    shades = [0.5 + 0.45 * i / max(1, len(rows) - 1) for i in range(len(rows))]
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for row, shade in zip(rows, shades):
        for key, cmap, style, label in (
            ("run", "Blues", "-", f"seed {row['seed']}"),
            ("control", "Oranges", "--", f"control {row['seed']} (shuffled rewards)"),
        ):
            summary = row.get(key)
            if not summary or not summary["curve"]:
                continue
            steps, accuracies = zip(*summary["curve"])
            ax.plot(
                steps,
                accuracies,
                linestyle=style,
                color=plt.get_cmap(cmap)(shade),
                marker="." if len(steps) < 50 else None,
                linewidth=1.5,
                label=label,
            )
    problems = {row["run"]["num_eval_problems"] for row in rows} - {None}
    title = "Greedy held-out accuracy during RL"
    if len(problems) == 1:
        title += f" ({problems.pop()} held-out problems)"
    ax.set_title(title)
    ax.set_xlabel("RL iteration")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("greedy held-out accuracy")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return path


def plot_mean_curves(series: Sequence[tuple[str, Sequence[dict[str, Any]]]], path: str, title: str) -> str:
    """The mean greedy held-out curve of each of `series` ((label, run summaries)) with a band: the 95% percentile
    bootstrap interval of the mean over its runs at each evaluation (`stats.bootstrap_mean_interval`; none with
    one run), over the evaluations every run has. Saves a PNG at `path` and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    colors = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")
    for i, (label, runs) in enumerate(series):
        curves = [dict(run["curve"]) for run in runs if run and run["curve"]]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if not steps:
            continue
        values = [[c[step] for c in curves] for step in steps]
        mean = [sum(v) / len(v) for v in values]
        ax.plot(steps, mean, color=colors(i), linewidth=1.6, marker="." if len(steps) < 50 else None, label=label)
        if len(curves) >= 2:
            intervals = [stats.bootstrap_mean_interval(v) for v in values]
            ax.fill_between(steps, [x.low for x in intervals], [x.high for x in intervals], color=colors(i), alpha=0.2)
    ax.set_title(f"{title}\nmean over seeds; band: 95% bootstrap interval of the mean", fontsize=10)
    ax.set_xlabel("RL iteration")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("greedy held-out accuracy")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- running


def load_ledger(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save_ledger(path: str, ledger: dict[str, Any], name: str) -> None:
    """Records `ledger[name]` in the ledger file at `path`, keeping the entries other sweeps wrote there since
    this one read it: several sweeps may share an output directory (each its own seeds, e.g. one per core)."""
    with open(path + ".lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        on_disk = load_ledger(path)
        on_disk[name] = ledger[name]
        files.write_json(path, on_disk, indent=2)


def report_progress(name: str, process: subprocess.Popen, run_dir: str, start: float, every_s: float) -> int:
    """Waits for `process` (a train.py run), printing a line every `every_s` seconds: the warm-start's time, then
    each new last logged iteration with its reward and accuracy; returns its exit status."""
    shown = None
    while True:
        try:
            return process.wait(timeout=every_s)
        except subprocess.TimeoutExpired:
            pass
        path = run_directory.path(run_dir, run_directory.METRICS)
        if not os.path.isfile(path):
            print(f"{name}: warm-start and compiling ({time.perf_counter() - start:.0f} s)", flush=True)
            continue
        last = {}
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line being written
                    continue
                if "rollout/rewards" in record:
                    last = record
        if last and last["step"] != shown:
            shown = last["step"]
            accuracy = last.get("rollout/accuracy")
            print(
                f"{name}: iteration {shown}, reward {last['rollout/rewards']:.3f}"
                + (f", accuracy {accuracy:.3f}" if accuracy is not None else "")
                + f" ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )


class Plan:
    """The sweep's progress over its runs: before each, a line with its rank, the time spent so far and, once a
    run has trained here, an estimate of the time left (the mean of the runs trained so far, times those left)."""

    def __init__(self, total: int):
        self.total, self.done, self.trained, self.start = total, 0, [], time.perf_counter()

    def begin(self, name: str) -> None:
        elapsed = time.perf_counter() - self.start
        line = f"[{self.done + 1}/{self.total}] {name}: {elapsed / 60:.1f} min so far"
        if self.trained:
            left = sum(self.trained) / len(self.trained) * (self.total - self.done)
            line += f", about {left / 60:.0f} min left"
        print(line, flush=True)

    def finish(self, seconds: Optional[float]) -> None:
        """A run is done: `seconds` it trained here, None when it was reused."""
        self.done += 1
        if seconds is not None:
            self.trained.append(seconds)


def run_train(
    name: str,
    command: list[str],
    run_dir: str,
    env: dict[str, str],
    out: str,
    ledger: dict,
    prepare: Callable[[], None] | None = None,
    progress_every_s: float = 15.0,
    plan: Optional[Plan] = None,
) -> float:
    """Runs one train.py (or reuses it when the same command already finished it); returns its wall seconds.

    A run directory left by another command (other overrides or XLA flags) is removed first: train.py would
    resume it and mix the two. One left unfinished by the same command is resumed. `prepare()` runs just
    before train.py (the control copies its seed's models then). `plan`: the sweep's progress, told of this run."""
    if plan is not None:
        plan.begin(name)
    entry = ledger.get(name)
    same = bool(entry) and entry["command"] == command and entry["xla_flags"] == env.get("XLA_FLAGS")
    finished = os.path.isfile(run_directory.path(run_dir, run_directory.METRICS)) and read_run(run_dir)["finished"]
    if same and entry.get("seconds") is not None and finished:
        print(f"{name}: already finished by the same command, reusing {run_dir}", flush=True)
        if plan is not None:
            plan.finish(None)
        return entry["seconds"]
    if not same and os.path.exists(run_dir):
        print(f"{name}: {run_dir} was made by another command; starting it over", flush=True)
        shutil.rmtree(run_dir)
    ledger[name] = {"command": command, "xla_flags": env.get("XLA_FLAGS"), "seconds": None}  # started
    save_ledger(os.path.join(out, "runs.json"), ledger, name)
    if prepare is not None:
        prepare()
    stderr_path = os.path.join(out, "logs", f"{name}.stderr")  # an algorithm row's runs: logs/<row>/seed<k>.stderr
    os.makedirs(os.path.dirname(stderr_path), exist_ok=True)
    print(f"{name}: {' '.join(command)}", flush=True)
    start = time.perf_counter()
    # stdout (train.py's summary) is inherited; stderr (JAX's warnings) goes to a file, shown if the run fails.
    with open(stderr_path, "w", encoding="utf-8") as stderr:
        process = subprocess.Popen([sys.executable, *command], env=env, stderr=stderr)
        status = report_progress(name, process, run_dir, start, progress_every_s)
    seconds = time.perf_counter() - start
    if status != 0:
        with open(stderr_path, encoding="utf-8", errors="replace") as f:
            tail = "".join(f.readlines()[-STDERR_TAIL_LINES:])
        print(tail, file=sys.stderr, end="" if tail.endswith("\n") else "\n")
        fail(f"the {name} run ({run_dir}) failed with exit status {status} (its stderr: {stderr_path})")
    ledger[name] = {"command": command, "xla_flags": env.get("XLA_FLAGS"), "seconds": seconds}
    save_ledger(os.path.join(out, "runs.json"), ledger, name)
    if plan is not None:
        plan.finish(seconds)
    return seconds


def copy_start_models(seed_dir: str, control_dir: str) -> None:
    """The seed run's starting models into the control's run dir: the control then skips the warm-start."""
    os.makedirs(control_dir, exist_ok=True)
    for name in SHARED_MODELS:
        source, target = os.path.join(seed_dir, name), os.path.join(control_dir, name)
        if os.path.isdir(source) and not os.path.exists(target):
            shutil.copytree(source, target)


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    # XLA flags start with "--", which argparse would read as an option of its own: glue them to their name.
    for i in range(len(own) - 1):
        if own[i] == "--xla-flags":
            own[i : i + 2] = [f"--xla-flags={own[i + 1]}"]
            break
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] [-- --config.key=value ...]",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the seeds (default: 0 1 2)")
    parser.add_argument("--out", default="runs/curves", help="output directory (default: runs/curves)")
    parser.add_argument("--config", help="a mathrl_jax config file (default: train.py's, configs/default.py)")
    parser.add_argument("--no-control", action="store_true", help="skip the control runs (shuffled rewards)")
    parser.add_argument("--xla-flags", help="XLA_FLAGS of the training runs (replaces the environment's)")
    parser.add_argument(
        "--progress-every-s", type=float, default=15.0, help="a run's progress line at most this often (seconds)"
    )
    parser.add_argument(
        "--algorithms",
        nargs="+",
        help="one table for these algorithms (or 'all'), each at its ALGORITHM_ROWS settings (see above)",
    )
    parser.add_argument(
        "--margin", type=float, default=0.15, help="the RL-minus-control gain a row should clear (default: 0.15)"
    )
    parser.add_argument(
        "--eval-interval",
        type=int,
        metavar="N",
        help="evaluate every N RL iterations (--config.eval_interval=N for every run): points enough to fit a curve",
    )
    args = parser.parse_args(own)
    if args.algorithms:
        try:
            rows = expand_algorithms(args.algorithms)
        except ValueError as error:
            parser.error(str(error))
        own = [row.name for row in rows if row.config]
        if args.config and own:
            parser.error(f"--config and --algorithms {' '.join(own)}: {', '.join(own)} trains on its own config")
    if not args.progress_every_s > 0:
        parser.error(f"--progress-every-s {args.progress_every_s}: expected > 0")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {' '.join(map(str, args.seeds))} repeats a seed")
    for flag in overrides:
        key = flag.split("=", 1)[0].removeprefix("--config.")
        if key in OWN_KEYS:
            parser.error(f"{flag}: this script sets --config.{key} for each run")
        if key == "eval_interval" and args.eval_interval is not None:
            parser.error(f"{flag} and --eval-interval: give one")
    if args.eval_interval is not None:
        if args.eval_interval < 1:
            parser.error(f"--eval-interval {args.eval_interval}: expected >= 1")
        overrides = [f"--config.eval_interval={args.eval_interval}", *overrides]
    return args, overrides


def seed_and_control(
    prefix: str,
    directory: str,
    base: list[str],
    seed: int,
    *,
    control: bool,
    env: dict[str, str],
    out: str,
    ledger: dict,
    progress_every_s: float,
    start_from: Optional[str] = None,
    plan: Optional[Plan] = None,
) -> dict[str, Any]:
    """Runs seed `seed` into `<directory>/seed<k>` and, with `control`, its control into `<directory>/control<k>`
    (starting from the seed's models). `start_from`: a run directory whose models the seed run starts from (a
    warm-start another run already trained). Returns the table's row: {"seed", "run", "control"}."""
    seed_dir = os.path.join(directory, f"seed{seed}")
    command = [*base, f"--config.run_dir={seed_dir}", f"--config.seed={seed}"]
    prepare = None if start_from is None else (lambda: copy_start_models(start_from, seed_dir))
    seconds = run_train(
        f"{prefix}seed{seed}",
        command,
        seed_dir,
        env,
        out,
        ledger,
        prepare=prepare,
        progress_every_s=progress_every_s,
        plan=plan,
    )
    row = {"seed": seed, "run": dict(read_run(seed_dir), wall_seconds=seconds), "control": None}
    if control:
        control_dir = os.path.join(directory, f"control{seed}")
        command = [*base, f"--config.run_dir={control_dir}", f"--config.seed={seed}", "--config.shuffle_rewards=True"]
        seconds = run_train(
            f"{prefix}control{seed}",
            command,
            control_dir,
            env,
            out,
            ledger,
            prepare=lambda: copy_start_models(seed_dir, control_dir),
            progress_every_s=progress_every_s,
            plan=plan,
        )
        row["control"] = dict(read_run(control_dir), wall_seconds=seconds)
    return row


def rl_seconds(summary: Optional[dict[str, Any]]) -> Optional[float]:
    """A run's wall time without the warm-start it trained (None when not measured)."""
    if not summary or summary.get("wall_seconds") is None:
        return None
    return summary["wall_seconds"] - (summary.get("warmstart_seconds") or 0.0)


def algorithms_table(results: Sequence[tuple[AlgorithmRow, Sequence[dict[str, Any]]]], margin: float) -> str:
    """One line per algorithm row: its RL gains and its control's over the seeds (mean (min..max)), the mean of
    their differences, whether that clears `margin`, the mean wall time of an RL phase; the game row also its
    turns per held-out game."""
    header = [
        "algorithm",
        "flags",
        "seeds",
        "RL start (greedy)",
        "RL gain, mean (min..max)",
        "control gain, mean (min..max)",
        "RL - control",
        f">= {margin:+.2f}",
        "turns per game start -> end",
        "RL wall time (s), run / control",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row, seeds in results:
        gains = [r["run"]["rl_gain"] for r in seeds if r["run"]["rl_gain"] is not None]
        controls = [r["control"]["rl_gain"] for r in seeds if r["control"] and r["control"]["rl_gain"] is not None]
        gaps = [
            r["run"]["rl_gain"] - r["control"]["rl_gain"]
            for r in seeds
            if r["control"] and r["control"]["rl_gain"] is not None and r["run"]["rl_gain"] is not None
        ]
        starts = [r["run"]["rl_start"] for r in seeds if r["run"]["rl_start"] is not None]
        turns = [(r["run"]["turns_start"], r["run"]["turns_end"]) for r in seeds if r["run"]["turns_end"] is not None]
        gap = _mean(gaps)
        run_seconds = [x for x in (rl_seconds(r["run"]) for r in seeds) if x is not None]
        control_seconds = [x for x in (rl_seconds(r["control"]) for r in seeds) if x is not None]
        cells = [
            row.name,
            " ".join(flag.removeprefix("--config.") for flag in row.flags)
            + (f" ({os.path.relpath(row.config, ROOT)})" if row.config else ""),
            ", ".join(str(r["seed"]) for r in seeds),
            _acc(_mean(starts)),
            _spread(gains),
            _spread(controls),
            _gain(gap),
            "-" if gap is None else ("yes" if gap >= margin else "no"),
            "-" if not turns else f"{_mean([a for a, _ in turns]):.2f} -> {_mean([b for _, b in turns]):.2f}",
            f"{_seconds(_mean(run_seconds))} / {_seconds(_mean(control_seconds))}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_algorithms(results: Sequence[tuple[AlgorithmRow, Sequence[dict[str, Any]]]], path: str) -> str:
    """One panel per algorithm row: greedy held-out accuracy (the game: success rate) against the RL iteration,
    a solid blue line per seed, a dashed orange one per control. Saves a PNG at `path` and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    columns = min(3, len(results))
    panels = math.ceil(len(results) / columns)
    fig, axes = plt.subplots(panels, columns, figsize=(4.2 * columns, 3.0 * panels), squeeze=False, sharey=True)
    for ax, (row, seeds) in zip(axes.flat, results):
        shades = [0.5 + 0.45 * i / max(1, len(seeds) - 1) for i in range(len(seeds))]
        for seed_row, shade in zip(seeds, shades):
            for key, cmap, style in (("run", "Blues", "-"), ("control", "Oranges", "--")):
                summary = seed_row.get(key)
                if summary and summary["curve"]:
                    steps, accuracies = zip(*summary["curve"])
                    ax.plot(steps, accuracies, linestyle=style, color=plt.get_cmap(cmap)(shade), linewidth=1.3)
        ax.set_title(row.name + (" (game: success rate)" if row.config else ""), fontsize=10)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(results) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("greedy held-out accuracy")
    for ax in axes[-1, :]:
        ax.set_xlabel("RL iteration")
    handles = [
        matplotlib.lines.Line2D([], [], color=plt.get_cmap("Blues")(0.8), label="seeds"),
        matplotlib.lines.Line2D([], [], color=plt.get_cmap("Oranges")(0.8), linestyle="--", label="controls"),
    ]
    fig.legend(handles=handles, loc="upper right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.93, 1))
    fig.savefig(path, format="png", dpi=90)
    plt.close(fig)
    return path


def expand_algorithms(names: Sequence[str]) -> list[AlgorithmRow]:
    """The rows of `names` (algorithm names, row names, or "all"), in the table's order, each once."""
    wanted = set()
    for name in names:
        if name == "all":
            wanted.update(row for row in ROW_BY_NAME if row not in STRESS_ROWS)
        elif name == "stress":
            wanted.update(STRESS_ROWS)
        elif name in ALGORITHM_ROWS:
            wanted.update(ALGORITHM_ROWS[name])
        elif name in ROW_BY_NAME:
            wanted.add(name)
        else:
            known = ", ".join(["all", "stress", *ALGORITHM_ROWS, *(r for r in ROW_BY_NAME if r not in ALGORITHM_ROWS)])
            raise ValueError(f"--algorithms {name}: unknown; expected some of {known}")
    return [row for row in ROWS if row.name in wanted]


def statistics_text(results: Sequence[tuple[str, Sequence[dict[str, Any]]]], prefix: bool) -> str:
    """The per-run table (every seed run and control; labels `<row>/seed<k>` with `prefix`) and the summary over
    seeds (`summary_table`), with their note, as markdown."""
    runs = [
        (f"{name}/" * prefix + f"{kind}{r['seed']}", r[key])
        for name, seeds in results
        for r in seeds
        for kind, key in (("seed", "run"), ("control", "control"))
        if r.get(key)
    ]
    return f"Per run:\n\n{runs_table(runs)}\nOver seeds:\n\n{summary_table(results)}\n{STATISTICS_NOTE}\n"


def task_name(row: AlgorithmRow, config: Optional[str] = None) -> str:
    """The task an algorithm row trains on: its config file's name, else `config`'s (the sweep's `--config`), or
    "default" (the offline default)."""
    path = row.config or config
    return os.path.splitext(os.path.basename(path))[0] if path else "default"


def dataset_name(config: Optional[str], overrides: Sequence[str]) -> str:
    """The `dataset_name` the runs train on: the last `--config.dataset_name=` override, else the config file's
    (`config`, or train.py's default)."""
    for flag in reversed(overrides):
        if flag.startswith("--config.dataset_name="):
            return flag.split("=", 1)[1]
    path = config or os.path.join(ROOT, "mathrl_jax", "configs", "default.py")
    spec = importlib.util.spec_from_file_location("_learning_curves_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config().dataset_name


def row_flags(row: AlgorithmRow, config: Optional[str], overrides: Sequence[str]) -> list[str]:
    """The row's flags, its process verifier (APPO, TPPO) the one of the task it trains on."""
    if not any(PROCESS_VERIFIER in flag for flag in row.flags):
        return list(row.flags)
    task = dataset_name(row.config or config, overrides)
    if task not in PROCESS_VERIFIERS:
        fail(
            f"{row.name} rewards steps, and dataset_name={task!r} has no rule-based process verifier (tasks with "
            f"one: {', '.join(PROCESS_VERIFIERS)})"
        )
    return [flag.replace(PROCESS_VERIFIER, PROCESS_VERIFIERS[task]) for flag in row.flags]


def run_algorithms(args, overrides: list[str], env: dict[str, str], out: str, ledger: dict) -> int:
    rows = expand_algorithms(args.algorithms)
    plan = Plan(len(rows) * len(args.seeds) * (1 if args.no_control else 2))
    results = []
    warmstarts: dict[int, str] = {}  # seed -> the run directory that trained the arithmetic warm-start
    for row in rows:
        base = [TRAIN_SCRIPT]
        config = row.config or (os.path.abspath(args.config) if args.config else None)
        if config:
            base.append(f"--config={config}")
        row = row._replace(flags=tuple(row_flags(row, config, overrides)))  # as run: the table shows them
        base += ["--config.progress=False", *row.flags, *overrides]
        seeds = []
        for seed in args.seeds:
            start_from = warmstarts.get(seed) if row.shares_warmstart else None
            seeds.append(
                seed_and_control(
                    f"{row.name}/",
                    os.path.join(out, row.name),
                    base,
                    seed,
                    control=not args.no_control,
                    env=env,
                    out=out,
                    ledger=ledger,
                    progress_every_s=args.progress_every_s,
                    start_from=start_from,
                    plan=plan,
                )
            )
            if row.shares_warmstart:
                warmstarts.setdefault(seed, os.path.join(out, row.name, f"seed{seed}"))
        results.append((row, seeds))
    pngs = [plot_algorithms(results, os.path.join(out, "algorithms.png"))]
    tasks = {row.name: task_name(row, args.config) for row, _ in results}
    for task in dict.fromkeys(tasks.values()):  # a figure per task, its rows' mean curves
        series = [(row.name, [r["run"] for r in seeds]) for row, seeds in results if tasks[row.name] == task]
        game = any(row.config for row, _ in results if tasks[row.name] == task)
        title = f"{task}: greedy held-out accuracy" + (" (success rate)" if game else "")
        pngs.append(plot_mean_curves(series, os.path.join(out, f"mean_curves_{task}.png"), title))
    table = algorithms_table(results, args.margin)
    named = [(row.name, seeds) for row, seeds in results]
    text = (
        f"{table}\nGains are greedy held-out accuracy (the game: greedy success rate) at the last RL iteration minus "
        "that at iteration 0; the control is the same run with uninformative rewards (shuffled within the batch).\n"
        f"\n{statistics_text(named, prefix=True)}"
    )
    with open(os.path.join(out, "algorithms.md"), "w", encoding="utf-8") as f:
        f.write(text)
    written = write_statistics(os.path.join(out, "statistics.json"), named)
    print(f"\n{text}\nwrote {', '.join(pngs)}, {os.path.join(out, 'algorithms.md')} and {written}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    if args.xla_flags is not None:
        env["XLA_FLAGS"] = args.xla_flags
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(out, "jax_cache"))
    ledger = load_ledger(os.path.join(out, "runs.json"))
    if args.algorithms:
        return run_algorithms(args, overrides, env, out, ledger)
    base = [TRAIN_SCRIPT]
    if args.config:
        base.append(f"--config={os.path.abspath(args.config)}")
    base += ["--config.progress=False", *overrides]
    plan = Plan(len(args.seeds) * (1 if args.no_control else 2))
    rows = [
        seed_and_control(
            "",
            out,
            base,
            seed,
            control=not args.no_control,
            env=env,
            out=out,
            ledger=ledger,
            progress_every_s=args.progress_every_s,
            plan=plan,
        )
        for seed in args.seeds
    ]
    png = plot_curves(rows, os.path.join(out, "curves.png"))
    table = markdown_table(rows)
    problems = rows[0]["run"]["num_eval_problems"]
    note = f"Greedy accuracy on {problems} held-out problems" if problems else "Greedy held-out accuracy"
    gaps = [
        row["run"]["rl_gain"] - row["control"]["rl_gain"]
        for row in rows
        if row["control"] and row["control"]["rl_gain"] is not None and row["run"]["rl_gain"] is not None
    ]
    if gaps:
        note += f"; RL gain minus control gain, mean over seeds: {_gain(_mean(gaps))}"
    name = os.path.splitext(os.path.basename(args.config))[0] if args.config else "default"
    results = [(name, rows)]
    text = f"{table}\n{note}.\n\n{statistics_text(results, prefix=False)}"
    with open(os.path.join(out, "curves.md"), "w", encoding="utf-8") as f:
        f.write(text)
    series = [("RL", [row["run"] for row in rows])]
    if not args.no_control:
        series.append(("control (shuffled rewards)", [row["control"] for row in rows]))
    mean_png = plot_mean_curves(series, os.path.join(out, "mean_curves.png"), f"{name}: greedy held-out accuracy")
    written = write_statistics(os.path.join(out, "statistics.json"), results)
    print(f"\n{text}\nwrote {png}, {mean_png}, {os.path.join(out, 'curves.md')} and {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
