"""Qwen2 / Qwen2.5 / Qwen3 decoder-only language models in Flax NNX.

The module tree mirrors Hugging Face's (`model.embed_tokens`, `model.layers[i]
.self_attn.q_proj`, ..., `lm_head`), so `models/hf.py` maps every parameter
by name with one table. Differences between the families are config switches:

| switch            | Qwen2 / Qwen2.5 | Qwen3 |
|-------------------|-----------------|-------|
| `attention_bias`  | True (q/k/v)    | False |
| `qk_norm`         | False           | True (RMSNorm over head_dim, before RoPE) |
| `head_dim`        | hidden / heads  | from the config |

Shapes: `input_ids [B, T]`, `positions [B, T]`, `attention_mask [B, T]` (1 on
real tokens; left or right padding), optional `segment_ids [B, T]` for packed
sequences. Training code uses the pure `(graphdef, state)` split of
`nnx.split`; `forward` runs a split model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional, Tuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from mathrl_jax.errors import MathRLError
from mathrl_jax.models import lora
from mathrl_jax.models.attention import (
    ATTENTION_IMPLEMENTATIONS,
    apply_rope,
    attention_allowed,
    cache_attention,
    full_attention,
    full_sequence_attention,
    materialize,
    rope_tables,
)
from mathrl_jax.models.sizes import size_error
from mathrl_jax.sharding.rules import constrain_batch, constrain_heads

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# What remat keeps of a layer for the backward, by jax.checkpoint_policies name (docs/real_shapes.md)
REMAT_POLICIES = ("nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable")


class ConfigError(MathRLError, ValueError):
    """A checkpoint config this implementation cannot represent; names the field."""


@dataclasses.dataclass(frozen=True)
class QwenConfig:
    """Architecture (from a Hugging Face `config.json`, read and written by `models/hf.py`) plus run-time numerics."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = True
    qk_norm: bool = False
    max_position_embeddings: int = 32768
    architecture: str = "Qwen2ForCausalLM"
    bos_token_id: Optional[int] = None
    eos_token_id: Any = None
    pad_token_id: Optional[int] = None
    # Run-time numerics, not part of the checkpoint.
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: bool = False
    remat_policy: str = "nothing_saveable"  # what remat keeps for the backward: REMAT_POLICIES
    scan_layers: bool = False  # a cache-less pass compiles one layer and scans it (see `QwenModel._scan_layers`)
    attention: str = "auto"  # the cache-less pass's attention: ATTENTION_IMPLEMENTATIONS
    # LoRA adapters (`models/lora.py`) on the projections named in `lora_targets`; rank 0: none.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: Tuple[str, ...] = ()

    def __post_init__(self):
        error = size_error(self)
        if error:
            raise ConfigError(error)
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ConfigError(f"{name}={getattr(self, name)!r}; expected one of {sorted(_DTYPES)}")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ConfigError(f"attention={self.attention!r}; expected one of {ATTENTION_IMPLEMENTATIONS}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ConfigError(f"remat_policy={self.remat_policy!r}; expected one of {REMAT_POLICIES}")
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"architectures={self.architecture!r} is not supported; expected one of {sorted(ARCHITECTURES)}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.lora_rank < 0:
            raise ConfigError(f"lora_rank={self.lora_rank}; expected 0 (no adapters) or a positive rank")
        try:  # a tuple in a fixed order: the config is part of the (hashed) graphdef
            targets = lora.resolve_targets(self.lora_targets) if self.lora_rank else ()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        object.__setattr__(self, "lora_targets", targets)

    def adapts(self, projection: str) -> bool:
        """Whether `projection` (e.g. "q_proj") carries a LoRA adapter."""
        return self.lora_rank > 0 and projection in self.lora_targets

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self):
        return _DTYPES[self.param_dtype]


# ---------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------


class RMSNorm(nnx.Module):
    """y = w * (x / sqrt(mean(x^2) + eps)), normalised in float32 as transformers does."""

    def __init__(self, dim: int, eps: float, param_dtype):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


