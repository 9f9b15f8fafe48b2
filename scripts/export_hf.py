"""Export a training run's policy (an Orbax checkpoint) or a parameter file as a Hugging Face checkpoint directory.

    python scripts/export_hf.py RUN_DIR --out OUT_DIR [--step N]        # latest (or step N) checkpoint of a run
    python scripts/export_hf.py RUN_DIR/checkpoints/N --out OUT_DIR      # one checkpoint step
    python scripts/export_hf.py --params PARAMS --like CHECKPOINT_DIR --out OUT_DIR

Run mode. RUN_DIR is a `--config.run_dir` of `scripts/train.py` (it holds
`config.json` and `checkpoints/<step>/`, written by
`mathrl_jax.train.checkpoint.Checkpointer`); the `checkpoints` directory or one
step directory in it may be given instead. Only the policy parameters are read
(the `params` part of the saved TrainState; the optimizer state and a critic
are skipped), on the CPU, with any mesh the run was trained on, and checked
against the checksums saved with them, by the trainer's own restore
(`Checkpointer.restore(..., partial=True)`, read-only). The architecture
and tokenizer come from the model the run started from, found as the training
loop does: `RUN_DIR/warmstart_model` when the run warm-started, else the
config's `model_name_or_path`, else `RUN_DIR/initial_model` (`--like DIR`
overrides this, e.g. for a run dir copied from another machine). Tensors are
saved in the run's `param_dtype` unless `--dtype` is given. A finished run
already has its last policy in `RUN_DIR/final_model`; this exports earlier
steps and runs that were stopped. A LoRA run's checkpoint holds its adapters
alone: they are merged into that base model, which must be the one they were
trained on (the hash the checkpoint recorded; another is refused).

Parameter-file mode. PARAMS is a file of parameters saved with
`flax.serialization.msgpack_serialize(nnx.to_pure_dict(nnx.state(model)))`,
or a directory holding one (`params.msgpack`). CHECKPOINT_DIR is the HF
checkpoint the model was built from: its `config.json` gives the
architecture and its tokenizer files are copied.

Either way the output loads with
`transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` and in vLLM. It
is written to a temporary sibling directory and renamed when complete, so a
failed export leaves no partial OUT_DIR. An existing non-empty OUT_DIR is
refused unless `--force`, which replaces only a previous export: a directory
holding nothing but what an export writes (config.json, model.safetensors or
numbered shards with model.safetensors.index.json, tokenizer files). One that
holds anything else (`notes.txt`, `sub/data.csv`) is refused even with
`--force`, naming a file, before anything is written or removed.

Exit status: 0 on success; 2 for bad input (no run or checkpoint at the path,
an unknown step, a model that does not match the checkpoint, params that fail
verification, an OUT_DIR in the way; in parameter-file mode an unreadable or
mismatched parameter file), with a one-line message naming the path.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
from flax import nnx, serialization

from mathrl_jax import files
from mathrl_jax.errors import TrainingError
from mathrl_jax.models import hf
from mathrl_jax.models.hf_config import load_config
from mathrl_jax.models.qwen import ConfigError, QwenConfig, QwenForCausalLM
from mathrl_jax.train import run_directory
from mathrl_jax.train.checkpoint import (
    LORA_BASE_KEY,
    STATE_ITEM,
    Checkpointer,
    CheckpointError,
    TargetMismatchError,
    UnverifiedCheckpointError,
    check_lora_base,
    lora_base_record,
)

CHECKPOINTS = run_directory.CHECKPOINTS
PARAMS_KEY = "params"  # the TrainState field of the policy parameters
DTYPES = ("float32", "bfloat16", "float16")


class InputError(ValueError):
    """Bad input of the run mode: exit status 2, the message names the path and what was expected."""


# ---------------------------------------------------------------------------------------------
# Parameter-file mode
# ---------------------------------------------------------------------------------------------


def load_params(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "params.msgpack")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no parameter file at {path!r}")
    with open(path, "rb") as f:
        try:
            return serialization.msgpack_restore(f.read())
        except Exception as e:  # msgpack raises several unrelated types
            raise ValueError(f"{path!r} is not a msgpack parameter file: {e}") from None


def _abstract_state(config: QwenConfig, adapters_only: bool = False) -> nnx.State:
    model = nnx.eval_shape(lambda: QwenForCausalLM(config, rngs=nnx.Rngs(0)))
    return nnx.state(model, nnx.LoRAParam) if adapters_only else nnx.state(model)


def export(params_path: str, like: str, out: str, dtype: str = None, force: bool = False) -> None:
    """Parameter-file mode: `params_path` (msgpack) with the architecture of `like`, written to `out`."""
    overrides = {"param_dtype": dtype} if dtype else {}
    config = load_config(like, **overrides)
    state = _abstract_state(config)
    try:
        nnx.replace_by_pure_dict(state, load_params(params_path))
    except (KeyError, ValueError) as e:
        raise ValueError(f"{params_path!r} does not match the {config.architecture} in {like!r}: {e}") from None
    check_out(out, force, protected=[like, params_path])
    write_atomically(out, lambda d: hf.export_checkpoint(state, config, d, tokenizer_dir=like), force)


# ---------------------------------------------------------------------------------------------
# Run mode: locating the run, the step and the starting model
# ---------------------------------------------------------------------------------------------


def _is_step_name(name: str) -> bool:
    return name.isdigit() and str(int(name)) == name


def locate(path: str, step: Optional[int]) -> Tuple[str, str, Optional[int]]:
    """(run dir, checkpoints dir, step) for a run dir, its checkpoints dir (step: `step`) or a step dir (its step).

    Which directory was meant is told by its name and contents, so the messages can say what was expected;
    raises InputError.
    """
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise InputError(f"{path!r} is not a directory; expected a run dir (with {CHECKPOINTS}/) or a checkpoint step")
    name = os.path.basename(path)
    if _is_step_name(name) and os.path.basename(os.path.dirname(path)) == CHECKPOINTS:
        if not os.path.isdir(os.path.join(path, STATE_ITEM)):
            raise InputError(f"checkpoint step {path!r} has no '{STATE_ITEM}' item; it is not a complete checkpoint")
        if step is not None and step != int(name):
            raise InputError(f"--step {step} disagrees with the checkpoint step directory {path!r}")
        return os.path.dirname(os.path.dirname(path)), os.path.dirname(path), int(name)
    if name == CHECKPOINTS and not os.path.isdir(os.path.join(path, CHECKPOINTS)):
        run_dir, checkpoints_dir = os.path.dirname(path), path
    else:
        run_dir, checkpoints_dir = path, os.path.join(path, CHECKPOINTS)
    if not os.path.isdir(checkpoints_dir):
        raise InputError(
            f"{path!r} is not a training run dir: no {CHECKPOINTS}/ directory in it "
            f"(expected RUN_DIR with {CHECKPOINTS}/<step>/, or RUN_DIR/{CHECKPOINTS}/<step>)"
        )
    return run_dir, checkpoints_dir, step


def choose_step(checkpointer: Checkpointer, step: Optional[int]) -> int:
    """`step`, or the latest, of the checkpointer's steps that hold a state item; raises InputError.

    Not `Checkpointer.restore(step=None)`'s choice: that falls back to an older step when the newest fails
    verification, where an export names its step and refuses a damaged one. Orbax takes any directory named by an
    integer for a finalized step (on a local disk the rename marks completion); one without the state item (made
    by hand, half deleted), which the trainer's restore refuses, is skipped.
    """
    directory = checkpointer.directory
    steps = [s for s in checkpointer.all_steps() if os.path.isdir(os.path.join(directory, str(s), STATE_ITEM))]
    if not steps:
        raise InputError(f"no complete checkpoint in {directory!r} (expected step directories such as 1/, 2/)")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise InputError(f"no checkpoint for step {step} in {directory!r}; the steps there are {steps}")
    return step


def read_run_config(run_dir: str) -> Dict[str, Any]:
    """The run's `config.json` (an empty dict when it is missing: the layout then decides)."""
    path = run_directory.path(run_dir, run_directory.CONFIG)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read the run config {path!r}: {e}") from None
    if not isinstance(config, dict):
        raise InputError(f"the run config {path!r} is not a JSON object")
    return config


