"""The NNX Qwen model against transformers, and its own invariances (padding, KV cache, packing, remat)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from mathrl_jax.models import hf, qwen
from mathrl_jax.models.attention import (
    ATTENTION_BLOCK,
    ATTENTION_MAX_BLOCKS,
    attention_block_size,
    auto_attention,
    causal_attention,
    default_positions,
    full_attention,
    full_sequence_attention,
    grouped_attention,
)
from mathrl_jax.models.hf_config import config_from_dict
from tests.models.conftest import VARIANTS, padded_batch, torch_logits


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_float32_logits_match_transformers_with_left_and_right_padding(hf_checkpoints, variant):
    directory, torch_model = hf_checkpoints[variant]
    model = hf.load_model(directory)
    ids, mask = padded_batch()
    reference = torch_logits(torch_model, ids, mask)
    logits, cache = jax.jit(lambda i, m: model(i, attention_mask=m))(jnp.asarray(ids), jnp.asarray(mask))
    assert cache is None and logits.dtype == jnp.float32
    counted = mask.astype(bool)
    scale = np.abs(reference[counted]).max()
    assert scale > 1.0  # the weights give non-trivial logits
    assert np.abs(np.asarray(logits) - reference)[counted].max() < 1e-4 * scale


@pytest.mark.parametrize("variant", ["qwen2", "qwen3"])
def test_bfloat16_logits_match_transformers_bfloat16(hf_checkpoints, variant):
    directory, torch_model = hf_checkpoints[variant]
    model = hf.load_model(directory, param_dtype="bfloat16", dtype="bfloat16")
    ids, mask = padded_batch(seed=1)
    reference32 = torch_logits(torch_model, ids, mask)
    reference16 = torch_logits(torch_model.to(torch.bfloat16), ids, mask)
    torch_model.to(torch.float32)
    logits, _ = model(jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    assert logits.dtype == jnp.bfloat16
    counted = mask.astype(bool)
    scale = np.abs(reference32[counted]).max()
    ours = np.abs(np.asarray(logits, np.float32) - reference32)[counted].max()
    theirs = np.abs(reference16 - reference32)[counted].max()
    # bf16 keeps 8 bits of mantissa; both implementations land within a few bf16 ulps of float32,
    # and ours is no worse than transformers' own bf16 run beyond a small factor.
    assert ours < 0.05 * scale
    assert ours < 3 * theirs + 1e-3 * scale


def test_padding_does_not_change_real_tokens(hf_checkpoints):
    model = hf.load_model(hf_checkpoints["qwen2"][0])
    ids = jnp.asarray(np.random.RandomState(2).randint(0, 97, (1, 7)))
    plain, _ = model(ids)
    left = jnp.concatenate([jnp.full((1, 5), 13), ids], axis=1)
    left_mask = jnp.concatenate([jnp.zeros((1, 5), jnp.int32), jnp.ones((1, 7), jnp.int32)], axis=1)
    left_logits, _ = model(left, attention_mask=left_mask)
    right = jnp.concatenate([ids, jnp.full((1, 4), 13)], axis=1)
    right_mask = jnp.concatenate([jnp.ones((1, 7), jnp.int32), jnp.zeros((1, 4), jnp.int32)], axis=1)
    right_logits, _ = model(right, attention_mask=right_mask)
    np.testing.assert_allclose(left_logits[:, 5:], plain, atol=2e-5)
    np.testing.assert_allclose(right_logits[:, :7], plain, atol=2e-5)


@pytest.mark.parametrize("variant", ["qwen2", "qwen3"])
def test_kv_cache_decoding_matches_full_forward_at_every_position(hf_checkpoints, variant):
    """Prefill a left-padded prompt into the cache, then decode one token at a time."""
    model = hf.load_model(hf_checkpoints[variant][0])
    config = model.config
    ids = np.random.RandomState(3).randint(0, 97, (2, 10))
    mask = np.ones_like(ids)
    mask[1, :3] = 0  # left padding of the prompt
    prompt_length, total = 6, 10
    full_logits, _ = model(jnp.asarray(ids), attention_mask=jnp.asarray(mask))

    positions = np.asarray(default_positions(jnp.asarray(mask)))
    cache = qwen.init_cache(config, batch=2, max_length=total)
    cache_mask = np.zeros((2, total), np.int32)
    cache_mask[:, :prompt_length] = mask[:, :prompt_length]
    step = jax.jit(
        lambda tokens, pos, m, c, index: model(tokens, positions=pos, attention_mask=m, cache=c, cache_index=index)
    )
    logits, cache = step(
        jnp.asarray(ids[:, :prompt_length]),
        jnp.asarray(positions[:, :prompt_length]),
        jnp.asarray(cache_mask),
        cache,
        0,
    )
    np.testing.assert_allclose(logits[1, 3:], full_logits[1, 3:prompt_length], atol=1e-5)
    np.testing.assert_allclose(logits[0], full_logits[0, :prompt_length], atol=1e-5)
    for t in range(prompt_length, total):
        cache_mask[:, t] = 1
        logits, cache = step(
            jnp.asarray(ids[:, t : t + 1]), jnp.asarray(positions[:, t : t + 1]), jnp.asarray(cache_mask), cache, t
        )
        np.testing.assert_allclose(logits[:, 0], full_logits[:, t], atol=1e-5, err_msg=f"position {t}")


def test_packed_sequences_match_separate_sequences(hf_checkpoints):
    model = hf.load_model(hf_checkpoints["qwen3"][0])
    rng = np.random.RandomState(4)
    first, second = rng.randint(0, 97, (1, 5)), rng.randint(0, 97, (1, 7))
    packed = jnp.asarray(np.concatenate([first, second], axis=1))
    segments = jnp.asarray([[0] * 5 + [1] * 7])
    positions = jnp.asarray([list(range(5)) + list(range(7))])
    packed_logits, _ = model(packed, positions=positions, segment_ids=segments)
    np.testing.assert_allclose(packed_logits[:, :5], model(jnp.asarray(first))[0], atol=2e-5)
    np.testing.assert_allclose(packed_logits[:, 5:], model(jnp.asarray(second))[0], atol=2e-5)


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("policy", qwen.REMAT_POLICIES)
def test_remat_gives_the_same_loss_and_gradients(hf_checkpoints, policy, scan_layers):
    directory = hf_checkpoints["qwen2"][0]
    ids = jnp.asarray(np.random.RandomState(5).randint(0, 97, (2, 9)))

    def loss_and_grads(remat):
        model = hf.load_model(directory, remat=remat, remat_policy=policy, scan_layers=scan_layers)
        graphdef, state = nnx.split(model)

        def loss(s):
            logits, _ = qwen.forward(graphdef, s, ids)
            return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

        return jax.jit(jax.value_and_grad(loss))(state)

    (loss_plain, grads_plain), (loss_remat, grads_remat) = loss_and_grads(False), loss_and_grads(True)
    np.testing.assert_allclose(loss_remat, loss_plain, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads_remat), jax.tree.leaves(grads_plain)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_a_bad_remat_policy_is_refused_by_name():
    with pytest.raises(qwen.ConfigError, match="^remat_policy='dots'; expected one of"):
        qwen.QwenConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, remat_policy="dots",
        )  # fmt: skip


@pytest.mark.parametrize("remat", [False, True])
def test_scanned_layers_give_the_unrolled_loss_and_gradients(hf_checkpoints, remat):
    directory = hf_checkpoints["qwen3"][0]
    ids = jnp.asarray(np.random.RandomState(6).randint(0, 97, (2, 9)))
    mask = jnp.ones((2, 9), jnp.int32).at[0, :3].set(0)

    def loss_and_grads(scan_layers):
        model = hf.load_model(directory, remat=remat, scan_layers=scan_layers)
        assert model.config.num_hidden_layers > 1
        graphdef, state = nnx.split(model)

        def loss(s):
            logits, _ = qwen.forward(graphdef, s, ids, attention_mask=mask)
            return jnp.sum(jax.nn.log_softmax(logits)[..., 0] * mask)

        return jax.jit(jax.value_and_grad(loss))(state)

    (loss_scan, grads_scan), (loss_unrolled, grads_unrolled) = loss_and_grads(True), loss_and_grads(False)
    np.testing.assert_allclose(loss_scan, loss_unrolled, rtol=1e-6)
    assert jax.tree.structure(grads_scan) == jax.tree.structure(grads_unrolled)
    for a, b in zip(jax.tree.leaves(grads_scan), jax.tree.leaves(grads_unrolled)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _matmuls_in_training_step(num_layers: int, scan_layers: bool, remat=True, policy="nothing_saveable") -> int:
    """`dot_general`s in the lowered program of a loss and its gradients, bf16 compute, remat by default."""
    config = qwen.QwenConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, dtype="bfloat16", remat=remat, remat_policy=policy, scan_layers=scan_layers,
    )  # fmt: skip
    graphdef, state = nnx.eval_shape(lambda: nnx.split(qwen.QwenForCausalLM(config, rngs=nnx.Rngs(0))))
    ids = jax.ShapeDtypeStruct((2, 16), jnp.int32)

    def loss(s, ids):
        logits, _ = qwen.forward(graphdef, s, ids)
        return jnp.mean(logits.astype(jnp.float32))

    return jax.jit(jax.grad(loss)).lower(state, ids).as_text().count("dot_general")


def test_a_training_pass_compiles_one_decoder_layer_whatever_the_depth():
    """The program (and so its compile time) does not grow with the number of layers: a Qwen2.5-1.5B update compiles
    one layer, not 28. Without the scan the same program holds every layer's matmuls."""
    assert _matmuls_in_training_step(2, True) == _matmuls_in_training_step(6, True)
    unrolled_2, unrolled_6 = _matmuls_in_training_step(2, False), _matmuls_in_training_step(6, False)
    per_layer = unrolled_2 - _matmuls_in_training_step(1, False)
    assert per_layer > 0 and unrolled_6 - unrolled_2 == 4 * per_layer


