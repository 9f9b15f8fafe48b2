"""Meshes from `dp` / `fsdp` / `tp` flags, partition rules, and multi-host set-up."""

from mathrl_jax.sharding.mesh import AXES, BATCH_AXES, MeshConfig, MeshError, follow_mesh, make_mesh, resolve_mesh_shape
from mathrl_jax.sharding.rules import (
    ShardingRuleError,
    batch_spec,
    constrain,
    constrain_batch,
    constrain_heads,
    loader_sharding_fn,
    optimizer_state_shardings,
    path_string,
    qwen_rules,
    shard_tree,
    sharded_init,
    spec_for,
    tree_shardings,
    tree_specs,
)

__all__ = [name for name in dir() if not name.startswith("_")]
