"""Partition rules: parameter path pattern -> `PartitionSpec`.

A rule set is an ordered tuple of `(regex, PartitionSpec)`; a leaf takes the
spec of the first rule whose regex is found in its path string (keys joined
by "/", e.g. `model/layers/3/self_attn/q_proj/kernel`). Optimizer states
(optax `mu`, `nu`, ...) mirror the parameter tree, so their leaves have the
same path suffixes and match the same rules; rank-0 leaves (step counters)
are replicated. A leaf that matches no rule is an error, never silently
replicated.

Qwen layout (Megatron-style tensor parallelism over "tp", ZeRO-3-style
parameter sharding over "fsdp"):

| parameter                          | shape      | spec            |
|------------------------------------|------------|-----------------|
| embed_tokens.embedding             | [V, D]     | (tp, fsdp)      |
| q/k/v_proj.kernel, gate/up.kernel  | [D, out]   | (fsdp, tp)      |
| q/k/v_proj.bias                    | [out]      | (tp,)           |
| o_proj.kernel, down_proj.kernel    | [in, D]    | (tp, fsdp)      |
| a kernel's LoRA lora_a, lora_b     | [in, r], [r, out] | (its in-spec, None), (None, its out-spec) |
| lm_head.kernel                     | [D, V]     | (fsdp, tp)      |
| score (critic head)                | [D, 1], [1]| (fsdp, None), ()|
| value_head (OpenR's MLP head)      | [D, 1024], ...| ()           |
| every norm weight                  | [D]        | ()              |

k/v projections are replicated over tp when tp does not divide the number of
key-value heads (as vLLM does), so a 12-head / 2-kv-head model runs at tp=4.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, Sequence, Tuple

import chex
import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mathrl_jax.errors import MathRLError
from mathrl_jax.sharding import distributed

Rules = Tuple[Tuple[str, P], ...]


class ShardingRuleError(MathRLError, ValueError):
    """A leaf no rule covers, or a rule that does not fit a leaf's shape."""


def qwen_rules(num_key_value_heads: Optional[int] = None, tp: int = 1) -> Rules:
    """The Qwen rule set (see the module table).

    k/v projections are replicated over tp when tp does not divide
    `num_key_value_heads`. The "/" before each name keeps `q_norm/weight` and
    the like from matching another module's rule.
    """
    kv_tp = "tp" if num_key_value_heads is None or num_key_value_heads % tp == 0 else None
    kernels = (
        ("q_proj|gate_proj|up_proj", P("fsdp", "tp")),
        ("k_proj|v_proj", P("fsdp", kv_tp)),
        ("o_proj|down_proj", P("tp", "fsdp")),
    )
    # A LoRA adapter's A `[in, r]` splits its input side as the kernel does, B `[r, out]` its output side: the
    # low-rank path then needs the collectives of the base matmul, no others.
    adapters = tuple(
        rule
        for names, (split_in, split_out) in kernels
        for rule in (
            (rf"/({names})/lora/lora_a$", P(split_in, None)),
            (rf"/({names})/lora/lora_b$", P(None, split_out)),
        )
    )
    return (
        (r"(^|/)embed_tokens/embedding$", P("tp", "fsdp")),
        *((rf"/({names})/kernel$", spec) for names, spec in kernels),
        *adapters,
        (r"/q_proj/bias$", P("tp")),
        (r"/(k_proj|v_proj)/bias$", P(kv_tp)),
        (r"(^|/)lm_head/kernel$", P("fsdp", "tp")),
        (r"(^|/)score/kernel$", P("fsdp", None)),
        (r"(^|/)score/bias$", P()),
        (r"(^|/)value_head/layers/\d+/kernel$", P()),  # OpenR's MLP head (value_head.MLPValueHead): small
        (r"norm/weight$", P()),
    )


def path_string(path: Sequence[Any]) -> str:
    """`model/layers/0/self_attn/q_proj/kernel` for a jax tree path (NNX's trailing `.value` dropped).

    The one key-path naming of the project: partition rules match it, and `train.checkpoint` names
    the leaves of a checkpoint (in its messages and `saved_shapes`) with it.
    """
    if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "value":
        path = path[:-1]  # an nnx.Variable flattens to its `.value`; a dict key "value" is kept
    return jax.tree_util.keystr(tuple(path), simple=True, separator="/")


def spec_for(path: str, shape: Tuple[int, ...], rules: Rules, mesh: Optional[jax.sharding.Mesh] = None) -> P:
    """The PartitionSpec of one leaf; checks it divides the leaf's shape on `mesh`."""
    if len(shape) == 0:
        return P()
    for pattern, spec in rules:
        if re.search(pattern, path):
            if len(spec) > len(shape):
                raise ShardingRuleError(f"rule {pattern!r} -> {spec} has more axes than {path} of shape {shape}")
            if mesh is not None:
                for dim, axes in zip(shape, spec):
                    names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
                    size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
                    if dim % size:
                        raise ShardingRuleError(
                            f"{path} of shape {shape}: dimension {dim} is not divisible by mesh axes "
                            f"{names} of size {size} (rule {pattern!r} -> {spec})"
                        )
            return spec
    raise ShardingRuleError(f"no partition rule matches {path!r} (shape {shape}); add one to the rule set")


