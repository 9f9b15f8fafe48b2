"""Orbax checkpoints of a training state, with exact resume.

`Checkpointer` wraps an Orbax `CheckpointManager`; every step directory holds
three items:

    <directory>/<step>/state      the pytree (OCDBT / TensorStore), sharded as it lives
    <directory>/<step>/metadata   JSON (in the file metadata/metadata): data position, config, version, ...
    <directory>/<step>/checksums  JSON: each leaf's dtype and checksum, taken from memory at `save`

Guarantees:

- Periodic and final saves: `should_save(step)` is true on positive multiples
  of `save_interval`; `save(..., force=True)` saves at any step (the end of a run).
  Only the last `max_to_keep` steps are kept.
- Asynchronous writes: `save` returns once the arrays are copied to host memory;
  the files are written in a background thread, so the device buffers may be
  donated or deleted right after `save` returns.
- Atomic: Orbax writes a step into `<step>.orbax-checkpoint-tmp`, writes
  `commit_success.txt` into it, then renames it to `<step>` (on a local or POSIX
  file system; on GCS `commit_success.txt` alone marks completion). A process
  killed at any moment leaves either a complete step or a tmp directory that is
  never taken for a checkpoint and is removed when the next `Checkpointer` opens
  the directory.
- Exact resume: `restore` returns every leaf bit-identical (arrays, optax state,
  raw `uint32` RNG key data from `jax.random.key_data`, Python `int`/`float`/`bool`)
  and the JSON metadata as saved (JSON round trip: tuples come back as lists).
- Sharded: each process writes its own shards; `restore` places every array with
  the target's sharding, which may be another mesh shape than the one saved.
- Verified: Orbax checks no data it reads back (OCDBT and zarr keep no checksum of the
  array data; a flipped byte in a data file restores as other numbers), so `save` stores
  a 64-bit checksum of every leaf (`train.checksums`, computed where the array lives, the same for
  any sharding) and `restore` compares each restored leaf with it. A step that fails is
  refused; restoring the latest step falls back to the newest intact one, with a warning
  naming both; the refused steps are removed at the next `save`; rotation (`max_to_keep`)
  never removes the last step `restore` verified. Every step failing is a
  `CorruptCheckpointError`. Steps saved before checksums were kept restore unverified.

The state is a pytree of dicts, lists, tuples, NamedTuples (optax states), registered
dataclasses or flax `nnx.State`. Orbax saves it as it is and restores it into the
structure of the restore target (`ocp.args.StandardRestore` of the target's abstract
leaves), so the target may hold a mapping, NamedTuple or dataclass where a mapping,
NamedTuple or dataclass of the same keys was saved. Where the saved tree has a dict for a
list or tuple of the target (checkpoints of the previous layout: every container a dict, list
and tuple entries keyed "0", "1", ...), `restore` matches the leaves by key instead.
Leaves are named by key path ("params/layers/0/kernel", `sharding.path_string`). NNX
Variables are stored as their values, so a state saved from `nnx.State` restores into
`nnx.to_pure_dict(state)` and back. Typed PRNG key arrays are refused: store
`jax.random.key_data(key)` (and rewrap with `jax.random.wrap_key_data`).

Checkpoint layout and atomicity as Orbax (`orbax.checkpoint.CheckpointManager`,
`orbax/checkpoint/_src/path/atomicity.py`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from mathrl_jax.errors import MathRLError
from mathrl_jax.sharding.rules import path_string
from mathrl_jax.train.checksums import leaf_checksums, saved_dtype

if TYPE_CHECKING:
    from typing import Self  # Python >= 3.11; annotations only

STATE_ITEM = "state"
METADATA_ITEM = "metadata"
CHECKSUMS_ITEM = "checksums"

_log = logging.getLogger(__name__)


class CheckpointError(MathRLError, RuntimeError):
    """A checkpoint that cannot be saved or restored; names the directory, the step and the bad key."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint whose data fails verification (a leaf's checksum differs from the one saved with it) or cannot
    be read; names the step and the leaves."""


class UnreadableCheckpointError(CorruptCheckpointError):
    """A checkpoint Orbax could not read: a damaged file, or a passing I/O failure. Not restored, but never
    deleted for it: only a checksum that differs proves the data damaged."""


# --------------------------------------------------------------------------------------------
# Leaves (the tree itself is Orbax's: it saves any pytree and restores into the target's structure)
# --------------------------------------------------------------------------------------------


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _map_leaves(tree: Any, what: str, fn: Callable[[str, Any], Any]) -> tuple[Any, dict[str, Any]]:
    """Unwraps the NNX Variables of `tree`, names its leaves and maps `fn(key, leaf)` over them.

    Returns (the mapped tree, {key: mapped leaf}). Refuses a tree without leaves or a bare leaf (Orbax's
    StandardSave refuses both, without naming the directory or step), and keys that collide once joined
    with "/" (our names) or "." (Orbax's names of the stored arrays: it silently stores one over the other).
    """
    # A Variable flattens to `.value`; unwrapped, an nnx.State is stored under the keys of its pure dict.
    tree = jax.tree.map(lambda x: x.get_value() if _is_variable(x) else x, tree, is_leaf=_is_variable)
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    if not with_path:
        raise CheckpointError(f"the {what} has no leaves (got {type(tree).__name__}); nothing to checkpoint")
    if with_path[0][0] == ():
        raise CheckpointError(
            f"the {what} is a single {type(tree).__name__}; wrap it in a container, e.g. {{'params': x}}"
        )
    names = [path_string(path) for path, _ in with_path]
    for joined in (names, [name.replace("/", ".") for name in names]):
        seen: set[str] = set()
        for name in joined:
            if name in seen:
                raise CheckpointError(f"two leaves of the {what} have the same key {name!r}; rename one")
            seen.add(name)
    leaves = [fn(name, leaf) for name, (_, leaf) in zip(names, with_path)]
    return jax.tree_util.tree_unflatten(treedef, leaves), dict(zip(names, leaves))


def _is_typed_key(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _savable(name: str, leaf: Any) -> Any:
    if _is_typed_key(leaf):
        raise CheckpointError(
            f"state leaf {name!r} is a typed PRNG key array ({leaf.dtype}); store its raw data "
            f"jax.random.key_data(key) (uint32) instead, and rewrap with jax.random.wrap_key_data"
        )
    if isinstance(leaf, (np.ndarray, np.generic)) and leaf.dtype.kind in "OUSV":
        raise CheckpointError(f"state leaf {name!r} has dtype {leaf.dtype}; only numeric arrays are saved")
    # NumPy leaves need no copy here: Orbax deep-copies host arrays before `save` returns.
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float)):
        return leaf
    raise CheckpointError(
        f"state leaf {name!r} is a {type(leaf).__name__}; a state holds jax/NumPy arrays and Python "
        f"int/float/bool (put strings and other JSON values in `metadata`)"
    )


def _abstract(name: str, leaf: Any) -> Any:
    """The abstract leaf Orbax restores for one target leaf."""
    if _is_typed_key(leaf):
        raise CheckpointError(
            f"target leaf {name!r} is a typed PRNG key array ({leaf.dtype}); checkpoints hold raw key data, "
            f"use jax.random.key_data(key) in the target"
        )
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    if isinstance(leaf, (np.ndarray, np.generic)):
        return np.asarray(leaf)  # Orbax takes no NumPy scalars: a 0-d array (see `_from_disk`)
    if isinstance(leaf, (jax.ShapeDtypeStruct, bool, int, float)):
        return leaf
    raise CheckpointError(
        f"target leaf {name!r} is a {type(leaf).__name__}; expected a jax.Array, jax.ShapeDtypeStruct, "
        f"NumPy array or Python int/float/bool"
    )


def _from_disk(target: Any, value: Any) -> Any:
    """A restored value in the type of its target leaf: NNX Variables rewrapped, NumPy scalars.

    Orbax itself casts arrays and Python scalars to the target's dtype or type; NumPy scalars it
    restores as the 0-d arrays they were asked as (see `_abstract`).
    """
    if _is_variable(target):
        return target.replace(value=value)
    if isinstance(target, np.generic):
        return np.asarray(value, dtype=target.dtype)[()]
    return value


# --------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------


def _non_json(value: Any, where: str) -> str | None:
    """Where in `value` something is not a JSON value (None when all of it is)."""
    if value is None or isinstance(value, (bool, str, int, float)):
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has the key {key!r} of type {type(key).__name__} (JSON keys are strings)"
            found = _non_json(item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        return next((f for i, x in enumerate(value) if (f := _non_json(x, f"{where}[{i}]"))), None)
    return f"{where} is a {type(value).__name__} ({value!r:.60}); use int, float, str, bool, None, list or dict"


class Checkpointer:
    """Saves and restores (state pytree, JSON metadata) by step in `directory`.

    Args:
      directory: the checkpoint root (a local path, or a URL such as gs://... that Orbax
        supports); created if missing. Step `s` lives in `<directory>/<s>`.
      save_interval: `should_save(step)` is true when `step` is a positive multiple of it;
        0 disables periodic saves (only `save(..., force=True)` writes).
      max_to_keep: how many of the latest steps to keep; None keeps every step.
      async_save: write the files in a background thread (see the module docstring).

    Every process of a multi-host job constructs the Checkpointer and calls
    `save` / `restore` with its part of the global arrays; Orbax writes the
    JSON metadata from process 0 only.

    Call `close()` (or use `with Checkpointer(...) as c:`) before the process
    exits: it waits for the last asynchronous save. A process that exits or dies
    without it leaves that save unfinalized, i.e. not a checkpoint.
    """

    def __init__(
        self, directory: str, *, save_interval: int, max_to_keep: int | None = 3, async_save: bool = True
    ) -> None:
        if isinstance(save_interval, bool) or not isinstance(save_interval, (int, np.integer)) or save_interval < 0:
            raise ValueError(f"save_interval={save_interval!r}: expected an int >= 0 (0: only forced saves)")
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, (int, np.integer)) or max_to_keep < 1
        ):
            raise ValueError(f"max_to_keep={max_to_keep!r}: expected an int >= 1, or None to keep every step")
        directory = os.fspath(directory)
        if "://" not in directory:  # a local path; gs://... and other URLs are left to Orbax (etils.epath)
            directory = os.path.abspath(os.path.expanduser(directory))
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise CheckpointError(f"checkpoint directory {directory!r} exists and is not a directory")
        self.directory = directory
        self.save_interval = int(save_interval)
        self.max_to_keep = None if max_to_keep is None else int(max_to_keep)
        self.async_save = bool(async_save)
        self._corrupt: set[int] = set()  # steps `restore` found corrupt: never restored, removed at the next save
        self._verified: int | None = None  # the newest step whose checksums `restore` verified: rotation keeps it
        self.restored_step: int | None = None  # the step the last `restore` returned (an older one on a fallback)
        policies = ocp.checkpoint_managers
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=max(self.save_interval, 1),
            # The newest `max_to_keep` steps, and the last verified one however old: were the newer ones damaged,
            # a resume would still find an intact step.
            preservation_policy=policies.AnyPreservationPolicy(
                [policies.LatestN(n=self.max_to_keep), _KeepStep(lambda: self._verified)]
            ),
            enable_async_checkpointing=self.async_save,
            cleanup_tmp_directories=True,  # remove the tmp dirs of writes that a crash interrupted
            create=True,
        )
        # Handlers named up front, so that a fresh manager can read the metadata of steps it did not write.
        handlers = {
            STATE_ITEM: ocp.StandardCheckpointHandler(),
            METADATA_ITEM: ocp.JsonCheckpointHandler(),
            CHECKSUMS_ITEM: ocp.JsonCheckpointHandler(),
        }
        self._manager = ocp.CheckpointManager(directory, options=options, item_handlers=handlers)
        self._closed = False

    # ---- steps ----

    def all_steps(self) -> list[int]:
        """The complete (finalized) steps in the directory, ascending; includes a save still being written."""
        return sorted(int(s) for s in self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest complete step, or None when the directory holds none."""
        step = self._manager.latest_step()
        return None if step is None else int(step)

    def reload(self) -> None:
        """Re-reads the step list from disk (for a reader of a directory that another job writes)."""
        self._manager.reload()

    def should_save(self, step: int) -> bool:
        """True when `step` is a positive multiple of `save_interval` and newer than the latest saved step."""
        step = _check_step(step)
        if self.save_interval == 0 or step == 0 or step % self.save_interval:
            return False
        intact = [s for s in self.all_steps() if s not in self._corrupt]  # a corrupt step is saved anew
        return not intact or step > intact[-1]

    # ---- save ----

    def save(self, step: int, state: Any, metadata: Mapping[str, Any] | None = None, *, force: bool = False) -> bool:
        """Saves `state` and `metadata` as `step` if `should_save(step)` or `force`; returns whether it did.

        Args:
          step: the step number (an int >= 0).
          state: a pytree of jax.Array / NumPy arrays and Python int/float/bool leaves
            (e.g. a TrainState with params, optax state, uint32 RNG key data and a step counter).
          metadata: a JSON object (str keys; int, float, str, bool, None, list, dict values),
            e.g. {"data_position": 1234, "config": {...}, "version": "0.1.0"}.
          force: save even when `should_save(step)` is false (the final step of a run).

        A step that already exists is not overwritten (returns False). A step older
        than the latest saved one is an error: restore that step first, or use
        another directory.
        """
        self._check_open()
        step = _check_step(step)
        if not force and not self.should_save(step):
            return False
        metadata = {} if metadata is None else metadata
        if not isinstance(metadata, Mapping):
            raise CheckpointError(f"metadata must be a JSON object (a dict), got {type(metadata).__name__}")
        problem = _non_json(metadata, "metadata")
        if problem:
            raise CheckpointError(f"cannot save step {step} in {self.directory}: {problem}")
        state, named = _map_leaves(state, "state", _savable)
        dtypes = {name: saved_dtype(leaf) for name, leaf in named.items()}
        checksums = {
            name: {"dtype": dtypes[name].name, "checksum": checksum}
            for name, checksum in leaf_checksums(named, dtypes).items()
        }
        self._remove_corrupt_steps()
        steps = self.all_steps()
        if step in steps:
            _log.info("checkpoint step %d already exists in %s; not saved again", step, self.directory)
            return False
        if steps and step < steps[-1]:
            raise CheckpointError(
                f"cannot save step {step} in {self.directory}: it already holds the newer step {steps[-1]} "
                f"(steps {steps}); resume from the latest step or use another directory"
            )
        args = ocp.args.Composite(
            **{
                STATE_ITEM: ocp.args.StandardSave(state),
                METADATA_ITEM: ocp.args.JsonSave(json.loads(json.dumps(dict(metadata)))),
                CHECKSUMS_ITEM: ocp.args.JsonSave({"leaves": checksums, "metadata_sha256": _json_sha256(metadata)}),
            }
        )
        try:
            return bool(self._manager.save(step, args=args, force=True))
        except Exception as e:  # re-raised with the directory and step named
            raise CheckpointError(f"cannot save step {step} in {self.directory}: {e}") from e

    def _remove_corrupt_steps(self) -> None:
        """Deletes the steps `restore` found corrupt, so that the run can save those steps again."""
        for step in sorted(self._corrupt & set(self.all_steps())):
            _log.warning("removing checkpoint %s/%d: it failed verification when restored", self.directory, step)
            self.wait_until_finished()
            self._manager.delete(step)
        self._corrupt.clear()

    # ---- restore ----

    def _resolve_step(self, step: int | None) -> int:
        self.wait_until_finished()
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(f"no complete checkpoint in {self.directory}")
        if step is None:
            return steps[-1]
        step = _check_step(step)
        if step not in steps:
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; the steps there are {steps}")
        return step

    def saved_shapes(self, step: int | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """{key: (shape, dtype)} of the state saved at `step` (default: the latest), read from its metadata."""
        step = self._resolve_step(step)
        return {name: (tuple(m.shape), np.dtype(m.dtype)) for name, m in _named(self._saved_tree(step)).items()}

    def _saved_tree(self, step: int) -> Any:
        """The tree of Orbax's array or scalar metadata of the state saved at `step` (lists for tuples)."""
        where = os.path.join(self.directory, str(step))
        try:
            tree = self._manager.metadata(step).item_metadata[STATE_ITEM]
        except Exception as e:  # Orbax raises several unrelated types for unreadable metadata
            raise CorruptCheckpointError(f"cannot read the state metadata of checkpoint {where}: {e}") from e
        tree = getattr(tree, "tree", tree)
        if tree is None:
            raise CheckpointError(f"checkpoint {where} has no '{STATE_ITEM}' item; it was not written by Checkpointer")
        return tree

    def read_metadata(self, step: int | None = None) -> dict[str, Any]:
        """The JSON metadata saved with `step` (default: the latest), without reading the arrays."""
        self._check_open()
        step = self._resolve_step(step)
        args = ocp.args.Composite(**{METADATA_ITEM: ocp.args.JsonRestore()})
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as e:  # re-raised with the directory and step named
            raise CheckpointError(f"cannot read the metadata of checkpoint {self.directory}/{step}: {e}") from e
        return dict(restored[METADATA_ITEM] or {})

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """(state, metadata) of `step` (default: the newest intact step).

        Args:
          target: a pytree with the saved structure. Its leaves say what to build:
            a jax.Array (that array's shape, dtype and sharding), a
            `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` (any sharding, e.g. on a
            mesh of another shape than the one saved; without a sharding, the saved one
            is used, which needs the same devices), a NumPy array or scalar, or a
            Python int/float/bool.
          step: which step; None for the latest that passes verification.

        Returns:
          (the state with the target's tree structure, shardings and dtypes, the metadata dict).
          Values are bit-identical to those saved when the dtypes agree (a differing
          target dtype is a cast). Every leaf is verified against the checksum saved with
          it (steps saved before checksums were kept are restored unverified).
          `restored_step` says which step it was.

        With `step=None`, a step that fails verification (a damaged data file, unreadable
        metadata) is refused and the next older one tried; a warning names the refused and the
        restored steps. The refused steps are removed at the next `save`, and rotation keeps the
        restored step until the run ends (see `_KeepStep`).

        Raises:
          CheckpointError: no checkpoint in the directory, no such step, or a target whose
            keys or shapes differ from the saved ones (the keys are named).
          CorruptCheckpointError: the step asked for, or with `step=None` every step, fails
            verification (the steps and leaves are named).
        """
        self._check_open()
        if step is not None:
            step = self._resolve_step(step)
            return self._restore_verified(target, step)
        self._resolve_step(None)  # raises when the directory holds no step
        steps = self.all_steps()
        refused: list[tuple[int, CorruptCheckpointError]] = []
        for candidate in reversed(steps):
            try:
                restored = self._restore_verified(target, candidate)
            except CorruptCheckpointError as error:
                if not isinstance(error, UnreadableCheckpointError):  # proven damaged: removed at the next save
                    self._corrupt.add(candidate)
                refused.append((candidate, error))
                continue
            if refused:
                _log.warning(
                    "checkpoint step %s in %s failed verification and is not restored (%s); restored step %d, the "
                    "newest intact step, instead",
                    ", ".join(str(s) for s, _ in refused),
                    self.directory,
                    "; ".join(str(e) for _, e in refused),
                    candidate,
                )
            return restored
        raise CorruptCheckpointError(
            f"no intact checkpoint in {self.directory}: every step fails verification ("
            + "; ".join(f"step {s}: {e}" for s, e in refused)
            + "); restore an intact copy or start the run in a new directory"
        )

    def _restore_verified(self, target: Any, step: int) -> tuple[Any, dict[str, Any]]:
        """`restore` of one step, its leaves verified against the checksums saved with it."""
        where = os.path.join(self.directory, str(step))
        abstract, wanted = _map_leaves(target, "restore target", _abstract)
        saved = self._saved_tree(step)
        _check_matches(where, wanted, _named(saved))
        recorded, metadata_sha256 = self._recorded_checksums(step)
        # Read in the dtype each leaf was summed in, cast to the target's after the check: a checksum of a value
        # already cast (e.g. float32 to bfloat16) could not match.
        summed = {
            name: _in_dtype(leaf, recorded[name][0] if name in recorded else None) for name, leaf in wanted.items()
        }
        abstract = jax.tree.unflatten(jax.tree.structure(abstract), list(summed.values()))
        # Checkpoints of the previous layout (before the state was saved as it is) hold every container as a
        # dict, lists and tuples keyed "0", "1", ...; Orbax restores no list from a dict. Those are restored in
        # the saved structure, with the target's abstract leaves by key, and put back into the target's by key.
        by_key = _sequences(saved) != _sequences(abstract)
        item = jax.tree_util.tree_map_with_path(lambda p, _: summed[path_string(p)], saved) if by_key else abstract
        args = ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardRestore(item), METADATA_ITEM: ocp.args.JsonRestore()})
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as e:  # re-raised with the directory and step named; a damaged file is one cause
            raise UnreadableCheckpointError(f"cannot restore checkpoint {where}: {e}") from e
        values = _named(restored[STATE_ITEM])
        metadata = dict(restored[METADATA_ITEM] or {})
        if recorded and set(recorded) != set(values):
            raise CorruptCheckpointError(f"checkpoint {where} fails verification: its checksums name other leaves")
        if metadata_sha256 is not None and _json_sha256(metadata) != metadata_sha256:
            raise CorruptCheckpointError(f"checkpoint {where} fails verification: its metadata differ from the saved")
        checked = {  # a leaf JAX could not read in its saved dtype (float64 without x64) cannot be checked
            name: values[name]
            for name, (dtype, checksum) in recorded.items()
            if checksum is not None and _dtype_of(values[name]) in (None, dtype)
        }
        got = leaf_checksums(checked, {name: recorded[name][0] for name in checked})
        damaged = sorted(name for name in checked if got[name] is not None and got[name] != recorded[name][1])
        if damaged:
            raise CorruptCheckpointError(
                f"checkpoint {where} fails verification: the data of {_short(damaged)} differ from the checksums "
                f"saved with it (a damaged file)"
            )
        values = [_in_dtype(values[name], _dtype_of(wanted[name])) for name in wanted]  # the target's dtypes
        values = jax.tree.unflatten(jax.tree.structure(abstract), values)
        state = jax.tree.map(_from_disk, target, values, is_leaf=_is_variable)
        if recorded:
            self._verified = step if self._verified is None else max(self._verified, step)
        self.restored_step = step
        return state, metadata

    def _recorded_checksums(self, step: int) -> tuple[dict[str, tuple[np.dtype, str | None]], str | None]:
        """({key: (dtype, checksum)}, the metadata's SHA-256) saved with `step`; ({}, None) for a step saved before
        checksums were kept."""
        where = os.path.join(self.directory, str(step))
        if not (self._manager.directory / str(step) / CHECKSUMS_ITEM).exists():  # an etils.epath.Path: local or URL
            _log.info("checkpoint %s has no checksums (saved by an older version); restored unverified", where)
            return {}, None
        try:
            args = ocp.args.Composite(**{CHECKSUMS_ITEM: ocp.args.JsonRestore()})
            saved = self._manager.restore(step, args=args)[CHECKSUMS_ITEM]
            leaves = {name: (jnp.dtype(entry["dtype"]), entry["checksum"]) for name, entry in saved["leaves"].items()}
            return leaves, str(saved["metadata_sha256"])
        except Exception as e:  # noqa: BLE001  unreadable JSON, a missing field: the step cannot be trusted
            raise CorruptCheckpointError(f"cannot read the checksums of checkpoint {where}: {e}") from e

    # ---- life cycle ----

    def wait_until_finished(self) -> None:
        """Blocks until a background save is written and finalized (raises its error, if any)."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for the pending save, then releases the manager; idempotent."""
        if not self._closed:
            self._closed = True
            self._manager.close()

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"the Checkpointer of {self.directory} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Checkpointer({self.directory!r}, save_interval={self.save_interval}, "
            f"max_to_keep={self.max_to_keep}, async_save={self.async_save})"
        )


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise CheckpointError(f"step={step!r}: expected an int >= 0")
    return int(step)