@pytest.mark.parametrize("scan_layers", [False, True])
def test_a_remat_policy_recomputes_only_the_matmuls_it_does_not_keep(scan_layers):
    """The backward recomputes every matmul of a layer with "nothing_saveable", only attention's with
    "dots_with_no_batch_dims_saveable" (the projections' outputs are kept), and none with "dots_saveable": the
    program then has the matmuls of no remat at all."""
    count = {p: _matmuls_in_training_step(2, scan_layers, policy=p) for p in qwen.REMAT_POLICIES}
    plain = _matmuls_in_training_step(2, scan_layers, remat=False)
    assert count["nothing_saveable"] > count["dots_with_no_batch_dims_saveable"] > count["dots_saveable"] == plain


def test_hidden_states_and_unembedding_reproduce_the_logits(hf_checkpoints):
    from mathrl_jax.losses import token_logprobs_from_hidden, token_logprobs_from_logits

    for variant in ("qwen2", "qwen2_tied"):
        model = hf.load_model(hf_checkpoints[variant][0])
        ids = jnp.asarray(np.random.RandomState(6).randint(0, 97, (2, 8)))
        logits, _ = model(ids)
        hidden, _ = model(ids, return_hidden=True)
        weight, layout = model.unembedding()
        from_hidden, _ = token_logprobs_from_hidden(hidden, weight, ids, weight_layout=layout)
        from_logits, _ = token_logprobs_from_logits(logits, ids)
        np.testing.assert_allclose(from_hidden, from_logits, atol=1e-5)