def base_model_dir(run_dir: str, run_config: Dict[str, Any]) -> str:
    """The HF checkpoint the run's policy started from, as `mathrl_jax.train.setup.build_run` picks it."""
    warm = run_directory.path(run_dir, run_directory.WARMSTART_MODEL)
    warm_steps = (run_config.get("warmstart") or {}).get("steps", 0) if run_config else None
    # Without a config.json, a warmstart_model directory can only come from a warm-start.
    if os.path.isdir(warm) and (warm_steps is None or (isinstance(warm_steps, int) and warm_steps > 0)):
        return warm
    model = run_config.get("model_name_or_path") or ""
    if model:
        if not os.path.isdir(model):
            raise InputError(
                f"the run started from model_name_or_path {model!r} (in {run_dir}/config.json), which is not a "
                "directory here; pass --like with that checkpoint's directory"
            )
        return model
    initial = run_directory.path(run_dir, run_directory.INITIAL_MODEL)
    if os.path.isdir(initial):
        return initial
    raise InputError(
        f"cannot tell which model the run {run_dir!r} started from (no warmstart_model/, initial_model/ or "
        "model_name_or_path in config.json); pass --like with that checkpoint's directory"
    )


# ---------------------------------------------------------------------------------------------
# Run mode: reading the policy params of one checkpoint step
# ---------------------------------------------------------------------------------------------


