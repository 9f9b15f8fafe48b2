"""The device mesh, built from the `dp`, `fsdp`, `tp` flags.

  dp    data parallel: parameters replicated, batch split
  fsdp  fully sharded data parallel: parameters and optimizer state split, batch split
  tp    tensor parallel: attention heads and MLP columns split, batch replicated

One of the three may be -1, meaning "all the remaining devices". The mesh
spans every device of every host (`jax.devices()`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence, Tuple, Union

import jax
import numpy as np

from mathrl_jax.errors import MathRLError

AXES = ("dp", "fsdp", "tp")
BATCH_AXES = ("dp", "fsdp")  # the axes a batch is split over


class MeshError(MathRLError, ValueError):
    """A mesh shape that cannot be built; says what was asked, what exists, and what would work."""


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    dp: int = 1
    fsdp: int = -1
    tp: int = 1

    @classmethod
    def from_mapping(cls, mapping: Union["MeshConfig", Dict[str, int]]) -> "MeshConfig":
        if isinstance(mapping, MeshConfig):
            return mapping
        unknown = sorted(set(mapping) - set(AXES))
        if unknown:
            raise MeshError(f"unknown mesh axis {', '.join(map(repr, unknown))}; the axes are {', '.join(AXES)}")
        return cls(**{k: int(v) for k, v in mapping.items()})

    def as_tuple(self) -> Tuple[int, int, int]:
        return (self.dp, self.fsdp, self.tp)


def follow_mesh(own: Dict[str, Optional[int]], trainer: Dict[str, int]) -> Dict[str, int]:
    """A second mesh (the sampler's) whose unset (None) axes take the trainer's values."""
    return {axis: trainer[axis] if own.get(axis) is None else own[axis] for axis in AXES}


def _valid_shapes(num_devices: int, limit: int = 6):
    """A few (dp, fsdp, tp) that multiply to num_devices, most fsdp-heavy first."""
    shapes = []
    for tp in range(1, num_devices + 1):
        if num_devices % tp:
            continue
        rest = num_devices // tp
        for dp in range(1, rest + 1):
            if rest % dp == 0:
                shapes.append((dp, rest // dp, tp))
    shapes.sort(key=lambda s: (s[2], s[0]))
    return ", ".join(f"dp={a} fsdp={b} tp={c}" for a, b, c in shapes[:limit])


def resolve_mesh_shape(
    config: Union[MeshConfig, Dict[str, int]],
    num_devices: int,
    num_attention_heads: Optional[int] = None,
) -> Tuple[int, int, int]:
    """(dp, fsdp, tp) with -1 filled in, checked against the device count and the model's heads."""
    config = MeshConfig.from_mapping(config)
    shape = list(config.as_tuple())
    asked = ", ".join(f"{a}={s}" for a, s in zip(AXES, shape))
    if any(s == 0 or s < -1 for s in shape):
        raise MeshError(f"mesh {asked}: each axis must be a positive size or -1")
    if shape.count(-1) > 1:
        raise MeshError(f'mesh {asked}: at most one axis may be -1 ("the rest of the devices")')
    known = int(np.prod([s for s in shape if s != -1]))
    if -1 in shape:
        if num_devices % known:
            raise MeshError(
                f"mesh {asked}: the fixed axes use {known} devices, which does not divide the "
                f"{num_devices} devices there are; shapes that work: {_valid_shapes(num_devices)}"
            )
        shape[shape.index(-1)] = num_devices // known
    elif known != num_devices:
        raise MeshError(
            f"mesh {asked} needs {known} devices but there are {num_devices}; "
            f"shapes that work: {_valid_shapes(num_devices)}"
        )
    tp = shape[2]
    if num_attention_heads is not None and num_attention_heads % tp:
        divisors = [
            d for d in range(1, num_attention_heads + 1) if num_attention_heads % d == 0 and num_devices % d == 0
        ]
        raise MeshError(
            f"mesh tp={tp} does not divide the model's {num_attention_heads} attention heads; "
            f"tp values that work here: {', '.join(map(str, divisors))}"
        )
    return tuple(shape)


def make_mesh(
    config: Union[MeshConfig, Dict[str, int]],
    devices: Optional[Sequence[jax.Device]] = None,
    num_attention_heads: Optional[int] = None,
) -> jax.sharding.Mesh:
    """A `Mesh` with axes ("dp", "fsdp", "tp") over `devices` (default: all devices of all hosts).

    tp is the innermost axis, so tensor-parallel groups sit on neighbouring
    devices (the same host, the fastest links).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(config, len(devices), num_attention_heads)
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    return jax.make_mesh(shape, AXES, axis_types=auto, devices=devices)