def _named(tree: Any) -> dict[str, Any]:
    """{key: leaf} of `tree`, keys as `path_string`."""
    return {path_string(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _sequences(tree: Any) -> set[str]:
    """The keys of the lists and tuples (not NamedTuples: keyed by field) in `tree` that hold leaves."""
    return {
        path_string(path[:i])
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
        for i, key in enumerate(path)
        if isinstance(key, jax.tree_util.SequenceKey)
    }


def _check_matches(where: str, wanted: dict[str, Any], saved: dict[str, Any]) -> None:
    """Raises a CheckpointError naming the keys of the target that the checkpoint at `where` lacks, and so on.

    Orbax checks this too, but its messages name neither the step nor which side lacks a key.
    """
    missing = sorted(name for name in wanted if name not in saved)
    extra = sorted(name for name in saved if name not in wanted)
    shapes = [
        f"{name}: saved {tuple(saved[name].shape or ())}, target {tuple(np.shape(leaf))}"
        for name, leaf in wanted.items()
        if name in saved and tuple(np.shape(leaf)) != tuple(saved[name].shape or ())
    ]
    parts = [
        f"{what}: {_short(names)}"
        for what, names in [
            ("keys of the target not in the checkpoint", missing),
            ("keys in the checkpoint not in the target", extra),
            ("shapes differ", shapes),
        ]
        if names
    ]
    if parts:
        raise CheckpointError(f"checkpoint {where} does not match the restore target; " + "; ".join(parts))


def _short(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _json_sha256(value: Any) -> str:
    """SHA-256 of a JSON value's canonical text (sorted keys), as it reads back: tuples are lists."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _dtype_of(leaf: Any) -> np.dtype | None:
    """The dtype of an abstract restore leaf; None for a Python scalar (restored as its own type)."""
    return np.dtype(leaf.dtype) if isinstance(leaf, (jax.ShapeDtypeStruct, jax.Array, np.ndarray)) else None


def _in_dtype(leaf: Any, dtype: np.dtype | None) -> Any:
    """An abstract or restored leaf in `dtype` (unchanged when `dtype` is None, when the leaf already has it or is a
    Python scalar, and for a ShapeDtypeStruct when JAX cannot hold the dtype, e.g. float64 without x64)."""
    if dtype is None or _dtype_of(leaf) in (None, dtype):
        return leaf
    if isinstance(leaf, jax.ShapeDtypeStruct):
        if jax.dtypes.canonicalize_dtype(dtype) != dtype:
            return leaf
        return jax.ShapeDtypeStruct(leaf.shape, dtype, sharding=leaf.sharding)
    return leaf.astype(dtype)


class _KeepStep:
    """An Orbax preservation policy that keeps the step `step()` names (None: none), whatever the other policies say.

    Orbax's `max_to_keep` alone keeps the newest steps: after a resume from an older step because the newer ones
    were damaged, saving would rotate the one step known to be intact out. See
    `orbax.checkpoint.checkpoint_managers.PreservationPolicy`.
    """

    def __init__(self, step: Callable[[], int | None]) -> None:
        self._step = step

    def should_preserve(self, checkpoints: Any, *, context: Any) -> list[bool]:
        keep = self._step()
        return [info.step == keep for info in checkpoints]
