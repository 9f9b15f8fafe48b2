"""LoRA adapters: the adapted forward equals the merged plain model's, PEFT's layout and numerics (transformers +
peft as the reference), the partition rules place adapters like their base weights."""

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mathrl_jax import sharding
from mathrl_jax.models import hf, lora, peft_adapters, tiny
from mathrl_jax.models.qwen import ConfigError, QwenForCausalLM

TARGETS = "q_proj,v_proj,down_proj"


def _perturbed(model, seed=1, scale=0.05):
    """The model with every adapter moved off its initial value (B = 0 would make any merge look right)."""
    graphdef, adapters, base = nnx.split(model, nnx.LoRAParam, ...)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves), base)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("base"))
    tiny.write_tiny_checkpoint(directory, seed=0)
    return directory


def _ids():
    return jnp.asarray(np.random.default_rng(0).integers(3, 40, size=(2, 9)), jnp.int32)


def test_fresh_adapters_leave_the_model_unchanged_and_only_named_projections_are_adapted(base_dir):
    plain = hf.load_model(base_dir)
    adapted = hf.load_model(base_dir, lora_rank=4, lora_alpha=8, lora_targets=TARGETS)
    np.testing.assert_array_equal(np.asarray(adapted(_ids())[0]), np.asarray(plain(_ids())[0]))
    _, adapters, _ = nnx.split(adapted, nnx.LoRAParam, ...)
    layer = nnx.to_pure_dict(adapters)["model"]["layers"][0]
    assert set(layer["self_attn"]) == {"q_proj", "v_proj"} and set(layer["mlp"]) == {"down_proj"}
    a = layer["self_attn"]["q_proj"]["lora"]["lora_a"]
    assert a.dtype == jnp.float32 and a.shape == (128, 4)
    # PEFT's kaiming_uniform(a=sqrt(5)) on [r, in]: uniform in +-1/sqrt(in), variance 1 / (3 in).
    bound = 1 / np.sqrt(128)
    assert np.abs(a).max() <= bound and abs(float(np.var(a)) - bound**2 / 3) < 0.2 * bound**2 / 3
    assert not np.any(layer["self_attn"]["q_proj"]["lora"]["lora_b"])


def test_targets_are_checked_and_all_linear_is_every_decoder_projection():
    with pytest.raises(ConfigError, match="qq_proj"):
        tiny.tiny_config(lora_rank=2, lora_targets="q_proj,qq_proj")
    with pytest.raises(ConfigError, match="lora_rank=-1"):
        tiny.tiny_config(lora_rank=-1, lora_targets="q_proj")
    assert tiny.tiny_config(lora_rank=2, lora_targets="all-linear").lora_targets == lora.TARGETS
    assert tiny.tiny_config(lora_rank=2, lora_targets=["v_proj", "q_proj"]).lora_targets == ("q_proj", "v_proj")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_adapter_forward_equals_the_merged_plain_model(base_dir, tmp_path, dtype):
    """W x + s B A x (the adapters applied) against the plain model whose kernels are W + s A B (merged)."""
    numerics = dict(param_dtype=dtype, dtype=dtype)
    adapted = _perturbed(hf.load_model(base_dir, lora_rank=4, lora_alpha=8, lora_targets=TARGETS, **numerics))
    hf.export_checkpoint(nnx.state(adapted), adapted.config, str(tmp_path), tokenizer_dir=base_dir)
    merged = hf.load_model(str(tmp_path), **numerics)
    assert not any(isinstance(v, nnx.LoRAParam) for _, v in nnx.iter_graph(merged))
    got, want = np.asarray(adapted(_ids())[0], np.float32), np.asarray(merged(_ids())[0], np.float32)
    plain = np.asarray(hf.load_model(base_dir, **numerics)(_ids())[0], np.float32)
    effect, error = np.abs(got - plain).max(), np.abs(got - want).max()
    # bf16: the merged kernel is rounded once, the adapted pass rounds W x and s B A x apart
    assert error < (1e-5 if dtype == "float32" else 0.1 * effect), (error, effect)
    assert effect > 0.3  # the adapters matter


