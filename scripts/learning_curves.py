"""Learning curves over seeds: the RL run and its control (shuffled rewards), as a PNG and a markdown table.

    python scripts/learning_curves.py [--seeds 0 1 2] [--out runs/curves] [--config PATH] [--no-control]
                                      [--algorithms all | NAME ...] [--xla-flags "..."] [-- --config.key=value ...]

For each seed k it runs `scripts/train.py` (the offline default, or `--config`) into `<out>/seed<k>`, then the
control into `<out>/control<k>`: the same command with `--config.shuffle_rewards=True` (the verifier's rewards
shuffled within each batch), started from the seed's warm-start model, which is copied into the control's run
directory first so that both RL phases start from the same policy. Everything after `--` goes to every
train.py call; `--xla-flags` replaces XLA_FLAGS in their environment, e.g. XLA:CPU's Eigen matmuls instead of
YNNPACK's, `--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_xnnpack=false`, to check that the result
survives another rounding (with jaxlib 0.10, `--xla_cpu_use_onednn=true` changes no bit). The runs share a
JAX compilation cache (`<out>/jax_cache`, unless JAX_COMPILATION_CACHE_DIR is set), so a control does not
compile again what its seed run compiled. A run already finished by the same command is read, not run again
(`<out>/runs.json`).

Writes `<out>/curves.png` (greedy held-out accuracy against the RL iteration: a solid line per seed, a dashed
one per control) and `<out>/curves.md` (printed too): one row per seed, then the mean and min..max of the
gains over the seeds.

With `--algorithms NAME ...` (or `all`) it makes one table for several algorithms instead: each row is an
algorithm at the settings of `ALGORITHM_ROWS` (the offline default plus its own flags; `async_ppo` twice, with
staleness 1 and 2; `reinforce_rebn` on the offline game, `configs/guess_number_tiny.py`, its accuracy the greedy
success rate of held-out games), run over the seeds with their controls into `<out>/<row>/seed<k>` and
`<out>/<row>/control<k>`. Every arithmetic row of a seed starts from the same warm-start (trained by the first,
copied by the others, as a control copies its seed's). It writes `<out>/algorithms.md` (one line per row: the RL
gain and the control's, mean and min..max over the seeds, their difference, the wall time of an RL phase) and
`<out>/algorithms.png` (one panel per row, seeds solid, controls dashed).

Reading it: "RL gain" is the greedy held-out accuracy at the last RL iteration minus that at iteration 0 (the
warm-started policy). The control gets the same updates with rewards that carry no information, so its gain is
what the RL phase does without learning from the verifier (drift, noise of the evaluation). RL works when the
RL gains sit above the control gains by more than their spread over seeds; the evaluation's own noise is at
most 0.5/sqrt(held-out problems), one standard deviation (500 problems: +-2.2 points).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional, Tuple

from mathrl_jax import files
from mathrl_jax.train.metrics import read_jsonl_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_SCRIPT = os.path.join(ROOT, "scripts", "train.py")
# Set per run by this script: an override of them would mix up the runs.
OWN_KEYS = ("run_dir", "seed", "shuffle_rewards")
# What the control copies from its seed's run directory: the same starting model, and no warm-start of its own.
SHARED_MODELS = ("initial_model", "warmstart_model")
STDERR_TAIL_LINES = 40
GAME_CONFIG = os.path.join(ROOT, "mathrl_jax", "configs", "guess_number_tiny.py")
PROCESS_REWARDS = (
    "--config.prm_model_name_or_path=arithmetic_steps",  # the offline task's process verifier, where OpenR's PRM sits
    "--config.reward_source=prm+verifier",
    "--config.step_separator=,",
)


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
)
ALGORITHM_ROWS = {
    "grpo": ("grpo",),
    "drgrpo": ("drgrpo",),
    "dapo": ("dapo",),
    "rloo": ("rloo",),
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
ROW_BY_NAME = {row.name: row for row in ROWS}


def fail(message: str) -> None:
    print(f"learning_curves.py: error: {message}", file=sys.stderr)
    sys.exit(1)


# ----------------------------------------------------------------------------- reading runs


def read_config(run_dir: str) -> dict[str, Any]:
    """The run's `config.json` (written by train.py), or {} before it exists."""
    path = os.path.join(run_dir, "config.json")
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
    `turns_start`, `turns_end` (a multi-turn run's turns per held-out game); `warmstart_before`,
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


# ----------------------------------------------------------------------------- running


def load_ledger(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save_ledger(path: str, ledger: dict[str, Any]) -> None:
    files.write_json(path, ledger, indent=2)


def report_progress(name: str, process: subprocess.Popen, run_dir: str, start: float, every_s: float) -> int:
    """Waits for `process` (a train.py run), printing a line every `every_s` seconds: the warm-start's time, then
    each new last logged iteration with its reward and accuracy; returns its exit status."""
    shown = None
    while True:
        try:
            return process.wait(timeout=every_s)
        except subprocess.TimeoutExpired:
            pass
        path = os.path.join(run_dir, "metrics.jsonl")
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


def run_train(
    name: str,
    command: list[str],
    run_dir: str,
    env: dict[str, str],
    out: str,
    ledger: dict,
    prepare: Callable[[], None] | None = None,
    progress_every_s: float = 15.0,
) -> float:
    """Runs one train.py (or reuses it when the same command already finished it); returns its wall seconds.

    A run directory left by another command (other overrides or XLA flags) is removed first: train.py would
    resume it and mix the two. One left unfinished by the same command is resumed. `prepare()` runs just
    before train.py (the control copies its seed's models then)."""
    entry = ledger.get(name)
    same = bool(entry) and entry["command"] == command and entry["xla_flags"] == env.get("XLA_FLAGS")
    finished = os.path.isfile(os.path.join(run_dir, "metrics.jsonl")) and read_run(run_dir)["finished"]
    if same and entry.get("seconds") is not None and finished:
        print(f"{name}: already finished by the same command, reusing {run_dir}", flush=True)
        return entry["seconds"]
    if not same and os.path.exists(run_dir):
        print(f"{name}: {run_dir} was made by another command; starting it over", flush=True)
        shutil.rmtree(run_dir)
    ledger[name] = {"command": command, "xla_flags": env.get("XLA_FLAGS"), "seconds": None}  # started
    save_ledger(os.path.join(out, "runs.json"), ledger)
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
    save_ledger(os.path.join(out, "runs.json"), ledger)
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
    args = parser.parse_args(own)
    if args.algorithms:
        if args.config:
            parser.error("--config and --algorithms: each algorithm row names its own config")
        try:
            expand_algorithms(args.algorithms)
        except ValueError as error:
            parser.error(str(error))
    if not args.progress_every_s > 0:
        parser.error(f"--progress-every-s {args.progress_every_s}: expected > 0")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {' '.join(map(str, args.seeds))} repeats a seed")
    for flag in overrides:
        key = flag.split("=", 1)[0].removeprefix("--config.")
        if key in OWN_KEYS:
            parser.error(f"{flag}: this script sets --config.{key} for each run")
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
) -> dict[str, Any]:
    """Runs seed `seed` into `<directory>/seed<k>` and, with `control`, its control into `<directory>/control<k>`
    (starting from the seed's models). `start_from`: a run directory whose models the seed run starts from (a
    warm-start another run already trained). Returns the table's row: {"seed", "run", "control"}."""
    seed_dir = os.path.join(directory, f"seed{seed}")
    command = [*base, f"--config.run_dir={seed_dir}", f"--config.seed={seed}"]
    prepare = None if start_from is None else (lambda: copy_start_models(start_from, seed_dir))
    seconds = run_train(
        f"{prefix}seed{seed}", command, seed_dir, env, out, ledger, prepare=prepare, progress_every_s=progress_every_s
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
            wanted.update(ROW_BY_NAME)
        elif name in ALGORITHM_ROWS:
            wanted.update(ALGORITHM_ROWS[name])
        elif name in ROW_BY_NAME:
            wanted.add(name)
        else:
            known = ", ".join(["all", *ALGORITHM_ROWS, *(r for r in ROW_BY_NAME if r not in ALGORITHM_ROWS)])
            raise ValueError(f"--algorithms {name}: unknown; expected some of {known}")
    return [row for row in ROWS if row.name in wanted]


def run_algorithms(args, overrides: list[str], env: dict[str, str], out: str, ledger: dict) -> int:
    rows = expand_algorithms(args.algorithms)
    results = []
    warmstarts: dict[int, str] = {}  # seed -> the run directory that trained the arithmetic warm-start
    for row in rows:
        base = [TRAIN_SCRIPT]
        if row.config:
            base.append(f"--config={row.config}")
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
                )
            )
            if row.shares_warmstart:
                warmstarts.setdefault(seed, os.path.join(out, row.name, f"seed{seed}"))
        results.append((row, seeds))
    png = plot_algorithms(results, os.path.join(out, "algorithms.png"))
    table = algorithms_table(results, args.margin)
    text = (
        f"{table}\nGains are greedy held-out accuracy (the game: greedy success rate) at the last RL iteration minus "
        "that at iteration 0; the control is the same run with uninformative rewards (shuffled within the batch).\n"
    )
    with open(os.path.join(out, "algorithms.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(f"\n{text}\nwrote {png} and {os.path.join(out, 'algorithms.md')}")
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
    text = f"{table}\n{note}.\n"
    with open(os.path.join(out, "curves.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(f"\n{text}\nwrote {png} and {os.path.join(out, 'curves.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
