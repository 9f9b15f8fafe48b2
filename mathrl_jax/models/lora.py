"""LoRA (Hu et al. 2021) on the Qwen projections: `W x + (alpha / r) B A x`, with the base `W` frozen.

The adapters are NNX's own: `nnx.LoRA` holds them, as `nnx.LoRAParam` variables (so
`nnx.split(model, nnx.LoRAParam, ...)` separates what trains from the frozen base). `LoRALinear` adds what
`nnx.LoRALinear` lacks: PEFT's scale `alpha / r`. Folding the scale into `B` instead would change the training
dynamics, not just the parametrisation: Adam's step on `B` is about the learning rate whatever `B`'s scale, so
the update of `W` would be `r / alpha` times PEFT's at the same learning rate.

Layout and initialisation follow PEFT's `LoraLayer` (`init_lora_weights=True`), so adapters move between the two
unchanged: `lora_a` is `[in, r]` (PEFT's `lora_A.weight` `[r, in]`, transposed), `lora_b` `[r, out]` (PEFT's
`lora_B.weight` `[out, r]`, transposed); A is uniform in +-1/sqrt(in) (torch's `kaiming_uniform_(a=sqrt(5))`),
B is 0, so a fresh adapter leaves the model unchanged. Adapters are float32 whatever the base's dtype (PEFT's
`autocast_adapter_dtype`): they are small, and bf16 steps on them would be lost to rounding.

Dropout (PEFT's `lora_dropout`) is off unless a pass asks for it (`with_dropout(model, rate, key)`, which the
trainer's update does): then each adapter computes `W x + (alpha / r) B A dropout(x)`, the base term untouched,
with inverted dropout `dropout(x) = x * keep / (1 - p)`, keep ~ Bernoulli(1 - p) per entry, drawn from its own
key (`adapter_dropout_key`). A model no pass gave a key to (sampling, evaluation, merging, the reference) has no
dropout and the same program as before.
"""

from __future__ import annotations

import functools
import zlib
from typing import Tuple

import jax
import jax.numpy as jnp
from flax import nnx

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections an adapter can sit on: every Linear of a decoder layer (PEFT's `all-linear` for a causal LM
leaves out the output head, and so does this)."""
ALL_LINEAR = "all-linear"


def resolve_targets(targets) -> Tuple[str, ...]:
    """`targets` ("q_proj,v_proj", a sequence of names, or "all-linear") as a tuple in `TARGETS`' order.

    Raises ValueError naming an unknown projection or an empty list."""
    if isinstance(targets, str):
        names = [t.strip() for t in targets.split(",") if t.strip()]
    else:
        names = [str(t) for t in targets]
    if ALL_LINEAR in names:
        names = list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        raise ValueError(
            f"LoRA targets {targets!r}: expected {ALL_LINEAR!r} or some of {', '.join(TARGETS)}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    return tuple(t for t in TARGETS if t in names)


def a_initializer(key, shape, dtype=jnp.float32):
    """PEFT's A: `kaiming_uniform_(a=sqrt(5))` on `[r, in]`, i.e. uniform in +-1/sqrt(in) (`shape` is `[in, r]`).
    The same as torch's `nn.Linear` weight init for an `[in, out]` kernel (OpenR's value head uses it so)."""
    bound = 1.0 / jnp.sqrt(shape[0])
    return jax.random.uniform(key, shape, dtype, -bound, bound)


class LoRALinear(nnx.Linear):
    """`nnx.Linear` plus `alpha / rank * lora(x)`; its `kernel` and `bias` sit where a plain Linear's do, so the
    Hugging Face name table and the partition rules find the base weights unchanged."""

    def __init__(self, in_features: int, out_features: int, *, rank: int, alpha: float, rngs: nnx.Rngs, **kwargs):
        super().__init__(in_features, out_features, rngs=rngs, **kwargs)
        self.lora = nnx.LoRA(
            in_features,
            rank,
            out_features,
            dtype=kwargs.get("dtype"),
            param_dtype=jnp.float32,
            a_initializer=a_initializer,
            rngs=rngs,
        )
        self.scaling = alpha / rank

    def __call__(self, x):
        key = getattr(self, "dropout_key", None)  # set by `with_dropout` for one training pass
        lora_input = x if key is None else dropout(x, self.dropout_rate, jax.random.wrap_key_data(key.get_value()))
        return super().__call__(x) + (self.scaling * self.lora(lora_input)).astype(x.dtype)


class DropoutKey(nnx.Variable):
    """The raw key data of one adapter's dropout in one training pass (`with_dropout`): no parameter, never
    trained or saved (the model it sits on is built for the pass and dropped after it)."""


def dropout(x: jax.Array, rate: float, key: jax.Array) -> jax.Array:
    """Inverted dropout, as torch's `nn.Dropout` in training mode (PEFT's `lora_dropout`):
    x * keep / (1 - rate), keep ~ Bernoulli(1 - rate) per entry of `x` (`dropout_mask`), in `x`'s dtype."""
    keep = dropout_mask(key, rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def dropout_mask(key: jax.Array, rate: float, shape) -> jax.Array:
    """`shape` bool: True where an entry is kept (probability 1 - rate)."""
    return jax.random.bernoulli(key, 1.0 - rate, shape)


def adapter_dropout_key(key: jax.Array, path) -> jax.Array:
    """The dropout key of the adapter at module `path` (a tuple of keys, as `nnx.iter_modules` gives it): `key`
    folded with a hash of the path, so each adapter (q, k and v of one layer included) draws its own mask."""
    return jax.random.fold_in(key, zlib.crc32("/".join(str(k) for k in path).encode()))


def with_dropout(model: nnx.Module, rate: float, key: jax.Array) -> nnx.Module:
    """`model` (in place, and returned) with dropout of probability `rate` on every adapter's input for the passes
    it makes from now on, each adapter's mask drawn from `adapter_dropout_key(key, path)`. `rate` 0 leaves it
    as it is. Meant for a model built for one pass (`nnx.merge` inside the jitted update), which a new key each
    pass then gives new masks."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"LoRA dropout {rate!r}: expected a probability in [0, 1)")
    if rate == 0.0:
        return model
    for path, module in nnx.iter_modules(model):
        if isinstance(module, LoRALinear):
            module.dropout_rate = float(rate)
            module.dropout_key = DropoutKey(jax.random.key_data(adapter_dropout_key(key, path)))
    return model


def is_adapter(path) -> bool:
    """Whether a state path (tuple of keys) is an adapter's (`.../lora/lora_a` or `lora_b`)."""
    return len(path) >= 2 and str(path[-2]) == "lora" and str(path[-1]) in ("lora_a", "lora_b")


def initialize(state: nnx.State, seed: int) -> nnx.State:
    """`state` with every adapter given PEFT's initial values: A uniform in +-1/sqrt(in), B zero.

    Each A draws from `seed` folded with a hash of its path, so its value depends on neither the order of the
    leaves nor how many there are (a model with other targets draws the same A for a projection both adapt).
    The leaves may be abstract (`nnx.eval_shape`): a loaded model's adapters are made here, not traced."""

    def init(path, leaf):
        if not is_adapter(path):
            return leaf
        name = "/".join(str(k) for k in path)
        if str(path[-1]) == "lora_b":
            return jnp.zeros(leaf.shape, jnp.float32)
        key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(name.encode()))
        return a_initializer(key, leaf.shape, jnp.float32)

    pure = nnx.to_pure_dict(state)
    flat = {path: init(path, leaf) for path, leaf in _flatten(pure)}
    nnx.replace_by_pure_dict(state, _unflatten(flat))
    return state