def test_peft_export_loads_in_peft_and_matches_the_jax_logits(base_dir, tmp_path):
    import peft  # dev dependencies: the test must not skip
    import torch
    import transformers

    adapted = _perturbed(hf.load_model(base_dir, lora_rank=4, lora_alpha=8, lora_targets=TARGETS))
    peft_adapters.export_adapters(nnx.state(adapted), adapted.config, str(tmp_path / "adapter"), base_dir)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    ids = _ids()
    with torch.no_grad():
        want = model(torch.as_tensor(np.asarray(ids))).logits.numpy()
    np.testing.assert_allclose(np.asarray(adapted(ids)[0]), want, atol=1e-4)
    # and back: the directory read into a fresh model reproduces the adapters exactly
    fresh = hf.load_model(base_dir, lora_rank=4, lora_alpha=8, lora_targets=TARGETS, lora_seed=9)
    graphdef, adapters, rest = nnx.split(fresh, nnx.LoRAParam, ...)
    nnx.replace_by_pure_dict(adapters, peft_adapters.read_adapters(str(tmp_path / "adapter"), fresh.config))
    np.testing.assert_array_equal(np.asarray(nnx.merge(graphdef, adapters, rest)(ids)[0]), np.asarray(adapted(ids)[0]))


def test_adapter_directories_of_another_shape_or_kind_are_refused(base_dir, tmp_path):
    adapted = hf.load_model(base_dir, lora_rank=4, lora_alpha=8, lora_targets=TARGETS)
    peft_adapters.export_adapters(nnx.state(adapted), adapted.config, str(tmp_path))
    with pytest.raises(peft_adapters.ModelCheckpointError, match="has shape"):
        peft_adapters.read_adapters(str(tmp_path), tiny.tiny_config(lora_rank=2, lora_targets=TARGETS))
    with pytest.raises(peft_adapters.ModelCheckpointError, match="missing adapter tensor .*k_proj"):
        peft_adapters.read_adapters(str(tmp_path), tiny.tiny_config(lora_rank=4, lora_targets="q_proj,k_proj"))
    cfg = peft_adapters.read_adapter_config(str(tmp_path))
    assert cfg["r"] == 4 and cfg["target_modules"] == ["q_proj", "v_proj", "down_proj"]
    (tmp_path / peft_adapters.CONFIG_FILE).write_text('{"peft_type": "LORA", "use_dora": true}')
    with pytest.raises(peft_adapters.ModelCheckpointError, match="use_dora=True"):
        peft_adapters.read_adapter_config(str(tmp_path))


def test_partition_rules_place_adapters_like_their_base_weights():
    """A's input side is split as the kernel's input side, B's output side as the kernel's output side."""
    config = tiny.tiny_config(lora_rank=4, lora_targets="all-linear")
    state = nnx.state(nnx.eval_shape(lambda: QwenForCausalLM(config, rngs=nnx.Rngs(0))))
    specs = sharding.tree_specs(nnx.to_pure_dict(state), sharding.qwen_rules(config.num_key_value_heads, 2))
    layer = specs["model"]["layers"][0]
    for block, name in [("self_attn", n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + [
        ("mlp", n) for n in ("gate_proj", "up_proj", "down_proj")
    ]:
        kernel, adapter = layer[block][name]["kernel"], layer[block][name]["lora"]
        assert tuple(adapter["lora_a"]) == (kernel[0], None), name
        assert tuple(adapter["lora_b"]) == (None, kernel[1]), name


def test_merge_adapters_gives_the_plain_model_of_the_adapted_one(base_dir):
    """`lora.merge_adapters`: the plain model's state (no adapter left) computes what the adapted model does; every
    tensor an adapter does not touch is the input's own buffer (a sync copies the adapted kernels alone), and the
    merged kernels come in the dtype asked for."""
    adapted = _perturbed(hf.load_model(base_dir, lora_rank=4, lora_alpha=8, lora_targets=TARGETS))
    state = nnx.state(adapted)
    merged = lora.merge_adapters(state, adapted.config.lora_alpha / adapted.config.lora_rank)
    flat, merged_flat = dict(nnx.to_flat_state(state)), dict(nnx.to_flat_state(merged))
    assert not any(lora.is_adapter(path) for path in merged_flat)
    assert set(merged_flat) == {path for path in flat if not lora.is_adapter(path)}
    plain_config = dataclasses.replace(adapted.config, lora_rank=0)
    plain = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: QwenForCausalLM(plain_config, rngs=nnx.Rngs(0)))), merged)
    got, want = np.asarray(plain(_ids())[0]), np.asarray(adapted(_ids())[0])
    base = np.asarray(hf.load_model(base_dir)(_ids())[0])
    assert np.abs(got - want).max() < 1e-5 < 0.3 < np.abs(want - base).max()
    adapted_kernels = {p for p in merged_flat if p[-2] in ("q_proj", "v_proj", "down_proj") and p[-1] == "kernel"}
    assert len(adapted_kernels) == 3 * adapted.config.num_hidden_layers
    for path, variable in merged_flat.items():
        same = variable.get_value() is flat[path].get_value()
        assert same == (path not in adapted_kernels), path
    halved = dict(nnx.to_flat_state(lora.merge_adapters(state, 2.0, jnp.bfloat16)))
    assert {halved[p].get_value().dtype for p in adapted_kernels} == {jnp.dtype(jnp.bfloat16)}


