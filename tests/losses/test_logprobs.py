"""Chunked log-probs / entropy against a float64 NumPy softmax, and their gradients
against autodiff of the unchunked formula."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mathrl_jax.losses import token_logprobs_from_hidden, token_logprobs_from_logits


def np_logprobs_entropy(logits, tokens, temperature=1.0):
    z = np.asarray(logits, np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    taken = np.take_along_axis(log_probs, np.asarray(tokens)[..., None], -1)[..., 0]
    entropy = -(np.exp(log_probs) * log_probs).sum(-1)
    return taken, entropy


def autodiff_reference(logits, tokens, temperature=1.0):
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    taken = jnp.take_along_axis(log_probs, tokens[..., None], -1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, -1)
    return taken, entropy


def random_inputs(seed, batch, length, vocab, scale=3.0):
    rng = np.random.RandomState(seed)
    logits = (rng.randn(batch, length, vocab) * scale).astype(np.float32)
    tokens = rng.randint(0, vocab, size=(batch, length)).astype(np.int32)
    return jnp.asarray(logits), jnp.asarray(tokens)


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 15, 16, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_numpy_for_every_chunking(chunk_size, temperature):
    # 3 x 5 = 15 rows: chunk sizes that divide it, do not divide it, and exceed it.
    logits, tokens = random_inputs(0, 3, 5, 37)
    logp, entropy = jax.jit(
        lambda l, t: token_logprobs_from_logits(l, t, chunk_size=chunk_size, temperature=temperature)
    )(logits, tokens)
    ref_logp, ref_entropy = np_logprobs_entropy(logits, tokens, temperature)
    assert logp.dtype == jnp.float32 and entropy.dtype == jnp.float32
    np.testing.assert_allclose(logp, ref_logp, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(entropy, ref_entropy, atol=2e-5, rtol=1e-5)


@functools.lru_cache(maxsize=None)
def weighted_gradient(chunk_size):
    """Jitted d/dlogits of sum(w1 logp + w2 H), chunked (chunk_size) or reference (None)."""

    def objective(logits, tokens, w_logp, w_entropy):
        if chunk_size is None:
            logp, entropy = autodiff_reference(logits, tokens, temperature=0.8)
        else:
            logp, entropy = token_logprobs_from_logits(logits, tokens, chunk_size=chunk_size, temperature=0.8)
        return jnp.sum(w_logp * logp + w_entropy * entropy)

    return jax.jit(jax.grad(objective))


@given(seed=st.integers(0, 2**31 - 1), chunk_size=st.sampled_from([3, 8, 20]))
def test_gradient_matches_autodiff_of_log_softmax(seed, chunk_size):
    logits, tokens = random_inputs(seed, 2, 10, 23)
    rng = np.random.RandomState(seed % 2**30 + 1)
    weights = [jnp.asarray(rng.randn(2, 10).astype(np.float32)) for _ in range(2)]
    np.testing.assert_allclose(
        weighted_gradient(chunk_size)(logits, tokens, *weights),
        weighted_gradient(None)(logits, tokens, *weights),
        atol=2e-5,
        rtol=1e-4,
    )


def test_bfloat16_logits_give_float32_results_and_bfloat16_gradient():
    logits, tokens = random_inputs(1, 2, 6, 50)
    logits_bf16 = logits.astype(jnp.bfloat16)
    logp, entropy = token_logprobs_from_logits(logits_bf16, tokens, chunk_size=5)
    assert logp.dtype == jnp.float32 and entropy.dtype == jnp.float32
    # Exact up to float32 arithmetic on the (bf16-rounded) input values.
    ref_logp, ref_entropy = np_logprobs_entropy(np.asarray(logits_bf16.astype(jnp.float32)), tokens)
    np.testing.assert_allclose(logp, ref_logp, atol=2e-5)
    np.testing.assert_allclose(entropy, ref_entropy, atol=2e-5)
    grad = jax.grad(lambda x: token_logprobs_from_logits(x, tokens, chunk_size=5)[0].sum())(logits_bf16)
    assert grad.dtype == jnp.bfloat16


def test_padding_positions_do_not_change_other_rows():
    logits, tokens = random_inputs(2, 2, 8, 19)
    logp, _ = token_logprobs_from_logits(logits, tokens, chunk_size=3)
    # Right-pad with garbage positions: counted positions are unchanged.
    pad_logits = jnp.concatenate([logits, 1e4 * jnp.ones((2, 5, 19))], axis=1)
    pad_tokens = jnp.concatenate([tokens, jnp.full((2, 5), 7, jnp.int32)], axis=1)
    padded_logp, _ = token_logprobs_from_logits(pad_logits, pad_tokens, chunk_size=3)
    np.testing.assert_allclose(padded_logp[:, :8], logp, atol=1e-6)


@pytest.mark.parametrize("layout", ["dv", "vd"])
def test_from_hidden_matches_logits_path_and_its_gradients(layout):
    rng = np.random.RandomState(3)
    batch, length, dim, vocab = 2, 7, 8, 31
    hidden = jnp.asarray(rng.randn(batch, length, dim).astype(np.float32))
    kernel = jnp.asarray(rng.randn(dim, vocab).astype(np.float32) * 0.5)
    weight = kernel if layout == "dv" else kernel.T
    tokens = jnp.asarray(rng.randint(0, vocab, (batch, length)).astype(np.int32))

    def chunked(h, w):
        logp, entropy = token_logprobs_from_hidden(h, w, tokens, chunk_size=4, weight_layout=layout, temperature=0.9)
        return jnp.sum(logp) + 0.5 * jnp.sum(entropy), (logp, entropy)

    def reference(h, w):
        kernel_dv = w if layout == "dv" else w.T
        logp, entropy = autodiff_reference(h @ kernel_dv, tokens, temperature=0.9)
        return jnp.sum(logp) + 0.5 * jnp.sum(entropy), (logp, entropy)

    (_, (logp, entropy)), grads = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True))(hidden, weight)
    (_, (ref_logp, ref_entropy)), ref_grads = jax.value_and_grad(reference, argnums=(0, 1), has_aux=True)(
        hidden, weight
    )
    np.testing.assert_allclose(logp, ref_logp, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_from_hidden_rejects_mismatched_unembedding():
    hidden = jnp.zeros((1, 2, 8))
    with pytest.raises(ValueError, match="hidden size 8"):
        token_logprobs_from_hidden(hidden, jnp.zeros((9, 5)), jnp.zeros((1, 2), jnp.int32))


def _compiled_bytes(fn, *shapes):
    analysis = jax.jit(fn).lower(*shapes).compile().memory_analysis()
    if analysis is None:
        pytest.skip("this backend reports no memory analysis")
    return analysis


def test_chunked_path_needs_no_second_copy_of_the_logits():
    """The scratch memory is a few [chunk, V] buffers, whatever the number of rows."""
    vocab, chunk = 4096, 16
    tokens = jax.ShapeDtypeStruct((4, 512), jnp.int32)
    logits = jax.ShapeDtypeStruct((4, 512, vocab), jnp.float32)
    logits_bytes = 4 * 512 * vocab * 4

    forward = _compiled_bytes(lambda l, t: token_logprobs_from_logits(l, t, chunk_size=chunk), logits, tokens)
    assert forward.temp_size_in_bytes <= 8 * chunk * vocab * 4 < 0.25 * logits_bytes

    def grad_fn(l, t):
        return jax.grad(lambda x: token_logprobs_from_logits(x, t, chunk_size=chunk)[0].sum())(l)

    backward = _compiled_bytes(grad_fn, logits, tokens)
    # The gradient itself is an output of logits' size; beyond it only chunk buffers.
    assert backward.temp_size_in_bytes <= 8 * chunk * vocab * 4

    def unchunked(l, t):
        return autodiff_reference(l, t)[0]

    # Sanity check of the measurement: the plain formula does need a full copy.
    assert _compiled_bytes(unchunked, logits, tokens).temp_size_in_bytes >= logits_bytes


def test_rejects_bad_arguments():
    logits, tokens = random_inputs(0, 1, 2, 5)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_from_logits(logits, tokens, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs_from_logits(logits, tokens, chunk_size=0)