def test_config_reads_both_transformers_layouts():
    base = dict(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    v4 = config_from_dict(dict(base, architectures=["Qwen2ForCausalLM"], rope_theta=5.0))
    v5 = config_from_dict(dict(base, model_type="qwen2", rope_parameters={"rope_type": "default", "rope_theta": 5.0}))
    assert v4.rope_theta == v5.rope_theta == 5.0
    assert v4.head_dim == 4 and v4.num_key_value_heads == 2 and v4.attention_bias and not v4.qk_norm


@pytest.mark.parametrize(
    "change, field",
    [
        ({"architectures": ["LlamaForCausalLM"]}, "architectures"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ],
)
def test_unsupported_configs_raise_naming_the_field(change, field):
    base = dict(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    with pytest.raises(qwen.ConfigError, match=field):
        config_from_dict(dict(base, **change))


def test_missing_config_field_is_named():
    complete = dict(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        incomplete = {k: v for k, v in complete.items() if k != field}
        with pytest.raises(qwen.ConfigError, match=field):
            config_from_dict(incomplete)


def _random_attention_inputs(seed, batch=3, length=23, heads=4, kv_heads=2, dim=8):
    """q, k, v and the causal `allowed` mask of a batch with a full row, right and left padding, and packing."""
    rng = np.random.RandomState(seed)
    q = jnp.asarray(rng.normal(size=(batch, length, heads, dim)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(batch, length, kv_heads, dim)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(batch, length, kv_heads, dim)), jnp.float32)
    mask = np.ones((batch, length), np.int32)
    mask[1, length - 6 :] = 0  # right padding
    mask[2, :4] = 0  # left padding
    segments = np.zeros((batch, length), np.int32)
    segments[0, 9:] = 1  # row 0 packs three sequences
    segments[0, 17:] = 2
    ids = jnp.zeros((batch, length), jnp.int32)
    _, allowed = full_sequence_attention(ids, jnp.asarray(mask), segment_ids=jnp.asarray(segments))
    return q, k, v, allowed


@pytest.mark.parametrize("block_size", [5, 8, None])
def test_causal_attention_equals_the_unblocked_attention(block_size):
    """Blocked causal attention (keys past a query block skipped) = plain masked attention, values and gradients.

    Length 23 is not a multiple of 5 or 8 (None: one block of 64); rows without any allowed key (padding) are
    excluded, as no caller reads them.
    """
    q, k, v, allowed = _random_attention_inputs(seed=7)
    assert not bool(jnp.any(jnp.triu(jnp.ones(allowed.shape[1:], bool), 1) & allowed))  # causal, as required
    readable = jnp.any(allowed, axis=-1)[:, :, None, None]  # [B, T, 1, 1]
    assert not bool(jnp.all(readable))  # the batch does have unreadable rows
    weights = jnp.asarray(np.random.RandomState(8).normal(size=q.shape), jnp.float32) * readable

    def loss(attention, q, k, v):
        return jnp.sum(attention(q, k, v, allowed) * weights)

    blocked = lambda q, k, v, a: causal_attention(q, k, v, a, block_size=block_size)
    out_blocked = jax.jit(blocked)(q, k, v, allowed)
    out_plain = jax.jit(grouped_attention)(q, k, v, allowed)
    np.testing.assert_allclose(np.where(readable, out_blocked, 0), np.where(readable, out_plain, 0), atol=1e-5)
    grads_blocked = jax.jit(jax.grad(lambda *x: loss(blocked, *x), argnums=(0, 1, 2)))(q, k, v)
    grads_plain = jax.jit(jax.grad(lambda *x: loss(grouped_attention, *x), argnums=(0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", grads_blocked, grads_plain):
        assert float(jnp.max(jnp.abs(b))) > 1e-2, name  # a gradient that says something
        np.testing.assert_allclose(a, b, atol=2e-5, err_msg=f"d loss / d {name}")


def test_causal_attention_in_bfloat16_stays_close_to_float32():
    q, k, v, allowed = _random_attention_inputs(seed=9)
    readable = np.asarray(jnp.any(allowed, axis=-1))
    plain = jax.jit(grouped_attention)
    exact = np.asarray(plain(q, k, v, allowed))[readable]
    half = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    out = jax.jit(lambda q, k, v, a: causal_attention(q, k, v, a, block_size=8))(*half, allowed)
    assert out.dtype == jnp.bfloat16
    reference_half = np.asarray(plain(*half, allowed), np.float32)[readable]
    ours = np.abs(np.asarray(out, np.float32)[readable] - exact).max()
    theirs = np.abs(reference_half - exact).max()
    assert ours < 0.05 and ours < 2 * theirs + 1e-3


def test_causal_attention_rejects_bad_inputs():
    q, k, v, allowed = _random_attention_inputs(seed=10)
    with pytest.raises(ValueError, match="block_size=0"):
        causal_attention(q, k, v, allowed, block_size=0)
    with pytest.raises(AssertionError):
        causal_attention(q, k, v, allowed[:, :, :-1])


@pytest.mark.parametrize("length", [1, 63, 64, 256, 513, 4096, 5000])
def test_attention_block_size_bounds_the_number_of_blocks(length):
    block = attention_block_size(length)
    assert block >= ATTENTION_BLOCK
    assert -(-length // block) <= ATTENTION_MAX_BLOCKS


@pytest.mark.parametrize("dtype, atol, rtol", [(jnp.float32, 2e-5, 0), (jnp.bfloat16, 3e-2, 2e-2)])
def test_dot_product_attention_equals_the_blocked_attention(dtype, atol, rtol):
    """`jax.nn.dot_product_attention` with the padding-and-segments mask = `causal_attention`, values and
    gradients, on rows with an allowed key: the "xla" implementation everywhere, and on a GPU "cudnn" too (the
    fused kernel takes bfloat16 / float16 only). Head size 64 and 40 tokens: a shape cuDNN accepts."""
    inputs = _random_attention_inputs(seed=11, length=40, dim=64)
    q, k, v, allowed = (x.astype(dtype) if x.dtype == jnp.float32 else x for x in inputs)
    readable = jnp.any(allowed, axis=-1)[:, :, None, None]
    weights = jnp.asarray(np.random.RandomState(12).normal(size=q.shape), dtype) * readable

    def run(implementation):
        attend = lambda q, k, v: full_attention(q, k, v, allowed, implementation)  # noqa: E731
        out = jax.jit(attend)(q, k, v)
        grads = jax.jit(jax.grad(lambda *x: jnp.sum((attend(*x) * weights).astype(jnp.float32)), argnums=(0, 1, 2)))
        return np.where(readable, np.asarray(out, np.float32), 0), [np.asarray(g, np.float32) for g in grads(q, k, v)]

    implementations = ["xla"] + (["cudnn"] if jax.default_backend() == "gpu" and dtype != jnp.float32 else [])
    blocked, blocked_grads = run("blocked")
    for implementation in implementations:
        out, grads = run(implementation)
        np.testing.assert_allclose(out, blocked, atol=atol, rtol=rtol, err_msg=implementation)
        for name, a, b in zip("qkv", grads, blocked_grads):  # bf16: a few ulp
            np.testing.assert_allclose(a, b, atol=atol, rtol=rtol, err_msg=f"{implementation}: d loss / d {name}")


@pytest.mark.parametrize(
    "backend, dtype, head_dim, capability, expected",
    [
        ("cpu", jnp.bfloat16, 128, None, "blocked"),
        ("cpu", jnp.float32, 64, None, "blocked"),
        ("gpu", jnp.bfloat16, 128, "9.0", "cudnn"),  # H100: measured fastest (docs/gpu.md)
        ("gpu", jnp.float16, 64, "8.0", "cudnn"),
        ("gpu", jnp.float32, 128, "9.0", "xla"),  # the fused kernel takes half precision only
        ("gpu", jnp.bfloat16, 128, "7.0", "xla"),  # V100: no fused kernel
        ("gpu", jnp.bfloat16, 256, "9.0", "xla"),  # head size over 128
        ("gpu", jnp.bfloat16, 100, "9.0", "xla"),  # not a multiple of 8
        ("gpu", jnp.bfloat16, 128, "gfx90a", "xla"),  # an AMD GPU
        ("gpu", jnp.bfloat16, 128, None, "xla"),
        ("tpu", jnp.bfloat16, 128, None, "xla"),
    ],
)
def test_auto_attention_picks_the_fused_kernel_only_where_it_runs(backend, dtype, head_dim, capability, expected):
    assert auto_attention(backend, dtype, head_dim, capability) == expected


def test_the_model_with_dot_product_attention_gives_the_blocked_models_logits(hf_checkpoints):
    """Padded and packed rows (the blocked model's logits are transformers', above)."""
    directory = hf_checkpoints["qwen2"][0]
    ids, mask = padded_batch()
    segments = np.where(mask > 0, 1, 0)
    segments[0, segments.shape[1] // 2 :] *= 2  # row 0 holds two sequences
    counted = mask.astype(bool)
    logits = {}
    for implementation in ("blocked", "xla"):
        model = hf.load_model(directory, attention=implementation)
        run = jax.jit(lambda i, m, s: (model(i, attention_mask=m)[0], model(i, segment_ids=s)[0]))
        logits[implementation] = [
            np.asarray(x) for x in run(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(segments))
        ]
    scale = np.abs(logits["blocked"][0][counted]).max()
    for a, b in zip(logits["xla"], logits["blocked"]):
        assert np.abs(a - b)[counted].max() < 1e-5 * scale
    with pytest.raises(qwen.ConfigError, match="attention='flash'"):
        hf.load_model(directory, attention="flash")
