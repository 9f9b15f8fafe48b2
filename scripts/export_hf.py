"""Export a training run's policy (an Orbax checkpoint) or a parameter file as a Hugging Face checkpoint directory.

    python scripts/export_hf.py RUN_DIR --out OUT_DIR [--step N]        # latest (or step N) checkpoint of a run
    python scripts/export_hf.py RUN_DIR/checkpoints/N --out OUT_DIR      # one checkpoint step
    python scripts/export_hf.py --params PARAMS --like CHECKPOINT_DIR --out OUT_DIR

Run mode. RUN_DIR is a `--config.run_dir` of `scripts/train.py` (it holds
`config.json` and `checkpoints/<step>/`, written by
`mathrl_jax.train.checkpoint.Checkpointer`); the `checkpoints` directory or one
step directory in it may be given instead. Only the policy parameters are read
(the `params` part of the saved TrainState; the optimizer state and a critic
are skipped), on the CPU, with any mesh the run was trained on. The architecture
and tokenizer come from the model the run started from, found as the training
loop does: `RUN_DIR/warmstart_model` when the run warm-started, else the
config's `model_name_or_path`, else `RUN_DIR/initial_model` (`--like DIR`
overrides this, e.g. for a run dir copied from another machine). Tensors are
saved in the run's `param_dtype` unless `--dtype` is given. A finished run
already has its last policy in `RUN_DIR/final_model`; this exports earlier
steps and runs that were stopped.

Parameter-file mode. PARAMS is a file of parameters saved with
`flax.serialization.msgpack_serialize(nnx.to_pure_dict(nnx.state(model)))`,
or a directory holding one (`params.msgpack`). CHECKPOINT_DIR is the HF
checkpoint the model was built from: its `config.json` gives the
architecture and its tokenizer files are copied.

Either way the output loads with
`transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` and in vLLM. It
is written to a temporary sibling directory and renamed when complete, so a
failed export leaves no partial OUT_DIR. An existing non-empty OUT_DIR is
refused unless `--force` (which replaces it).

Exit status: 0 on success; 2 for bad input (no run or checkpoint at the path,
an unknown step, a model that does not match the checkpoint, an OUT_DIR in the
way), with a one-line message naming the path; 1 for an unreadable or
mismatched parameter file in parameter-file mode (as before).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from flax import nnx, serialization

from mathrl_jax import files
from mathrl_jax.models import hf
from mathrl_jax.models.hf_config import load_config
from mathrl_jax.models.qwen import ConfigError, QwenConfig, QwenForCausalLM

CHECKPOINTS = "checkpoints"
STATE_ITEM = "state"  # mathrl_jax.train.checkpoint_directory.STATE_ITEM
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


def _abstract_state(config: QwenConfig) -> nnx.State:
    return nnx.state(nnx.eval_shape(lambda: QwenForCausalLM(config, rngs=nnx.Rngs(0))))


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


def checkpoint_steps(checkpoints_dir: str) -> List[int]:
    """The complete steps in a Checkpointer directory, ascending.

    Orbax writes a step into `<step>.orbax-checkpoint-tmp...` and renames it to `<step>` once complete (local
    file systems), so a directory named by an integer with a `state` item is a finished step.
    """
    steps = []
    for name in os.listdir(checkpoints_dir):
        if _is_step_name(name) and os.path.isdir(os.path.join(checkpoints_dir, name, STATE_ITEM)):
            steps.append(int(name))
    return sorted(steps)


def locate(path: str, step: Optional[int]) -> Tuple[str, str, int]:
    """(run dir, step dir, step) for a run dir, its checkpoints dir or a step dir; raises InputError."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise InputError(f"{path!r} is not a directory; expected a run dir (with {CHECKPOINTS}/) or a checkpoint step")
    name = os.path.basename(path)
    if _is_step_name(name) and os.path.basename(os.path.dirname(path)) == CHECKPOINTS:
        if not os.path.isdir(os.path.join(path, STATE_ITEM)):
            raise InputError(f"checkpoint step {path!r} has no '{STATE_ITEM}' item; it is not a complete checkpoint")
        if step is not None and step != int(name):
            raise InputError(f"--step {step} disagrees with the checkpoint step directory {path!r}")
        return os.path.dirname(os.path.dirname(path)), path, int(name)
    if name == CHECKPOINTS and not os.path.isdir(os.path.join(path, CHECKPOINTS)):
        run_dir, checkpoints_dir = os.path.dirname(path), path
    else:
        run_dir, checkpoints_dir = path, os.path.join(path, CHECKPOINTS)
    if not os.path.isdir(checkpoints_dir):
        raise InputError(
            f"{path!r} is not a training run dir: no {CHECKPOINTS}/ directory in it "
            f"(expected RUN_DIR with {CHECKPOINTS}/<step>/, or RUN_DIR/{CHECKPOINTS}/<step>)"
        )
    steps = checkpoint_steps(checkpoints_dir)
    if not steps:
        raise InputError(f"no complete checkpoint in {checkpoints_dir!r} (expected step directories such as 1/, 2/)")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise InputError(f"no checkpoint for step {step} in {checkpoints_dir!r}; the steps there are {steps}")
    return run_dir, os.path.join(checkpoints_dir, str(step)), step


