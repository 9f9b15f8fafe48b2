"""The leaves of a state that `train.checkpoint` saves and restores: named by key path, refused where two keys
collide or a leaf cannot be stored, turned into the abstract leaves Orbax restores, and given back in the type of
the target's leaves; the restore target's keys and shapes compared with those saved (`TargetMismatchError`); and the
entries of a saved state that a partial restore reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from mathrl_jax.sharding.rules import path_string
from mathrl_jax.train.checkpoint._errors import CheckpointError

# --------------------------------------------------------------------------------------------
# Leaves (the tree itself is Orbax's: it saves any pytree and restores into the target's structure)
# --------------------------------------------------------------------------------------------


def is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def map_leaves(tree: Any, what: str, fn: Callable[[str, Any], Any]) -> tuple[Any, dict[str, Any]]:
    """Unwraps the NNX Variables of `tree`, names its leaves and maps `fn(key, leaf)` over them.

    Returns (the mapped tree, {key: mapped leaf}). Refuses a tree without leaves or a bare leaf (Orbax's
    StandardSave refuses both, without naming the directory or step), and keys that collide once joined
    with "/" (our names) or "." (Orbax's names of the stored arrays: it silently stores one over the other).
    """
    # A Variable flattens to `.value`; unwrapped, an nnx.State is stored under the keys of its pure dict.
    tree = jax.tree.map(lambda x: x.get_value() if is_variable(x) else x, tree, is_leaf=is_variable)
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


def savable_leaf(name: str, leaf: Any) -> Any:
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


def abstract_leaf(name: str, leaf: Any) -> Any:
    """The abstract leaf Orbax restores for one target leaf."""
    if _is_typed_key(leaf):
        raise CheckpointError(
            f"target leaf {name!r} is a typed PRNG key array ({leaf.dtype}); checkpoints hold raw key data, "
            f"use jax.random.key_data(key) in the target"
        )
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    if isinstance(leaf, (np.ndarray, np.generic)):
        return np.asarray(leaf)  # Orbax takes no NumPy scalars: a 0-d array (see `leaf_from_disk`)
    if isinstance(leaf, (jax.ShapeDtypeStruct, bool, int, float)):
        return leaf
    raise CheckpointError(
        f"target leaf {name!r} is a {type(leaf).__name__}; expected a jax.Array, jax.ShapeDtypeStruct, "
        f"NumPy array or Python int/float/bool"
    )


def leaf_from_disk(target: Any, value: Any) -> Any:
    """A restored value in the type of its target leaf: NNX Variables rewrapped, NumPy scalars.

    Orbax itself casts arrays and Python scalars to the target's dtype or type; NumPy scalars it
    restores as the 0-d arrays they were asked as (see `abstract_leaf`).
    """
    if is_variable(target):
        return target.replace(value=value)
    if isinstance(target, np.generic):
        return np.asarray(value, dtype=target.dtype)[()]
    return value


def leaves_by_name(tree: Any) -> dict[str, Any]:
    """{key: leaf} of `tree`, keys as `path_string`."""
    return {path_string(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def sequence_paths(tree: Any) -> set[str]:
    """The keys of the lists and tuples (not NamedTuples: keyed by field) in `tree` that hold leaves."""
    return {
        path_string(path[:i])
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
        for i, key in enumerate(path)
        if isinstance(key, jax.tree_util.SequenceKey)
    }


class TargetMismatchError(CheckpointError):
    """A restore target whose keys or shapes differ from those of the checkpoint; `differences` lists them, one phrase
    each (the keys of the target not in the checkpoint, those of the checkpoint not in the target, the shapes that
    differ), for a caller that names them in its own words (scripts/export_hf.py: the model of a run)."""

    def __init__(self, message: str, differences: list[str] | None = None) -> None:
        super().__init__(message)
        self.differences = list(differences or [])


def check_matches(where: str, wanted: dict[str, Any], saved: dict[str, Any]) -> None:
    """Raises a TargetMismatchError naming the keys of the target that the checkpoint at `where` lacks, and so on.

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
        f"{what}: {short_list(names)}"
        for what, names in [
            ("keys of the target not in the checkpoint", missing),
            ("keys in the checkpoint not in the target", extra),
            ("shapes differ", shapes),
        ]
        if names
    ]
    if parts:
        raise TargetMismatchError(
            f"checkpoint {where} does not match the restore target; " + "; ".join(parts), differences=parts
        )


def matching_part(entries: Mapping[Any, Any], wanted: dict[str, Any], where: str) -> dict[Any, Any]:
    """The items of `entries` in the top-level entries of the saved state that a partial restore target names.

    `entries` is keyed by top-level key (a saved state's tree) or by full key ("params/model/...": its checksums);
    `wanted` is the target's {key: leaf}. The saved state must be a mapping at the top (a dict, NamedTuple or dataclass
    is: Orbax keeps their fields by name), e.g. a TrainState of which the target holds `params` alone.
    """
    if not isinstance(entries, Mapping):
        raise CheckpointError(
            f"checkpoint {where} holds a {type(entries).__name__} at the top, not named entries; restore it whole"
        )
    tops = {name.split("/", 1)[0] for name in wanted}
    return {key: value for key, value in entries.items() if str(key).split("/", 1)[0] in tops}


def short_list(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def dtype_of(leaf: Any) -> np.dtype | None:
    """The dtype of an abstract restore leaf; None for a Python scalar (restored as its own type)."""
    return np.dtype(leaf.dtype) if isinstance(leaf, (jax.ShapeDtypeStruct, jax.Array, np.ndarray)) else None


def in_dtype(leaf: Any, dtype: np.dtype | None) -> Any:
    """An abstract or restored leaf in `dtype` (unchanged when `dtype` is None, when the leaf already has it or is a
    Python scalar, and for a ShapeDtypeStruct when JAX cannot hold the dtype, e.g. float64 without x64)."""
    if dtype is None or dtype_of(leaf) in (None, dtype):
        return leaf
    if isinstance(leaf, jax.ShapeDtypeStruct):
        if jax.dtypes.canonicalize_dtype(dtype) != dtype:
            return leaf
        return jax.ShapeDtypeStruct(leaf.shape, dtype, sharding=leaf.sharding)
    return leaf.astype(dtype)


def non_json(value: Any, where: str) -> str | None:
    """Where in `value` something is not a JSON value (None when all of it is)."""
    if value is None or isinstance(value, (bool, str, int, float)):
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has the key {key!r} of type {type(key).__name__} (JSON keys are strings)"
            found = non_json(item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        return next((f for i, x in enumerate(value) if (f := non_json(x, f"{where}[{i}]"))), None)
    return f"{where} is a {type(value).__name__} ({value!r:.60}); use int, float, str, bool, None, list or dict"
