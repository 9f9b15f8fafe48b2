"""A checkpoint directory for `train.checkpoint`: the Orbax `CheckpointManager` over it (with its rotation policy),
its complete steps, the state metadata and JSON metadata of a saved step, reading a step (whole or a part of its
state), and its life cycle.

`Checkpointer` saves and restores through it; the layout of a step directory is in `train.checkpoint`'s docstring.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from mathrl_jax.train.checkpoint._errors import CheckpointError, CorruptCheckpointError, UnreadableCheckpointError
from mathrl_jax.train.checkpoint._faults import SaveNoise, save_failure
from mathrl_jax.train.checkpoint._tree import leaves_by_name

if TYPE_CHECKING:
    from typing import Self  # Python >= 3.11; annotations only

STATE_ITEM = "state"
METADATA_ITEM = "metadata"
CHECKSUMS_ITEM = "checksums"
ARRAYS_ITEM = "arrays"  # host arrays saved beside the state (an asynchronous run's pending batches)
SAVE_CONCURRENT_GB = 1  # Orbax's bound on the bytes of a save in flight (`Checkpointer` below)


class CheckpointDirectory:
    """The directory side of `Checkpointer` (its base class; the arguments are documented there): the Orbax manager,
    the steps it holds, reading a step, and closing it."""

    def __init__(
        self,
        directory: str,
        *,
        save_interval: int,
        max_to_keep: int | None = 3,
        async_save: bool = True,
        read_only: bool = False,
        allow_unverified: bool = False,
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
        self.read_only = bool(read_only)
        self.allow_unverified = bool(allow_unverified)
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
            # A writer removes the tmp dirs of writes that a crash interrupted; a reader leaves them, and the
            # directory, alone: they may be the saves in progress of a run still training.
            cleanup_tmp_directories=not self.read_only,
            create=not self.read_only,
            # A reader skips each step's metadata when it lists them: it needs no save times, and a hand-made step
            # directory without metadata would be logged.
            lightweight_initialize=self.read_only,
        )
        # Handlers named up front, so that a fresh manager can read the metadata of steps it did not write.
        # At most 1 GB of a save in flight: Orbax's default (96) staged a whole state on the host at once, 0.9x the
        # state's bytes more (a 4 GiB state: 3.7 GiB extra, 1.4 with this, and a faster write here).
        handlers = {
            STATE_ITEM: ocp.StandardCheckpointHandler(save_concurrent_gb=SAVE_CONCURRENT_GB),
            METADATA_ITEM: ocp.JsonCheckpointHandler(),
            CHECKSUMS_ITEM: ocp.JsonCheckpointHandler(),
            ARRAYS_ITEM: ocp.StandardCheckpointHandler(),
        }
        self._manager = ocp.CheckpointManager(directory, options=options, item_handlers=handlers)
        self._closed = False
        self._saving: int | None = None  # the step of the save in flight (written in the background)
        self._failed: CheckpointError | None = None  # a save's failure, reported once; the manager is spent
        self._noise = SaveNoise(directory)  # what Orbax's threads log about a failed save: not printed beside it

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

    # ---- restore ----

    def _resolve_step(self, step: int | None) -> int:
        self.wait_until_finished()
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(f"no complete checkpoint in {self.directory}")
        if step is None:
            return steps[-1]
        step = check_step(step)
        if step not in steps:
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; the steps there are {steps}")
        return step

    def saved_shapes(self, step: int | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """{key: (shape, dtype)} of the state saved at `step` (default: the latest), read from its metadata."""
        step = self._resolve_step(step)
        return {name: (tuple(m.shape), np.dtype(m.dtype)) for name, m in leaves_by_name(self._saved_tree(step)).items()}

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

    def _read_step(self, step: int, item: Any, *, partial: bool = False) -> tuple[Any, dict[str, Any]]:
        """(the state saved at `step`, restored into `item`: its structure and abstract leaves; the JSON metadata).

        `partial`: `item` holds some of the saved state's top-level entries (keyed as saved), and only those are read.
        That read goes through an Orbax `PyTreeCheckpointHandler` (`partial_restore`) on the step's state directory,
        which holds that handler's format: the manager's `StandardCheckpointHandler` restores no part of a tree (it
        has no `partial_restore` and refuses placeholders). Its ShapeDtypeStructs without a sharding are given the
        saved one first, as `StandardRestore` does (that handler would return NumPy arrays).
        """
        where = os.path.join(self.directory, str(step))
        try:
            if not partial:
                args = {STATE_ITEM: ocp.args.StandardRestore(item), METADATA_ITEM: ocp.args.JsonRestore()}
                restored = self._manager.restore(step, args=ocp.args.Composite(**args))
                return restored[STATE_ITEM], dict(restored[METADATA_ITEM] or {})
            saved = self._saved_tree(step)
            item = jax.tree.map(_with_saved_sharding, item, {key: saved[key] for key in item})
            handler = ocp.PyTreeCheckpointHandler()
            try:
                restore_args = ocp.checkpoint_utils.construct_restore_args(item)
                args = ocp.args.PyTreeRestore(item, restore_args=restore_args, partial_restore=True)
                state = handler.restore(self._manager.directory / str(step) / STATE_ITEM, args=args)
            finally:
                handler.close()
            metadata = self._manager.restore(step, args=ocp.args.Composite(**{METADATA_ITEM: ocp.args.JsonRestore()}))
        except Exception as e:  # re-raised with the directory and step named; a damaged file is one cause
            raise UnreadableCheckpointError(f"cannot restore checkpoint {where}: {e}") from e
        return state, dict(metadata[METADATA_ITEM] or {})

    # ---- life cycle ----

    def wait_until_finished(self) -> None:
        """Blocks until a background save is written and finalized.

        Raises:
          CheckpointError: that save failed (a full disk, ...); one line naming its step, its directory and the
            steps kept (`_faults.save_failure`), raised again by every later call: Orbax's manager
            takes no save after a failed one.
        """
        if self._failed is not None:
            raise self._failed
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001  Orbax's threads raise whatever the write met
            if self._saving is None:
                raise
            raise self._save_failed(self._saving, e) from e
        self._saving = None
        self._noise.release()

    def _save_failed(self, step: int, error: BaseException) -> CheckpointError:
        """The error of the failed save of `step`, kept to be raised again; Orbax's noise about it is dropped."""
        self._noise.drop()
        self._saving = None
        with contextlib.suppress(Exception):  # Orbax dropped the steps to rotate out at the save's start: on disk
            self._manager.reload()  # they stay, deleted only once a save is finalized
        self._failed = save_failure(self.directory, step, error, [s for s in self.all_steps() if s != step])
        return self._failed

    def close(self) -> None:
        """Waits for the pending save, then releases the manager; idempotent. Raises a failure of that save
        (`wait_until_finished`), not one already raised."""
        if self._closed:
            return
        self._closed = True
        reported = self._failed is not None
        try:
            self.wait_until_finished()
        except CheckpointError:
            with contextlib.suppress(Exception):  # its own wait raises the failed save again
                self._manager.close()
            if reported:
                return
            raise
        self._manager.close()
        self._noise.uninstall()

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"the Checkpointer of {self.directory} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise CheckpointError(f"the Checkpointer of {self.directory} is read-only; it saves nothing")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Checkpointer({self.directory!r}, save_interval={self.save_interval}, "
            f"max_to_keep={self.max_to_keep}, async_save={self.async_save}"
            + (", read_only=True)" if self.read_only else ")")
        )


def check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise CheckpointError(f"step={step!r}: expected an int >= 0")
    return int(step)


def _with_saved_sharding(leaf: Any, saved: Any) -> Any:
    """`leaf`, or for a ShapeDtypeStruct without a sharding the same with the sharding of `saved` (Orbax metadata)."""
    if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None and getattr(saved, "sharding", None):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=saved.sharding.to_jax_sharding())
    return leaf


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
