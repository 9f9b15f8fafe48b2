"""Attention of the Qwen models, without parameters: where each token sits, which keys it may see, and
softmax(q k^T / sqrt(d)) v.

`models/qwen.py`'s `Attention` module projects q, k and v and calls into this one:

- positions and masks: `default_positions`, `attention_allowed` (`[B, T, S]`: which key slot each query sees),
  and both at once for a cache-less causal pass, `full_sequence_attention`;
- RoPE on q and k: `rope_tables`, `apply_rope`;
- the attention itself: `full_attention` for a cache-less pass (`causal_attention`, or one of
  `jax.nn.dot_product_attention`'s implementations; `ATTENTION_IMPLEMENTATIONS`, `auto_attention`),
  `cache_attention` for decoding over the KV cache, `grouped_attention` as the reference form.
"""

from __future__ import annotations

from typing import Optional, Tuple

import chex
import jax
import jax.numpy as jnp

# The training passes' attention (`full_attention`): "blocked" (`causal_attention`, the fastest on XLA:CPU),
# "xla" or "cudnn" (`jax.nn.dot_product_attention`'s implementations; cuDNN's fused kernel on NVIDIA GPUs, in
# bfloat16 / float16), "auto": `auto_attention`'s choice.
ATTENTION_IMPLEMENTATIONS = ("auto", "blocked", "xla", "cudnn")


def rope_tables(positions: chex.Array, head_dim: int, theta: float, dtype) -> Tuple[chex.Array, chex.Array]:
    """(cos, sin) `[B, T, head_dim]` of RoPE at `positions [B, T]`, in the "rotate half" layout of transformers.

    inv_freq_i = theta^(-2i / head_dim),  angle_{t,i} = position_t * inv_freq_i  (i < head_dim / 2),
    cos = cos([angle, angle]),  sin = sin([angle, angle])   (computed in float32, cast to `dtype`)
    """
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2.0 / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, d/2]
    angles = jnp.concatenate([angles, angles], -1)
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x: chex.Array, cos: chex.Array, sin: chex.Array) -> chex.Array:
    """x * cos + rotate_half(x) * sin for x `[B, T, N, d]` and `rope_tables` `[B, T, d]`."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


def default_positions(attention_mask: chex.Array) -> chex.Array:
    """Positions that count only real tokens, so left padding does not shift them: cumsum(mask) - 1."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def attention_allowed(
    query_slots: chex.Array,
    key_valid: chex.Array,
    query_segments: Optional[chex.Array] = None,
    key_segments: Optional[chex.Array] = None,
) -> chex.Array:
    """`[B, T, S]` bool: query at slot q may see key slot s iff s <= q, key s is real, same segment.

    Args:
      query_slots: `[B, T]` int, the cache/sequence slot of each query token.
      key_valid: `[B, S]`, 1 on slots holding real tokens.
      query_segments, key_segments: optional `[B, T]` / `[B, S]` packed-sequence ids.
    """
    key_slots = jnp.arange(key_valid.shape[-1])
    allowed = (key_slots[None, None, :] <= query_slots[:, :, None]) & (key_valid[:, None, :] > 0)
    if query_segments is not None:
        allowed &= query_segments[:, :, None] == key_segments[:, None, :]
    return allowed


def full_sequence_attention(
    input_ids: chex.Array,
    attention_mask: Optional[chex.Array] = None,
    positions: Optional[chex.Array] = None,
    segment_ids: Optional[chex.Array] = None,
) -> Tuple[chex.Array, chex.Array]:
    """(positions, `[B, T, T]` allowed) of a cache-less causal pass, with the defaults filled in."""
    batch, length = input_ids.shape
    if attention_mask is None:
        attention_mask = jnp.ones((batch, length), jnp.int32)
    if positions is None:
        positions = default_positions(attention_mask)
    slots = jnp.broadcast_to(jnp.arange(length), (batch, length))
    return positions, attention_allowed(slots, attention_mask, segment_ids, segment_ids)


