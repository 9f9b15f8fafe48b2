"""Train a policy with RL: `python scripts/train.py [--config mathrl_jax/configs/<name>.py] [--config.key=value ...]`.

With no arguments: the offline default (mathrl_jax/configs/default.py): the tiny
Qwen-architecture model on procedural arithmetic, on the CPU, in minutes.
A run directory (`--config.run_dir`) holds checkpoints, tensorboard events,
metrics.jsonl and config.json; running the same command again resumes it.

Bad input (unknown algorithm or config key, wrong type, missing or malformed
data file, missing model, bad mesh) exits with status 2 and a one-paragraph
message, before anything is written into the run directory.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(ROOT, "mathrl_jax", "configs", "default.py")


def fail(message: str) -> None:
    print(f"train.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_config(argv):
    """The config file and its overrides; unknown keys and wrong types become one-line errors."""
    from absl import flags
    from ml_collections import config_flags

    try:
        # Defining the flag already reads the `--config.key` overrides from sys.argv.
        config_flags.DEFINE_config_file(
            "config", default=DEFAULT_CONFIG, help_string="a mathrl_jax config file", sys_argv=list(argv)
        )
        flags.FLAGS(argv)
    except flags.Error as error:
        fail(without_traceback(str(error)))
    except OSError as error:  # a config file that does not load, met while applying an override to it
        fail(f"cannot load the config: {' '.join(str(error).split())}")
    except (KeyError, AttributeError) as error:
        unknown = unknown_key(argv, str(error))
        if unknown:
            fail(unknown)
        while error.args and isinstance(error.args[0], BaseException):  # an AttributeError around the KeyError
            error = error.args[0]
        message = " ".join(str(error.args[0] if error.args else error).split())  # KeyError's str() is its repr
        fail(f"--config has no key {message} (see mathrl_jax/configs/default.py for every key)")
    except (TypeError, ValueError) as error:
        fail(f"bad --config override: {error}")
    try:
        config = flags.FLAGS.config
        config.keys()  # a config file that did not load answers every access with its loading error
    except Exception as error:
        fail(f"cannot load the config: {' '.join(str(error).split())}")
    return config


def without_traceback(message: str) -> str:
    """absl's message on one line, a traceback it embeds (a config file's get_config failing) cut to its last line,
    the exception: `flag --config=FILE: Error whilst parsing config file: TypeError: Could not override ...`."""
    head, sep, trace = message.partition("Traceback (most recent call last):")
    if sep:
        lines = [line for line in trace.strip().splitlines() if line.strip()]
        head = f"{head.strip()} {lines[-1].strip() if lines else ''}"
    return " ".join(head.split())


def resolve_names(argv):
    """`argv` with TRL's and verl's names of our options rewritten to ours (`mathrl_jax/trl_verl_names.py`), each
    rewrite said on stderr; a name whose meaning differs stops here, naming the key to use."""
    from mathrl_jax import trl_verl_names as names

    try:
        argv, notes = names.resolve_names(argv)
    except names.RefusedName as error:
        fail(str(error))
    for note in notes:
        print(f"train.py: {note}", file=sys.stderr)
    return argv


def unknown_key(argv, error: str = ""):
    """The line for the `--config.KEY` that is not an option of the table (the one ml_collections' `error` names,
    else the first), with what it may have meant (our keys and TRL's / verl's names: `names.suggestions`); None if
    each is one (a key a config file of the user's adds: ml_collections' own message then stands)."""
    from mathrl_jax import trl_verl_names as names
    from mathrl_jax.configs import default
    from mathrl_jax.options import options_of

    keys = [option.key for option in options_of(default.OPTIONS)]
    given = [a.split("=", 1)[0][len("--config.") :] for a in argv[1:] if a.startswith("--config.")]
    unknown = [key for key in given if key not in keys]
    named = [key for key in unknown if f"'{key.rsplit('.', 1)[-1]}'" in error]  # the key ml_collections named
    if not (named or unknown):
        return None
    key = (named or unknown)[0]
    maybe = names.suggestions(key, keys)
    hint = f"; did you mean {' or '.join(maybe)}?" if maybe else ""
    return f"--config has no key {key!r}{hint} (`python scripts/train.py --help` lists every key)"


def join_processes(config) -> bool:
    """Starts `jax.distributed` when this is one process of several (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
    JAX_PROCESS_ID, or SLURM / Open MPI), before any other JAX call; returns whether it did."""
    from mathrl_jax.sharding import distributed

    if os.environ.get("JAX_NUM_PROCESSES"):  # a line that explains an abort here: a peer never joined
        print(
            f"train.py: process {os.environ.get('JAX_PROCESS_ID')} of {os.environ['JAX_NUM_PROCESSES']} joins the "
            f"others at {os.environ.get('JAX_COORDINATOR_ADDRESS')} (waits up to join_timeout_s="
            f"{config.join_timeout_s} s: a process that refused its config stops before joining)",
            file=sys.stderr,
            flush=True,
        )
    try:
        return distributed.initialize(
            heartbeat_timeout_s=config.heartbeat_timeout_s, join_timeout_s=config.join_timeout_s
        )
    except ValueError as error:
        fail(str(error))


HELP_FLAGS = ("-h", "--help", "--helpfull")


def print_help(argv) -> None:
    """`--help`: every option of the config (the default or `--config=FILE`, with any overrides applied), its value
    and its meaning (`train/setup/_help.py`)."""
    from mathrl_jax.train.setup import format_help

    config = parse_config([a for a in argv if a not in HELP_FLAGS])
    given = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    given += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]  # `--config FILE` too
    print(format_help(config, given[-1] if given else os.path.relpath(DEFAULT_CONFIG, ROOT)))


def main(argv=None) -> int:
    argv = resolve_names(list(sys.argv if argv is None else argv))
    if any(a in HELP_FLAGS for a in argv[1:]):
        print_help(argv)
        return 0
    config = parse_config(argv)
    from mathrl_jax.errors import TrainingError
    from mathrl_jax.train.setup import validate_settings

    try:  # before the processes join: each refuses a bad config alone, and no peer's exit can abort it
        validate_settings(config)
    except TrainingError as error:
        fail(str(error))
    several = join_processes(config)
    from mathrl_jax import compile_cache

    try:  # before the first compilation
        compile_cache.enable(config.compilation_cache_dir)
    except ValueError as error:
        fail(str(error))
    from mathrl_jax.errors import MathRLError
    from mathrl_jax.sharding import distributed
    from mathrl_jax.train.loop import train

    try:
        summary = train(config)
    except MathRLError as error:  # bad input, named in the message: exit 2 (a bug keeps its traceback)
        if several:
            distributed.leave(
                2, str(error), program="train.py", leader_grace_s=min(5.0, config.heartbeat_timeout_s / 2)
            )
        # A save that failed in Orbax's background threads (a full disk) can leave a coroutine that the
        # interpreter's shutdown reports as never awaited, two lines after the one that names the failure.
        import warnings

        warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
        fail(str(error))
    except BaseException:
        if several:
            import traceback

            distributed.leave(1, traceback.format_exc(), program="train.py", timeout_s=config.heartbeat_timeout_s + 10)
        raise
    if several:
        import jax

        if jax.process_index() != 0:
            return 0  # process 0 prints the summary
    warm = summary["warmstart"]
    curve = summary["eval"]
    print(f"run directory: {config.run_dir}")
    if warm and "warmstart/eval_accuracy_before" in warm:  # absent: no held-out problem to evaluate
        print(
            f"warm-start: greedy held-out accuracy {warm['warmstart/eval_accuracy_before']:.3f} -> "
            f"{warm['warmstart/eval_accuracy_after']:.3f} ({warm['warmstart/seconds']:.0f} s)"
        )
    if curve:
        print("RL eval curve (iteration: greedy held-out accuracy): " + ", ".join(f"{i}: {a:.3f}" for i, a in curve))
        if curve[0][0] == 0:  # a resumed run's curve starts later: no gain of the whole phase to report
            problems = summary["num_eval_problems"]
            print(f"RL phase gain: {curve[-1][1] - curve[0][1]:+.3f} (greedy, {problems} held-out problems)")
    for name, metrics in (("RL start", summary.get("eval_start")), ("RL end", summary.get("eval_end"))):
        if metrics and "eval/pass@1" in metrics:
            k = config.eval_n_samples
            print(
                f"{name}: greedy accuracy {metrics['eval/accuracy']:.3f}, T={config.temperature:g} accuracy "
                f"{metrics['eval/pass@1']:.3f}, pass@{k} {metrics[f'eval/pass@{k}']:.3f}"
            )
    if config.shuffle_rewards:
        print("(control run: each response's rewards were given to another response of its batch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