def read_policy_params(checkpointer: Checkpointer, step: int, config: QwenConfig, base: str = "") -> nnx.State:
    """The policy params of checkpoint `step`, on the CPU, as an `nnx.State` of `config`'s model.

    Only the `params` entry of the saved TrainState is read and verified (a partial restore), whatever mesh the
    run was trained on; its keys and shapes must be those of `config`'s model (raises InputError naming them).
    A LoRA run (`config.lora_rank`) saved its adapters alone: they are read into the model of `base`, which must
    be the base they were trained on (its hash, recorded in the checkpoint's metadata).
    """
    step_dir = os.path.join(checkpointer.directory, str(step))
    try:
        if not any(name.split("/", 1)[0] == PARAMS_KEY for name in checkpointer.saved_shapes(step)):
            raise InputError(f"checkpoint {step_dir!r} holds no '{PARAMS_KEY}' tree; it is not a training state")
        cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
        abstract = _abstract_state(config, adapters_only=bool(config.lora_rank))
        model = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=cpu), abstract)
        restored, _ = checkpointer.restore({PARAMS_KEY: model}, step, partial=True)
        if config.lora_rank:
            try:
                check_lora_base(checkpointer.read_metadata(step).get(LORA_BASE_KEY), lora_base_record(base), step)
            except TrainingError as e:
                raise InputError(f"{e} (--like names another base)") from None
            state = hf.load_state(base, config)  # the base, adapters fresh: the saved ones replace them
            return nnx.merge_state(state, restored[PARAMS_KEY])
    except TargetMismatchError as e:
        raise InputError(
            f"checkpoint {step_dir!r} does not match the {config.architecture} of its base model "
            f"({'; '.join(e.differences)}); pass --like with the model the run trained"
        ) from None
    except UnverifiedCheckpointError as e:  # saved before checksums were kept: only when the user says so
        e.setting = "--allow-unverified"
        raise InputError(str(e)) from None
    except CheckpointError as e:  # unreadable or damaged: the message names the step
        raise InputError(str(e)) from None
    return restored[PARAMS_KEY]


def export_run(
    path: str,
    out: str,
    *,
    step: Optional[int] = None,
    like: Optional[str] = None,
    dtype: Optional[str] = None,
    force: bool = False,
    allow_unverified: bool = False,
) -> Tuple[str, int]:
    """Run mode: writes the policy of checkpoint `step` (default: the latest) of the run at `path` to `out`.
    `allow_unverified` reads a step saved before checksums were kept (nothing can verify it).

    Returns (the step directory read, the step).
    """
    run_dir, checkpoints_dir, step = locate(path, step)
    with Checkpointer(
        checkpoints_dir, save_interval=0, read_only=True, allow_unverified=allow_unverified
    ) as checkpointer:
        step = choose_step(checkpointer, step)
        step_dir = os.path.join(checkpoints_dir, str(step))
        run_config = read_run_config(run_dir)
        base = like if like else base_model_dir(run_dir, run_config)
        if like and not os.path.isdir(like):
            raise InputError(f"--like {like!r} is not a directory; expected the HF checkpoint the run started from")
        param_dtype = dtype or run_config.get("param_dtype") or "float32"
        if param_dtype not in DTYPES:
            raise InputError(f"param_dtype {param_dtype!r} in {run_dir}/config.json: expected one of {DTYPES}")
        lora = run_config.get("lora") or {}
        adapters = (
            dict(lora_rank=lora["rank"], lora_alpha=lora["alpha"], lora_targets=lora["targets"])
            if lora.get("rank")
            else {}
        )
        try:
            config = load_config(base, param_dtype=param_dtype, **adapters)
        except (ConfigError, OSError, ValueError) as e:
            raise InputError(f"base model {base!r}: {e}") from None
        check_out(out, force, protected=[run_dir, base])
        state = read_policy_params(checkpointer, step, config, base)
    write_atomically(out, lambda d: hf.export_checkpoint(state, config, d, tokenizer_dir=base), force)
    return step_dir, step


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


EXPORT_FILES = frozenset(("config.json", "model.safetensors", "model.safetensors.index.json", *hf.TOKENIZER_FILES))
"""The names an export writes (`hf.write_checkpoint`), besides its numbered shards (`SHARD_NAME`)."""
SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def _first_file(path: str) -> str:
    """`path` itself, or for a directory the first file under it (sorted), relative to `path`'s parent."""
    for root, dirs, names in os.walk(path):
        dirs.sort()
        if names:
            return os.path.join(os.path.basename(path), os.path.relpath(os.path.join(root, min(names)), path))
    return os.path.basename(path) + (os.sep if os.path.isdir(path) else "")