def grouped_attention(q, k, v, allowed):
    """softmax(q k^T / sqrt(d) masked) v for q [B, T, H, d], k/v [B, S, K, d], allowed [B, T, S].

    Heads are grouped (H = K * G) without repeating k and v; logits and softmax
    are float32 whatever the compute dtype. The reference form of `cache_attention`
    (which takes k/v in the cache's `[B, K, S, d]` layout); the cache-less pass uses
    `causal_attention`.
    """
    return cache_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), allowed)


def cache_attention(q, k, v, allowed):
    """`grouped_attention` with k/v `[B, K, S, d]`, the KV cache's layout: the decoding path."""
    batch, length, heads, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    # Both operands with (batch, kv head) leading: plain batched matmuls, which XLA:CPU hands to its fast
    # kernels; only the queries (a few tokens when decoding) are transposed.
    qh = q.reshape(batch, length, kv_heads, groups, dim).transpose(0, 2, 1, 3, 4).reshape(batch, kv_heads, -1, dim)
    logits = jnp.einsum("bkrd,bksd->bkrs", qh, k, preferred_element_type=jnp.float32) / jnp.sqrt(dim).astype(
        jnp.float32
    )
    logits = logits.reshape(batch, kv_heads, length, groups, keys)
    logits = jnp.where(allowed[:, None, :, None, :], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype).reshape(batch, kv_heads, length * groups, keys)
    out = jnp.einsum("bkrs,bksd->bkrd", probs, v).reshape(batch, kv_heads, length, groups, dim)
    return out.transpose(0, 2, 1, 3, 4).reshape(batch, length, heads, dim)


ATTENTION_BLOCK = 64  # query tokens per block of `causal_attention`
ATTENTION_MAX_BLOCKS = 8  # longer sequences get longer blocks, so a layer has at most this many


def attention_block_size(length: int) -> int:
    """`causal_attention`'s default block: ATTENTION_BLOCK tokens, longer past ATTENTION_MAX_BLOCKS blocks."""
    return max(ATTENTION_BLOCK, -(-length // ATTENTION_MAX_BLOCKS))


def causal_attention(q, k, v, allowed, block_size: Optional[int] = None):
    """`grouped_attention` of a full causal pass, skipping the key blocks no query of a block can see.

      out_t = sum_{s <= t, allowed[t, s]} softmax_s(q_t . k_s / sqrt(d)) v_s

    Shapes: q `[B, T, H, d]`, k/v `[B, T, K, d]` (H = K * G), allowed `[B, T, T]`,
    which must be causal (False wherever s > t), as `full_sequence_attention` builds
    it. Queries are cut into blocks of `block_size` tokens (default
    `attention_block_size(T)`); block [a, b) attends to keys [0, b) only, so the
    fully-masked upper triangle is never computed: at T = 256 and 64-token blocks,
    5/8 of the logits of the unblocked form (the FlashAttention causal block skip,
    Dao et al. 2022, without the online softmax: each block's keys fit at once).
    Layout: q as `[B, K, T*G, d]` (rows ordered (t, g), so a block is a contiguous
    row range and the G query heads of a kv head share one matmul), k/v as
    `[B, K, T, d]`; 1/sqrt(d) is folded into q. Logits and softmax are float32.

    Rows with no allowed key (padding) are not defined by the formula: they
    return the mean of their block's values here (`grouped_attention`: of all
    values); callers never read them.
    """
    chex.assert_rank([q, k, v, allowed], [4, 4, 4, 3])
    batch, length, heads, dim = q.shape
    kv_heads = k.shape[2]
    chex.assert_shape([k, v], (batch, length, kv_heads, dim))
    chex.assert_shape(allowed, (batch, length, length))
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} key/value heads")
    block = attention_block_size(length) if block_size is None else block_size
    if block < 1:
        raise ValueError(f"block_size={block_size}; expected a positive number of tokens")
    groups = heads // kv_heads
    q = q * jnp.asarray(1.0 / dim**0.5, q.dtype)
    qh = q.reshape(batch, length, kv_heads, groups, dim).transpose(0, 2, 1, 3, 4)
    qh = qh.reshape(batch, kv_heads, length * groups, dim)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    outs = []
    for start in range(0, length, block):
        stop = min(start + block, length)
        rows = (stop - start) * groups
        logits = jnp.einsum(
            "bkrd,bksd->bkrs",
            qh[:, :, start * groups : stop * groups],
            kh[:, :, :stop],
            preferred_element_type=jnp.float32,
        ).reshape(batch, kv_heads, stop - start, groups, stop)
        logits = jnp.where(allowed[:, None, start:stop, None, :stop], logits, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype).reshape(batch, kv_heads, rows, stop)
        outs.append(jnp.einsum("bkrs,bksd->bkrd", probs, vh[:, :, :stop]))
    out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)
    out = out.reshape(batch, kv_heads, length, groups, dim).transpose(0, 2, 1, 3, 4)
    return out.reshape(batch, length, heads, dim)