def test_a_critic_on_the_frozen_base_is_the_plain_trunk_under_openrs_mlp_head(base_dir):
    """`value_head.FrozenBaseCritic` on a LoRA policy's base: values = w3 . relu(W2 relu(W1 h)) with h the final
    hidden states of the base with its adapters off (OpenR's `disable_adapter()`), computed here in numpy from the
    plain model's trunk; the critic's own state is the head alone."""
    from mathrl_jax.models import value_head
    from mathrl_jax.models.attention import full_sequence_attention
    from mathrl_jax.train.state import model_params

    policy = _perturbed(hf.load_model(base_dir, lora_rank=4, lora_alpha=8, lora_targets=TARGETS), scale=0.5)
    _, _, frozen = nnx.split(policy, nnx.LoRAParam, ...)
    graphdef, head = value_head.frozen_base_critic(policy.config, seed=3)
    assert {str(path[0]) for path, _ in nnx.to_flat_state(head)} == {"value_head"}
    layers = nnx.to_pure_dict(head)["value_head"]["layers"]
    kernels = [np.asarray(layers[i]["kernel"], np.float64) for i in sorted(layers)]
    assert [k.shape for k in kernels] == [(128, 1024), (1024, 512), (512, 1)]
    assert all(np.abs(k).max() <= 1 / np.sqrt(k.shape[0]) for k in kernels)  # torch's nn.Linear init
    critic = nnx.merge(graphdef, model_params(head, value_head.frozen_trunk(frozen)))
    got = np.asarray(critic(_ids()))
    plain = hf.load_model(base_dir)
    hidden, _ = plain.model(_ids(), *full_sequence_attention(_ids()))
    x = np.asarray(hidden, np.float64)
    want = (np.maximum(np.maximum(x @ kernels[0], 0) @ kernels[1], 0) @ kernels[2])[..., 0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    adapted_hidden, _ = policy.model(_ids(), *full_sequence_attention(_ids()))
    assert np.abs(np.asarray(adapted_hidden) - x).max() > 0.1  # the adapters would have changed them


def _linear(rank=3, alpha=6.0, n_in=16, n_out=5):
    layer = lora.LoRALinear(n_in, n_out, rank=rank, alpha=alpha, use_bias=True, rngs=nnx.Rngs(0))
    layer.lora.lora_b.set_value(jax.random.normal(jax.random.key(7), layer.lora.lora_b.get_value().shape))
    return layer


def test_adapter_dropout_is_peft_lora_dropout_before_a_with_its_documented_mask():
    """PEFT's LoRA layer in training mode: W x + b + (alpha / r) B A dropout(x), inverted dropout on the adapter's
    input only, the mask drawn from `adapter_dropout_key(key, path)`; computed here in NumPy from the weights."""
    rate, key = 0.3, jax.random.key(11)
    layer = _linear()
    x = np.random.default_rng(0).normal(size=(6, 16)).astype(np.float32)
    plain = np.asarray(layer(jnp.asarray(x)))
    got = np.asarray(lora.with_dropout(layer, rate, key)(jnp.asarray(x)))
    # A lone layer's path is (): its key is `key` folded with crc32 of "".
    keep = np.asarray(jax.random.bernoulli(jax.random.fold_in(key, zlib.crc32(b"")), 1 - rate, x.shape))
    kernel, bias = np.asarray(layer.kernel.get_value()), np.asarray(layer.bias.get_value())
    a, b = np.asarray(layer.lora.lora_a.get_value()), np.asarray(layer.lora.lora_b.get_value())
    want = x @ kernel + bias + (6.0 / 3) * ((x * keep / (1 - rate)) @ a @ b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert 0 < keep.mean() < 1 and not np.allclose(got, plain)  # some entries dropped, the output moved
    # The base term is untouched: with B = 0 dropout changes nothing.
    layer.lora.lora_b.set_value(jnp.zeros_like(layer.lora.lora_b.get_value()))
    np.testing.assert_allclose(np.asarray(layer(jnp.asarray(x))), x @ kernel + bias, rtol=1e-5, atol=1e-5)


def test_adapter_dropout_is_unbiased_and_zero_rate_changes_nothing():
    """E[dropout(x)] = x, so the mean adapted output over many keys approaches the output without dropout (within
    a bound of 5 standard errors), while each single key's differs; rate 0 is the same program's output, and
    a rate outside [0, 1) is refused."""
    x = jnp.asarray(np.random.default_rng(1).normal(size=(4, 16)).astype(np.float32))
    plain = np.asarray(_linear()(x))
    np.testing.assert_array_equal(np.asarray(lora.with_dropout(_linear(), 0.0, jax.random.key(0))(x)), plain)

    def dropped(key):
        return lora.with_dropout(_linear(), 0.5, key)(x)

    keys = jax.random.split(jax.random.key(3), 4000)
    outs = np.asarray(jax.vmap(dropped)(keys))
    mean, sem = outs.mean(0), outs.std(0) / np.sqrt(len(keys))
    assert np.all(outs.std(0) > 0)
    assert np.all(np.abs(mean - plain) <= 5 * sem + 1e-6), np.max(np.abs(mean - plain) / sem)
    with pytest.raises(ValueError, match="LoRA dropout 1.0"):
        lora.with_dropout(_linear(), 1.0, jax.random.key(0))


def test_each_adapter_of_a_model_draws_its_own_mask_and_scanned_layers_match_unrolled(base_dir):
    """In a model, q and v of one layer and the same projection of two layers draw different masks (keys folded
    with their paths); the scanned layers (`scan_layers`) give what the unrolled loop gives under the same key."""
    model = _perturbed(hf.load_model(base_dir, lora_rank=4, lora_alpha=8, lora_targets=TARGETS))
    key = jax.random.key(5)
    paths = [p for p, m in nnx.iter_modules(model) if isinstance(m, lora.LoRALinear)]
    masks = {p: np.asarray(lora.dropout_mask(lora.adapter_dropout_key(key, p), 0.5, (64,))) for p in paths}
    assert len(paths) == 3 * tiny.tiny_config().num_hidden_layers
    assert len({m.tobytes() for m in masks.values()}) == len(paths)
    plain = np.asarray(model(_ids())[0])
    graphdef, state = nnx.split(model)
    unrolled = lora.with_dropout(nnx.merge(graphdef, state), 0.2, key)
    got = np.asarray(unrolled(_ids())[0])
    assert np.max(np.abs(got - plain)) > 1e-4
    scanned_model = nnx.merge(graphdef, state)
    scanned_model.model.config = dataclasses.replace(scanned_model.model.config, scan_layers=True)
    scanned = np.asarray(lora.with_dropout(scanned_model, 0.2, key)(_ids())[0])
    np.testing.assert_allclose(scanned, got, rtol=2e-5, atol=2e-5)
