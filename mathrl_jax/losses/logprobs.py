"""Log-probabilities and entropies of taken tokens, computed in chunks.

For a Qwen vocabulary (V = 151,936) the logits of a batch are the largest
array of a training step; `jax.nn.log_softmax(logits.astype(float32))` would
make a second full-size float32 copy (and keep the softmax alive for the
backward pass). The functions here walk over chunks of rows instead, so the
extra memory is a few `[chunk, V]` buffers:

  log pi(y_t) = z_{t, y_t} - logsumexp_v z_{t, v}
  H_t         = logsumexp_v z_{t, v} - sum_v p_{t, v} z_{t, v}      (z = logits / temperature)

with gradients (written out by hand, so the backward pass needs no residual
other than the logits themselves and one float per row):

  d log pi(y_t) / dz_{t, v} = 1[v = y_t] - p_{t, v}
  d H_t / dz_{t, v}          = -p_{t, v} (log p_{t, v} + H_t)

`tokens` must already be aligned with the logits: `logits[:, t]` scores
`tokens[:, t]` (shift the sequence by one before calling, as in a causal LM).
Results are float32 whatever the logits' dtype.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import chex
import jax
import jax.numpy as jnp


def _chunk_layout(num_rows: int, chunk_size: int) -> Tuple[int, int]:
    """(chunk, number of chunks). The last chunk is shifted back to end at `num_rows`
    (overlapping its predecessor) so no row is padded and no slice is copied."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    chunk = min(chunk_size, num_rows)
    return chunk, -(-num_rows // chunk)


def _chunk_start(index, num_rows: int, chunk: int):
    return jnp.minimum(index * chunk, num_rows - chunk)


def _row_stats(scaled_logits: chex.Array, tokens: chex.Array):
    """(log p of the token, entropy, logsumexp) of each row of float32 `[C, V]` logits.

    One `exp` per element: with e = exp(z - max z) and s = sum e,
    logsumexp = max z + log s and H = log s - sum(e (z - max z)) / s.
    """
    row_max = jax.lax.stop_gradient(jnp.max(scaled_logits, axis=-1, keepdims=True))
    shifted = scaled_logits - row_max
    exps = jnp.exp(shifted)
    total = jnp.sum(exps, axis=-1)
    log_total = jnp.log(total)
    taken = jnp.take_along_axis(shifted, tokens[:, None], axis=-1)[:, 0]
    entropy = log_total - jnp.sum(exps * shifted, axis=-1) / total
    return taken - log_total, entropy, row_max[:, 0] + log_total


def _row_grad(scaled_logits, tokens, lse, entropy, g_logp, g_entropy, inv_temperature):
    """Cotangent of the raw logits of `[C, V]` rows (see the module doc)."""
    log_probs = scaled_logits - lse[:, None]
    probs = jnp.exp(log_probs)
    one_hot = jax.nn.one_hot(tokens, scaled_logits.shape[-1], dtype=jnp.float32)
    grad = g_logp[:, None] * (one_hot - probs) - g_entropy[:, None] * probs * (log_probs + entropy[:, None])
    return grad * inv_temperature


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _chunked_logits_stats(flat_logits, flat_tokens, temperature, chunk_size):
    logp, entropy, _ = _chunked_logits_forward(flat_logits, flat_tokens, temperature, chunk_size)
    return logp, entropy


def _chunked_logits_forward(flat_logits, flat_tokens, temperature, chunk_size):
    num_rows = flat_logits.shape[0]
    chunk, num_chunks = _chunk_layout(num_rows, chunk_size)

    def body(i, buffers):
        start = _chunk_start(i, num_rows, chunk)
        rows = jax.lax.dynamic_slice_in_dim(flat_logits, start, chunk).astype(jnp.float32)
        tokens = jax.lax.dynamic_slice_in_dim(flat_tokens, start, chunk)
        stats = _row_stats(rows / temperature, tokens)
        return tuple(jax.lax.dynamic_update_slice_in_dim(buf, s, start, 0) for buf, s in zip(buffers, stats))

    empty = jnp.zeros((num_rows,), jnp.float32)
    return jax.lax.fori_loop(0, num_chunks, body, (empty, empty, empty))


def _chunked_logits_fwd(flat_logits, flat_tokens, temperature, chunk_size):
    logp, entropy, lse = _chunked_logits_forward(flat_logits, flat_tokens, temperature, chunk_size)
    return (logp, entropy), (flat_logits, flat_tokens, lse, entropy)


def _chunked_logits_bwd(temperature, chunk_size, residuals, cotangents):
    flat_logits, flat_tokens, lse, entropy = residuals
    g_logp, g_entropy = cotangents
    num_rows = flat_logits.shape[0]
    chunk, num_chunks = _chunk_layout(num_rows, chunk_size)

    def body(i, grad_logits):
        start = _chunk_start(i, num_rows, chunk)
        rows = jax.lax.dynamic_slice_in_dim(flat_logits, start, chunk).astype(jnp.float32)
        row_slice = lambda x: jax.lax.dynamic_slice_in_dim(x, start, chunk)
        grad = _row_grad(
            rows / temperature,
            row_slice(flat_tokens),
            row_slice(lse),
            row_slice(entropy),
            row_slice(g_logp),
            row_slice(g_entropy),
            1.0 / temperature,
        )
        return jax.lax.dynamic_update_slice_in_dim(grad_logits, grad.astype(grad_logits.dtype), start, 0)

    grad_logits = jax.lax.fori_loop(0, num_chunks, body, jnp.zeros_like(flat_logits))
    return grad_logits, None


_chunked_logits_stats.defvjp(_chunked_logits_fwd, _chunked_logits_bwd)


def default_chunk_rows(vocab_size: int) -> int:
    """Rows per chunk when none is given: about 2^20 logits per chunk on CPU, 2^26 elsewhere.

    A CPU is fastest when a chunk stays in cache (8 rows of a 151,936-word
    vocabulary are 4.9 MB of float32); an accelerator needs large chunks to be
    busy, and 2^26 float32 values (256 MB) are still a small fraction of the
    logits of a real batch. At least 8 rows.
    """
    budget = 2**20 if jax.default_backend() == "cpu" else 2**26
    return max(8, budget // max(vocab_size, 1))


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")


def token_logprobs_from_logits(
    logits: chex.Array,
    tokens: chex.Array,
    *,
    temperature: float = 1.0,
    chunk_size: Optional[int] = None,
) -> Tuple[chex.Array, chex.Array]:
    """Log-prob and entropy at every position, from `[B, T, V]` logits.

    Args:
      logits: `[B, T, V]`, any float dtype.
      tokens: `[B, T]` int, the token scored at each position.
      temperature: the logits are divided by it (match the sampler's).
      chunk_size: rows (positions) processed at once; extra memory is a few
        `[chunk_size, V]` float32 buffers. Default: `default_chunk_rows(V)`.

    Returns:
      (logprobs, entropy), each `[B, T]` float32. Differentiable w.r.t. `logits`.
    """
    chex.assert_rank(logits, 3)
    chex.assert_rank(tokens, 2)
    chex.assert_equal_shape_prefix([logits, tokens], 2)
    _check_temperature(temperature)
    batch, length, vocab = logits.shape
    if chunk_size is None:
        chunk_size = default_chunk_rows(vocab)
    flat_tokens = jnp.clip(tokens.reshape(-1).astype(jnp.int32), 0, vocab - 1)
    logp, entropy = _chunked_logits_stats(
        logits.reshape(batch * length, vocab), flat_tokens, float(temperature), int(chunk_size)
    )
    return logp.reshape(batch, length), entropy.reshape(batch, length)


def token_logprobs_from_hidden(
    hidden: chex.Array,
    unembedding: chex.Array,
    tokens: chex.Array,
    *,
    temperature: float = 1.0,
    chunk_size: int = 512,
    weight_layout: str = "dv",
) -> Tuple[chex.Array, chex.Array]:
    """Log-prob and entropy from final hidden states and the unembedding matrix.

    The `[B, T, V]` logits are never formed: each chunk of positions computes its
    `[chunk, V]` logits (float32 accumulation), reduces them, and recomputes them
    in the backward pass (`jax.checkpoint`).

    Args:
      hidden: `[B, T, D]` final (normed) hidden states.
      unembedding: `[D, V]` (`weight_layout="dv"`, a Dense kernel) or `[V, D]`
        (`"vd"`, e.g. a tied embedding table).
      tokens: `[B, T]` int.
      temperature, chunk_size: as `token_logprobs_from_logits`.

    Returns:
      (logprobs, entropy), each `[B, T]` float32. Differentiable w.r.t. `hidden`
      and `unembedding`.
    """
    chex.assert_rank(hidden, 3)
    chex.assert_rank(unembedding, 2)
    chex.assert_rank(tokens, 2)
    chex.assert_equal_shape_prefix([hidden, tokens], 2)
    _check_temperature(temperature)
    if weight_layout not in ("dv", "vd"):
        raise ValueError(f"weight_layout must be 'dv' or 'vd', got {weight_layout!r}")
    contract_axis = 0 if weight_layout == "dv" else 1
    batch, length, dim = hidden.shape
    if unembedding.shape[contract_axis] != dim:
        raise ValueError(
            f"unembedding of shape {unembedding.shape} (layout {weight_layout!r}) does not match hidden size {dim}"
        )
    vocab = unembedding.shape[1 - contract_axis]
    num_rows = batch * length
    chunk, num_chunks = _chunk_layout(num_rows, chunk_size)
    padded = chunk * num_chunks
    # Hidden states are small next to logits: padding them to whole chunks is cheap.
    flat_hidden = jnp.pad(hidden.reshape(num_rows, dim), ((0, padded - num_rows), (0, 0)))
    flat_tokens = jnp.pad(jnp.clip(tokens.reshape(-1).astype(jnp.int32), 0, vocab - 1), (0, padded - num_rows))

    @jax.checkpoint
    def chunk_stats(rows, row_tokens):
        logits = jax.lax.dot_general(
            rows,
            unembedding,
            (((1,), (contract_axis,)), ((), ())),
            preferred_element_type=jnp.float32,
        )
        logp, entropy, _ = _row_stats(logits / temperature, row_tokens)
        return logp, entropy

    def body(_, xs):
        return None, chunk_stats(*xs)

    _, (logp, entropy) = jax.lax.scan(
        body,
        None,
        (flat_hidden.reshape(num_chunks, chunk, dim), flat_tokens.reshape(num_chunks, chunk)),
    )
    logp = logp.reshape(-1)[:num_rows].reshape(batch, length)
    entropy = entropy.reshape(-1)[:num_rows].reshape(batch, length)
    return logp, entropy