def _flatten(tree, prefix=()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _unflatten(flat: dict) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree


def merged_kernel(kernel: jax.Array, lora_a: jax.Array, lora_b: jax.Array, scaling: float) -> jax.Array:
    """`kernel + scaling * lora_a @ lora_b` in `kernel`'s dtype (the sum in float32): the plain Linear that
    computes what the adapted one does."""
    product = jnp.matmul(lora_a.astype(jnp.float32), lora_b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    update = scaling * product
    return (kernel.astype(jnp.float32) + update).astype(kernel.dtype)


def merge_adapters(state: nnx.State, scaling: float, dtype=None) -> nnx.State:
    """The state of the plain model (`lora_rank=0`) that computes what `state`'s adapted model does: each adapted
    kernel replaced by `merged_kernel` (in `dtype`, e.g. the compute dtype the kernel is cast to anyway; None: the
    kernel's own), the adapters dropped, every other Variable passed through, not copied.

    What the JAX sampler decodes with when it merges at each sync: decoding is many small steps, and a merged
    projection is one matmul instead of three. The merges run as one jitted program (`_merged_kernels`); the
    state is rebuilt around them here, outside jit, which would return a new buffer for every pass-through leaf
    (a copy of the whole model at each sync)."""
    flat = dict(nnx.to_flat_state(state))
    adapted = [path for path in flat if str(path[-1]) == "kernel" and path[:-1] + ("lora", "lora_a") in flat]
    triples = [
        tuple(flat[path[:-1] + key].get_value() for key in (("kernel",), ("lora", "lora_a"), ("lora", "lora_b")))
        for path in adapted
    ]
    merged = dict(zip(adapted, _merged_kernels(triples, float(scaling), None if dtype is None else jnp.dtype(dtype))))
    return nnx.from_flat_state(
        {
            path: variable.replace(value=merged[path]) if path in merged else variable
            for path, variable in flat.items()
            if not is_adapter(path)
        }
    )


@functools.partial(jax.jit, static_argnums=(1, 2))
def _merged_kernels(triples, scaling: float, dtype):
    """`merged_kernel` of each (kernel, lora_a, lora_b), in `dtype` (None: the kernel's), on the kernels' devices
    with their sharding: one program per model shape."""
    return [merged_kernel(k, a, b, scaling).astype(dtype or k.dtype) for k, a, b in triples]
