"""Mesh shapes from flags, and the errors for shapes that cannot work."""

import jax
import pytest

from mathrl_jax.sharding import MeshConfig, MeshError, make_mesh, resolve_mesh_shape


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"dp": 1, "fsdp": -1, "tp": 1}, (1, 8, 1)),
        ({"dp": 2, "fsdp": -1, "tp": 2}, (2, 2, 2)),
        ({"dp": -1, "fsdp": 1, "tp": 4}, (2, 1, 4)),
        ({"dp": 8, "fsdp": 1, "tp": 1}, (8, 1, 1)),
        ({"tp": 2}, (1, 4, 2)),  # fsdp defaults to -1
    ],
)
def test_resolves_minus_one_to_the_remaining_devices(flags, expected):
    assert resolve_mesh_shape(flags, 8) == expected


def test_make_mesh_spans_all_devices_with_tp_innermost():
    mesh = make_mesh(MeshConfig(dp=2, fsdp=2, tp=2))
    assert mesh.axis_names == ("dp", "fsdp", "tp")
    assert dict(mesh.shape) == {"dp": 2, "fsdp": 2, "tp": 2}
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())


@pytest.mark.parametrize(
    "flags, heads, words",
    [
        ({"dp": 3, "fsdp": 1, "tp": 1}, None, ["dp=3", "needs 3 devices", "8", "shapes that work", "dp=1 fsdp=8 tp=1"]),
        ({"dp": 3, "fsdp": -1, "tp": 1}, None, ["3 devices", "does not divide", "8 devices", "shapes that work"]),
        ({"dp": -1, "fsdp": -1, "tp": 1}, None, ["at most one axis may be -1"]),
        ({"dp": 0, "fsdp": -1, "tp": 1}, None, ["dp=0", "positive"]),
        ({"dp": 1, "fsdp": 2, "tp": 4}, 6, ["tp=4", "6 attention heads", "tp values that work here: 1, 2"]),
    ],
)
def test_bad_shapes_say_what_was_asked_what_exists_and_what_works(flags, heads, words):
    with pytest.raises(MeshError) as error:
        resolve_mesh_shape(flags, 8, num_attention_heads=heads)
    for word in words:
        assert word in str(error.value)


def test_unknown_axis_is_named():
    with pytest.raises(MeshError, match="unknown mesh axis 'pp'.*dp, fsdp, tp"):
        resolve_mesh_shape({"pp": 2}, 8)
