"""Orbax checkpoints with exact resume: `Checkpointer` (save, restore, verify), the errors a damaged or
foreign checkpoint raises, and the LoRA base a run records.

Behind the door: `_checkpointer` (Checkpointer), `_directory` (the directory, its steps and their state),
`_tree` (trees to and from Orbax's items), `_checksums` (per-leaf checksums), `_errors`, `_faults` (disk faults),
`_lora_base` (a LoRA run's base: recorded, checked on resume).
"""

from mathrl_jax.train.checkpoint._checkpointer import Checkpointer
from mathrl_jax.train.checkpoint._directory import STATE_ITEM
from mathrl_jax.train.checkpoint._errors import (
    CheckpointError,
    CorruptCheckpointError,
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
    "STATE_ITEM",
    "TargetMismatchError",
    "UnreadableCheckpointError",
    "UnverifiedCheckpointError",
    "check_lora_base",
    "lora_base_record",
]
