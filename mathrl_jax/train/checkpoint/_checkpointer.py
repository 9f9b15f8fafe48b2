"""`Checkpointer`: save, restore and verify a training state's steps (the guarantees: the room's door, `__init__`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from mathrl_jax.sharding.rules import path_string
from mathrl_jax.train.checkpoint._checksums import leaf_checksums, saved_dtype
from mathrl_jax.train.checkpoint._directory import (
    ARRAYS_ITEM,
    CHECKSUMS_ITEM,
    METADATA_ITEM,
    STATE_ITEM,
    CheckpointDirectory,
    check_step,
)
from mathrl_jax.train.checkpoint._errors import (
    CheckpointError,
    CorruptCheckpointError,
    MisnamedCheckpointError,
    UnreadableCheckpointError,
    UnverifiedCheckpointError,
)
from mathrl_jax.train.checkpoint._tree import (
    abstract_leaf,
    check_matches,
    dtype_of,
    in_dtype,
    is_variable,
    leaf_from_disk,
    leaves_by_name,
    map_leaves,
    matching_part,
    non_json,
    savable_leaf,
    sequence_paths,
    short_list,
)

_log = logging.getLogger(__name__)


class Checkpointer(CheckpointDirectory):
    """Saves and restores (state pytree, JSON metadata) by step in `directory`.

    Args:
      directory: the checkpoint root (a local path, or a URL such as gs://... that Orbax
        supports); created if missing. Step `s` lives in `<directory>/<s>`.
      save_interval: `should_save(step)` is true when `step` is a positive multiple of it;
        0 disables periodic saves (only `save(..., force=True)` writes).
      max_to_keep: how many of the latest steps to keep; None keeps every step.
      async_save: write the files in a background thread (see the module docstring).
      read_only: only read the directory (e.g. export a run that may still be training): it is not
        created, a save in progress is not taken for a crashed one and removed, and `save` is refused.
      allow_unverified: restore a step saved before checksums were kept (nothing can verify it), with a
        warning; without it such a step is an `UnverifiedCheckpointError`. A step whose checksums are
        missing although it was saved with them is refused either way.

    Every process of a multi-host job constructs the Checkpointer and calls
    `save` / `restore` with its part of the global arrays; Orbax writes the
    JSON metadata from process 0 only.

    Call `close()` (or use `with Checkpointer(...) as c:`) before the process
    exits: it waits for the last asynchronous save. A process that exits or dies
    without it leaves that save unfinalized, i.e. not a checkpoint.
    """

    # ---- steps ----

    def should_save(self, step: int) -> bool:
        """True when `step` is a positive multiple of `save_interval` and newer than the latest saved step; a step
        on the interval that is not newer is said in a warning (its save skipped, never silently)."""
        step = check_step(step)
        if self.save_interval == 0 or step == 0 or step % self.save_interval:
            return False
        intact = [s for s in self.all_steps() if s not in self._corrupt]  # a corrupt step is saved anew
        if not intact or step > intact[-1]:
            return True
        _log.warning(
            "checkpoint step %d is not saved: %s already holds step %d (steps %s), saved before this run reached it",
            step,
            self.directory,
            intact[-1],
            intact,
        )
        return False

    # ---- save ----

    def save(
        self,
        step: int,
        state: Any,
        metadata: Mapping[str, Any] | None = None,
        *,
        force: bool = False,
        arrays: Mapping[str, Any] | None = None,
    ) -> bool:
        """Saves `state` and `metadata` as `step` if `should_save(step)` or `force`; returns whether it did.

        Args:
          step: the step number (an int >= 0).
          state: a pytree of jax.Array / NumPy arrays and Python int/float/bool leaves
            (e.g. a TrainState with params, optax state, uint32 RNG key data and a step counter).
          metadata: a JSON object (str keys; int, float, str, bool, None, list, dict values),
            e.g. {"data_position": 1234, "config": {...}, "version": "0.1.0"}.
          force: save even when `should_save(step)` is false (the final step of a run).
          arrays: a nested dict of host NumPy arrays (no zero-size array: Orbax refuses them) saved beside the
            state as their own item, with checksums; `restore_arrays` reads them back bit for bit.

        A step that already exists is not overwritten (returns False, with a warning). A step older
        than the latest saved one is an error: restore that step first, or use
        another directory.

        Raises:
          CheckpointError: the save failed (a full disk, ...): this one, or the previous one, which was
            written in the background; the message names the step that failed, its directory and the steps kept.
        """
        self._check_writable()
        step = check_step(step)
        if not force and not self.should_save(step):
            return False
        metadata = {} if metadata is None else metadata
        if not isinstance(metadata, Mapping):
            raise CheckpointError(f"metadata must be a JSON object (a dict), got {type(metadata).__name__}")
        problem = non_json(metadata, "metadata")
        if problem:
            raise CheckpointError(f"cannot save step {step} in {self.directory}: {problem}")
        state, named = map_leaves(state, "state", savable_leaf)
        dtypes = {name: saved_dtype(leaf) for name, leaf in named.items()}
        checksums = {
            name: {"dtype": dtypes[name].name, "checksum": checksum}
            for name, checksum in leaf_checksums(named, dtypes).items()
        }
        self.wait_until_finished()  # a failure of the previous save is reported under its own step, not this one
        self._remove_corrupt_steps()
        steps = self.all_steps()
        if step in steps:
            _log.warning("checkpoint step %d already exists in %s; not saved again", step, self.directory)
            return False
        if steps and step < steps[-1]:
            raise CheckpointError(
                f"cannot save step {step} in {self.directory}: it already holds the newer step {steps[-1]} "
                f"(steps {steps}); resume from the latest step or use another directory"
            )
        recorded = {"leaves": checksums, "metadata_sha256": _json_sha256(metadata), "step": step}
        items = {
            STATE_ITEM: ocp.args.StandardSave(state),
            METADATA_ITEM: ocp.args.JsonSave(json.loads(json.dumps(dict(metadata)))),
        }
        if arrays:
            named_arrays = {name: np.asarray(a) for name, a in leaves_by_name(dict(arrays)).items()}
            empty = [name for name, a in named_arrays.items() if a.size == 0]
            if empty:
                raise CheckpointError(f"cannot save step {step} in {self.directory}: zero-size arrays {empty}")
            dtypes = {name: a.dtype for name, a in named_arrays.items()}
            recorded["arrays"] = {
                name: {"dtype": dtypes[name].name, "checksum": checksum}
                for name, checksum in leaf_checksums(named_arrays, dtypes).items()
            }
            items[ARRAYS_ITEM] = ocp.args.StandardSave(dict(arrays))
        items[CHECKSUMS_ITEM] = ocp.args.JsonSave(recorded)
        args = ocp.args.Composite(**items)
        self._saving = step
        self._noise.hold()  # Orbax's threads log a failed write many times over: reported once, by this class
        try:
            saved = bool(self._manager.save(step, args=args, force=True))
        except Exception as e:  # noqa: BLE001  re-raised in one line, with the directory and step named
            raise self._save_failed(step, e) from e
        if not self.async_save:
            self.wait_until_finished()
        return saved

    def _remove_corrupt_steps(self) -> None:
        """Deletes the steps `restore` found corrupt, so that the run can save those steps again."""
        for step in sorted(self._corrupt & set(self.all_steps())):
            _log.warning("removing checkpoint %s/%d: it failed verification when restored", self.directory, step)
            self.wait_until_finished()
            self._manager.delete(step)
        self._corrupt.clear()

    # ---- restore ----

    def restore(self, target: Any, step: int | None = None, *, partial: bool = False) -> tuple[Any, dict[str, Any]]:
        """(state, metadata) of `step` (default: the newest intact step).

        Args:
          target: a pytree with the saved structure. Its leaves say what to build:
            a jax.Array (that array's shape, dtype and sharding), a
            `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` (any sharding, e.g. on a
            mesh of another shape than the one saved; without a sharding, the saved one
            is used, which needs the same devices), a NumPy array or scalar, or a
            Python int/float/bool.
          step: which step; None for the latest that passes verification.
          partial: `target` holds some of the saved state's top-level entries (e.g. `{"params": ...}` of a saved
            TrainState): only those are read, verified and checked against the target (each whole); the others
            are not read.

        Returns:
          (the state with the target's tree structure, shardings and dtypes, the metadata dict).
          Values are bit-identical to those saved when the dtypes agree (a differing
          target dtype is a cast). Every leaf is verified against the checksum saved with
          it; a step saved before checksums were kept is restored unverified only with
          `allow_unverified`, with a warning. `restored_step` says which step it was.

        With `step=None`, a step that fails verification (a damaged data file, unreadable
        metadata, missing checksums that its Orbax metadata lists) is refused and the next older one
        tried; a warning names the refused and the restored steps. The refused steps are removed at
        the next `save`, and rotation keeps the restored step until the run ends (see `_KeepStep`).

        Raises:
          CheckpointError: no checkpoint in the directory, no such step, or a target whose
            keys or shapes differ from the saved ones (a `TargetMismatchError`; the keys are named).
          CorruptCheckpointError: the step asked for, or with `step=None` every step, fails
            verification (the steps and leaves are named).
          UnverifiedCheckpointError: the step to restore was saved before checksums were kept, and
            `allow_unverified` is false (no older step is tried in its place).
          MisnamedCheckpointError: the step to restore was saved as another step (its directory renamed or
            copied; no older step is tried in its place).
        """
        self._check_open()
        if step is not None:
            step = self._resolve_step(step)
            return self._restore_verified(target, step, partial)
        self._resolve_step(None)  # raises when the directory holds no step
        steps = self.all_steps()
        refused: list[tuple[int, CorruptCheckpointError]] = []
        for candidate in reversed(steps):
            try:
                restored = self._restore_verified(target, candidate, partial)
            except CorruptCheckpointError as error:
                if not isinstance(error, UnreadableCheckpointError):  # proven damaged: removed at the next save
                    self._corrupt.add(candidate)
                refused.append((candidate, error))
                continue
            except UnverifiedCheckpointError as error:  # not tried past: nothing says an older step is intact
                if not refused:
                    raise
                raise UnverifiedCheckpointError(
                    f"the newer steps {', '.join(str(s) for s, _ in refused)} fail verification; {error.reason}",
                    step=error.step,
                    where=error.where,
                ) from error
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

    def _lists_checksums(self, step: int) -> bool:
        """Whether the step's Orbax metadata (`_CHECKPOINT_METADATA`: the items it was saved with) names checksums;
        without that file Orbax lists the items present, which a missing checksums item is not."""
        try:
            return CHECKSUMS_ITEM in (self._manager.metadata(step).item_handlers or {})
        except Exception:  # noqa: BLE001  unreadable metadata: the checksums' absence is not explained by it
            return False

    def _restore_verified(self, target: Any, step: int, partial: bool = False) -> tuple[Any, dict[str, Any]]:
        """`restore` of one step, its leaves verified against the checksums saved with it."""
        where = os.path.join(self.directory, str(step))
        abstract, wanted = map_leaves(target, "restore target", abstract_leaf)
        saved = self._saved_tree(step)
        if partial:  # the entries the target names; the others are neither read nor checked
            saved = matching_part(saved, wanted, where)
        check_matches(where, wanted, leaves_by_name(saved))
        recorded, metadata_sha256 = self._recorded_checksums(step)
        if partial:
            recorded = matching_part(recorded, wanted, where)
        # Read in the dtype each leaf was summed in, cast to the target's after the check: a checksum of a value
        # already cast (e.g. float32 to bfloat16) could not match.
        summed = {
            name: in_dtype(leaf, recorded[name][0] if name in recorded else None) for name, leaf in wanted.items()
        }
        abstract = jax.tree.unflatten(jax.tree.structure(abstract), list(summed.values()))
        # Checkpoints of the previous layout (before the state was saved as it is) hold every container as a
        # dict, lists and tuples keyed "0", "1", ...; Orbax restores no list from a dict. Those are restored in
        # the saved structure, with the target's abstract leaves by key, and put back into the target's by key.
        # So is a part: Orbax's partial restore matches the item's keys to the saved strings, and an nnx.State
        # target keys its layers by int.
        by_key = partial or sequence_paths(saved) != sequence_paths(abstract)
        item = jax.tree_util.tree_map_with_path(lambda p, _: summed[path_string(p)], saved) if by_key else abstract
        restored, metadata = self._read_step(step, item, partial=partial)
        values = leaves_by_name(restored)
        if recorded and set(recorded) != set(values):
            raise CorruptCheckpointError(f"checkpoint {where} fails verification: its checksums name other leaves")
        if metadata_sha256 is not None and _json_sha256(metadata) != metadata_sha256:
            raise CorruptCheckpointError(f"checkpoint {where} fails verification: its metadata differ from the saved")
        checked = {  # a leaf JAX could not read in its saved dtype (float64 without x64) cannot be checked
            name: values[name]
            for name, (dtype, checksum) in recorded.items()
            if checksum is not None and dtype_of(values[name]) in (None, dtype)
        }
        got = leaf_checksums(checked, {name: recorded[name][0] for name in checked})
        damaged = sorted(name for name in checked if got[name] is not None and got[name] != recorded[name][1])
        if damaged:
            raise CorruptCheckpointError(
                f"checkpoint {where} fails verification: the data of {short_list(damaged)} differ from the checksums "
                f"saved with it (a damaged file)"
            )
        values = [in_dtype(values[name], dtype_of(wanted[name])) for name in wanted]  # the target's dtypes
        values = jax.tree.unflatten(jax.tree.structure(abstract), values)
        state = jax.tree.map(leaf_from_disk, target, values, is_leaf=is_variable)
        if recorded:
            self._verified = step if self._verified is None else max(self._verified, step)
        self.restored_step = step
        return state, metadata

    def restore_arrays(self, step: int) -> dict[str, Any]:
        """The host arrays saved with `step` (`save(..., arrays=)`), bit for bit, verified against their checksums;
        {} when the step holds none.

        Raises:
          CorruptCheckpointError: they cannot be read, or their data differ from the checksums saved with them.
        """
        self._check_open()
        where = os.path.join(self.directory, str(step))
        if not (self._manager.directory / str(step) / ARRAYS_ITEM).exists():
            return {}
        try:
            args = ocp.args.Composite(
                **{ARRAYS_ITEM: ocp.args.StandardRestore(), CHECKSUMS_ITEM: ocp.args.JsonRestore()}
            )
            restored = self._manager.restore(step, args=args)
            arrays = jax.tree.map(np.asarray, restored[ARRAYS_ITEM])
            recorded = {
                name: (np.dtype(e["dtype"]), e["checksum"]) for name, e in restored[CHECKSUMS_ITEM]["arrays"].items()
            }
        except Exception as e:  # noqa: BLE001  a damaged file, missing checksums: the arrays cannot be trusted
            raise CorruptCheckpointError(f"cannot read the arrays of checkpoint {where}: {e}") from e
        named = leaves_by_name(arrays)
        got = (
            leaf_checksums(named, {name: dtype for name, (dtype, _) in recorded.items()})
            if set(named) == set(recorded)
            else {}
        )
        damaged = sorted(name for name in recorded if got.get(name) != recorded[name][1])
        if damaged:
            raise CorruptCheckpointError(
                f"checkpoint {where} fails verification: the arrays {short_list(damaged)} differ from the checksums "
                "saved with them (a damaged file)"
            )
        return arrays

    def _recorded_checksums(self, step: int) -> tuple[dict[str, tuple[np.dtype, str | None]], str | None]:
        """({key: (dtype, checksum)}, the metadata's SHA-256) saved with `step`; ({}, None) for a step saved before
        checksums were kept, when `allow_unverified`.

        Raises:
          CorruptCheckpointError: the checksums are missing where they were written: the step's Orbax metadata
            lists them, or an older step has them (a version that kept them saved this one).
          UnverifiedCheckpointError: a step saved before checksums were kept, without `allow_unverified`.
        """
        where = os.path.join(self.directory, str(step))
        root = self._manager.directory  # an etils.epath.Path: local or URL
        if not (root / str(step) / CHECKSUMS_ITEM).exists():
            older = [s for s in self.all_steps() if s < step and (root / str(s) / CHECKSUMS_ITEM).exists()]
            listed = self._lists_checksums(step)
            if listed or older:
                written = "its metadata lists them" if listed else f"the older step {older[-1]} has some"
                raise CorruptCheckpointError(
                    f"checkpoint {where} fails verification: its checksums are missing ({written}; a deleted or lost "
                    "file), so its data cannot be verified"
                )
            if not self.allow_unverified:
                raise UnverifiedCheckpointError(
                    f"checkpoint {where} (step {step}) has no checksums (saved before they were kept), so nothing "
                    "can verify its data",
                    step=step,
                    where=where,
                )
            _log.warning(
                "checkpoint %s has no checksums (saved before they were kept); restored unverified, as allowed", where
            )
            return {}, None
        try:
            args = ocp.args.Composite(**{CHECKSUMS_ITEM: ocp.args.JsonRestore()})
            saved = self._manager.restore(step, args=args)[CHECKSUMS_ITEM]
            leaves = {name: (jnp.dtype(entry["dtype"]), entry["checksum"]) for name, entry in saved["leaves"].items()}
            sha256, saved_as = str(saved["metadata_sha256"]), saved.get("step")  # no "step": saved before it was kept
        except Exception as e:  # noqa: BLE001  unreadable JSON, a missing field: the step cannot be trusted
            raise CorruptCheckpointError(f"cannot read the checksums of checkpoint {where}: {e}") from e
        if saved_as is not None and saved_as != step:
            raise MisnamedCheckpointError(
                f"checkpoint {where} was saved as step {saved_as}, not {step}: its directory was renamed or copied "
                f"from another step; rename it back to {saved_as} or move it out of {self.directory}"
            )
        return leaves, sha256


def _json_sha256(value: Any) -> str:
    """SHA-256 of a JSON value's canonical text (sorted keys), as it reads back: tuples are lists."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