class KVCache(NamedTuple):
    """Preallocated keys and values, one `[B, num_kv_heads, S, head_dim]` array per layer."""

    keys: Tuple[chex.Array, ...]
    values: Tuple[chex.Array, ...]


def init_cache(config: QwenConfig, batch: int, max_length: int, dtype=None) -> KVCache:
    """An all-zero cache for `max_length` positions (prompt + generation)."""
    # Heads before positions: decoding contracts each kv head's `[S, d]` block, so with this layout the attention
    # reads the cache in place (with `[B, S, K, d]`, XLA:CPU copied a transpose of every layer's cache each step).
    shape = (batch, config.num_key_value_heads, max_length, config.head_dim)
    dtype = dtype or config.jnp_dtype
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_hidden_layers))
    return KVCache(keys=zeros, values=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_hidden_layers)))


def _flat(linear, x):
    """Applies `linear` to `x [..., in]` as one 2-D matmul `[N, in] @ [in, out]`.

    With 3-D inputs XLA contracts the weight gradient over two axes and, on CPU,
    transposes the large activation gradients to do it; the 2-D form avoids those
    copies (forward+backward 1.5x faster in scripts/bench_model.py).
    """
    lead = x.shape[:-1]
    return linear(x.reshape(-1, x.shape[-1])).reshape(*lead, -1)


def _linear(config: QwenConfig, rngs: nnx.Rngs, n_in: int, n_out: int, bias: bool, name: str = "") -> nnx.Linear:
    """A projection; a `lora.LoRALinear` when the config adapts `name`."""
    kwargs = dict(
        use_bias=bias,
        dtype=config.jnp_dtype,
        param_dtype=config.jnp_param_dtype,
        kernel_init=nnx.initializers.normal(0.02),
        rngs=rngs,
    )
    if config.adapts(name):
        return lora.LoRALinear(n_in, n_out, rank=config.lora_rank, alpha=config.lora_alpha, **kwargs)
    return nnx.Linear(n_in, n_out, **kwargs)


class Attention(nnx.Module):
    """Grouped-query attention with RoPE, optional q/k/v bias (Qwen2) and q/k norm (Qwen3)."""

    def __init__(self, config: QwenConfig, rngs: nnx.Rngs):
        c = config
        self.config = c
        self.q_proj = _linear(c, rngs, c.hidden_size, c.num_attention_heads * c.head_dim, c.attention_bias, "q_proj")
        self.k_proj = _linear(c, rngs, c.hidden_size, c.num_key_value_heads * c.head_dim, c.attention_bias, "k_proj")
        self.v_proj = _linear(c, rngs, c.hidden_size, c.num_key_value_heads * c.head_dim, c.attention_bias, "v_proj")
        self.o_proj = _linear(c, rngs, c.num_attention_heads * c.head_dim, c.hidden_size, False, "o_proj")
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, c.jnp_param_dtype)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, c.jnp_param_dtype)

    def __call__(self, x, positions, allowed, layer_cache=None, cache_index=None, rope=None):
        """`rope`: the `rope_tables` of `positions` when the caller computed them once for all layers."""
        c = self.config
        batch, length, _ = x.shape
        q = _flat(self.q_proj, x).reshape(batch, length, c.num_attention_heads, c.head_dim)
        k = _flat(self.k_proj, x).reshape(batch, length, c.num_key_value_heads, c.head_dim)
        v = _flat(self.v_proj, x).reshape(batch, length, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is None:
            rope = rope_tables(positions, c.head_dim, c.rope_theta, q.dtype)
        q = constrain_heads(apply_rope(q, *rope))
        k = constrain_heads(apply_rope(k, *rope))
        v = constrain_heads(v)
        if layer_cache is None:
            out = full_attention(q, k, v, allowed, c.attention)
        else:
            cached_k, cached_v = layer_cache  # [B, K, S, d]
            k = jax.lax.dynamic_update_slice_in_dim(
                cached_k, k.transpose(0, 2, 1, 3).astype(cached_k.dtype), cache_index, axis=2
            )
            v = jax.lax.dynamic_update_slice_in_dim(
                cached_v, v.transpose(0, 2, 1, 3).astype(cached_v.dtype), cache_index, axis=2
            )
            layer_cache = (k, v)
            out = cache_attention(q, k.astype(q.dtype), v.astype(q.dtype), allowed)
        out = constrain_heads(out)
        return _flat(self.o_proj, out.reshape(batch, length, -1)), layer_cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: QwenConfig, rngs: nnx.Rngs):
        c = config
        self.gate_proj = _linear(c, rngs, c.hidden_size, c.intermediate_size, False, "gate_proj")
        self.up_proj = _linear(c, rngs, c.hidden_size, c.intermediate_size, False, "up_proj")
        self.down_proj = _linear(c, rngs, c.intermediate_size, c.hidden_size, False, "down_proj")

    def __call__(self, x):
        return _flat(self.down_proj, jax.nn.silu(_flat(self.gate_proj, x)) * _flat(self.up_proj, x))