def tree_specs(tree: Any, rules: Rules, mesh: Optional[jax.sharding.Mesh] = None) -> Any:
    """A pytree of PartitionSpecs with the structure of `tree` (arrays or ShapeDtypeStructs)."""
    return jax.tree_util.tree_map_with_path(lambda path, x: spec_for(path_string(path), np.shape(x), rules, mesh), tree)


def tree_shardings(tree: Any, mesh: jax.sharding.Mesh, rules: Rules) -> Any:
    """A pytree of NamedShardings on `mesh` with the structure of `tree`."""
    return jax.tree_util.tree_map(
        lambda spec: NamedSharding(mesh, spec), tree_specs(tree, rules, mesh), is_leaf=lambda x: isinstance(x, P)
    )


def shard_tree(tree: Any, mesh: jax.sharding.Mesh, rules: Rules) -> Any:
    """Moves every leaf of `tree` to its rule's sharding (across processes too: `distributed.put`)."""
    return distributed.put(tree, tree_shardings(tree, mesh, rules))


def optimizer_state_shardings(opt_state: Any, mesh: jax.sharding.Mesh, rules: Rules) -> Any:
    """NamedShardings of an optimizer state: a leaf shaped like its parameter (AdamW's moments) takes the
    parameter's rule; a leaf of lower rank than that rule (Adafactor's factored row and column moments, its
    placeholders) is replicated: it is a vector of one side of the matrix, small beside the matrix itself."""

    def sharding(path, leaf):
        name, shape = path_string(path), np.shape(leaf)
        try:
            return NamedSharding(mesh, spec_for(name, shape, rules, mesh))
        except ShardingRuleError:
            if any(re.search(pattern, name) and len(spec) > len(shape) for pattern, spec in rules):
                return NamedSharding(mesh, P())
            raise

    return jax.tree_util.tree_map_with_path(sharding, opt_state)


def sharded_init(init_fn: Callable[[], Any], mesh: jax.sharding.Mesh, rules: Rules) -> Any:
    """Runs `init_fn` under jit with each output leaf created directly in its sharding.

    No leaf is ever materialised whole on one device: the shardings are derived
    from `jax.eval_shape(init_fn)` and passed as `out_shardings`.
    """
    abstract = jax.eval_shape(init_fn)
    return jax.jit(init_fn, out_shardings=tree_shardings(abstract, mesh, rules))()


def batch_spec(rank: int) -> P:
    """Batch-major arrays: the leading axis split over dp and fsdp, the rest replicated."""
    return P(("dp", "fsdp"), *([None] * (rank - 1)))


def constrain(x: chex.Array, spec: P) -> chex.Array:
    """`with_sharding_constraint` under an active mesh (`jax.set_mesh`).

    A no-op without a mesh, when the mesh lacks one of the spec's axes, or when a
    dimension does not divide by its axes (e.g. 2 kv heads on tp=4, which the
    rules replicate): the constraint is a hint, never a reason to fail.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    for dim, axes in zip(x.shape, spec):
        names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        if any(name not in mesh.axis_names for name in names):
            return x
        if dim % int(np.prod([mesh.shape[name] for name in names])):
            return x
    return jax.lax.with_sharding_constraint(x, spec)


def constrain_batch(x: chex.Array) -> chex.Array:
    """Activations `[B, ...]`: batch over ("dp", "fsdp"), the rest replicated."""
    return constrain(x, batch_spec(x.ndim))


def constrain_heads(x: chex.Array) -> chex.Array:
    """Per-head activations `[B, T, H, d]`: batch over ("dp", "fsdp"), heads over "tp"."""
    return constrain(x, P(("dp", "fsdp"), None, "tp", None))


def constrain_kv_cache(x: chex.Array) -> chex.Array:
    """A KV cache layer `[B, K, S, d]`: batch over ("dp", "fsdp"), kv heads over "tp"."""
    return constrain(x, P(("dp", "fsdp"), "tp", None, None))


def loader_sharding_fn(mesh: jax.sharding.Mesh, rules: Rules) -> Callable[[Tuple, Tuple[int, ...]], NamedSharding]:
    """The `(nnx_path, shape) -> Sharding` that `models.hf.load_state` takes, from a rule set."""
    return lambda path, shape: NamedSharding(mesh, spec_for("/".join(map(str, path)), shape, rules, mesh))