def read_run_config(run_dir: str) -> Dict[str, Any]:
    """The run's `config.json` (an empty dict when it is missing: the layout then decides)."""
    path = os.path.join(run_dir, "config.json")
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
    """The HF checkpoint the run's policy started from, as `mathrl_jax.train.loop.build_run` picks it."""
    warm = os.path.join(run_dir, "warmstart_model")
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
    initial = os.path.join(run_dir, "initial_model")
    if os.path.isdir(initial):
        return initial
    raise InputError(
        f"cannot tell which model the run {run_dir!r} started from (no warmstart_model/, initial_model/ or "
        "model_name_or_path in config.json); pass --like with that checkpoint's directory"
    )


# ---------------------------------------------------------------------------------------------
# Run mode: reading the policy params of one checkpoint step
# ---------------------------------------------------------------------------------------------


def _flat_leaves(tree: Any) -> Dict[Tuple[str, ...], Any]:
    """{key path as strings: leaf} of a nested dict (Orbax metadata and restored trees use string keys)."""
    flat: Dict[Tuple[str, ...], Any] = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, prefix + (str(key),))
        elif node is not None:
            flat[prefix] = node

    walk(tree, ())
    return flat


def _state_paths(state: nnx.State) -> Dict[Tuple[str, ...], Any]:
    """{key path as strings: abstract leaf} of an NNX state, as the Checkpointer names its leaves."""
    return {tuple(str(k) for k in path): leaf for path, leaf in nnx.to_flat_state(state)}


