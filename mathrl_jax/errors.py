"""The package's exception base: every error that means "bad input, named in the message" derives from it.

`scripts/train.py` turns a `MathRLError` into exit status 2 with its message; anything else is a bug and keeps its
traceback. Each subclass also derives from the built-in its callers knew (`ValueError`, `RuntimeError`,
`MemoryError`), so existing `except` clauses keep working.
"""


class MathRLError(Exception):
    """Bad input (config, data, checkpoint, mesh, model output, a peer), named in the message."""


class TrainingError(MathRLError, ValueError):
    """Bad input to a training run (config, data, model path, mesh); the message names it."""


def fail(message: str):
    """Raise `TrainingError(message)`: a check's one line, written where the check is."""
    raise TrainingError(message)