class DecoderLayer(nnx.Module):
    def __init__(self, config: QwenConfig, rngs: nnx.Rngs):
        c = config
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype)
        self.self_attn = Attention(c, rngs)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype)
        self.mlp = MLP(c, rngs)

    def __call__(self, x, positions, allowed, layer_cache=None, cache_index=None, rope=None):
        attn_out, layer_cache = self.self_attn(
            self.input_layernorm(x), positions, allowed, layer_cache, cache_index, rope
        )
        x = x + attn_out
        return x + self.mlp(self.post_attention_layernorm(x)), layer_cache


def _remat_layer(layer, x, positions, allowed, layer_cache, cache_index, rope):
    return layer(x, positions, allowed, layer_cache, cache_index, rope)


class QwenModel(nnx.Module):
    """The trunk: embeddings, decoder layers, final norm. Returns hidden states.

    `allowed` is `[B, T, S]`: without a cache, the causal `full_sequence_attention`
    mask (the layers skip its upper triangle); with one, `attention_allowed` of the
    cache slots.
    """

    def __init__(self, config: QwenConfig, rngs: nnx.Rngs):
        c = config
        self.config = c
        self.embed_tokens = nnx.Embed(
            c.vocab_size,
            c.hidden_size,
            dtype=c.jnp_dtype,
            param_dtype=c.jnp_param_dtype,
            embedding_init=nnx.initializers.normal(0.02),
            rngs=rngs,
        )
        self.layers = nnx.List([DecoderLayer(c, rngs) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.jnp_param_dtype)

    def __call__(self, input_ids, positions, allowed, cache: Optional[KVCache] = None, cache_index=None):
        c = self.config
        x = constrain_batch(self.embed_tokens(input_ids))
        rope = tuple(materialize(t) for t in rope_tables(positions, c.head_dim, c.rope_theta, x.dtype))
        new_keys, new_values = [], []
        # Remat trades compute for activation memory in a backward pass; a pass with a KV cache (the sampler's
        # prefill and decode) has none, and nnx.remat inside the decode loop would try to update the module
        # from the loop's trace level (flax TraceContextError).
        if cache is None and c.scan_layers and len(self.layers) > 1:
            return self.norm(self._scan_layers(x, positions, allowed, rope)), None
        policy = getattr(jax.checkpoint_policies, c.remat_policy)
        call = nnx.remat(_remat_layer, policy=policy) if c.remat and cache is None else _remat_layer
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else (cache.keys[i], cache.values[i])
            x, layer_cache = call(layer, x, positions, allowed, layer_cache, cache_index, rope)
            x = constrain_batch(x)
            if layer_cache is not None:
                new_keys.append(layer_cache[0])
                new_values.append(layer_cache[1])
        new_cache = None if cache is None else KVCache(tuple(new_keys), tuple(new_values))
        return self.norm(x), new_cache

    def _scan_layers(self, x, positions, allowed, rope):
        """The decoder layers as one `lax.scan` over their parameters, stacked here: XLA compiles one layer.

        The parameter tree keeps one entry per layer (Hugging Face names, sharding rules and checkpoints are
        unchanged); the stack is built in the pass, each Linear weight cast to the compute dtype first (its call
        casts it anyway). The stack and its gradient cost about twice the layers' weights in the compute dtype;
        layers stored stacked (MaxText's `scan_layers`) would not, at the price of another parameter tree. Passes
        with a KV cache keep the unrolled loop: a scan would copy each layer's cache in and out at every token.
        """
        c = self.config
        graphdef, _ = nnx.split(self.layers[0])
        compute = c.jnp_dtype

        def leaf(path, value):
            name = path[-1].key if hasattr(path[-1], "key") else str(path[-1])
            return value.astype(compute) if name in ("kernel", "bias") else value

        states = [jax.tree.map_with_path(leaf, nnx.to_pure_dict(nnx.state(layer))) for layer in self.layers]
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)

        def body(x, layer_params):
            layer = nnx.merge(graphdef, layer_params)
            x, _ = layer(x, positions, allowed, None, None, rope)
            return constrain_batch(x), None

        if c.remat:
            body = jax.checkpoint(body, policy=getattr(jax.checkpoint_policies, c.remat_policy))
        x, _ = jax.lax.scan(body, x, stacked)
        return x


