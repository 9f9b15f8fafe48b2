"""Checksums of a training state's leaves, for `train.checkpoint`: Orbax stores no checksum of the arrays' data
(OCDBT and zarr keep none), so a flipped byte in a data file would restore as other numbers.

Written here, not taken from `hashlib`: a checksum of a sharded array must be computed where its shards live (on
every process of a multi-host job) and give the same value for any sharding, which a byte-stream hash of the
gathered array cannot do without copying the whole state to one host. Two 32-bit sums modulo 2^32 (order-free,
hence sharding-free) over the array's bytes read as words: `_fold`.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

_GOLDEN = np.uint32(0x9E3779B9)  # 2^32 / golden ratio: decorrelates the index of word 0 from its value


def _fmix32(h: Any, xp: Any) -> Any:
    """MurmurHash3's 32-bit finalizer (Appleby): every input bit flips each output bit with probability ~1/2."""
    h = h ^ xp.right_shift(h, np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ xp.right_shift(h, np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ xp.right_shift(h, np.uint32(16))


def _fold(words: Any, index: Any, xp: Any) -> tuple[Any, Any]:
    """Two 32-bit sums over `words` (uint32) at flat positions `index` (uint32, row-major), modulo 2^32.

    sum(w_i * (2i + 1)) changes under any change of one word (an odd multiplier is invertible mod 2^32), so one
    flipped bit is always caught; sum(fmix32(w_i ^ fmix32(i + c))) changes like a random 32-bit value under any
    other damage. Sums modulo 2^32 are the same in any order, so the value does not depend on the sharding.
    """
    weighted = xp.sum(words * (index * np.uint32(2) + np.uint32(1)), dtype=np.uint32)
    mixed = xp.sum(_fmix32(words ^ _fmix32(index + _GOLDEN, xp), xp), dtype=np.uint32)
    return weighted, mixed


def _host_checksum(value: Any, dtype: np.dtype) -> str:
    """The checksum of a host value (NumPy array or scalar, Python scalar) as an array of `dtype`."""
    array = np.ascontiguousarray(np.asarray(value, dtype=dtype)).reshape(-1)
    if array.dtype == np.bool_:
        array = array.view(np.uint8)
    size = array.dtype.itemsize
    words = array.view(np.uint32) if size in (4, 8) else array.view({1: np.uint8, 2: np.uint16}[size])
    words = words.astype(np.uint32)
    with np.errstate(over="ignore"):
        weighted, mixed = _fold(words, np.arange(words.size, dtype=np.uint32), np)
    return f"{int(weighted):08x}{int(mixed):08x}"


def _device_words(array: jax.Array) -> jax.Array:
    """`array`'s bytes as uint32 words in its own shape (a trailing 2 for 8-byte dtypes), as `_host_checksum` reads
    them; no reshape, which would make XLA gather a sharded array."""
    if array.dtype == jnp.bool_:
        array = array.astype(jnp.uint8)
    if jnp.issubdtype(array.dtype, jnp.complexfloating):
        array = jnp.stack([array.real, array.imag], axis=-1)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[array.dtype.itemsize]
    return jax.lax.bitcast_convert_type(array, unsigned).astype(jnp.uint32)


@jax.jit
def _device_checksums(arrays: list[jax.Array]) -> list[jax.Array]:
    """`[2]` uint32 checksums of `arrays`, computed where they live (sharded, on every process of a multi-host job)."""
    sums = []
    for array in arrays:
        words = _device_words(array)
        index = jnp.zeros(words.shape, jnp.uint32)
        stride = 1
        for axis in reversed(range(words.ndim)):  # the row-major flat position, modulo 2^32
            index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * np.uint32(stride % 2**32)
            stride *= words.shape[axis]
        sums.append(jnp.stack(_fold(words, index, jnp)))
    return sums


def leaf_checksums(named: Mapping[str, Any], dtypes: Mapping[str, np.dtype]) -> dict[str, str | None]:
    """{key: checksum hex} of the leaves in `named`, each read as its `dtypes[key]`; None for a leaf that cannot
    be summed (a dtype without a byte layout here, such as int4)."""
    result: dict[str, str | None] = {}
    on_device = {}
    for name, leaf in named.items():
        if isinstance(leaf, jax.Array):
            on_device[name] = leaf if leaf.dtype == dtypes[name] else leaf.astype(dtypes[name])
        else:
            try:
                result[name] = _host_checksum(leaf, dtypes[name])
            except (KeyError, TypeError, ValueError):
                result[name] = None
    if on_device:
        try:
            sums = [s for group in _groups(list(on_device.values())) for s in jax.device_get(_device_checksums(group))]
        except Exception:  # noqa: BLE001  e.g. leaves on different devices: one program per leaf
            sums = []
            for leaf in on_device.values():
                try:
                    sums.append(jax.device_get(_device_checksums([leaf])[0]))
                except Exception:  # noqa: BLE001  a dtype without a byte layout here
                    sums.append(None)
        for name, pair in zip(on_device, sums):
            result[name] = None if pair is None else f"{int(pair[0]):08x}{int(pair[1]):08x}"
    return result


# Bytes of leaves summed by one program: XLA:CPU keeps about twice its leaves' bytes in temporaries (8.3 GiB for
# 4.1 GiB of leaves in one program), so a whole state at once doubled a checkpoint's memory at the 0.5B shape.
GROUP_BYTES = 512 * 2**20


def _groups(arrays: list) -> list:
    """`arrays` in consecutive groups of at most `GROUP_BYTES` (a larger leaf alone): one program each, the same
    groups at every save of a run (so each compiles once)."""
    groups, current, size = [], [], 0
    for array in arrays:
        nbytes = array.size * np.dtype(array.dtype).itemsize
        if current and size + nbytes > GROUP_BYTES:
            groups.append(current)
            current, size = [], 0
        current.append(array)
        size += nbytes
    return groups + [current] if current else groups


def saved_dtype(leaf: Any) -> np.dtype:
    """The dtype a leaf is summed as: its own, or NumPy's for a Python scalar."""
    return np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