def not_an_export(out: str) -> Optional[str]:
    """Why the existing directory `out` is not a previous export that `--force` may replace, or None.

    An export (`hf.write_checkpoint`) writes `config.json`, its weights (`model.safetensors`, or numbered shards
    with `model.safetensors.index.json`) and the tokenizer files it copies (`hf.TOKENIZER_FILES`), nothing else
    and no subdirectory: a directory holding any other entry (`notes.txt`, `sub/data.csv`) is someone else's,
    and is named. An empty directory is replaced too.
    """
    names = sorted(os.listdir(out))
    if not names:
        return None
    for name in names:
        path = os.path.join(out, name)
        if os.path.isdir(path) or os.path.islink(path) or not (name in EXPORT_FILES or SHARD_NAME.fullmatch(name)):
            return f"it holds {_first_file(path)!r}, which an export does not write"
    if "config.json" not in names or not {"model.safetensors", "model.safetensors.index.json"} & set(names):
        return "it has no config.json and safetensors weights, so it is not a previous export"
    return None


def check_out(out: str, force: bool, protected: List[str]) -> None:
    """Refuses an OUT_DIR that is a file, a non-empty directory (without `force`), a directory that is not a previous
    export (even with `force`: `not_an_export`), or an input or its parent. Nothing is written or removed before."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"--out {out!r} exists and is not a directory")
    for source in protected:
        if source and os.path.exists(source) and _inside(source, out):  # replacing out would remove an input
            raise InputError(f"--out {out!r} holds the input {source!r}; write the export elsewhere")
    if os.path.isdir(out):
        _check_replaceable(out, force)


def _check_replaceable(out: str, force: bool) -> None:
    if os.listdir(out) and not force:
        raise InputError(f"--out {out!r} exists and is not empty; pass --force to replace a previous export")
    problem = not_an_export(out)
    if problem:
        raise InputError(
            f"--out {out!r} is not replaced: {problem}; --force replaces only a previous export (config.json, "
            "safetensors weights, tokenizer files): remove the other files or write the export elsewhere"
        )


def write_atomically(out: str, write: Callable[[str], None], force: bool) -> None:
    """`write(tmp)` into a temporary sibling of `out`, then renamed to `out` (replacing a previous export with
    `force`)."""

    def may_replace(existing: str) -> None:  # checked again: the directory may have changed since check_out
        _check_replaceable(existing, force)

    files.write_directory(out, write, check_existing=may_replace)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="export_hf.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", nargs="?", help="run dir, its checkpoints/ dir, or a checkpoint step dir")
    parser.add_argument("--step", type=int, help="checkpoint step to export (default: the latest)")
    parser.add_argument("--params", help="parameter-file mode: msgpack file (or a directory with params.msgpack)")
    parser.add_argument(
        "--like", help="HF checkpoint directory with the config.json and tokenizer (run mode: the run's base model)"
    )
    parser.add_argument("--out", required=True, help="output HF checkpoint directory")
    parser.add_argument("--dtype", choices=DTYPES, help="dtype of the saved tensors (default: the params' dtype)")
    parser.add_argument(
        "--force", action="store_true", help="replace an existing --out that holds a previous export (and nothing else)"
    )
    parser.add_argument(
        "--allow-unverified",
        action="store_true",
        help="read a checkpoint step saved before checksums were kept (nothing can verify its data)",
    )
    args = parser.parse_args(argv)
    if (args.run is None) == (args.params is None):
        parser.error("give either a run dir / checkpoint step (positional) or --params with --like, not both")
    if args.params is not None:
        if not args.like:
            parser.error("--params needs --like (the HF checkpoint the params belong to)")
        if args.step is not None:
            parser.error("--step applies to a run dir, not to --params")
        try:
            export(args.params, args.like, args.out, args.dtype, args.force)
        except (InputError, ConfigError, hf.ModelCheckpointError, FileNotFoundError, ValueError) as e:
            print(f"export_hf: error: {e}", file=sys.stderr)
            return 2  # bad input, as in run mode
        print(f"wrote {args.out}")
        return 0
    try:
        step_dir, _ = export_run(
            args.run,
            args.out,
            step=args.step,
            like=args.like,
            dtype=args.dtype,
            force=args.force,
            allow_unverified=args.allow_unverified,
        )
    except (InputError, ConfigError, hf.ModelCheckpointError) as e:
        print(f"export_hf: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} from {step_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