def read_policy_params(step_dir: str, config: QwenConfig) -> nnx.State:
    """The policy params of the checkpoint in `step_dir`, on the CPU, as an `nnx.State` of `config`'s model.

    Only the `params` subtree of the saved TrainState is restored (an Orbax partial restore), whatever
    mesh the run was trained on; keys and shapes are checked against `config`'s model first.
    """
    import jax
    import orbax.checkpoint as ocp
    from etils import epath

    item_dir = epath.Path(os.path.join(step_dir, STATE_ITEM))
    handler = ocp.PyTreeCheckpointHandler()
    try:
        try:
            metadata = handler.metadata(item_dir)
        except Exception as e:  # Orbax raises several unrelated types for unreadable metadata
            raise InputError(f"cannot read the checkpoint metadata in {str(item_dir)!r}: {e}") from None
        saved = getattr(metadata, "tree", metadata)
        if not isinstance(saved, dict) or not isinstance(saved.get(PARAMS_KEY), dict):
            raise InputError(f"checkpoint {step_dir!r} holds no '{PARAMS_KEY}' tree; it is not a training state")
        saved_leaves = _flat_leaves(saved[PARAMS_KEY])
        state = _abstract_state(config)
        wanted = _state_paths(state)
        missing = sorted("/".join(p) for p in wanted if p not in saved_leaves)
        extra = sorted("/".join(p) for p in saved_leaves if p not in wanted)
        shapes = [
            f"{'/'.join(p)}: saved {tuple(saved_leaves[p].shape)}, model {tuple(leaf.shape)}"
            for p, leaf in wanted.items()
            if p in saved_leaves and tuple(saved_leaves[p].shape) != tuple(leaf.shape)
        ]
        if missing or extra or shapes:
            parts = [
                f"{what}: {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}"
                for what, names in (("model keys not saved", missing), ("saved keys not in the model", extra))
                + (("shapes differ", shapes),)
                if names
            ]
            raise InputError(
                f"checkpoint {step_dir!r} does not match the {config.architecture} of its base model "
                f"({'; '.join(parts)}); pass --like with the model the run trained"
            )
        cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
        target = {
            PARAMS_KEY: jax.tree.map(
                lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=cpu), saved[PARAMS_KEY]
            )
        }
        args = ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
        )
        try:
            restored = handler.restore(item_dir, args=args)
        except Exception as e:  # re-raised with the directory named
            raise InputError(f"cannot restore the params of checkpoint {step_dir!r}: {e}") from None
    finally:
        handler.close()
    values = _flat_leaves(restored[PARAMS_KEY])
    pure: Dict[Any, Any] = {}  # with the model's own keys (layer indices are ints there, strings on disk)
    for path, _ in nnx.to_flat_state(state):
        node = pure
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = values[tuple(str(k) for k in path)]
    nnx.replace_by_pure_dict(state, pure)
    return state


def export_run(
    path: str,
    out: str,
    *,
    step: Optional[int] = None,
    like: Optional[str] = None,
    dtype: Optional[str] = None,
    force: bool = False,
) -> Tuple[str, int]:
    """Run mode: writes the policy of checkpoint `step` (default: the latest) of the run at `path` to `out`.

    Returns (the step directory read, the step).
    """
    run_dir, step_dir, step = locate(path, step)
    run_config = read_run_config(run_dir)
    base = like if like else base_model_dir(run_dir, run_config)
    if like and not os.path.isdir(like):
        raise InputError(f"--like {like!r} is not a directory; expected the HF checkpoint the run started from")
    param_dtype = dtype or run_config.get("param_dtype") or "float32"
    if param_dtype not in DTYPES:
        raise InputError(f"param_dtype {param_dtype!r} in {run_dir}/config.json: expected one of {DTYPES}")
    try:
        config = load_config(base, param_dtype=param_dtype)
    except (ConfigError, OSError, ValueError) as e:
        raise InputError(f"base model {base!r}: {e}") from None
    check_out(out, force, protected=[run_dir, base])
    state = read_policy_params(step_dir, config)
    write_atomically(out, lambda d: hf.export_checkpoint(state, config, d, tokenizer_dir=base), force)
    return step_dir, step


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def check_out(out: str, force: bool, protected: List[str]) -> None:
    """Refuses an OUT_DIR that is a file, a non-empty directory (without `force`), or an input or its parent."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"--out {out!r} exists and is not a directory")
    for source in protected:
        if source and os.path.exists(source) and _inside(source, out):  # replacing out would remove an input
            raise InputError(f"--out {out!r} holds the input {source!r}; write the export elsewhere")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise InputError(f"--out {out!r} exists and is not empty; pass --force to replace it")


def write_atomically(out: str, write: Callable[[str], None], force: bool) -> None:
    """`write(tmp)` into a temporary sibling of `out`, then renamed to `out` (replacing it with `force`)."""

    def may_replace(existing: str) -> None:
        if os.listdir(existing) and not force:  # appeared since check_out
            raise InputError(f"--out {out!r} exists and is not empty; pass --force to replace it")

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
    parser.add_argument("--force", action="store_true", help="replace a non-empty existing --out")
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
        step_dir, _ = export_run(args.run, args.out, step=args.step, like=args.like, dtype=args.dtype, force=args.force)
    except (InputError, ConfigError, hf.ModelCheckpointError) as e:
        print(f"export_hf: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} from {step_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
