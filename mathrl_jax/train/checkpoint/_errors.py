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


class UnverifiedCheckpointError(CheckpointError):
    """A checkpoint saved without checksums (its metadata lists none: a version before they were kept), which
    nothing can verify: restored only when the caller allows it (`Checkpointer(allow_unverified=True)`). Not a
    damaged step: no older step is tried in its place. `step` and `where` (its directory) name it; `setting` is
    how the caller allows it, named in the message (a program sets its own option's name)."""

    def __init__(self, reason: str, *, step: int, where: str, setting: str = "allow_unverified=True") -> None:
        super().__init__(reason)
        self.reason = reason
        self.step = step
        self.where = where
        self.setting = setting

    def __str__(self) -> str:
        return f"{self.reason}; it is restored only with {self.setting}"


class MisnamedCheckpointError(CheckpointError):
    """A step directory whose checksums record another step than its name (a directory renamed, 4 -> 9, or copied
    from another step): restoring it would resume at the wrong step and skip the saves up to its name. Not a
    damaged step: no older step is tried in its place."""