class QwenForCausalLM(nnx.Module):
    """Qwen causal LM: `(logits or hidden states, updated KV cache)`."""

    def __init__(self, config: QwenConfig, rngs: nnx.Rngs):
        self.config = config
        self.model = QwenModel(config, rngs)
        if not config.tie_word_embeddings:
            self.lm_head = _linear(config, rngs, config.hidden_size, config.vocab_size, False)

    def unembedding(self) -> Tuple[chex.Array, str]:
        """The output projection and its layout, for `losses.token_logprobs_from_hidden`."""
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.embedding[...], "vd"
        return self.lm_head.kernel[...], "dv"

    def logits_from_hidden(self, hidden):
        if self.config.tie_word_embeddings:
            return _flat(self.model.embed_tokens.attend, hidden)
        return _flat(self.lm_head, hidden)

    def __call__(
        self,
        input_ids: chex.Array,
        *,
        attention_mask: Optional[chex.Array] = None,
        positions: Optional[chex.Array] = None,
        segment_ids: Optional[chex.Array] = None,
        cache: Optional[KVCache] = None,
        cache_index: Optional[chex.Array] = None,
        return_hidden: bool = False,
    ) -> Tuple[chex.Array, Optional[KVCache]]:
        """Runs the model on `input_ids [B, T]`.

        Without a cache: a full causal forward pass; `attention_mask [B, T]`
        (default all ones) marks real tokens, `positions` default to
        `default_positions(attention_mask)`, `segment_ids` restrict attention to
        the same packed sequence (pass per-segment positions with them).

        With a cache (`init_cache`): the tokens are written at slots
        `cache_index, ..., cache_index + T - 1` (a scalar shared by the batch)
        and `attention_mask` is `[B, S]`, 1 on every cache slot holding a real
        token up to and including the new ones; `positions` are required.

        Returns:
          (`[B, T, V]` logits, or `[B, T, D]` final hidden states with
          `return_hidden`; the updated cache or None).
        """
        chex.assert_rank(input_ids, 2)
        batch, length = input_ids.shape
        if cache is None:
            positions, allowed = full_sequence_attention(input_ids, attention_mask, positions, segment_ids)
        else:
            if positions is None or attention_mask is None or cache_index is None:
                raise ValueError("decoding with a cache needs positions, attention_mask [B, S] and cache_index")
            slots = cache_index + jnp.broadcast_to(jnp.arange(length), (batch, length))
            allowed = attention_allowed(slots, attention_mask)
        hidden, cache = self.model(input_ids, positions, allowed, cache, cache_index)
        if return_hidden:
            return hidden, cache
        return self.logits_from_hidden(hidden), cache


def forward(graphdef: nnx.GraphDef, state: nnx.State, input_ids: chex.Array, **kwargs):
    """Runs a split model (`graphdef, state = nnx.split(model)`): the pure form training code jits."""
    return nnx.merge(graphdef, state)(input_ids, **kwargs)
