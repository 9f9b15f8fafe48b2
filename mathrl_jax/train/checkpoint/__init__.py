"""Orbax checkpoints of a training state, with exact resume.

`Checkpointer` wraps an Orbax `CheckpointManager`; every step directory holds
three items:

    <directory>/<step>/state      the pytree (OCDBT / TensorStore), sharded as it lives
    <directory>/<step>/metadata   JSON (in the file metadata/metadata): data position, config, version, ...
    <directory>/<step>/checksums  JSON: each leaf's dtype and checksum, taken from memory at `save`
    <directory>/<step>/arrays     optional: host NumPy arrays saved beside the state (`save(..., arrays=)`), e.g. an
                                  asynchronous run's pending batches, verified by checksums as the state is

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
  a 64-bit checksum of every leaf (`_checksums`, computed where the array lives, the same for
  any sharding) and `restore` compares each restored leaf with it. A step that fails is
  refused; restoring the latest step falls back to the newest intact one, with a warning
  naming both; the refused steps are removed at the next `save`; rotation (`max_to_keep`)
  never removes the last step `restore` verified. Every step failing is a
  `CorruptCheckpointError`. Fail closed: a step whose checksums are missing while its Orbax
  metadata (`_CHECKPOINT_METADATA`) lists them, or an older step has them, is refused as damaged;
  a step saved before checksums were kept (its metadata lists none) is restored only with
  `allow_unverified=True` (with a warning), else an `UnverifiedCheckpointError` naming it.
- Named by its step: the checksums record the step saved, and a step directory whose name differs (renamed
  4 -> 9, or copied from another step) is refused, a `MisnamedCheckpointError` naming it (no older step is tried
  in its place: the directory's name is wrong, not its data).
- No save skipped silently: a step on the interval that is not newer than the latest intact step
  (`should_save` false), or a save of a step that exists, is said in a warning naming the step and directory.
- One line per failed save: a save that fails (a full disk) raises a `CheckpointError` naming
  its own step, its directory and the steps kept, where the failure is met (the next `save`,
  `wait_until_finished` or `close` for a background write); what Orbax's threads log about it
  is not printed (`_faults`). The steps saved before it stay as they were.

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

Behind the door: `_checkpointer` (Checkpointer), `_directory` (the directory, its steps and their state),
`_tree` (trees to and from Orbax's items), `_checksums` (per-leaf checksums), `_errors`, `_faults` (disk faults),
`_lora_base` (a LoRA run's base: recorded, checked on resume).
"""

from mathrl_jax.train.checkpoint._checkpointer import Checkpointer
from mathrl_jax.train.checkpoint._directory import STATE_ITEM
from mathrl_jax.train.checkpoint._errors import (
    CheckpointError,
    CorruptCheckpointError,
    MisnamedCheckpointError,
    UnreadableCheckpointError,
    UnverifiedCheckpointError,
)
from mathrl_jax.train.checkpoint._faults import DISK_ERRNOS
from mathrl_jax.train.checkpoint._lora_base import LORA_BASE_KEY, check_lora_base, lora_base_record
from mathrl_jax.train.checkpoint._tree import TargetMismatchError

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "CorruptCheckpointError",
    "DISK_ERRNOS",
    "LORA_BASE_KEY",
    "MisnamedCheckpointError",
    "STATE_ITEM",
    "TargetMismatchError",
    "UnreadableCheckpointError",
    "UnverifiedCheckpointError",
    "check_lora_base",
    "lora_base_record",
]
