"""The errors of `train.checkpoint`: a checkpoint that cannot be saved or restored, or whose data fails verification."""

from mathrl_jax.errors import MathRLError


class CheckpointError(MathRLError, RuntimeError):
    """A checkpoint that cannot be saved or restored; names the directory, the step and the bad key."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint whose data fails verification (a leaf's checksum differs from the one saved with it) or cannot
    be read; names the step and the leaves."""


class UnreadableCheckpointError(CorruptCheckpointError):
    """A checkpoint Orbax could not read: a damaged file, or a passing I/O failure. Not restored, but never
    deleted for it: only a checksum that differs proves the data damaged."""