def auto_attention(backend: str, dtype, head_dim: int, compute_capability: str | None) -> str:
    """What `attention="auto"` runs: "blocked" on CPU; on an NVIDIA GPU of compute capability 8.0 or later, in
    bfloat16 or float16, with a head size cuDNN's fused kernel takes (a multiple of 8, at most 128), "cudnn";
    "xla" otherwise. Measured on an H100 at the Qwen2.5-1.5B shape (fwd+bwd, bf16, 8 x 4096 packed tokens):
    cudnn 10.2 ms, blocked 14.5 ms, xla 45.4 ms; the update step 0.315 s with cudnn against 0.374 s with xla,
    compiling in 35 s against 53 s. "blocked" is not chosen on a GPU: its unrolled blocks made the 1.5B update
    compile for over 75 s there (docs/gpu.md)."""
    if backend == "cpu":
        return "blocked"
    major = (compute_capability or "").split(".")[0]
    fused = (
        backend in ("gpu", "cuda")
        and major.isdigit()
        and int(major) >= 8
        and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
        and head_dim % 8 == 0
        and head_dim <= 128
    )
    return "cudnn" if fused else "xla"


def full_attention(q, k, v, allowed, implementation: str = "auto"):
    """The attention of a cache-less causal pass (q `[B, T, H, d]`, k/v `[B, T, K, d]`, allowed `[B, T, T]`, causal,
    with padding and packed segments in it): `causal_attention`, or `jax.nn.dot_product_attention` with `allowed`
    as its mask (`ATTENTION_IMPLEMENTATIONS`). Equal on every row with an allowed key; a row with none (padding)
    is undefined by the formula, and each implementation returns something else there (callers never read it)."""
    if implementation == "auto":
        device = jax.devices()[0]
        implementation = auto_attention(
            jax.default_backend(), q.dtype, q.shape[-1], getattr(device, "compute_capability", None)
        )
    if implementation == "blocked":
        return causal_attention(q, k, v, allowed)
    return jax.nn.dot_product_attention(q, k, v, mask=allowed[:, None], implementation=implementation)


def materialize(x: chex.Array) -> chex.Array:
    """`x`, computed once into memory: `x @ I` (exact at HIGHEST precision, a few MFLOP).

    XLA fuses elementwise producers into each consumer, so RoPE's cos and sin
    would be recomputed in every fusion that reads them, once per head and layer
    (transcendental functions: 4x slower RoPE forward+backward on CPU). A dot is
    never fused into its consumers; `jax.lax.optimization_barrier` does not help,
    as XLA:CPU removes barriers before fusion.
    """
    eye = jnp.eye(x.shape[-1], dtype=x.dtype)
    return jnp.einsum("...i,ij->...j", x, eye, precision=jax.lax.Precision.HIGHEST)
