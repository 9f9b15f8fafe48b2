"""The safetensors format, read and written here by hand: a little-endian header length, a JSON header, the data.

`SafetensorsFile` reads one file through a memory map, `checkpoint_tensors` finds every tensor of a single-file or
sharded (index.json) checkpoint directory, `write_safetensors` streams one file to disk; their docstrings say why
the `safetensors` package does not do it. `models/hf.py` maps these tensors to and from the model's parameters.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Dict

import ml_dtypes
import numpy as np

from mathrl_jax import files
from mathrl_jax.errors import MathRLError

_SAFETENSORS_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_DTYPE_NAMES = {v: k for k, v in _SAFETENSORS_DTYPES.items()}


class ModelCheckpointError(MathRLError, ValueError):
    """A checkpoint directory that does not match the model; names the tensor or file."""


MAX_HEADER_BYTES = 100 * 2**20
"""The longest JSON header read (100 MiB, the `safetensors` package's own limit)."""


def _header_size(f, path: str) -> int:
    """The JSON header's length, from the first 8 bytes of the open file `f`; one that the file cannot hold, or
    over MAX_HEADER_BYTES (a damaged file: 1e15), raises ModelCheckpointError naming the file before it is read."""
    (size,) = struct.unpack("<Q", f.read(8))
    file_size = os.fstat(f.fileno()).st_size
    if size > file_size - 8 or size > MAX_HEADER_BYTES:
        raise ModelCheckpointError(
            f"{path} is not a readable safetensors file: its header length {size} is over "
            + (f"the {file_size} bytes of the file" if size > file_size - 8 else f"the limit of {MAX_HEADER_BYTES}")
        )
    return size


class SafetensorsFile:
    """Lazy reader of one `.safetensors` file: tensors are read-only views of a memory map.

    Written here rather than taken from `safetensors.safe_open` because its numpy framework cannot return
    bfloat16, the dtype of Qwen's checkpoints (numpy has no such dtype: "data type 'bfloat16' not understood",
    safetensors 0.8), and its flax framework copies each whole tensor onto the default device, where a sharded
    load (`jax.make_array_from_callback` in `read_tensors`) wants only each device's slice of a memory-mapped
    view. The format is a little-endian header length, a JSON header and the raw data.
    """

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                header_size = _header_size(f, path)
                header = json.loads(f.read(header_size))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelCheckpointError(f"{path} is not a readable safetensors file: {e}") from None
        self.metadata = header.pop("__metadata__", {})
        self.entries = header
        self._data_start = 8 + header_size
        self._map = np.memmap(path, dtype=np.uint8, mode="r") if os.path.getsize(path) > self._data_start else None

    def keys(self):
        return self.entries.keys()

    def get(self, name: str) -> np.ndarray:
        entry = self.entries[name]
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ModelCheckpointError(f"tensor {name!r} in {self.path} has unsupported dtype {entry['dtype']!r}")
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize or self._map is None:
            raise ModelCheckpointError(f"tensor {name!r} in {self.path} is truncated or its offsets are wrong")
        start = self._data_start + begin
        if start + (end - begin) > self._map.size:
            raise ModelCheckpointError(f"tensor {name!r} in {self.path} is truncated (file ends early)")
        return self._map[start : start + (end - begin)].view(dtype).reshape(shape)


def checkpoint_tensors(directory: str) -> Dict[str, SafetensorsFile]:
    """Tensor name -> the file that holds it, for single or sharded (index.json) checkpoints."""
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelCheckpointError(f"{index_path} has no 'weight_map'")
        files = {}
        located = {}
        for name, filename in weight_map.items():
            path = os.path.join(directory, filename)
            if filename not in files:
                if not os.path.isfile(path):
                    raise ModelCheckpointError(
                        f"{index_path} names {filename!r} (for tensor {name!r}), which is missing"
                    )
                files[filename] = SafetensorsFile(path)
            if name not in files[filename].entries:
                raise ModelCheckpointError(f"tensor {name!r} is not in {path}, although the index says it is")
            located[name] = files[filename]
        return located
    single = os.path.join(directory, "model.safetensors")
    if not os.path.isfile(single):
        raise ModelCheckpointError(f"no model.safetensors or model.safetensors.index.json in {directory!r}")
    file = SafetensorsFile(single)
    return {name: file for name in file.keys()}


def write_safetensors(path: str, tensors: Dict[str, np.ndarray]) -> None:
    """One `.safetensors` file, written whole (`files.atomic_write`), one tensor's bytes at a time.

    `safetensors.numpy.save_file` would turn every tensor of the shard into a bytes object before writing (its
    `_flatten`), holding a 4 GiB shard twice; this writes the same format streaming (transformers loads it, in
    float32 and bfloat16, in `tests/models/test_hf.py`).
    """
    header, offset = {}, 0
    for name, array in tensors.items():
        nbytes = array.nbytes
        header[name] = {
            "dtype": _DTYPE_NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with files.atomic_write(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for array in tensors.values():
            f.write(np.ascontiguousarray(array).tobytes())
