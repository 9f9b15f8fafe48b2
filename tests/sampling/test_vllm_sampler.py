"""The vLLM weight sync's conversion: JAX params to torch tensors under Hugging Face names (no engine needed;
the engine itself is tested in test_vllm_engine.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mathrl_jax import sharding as S
from mathrl_jax.models import hf
from mathrl_jax.sampling.vllm import torch_weights
from tests.models.conftest import VARIANTS, make_torch_model

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_torch_weights_equal_transformers_state_dict(variant, tmp_path):
    reference = make_torch_model(variant)
    reference.save_pretrained(str(tmp_path))
    model = hf.load_model(str(tmp_path))
    converted = dict(torch_weights(nnx.state(model), model.config))
    expected = reference.state_dict()
    if model.config.tie_word_embeddings:  # vLLM ties lm_head itself and skips the name
        expected = {k: v for k, v in expected.items() if k != "lm_head.weight"}
    assert sorted(converted) == sorted(expected)
    for name, tensor in converted.items():
        assert isinstance(tensor, torch.Tensor)
        assert tuple(tensor.shape) == tuple(expected[name].shape), name
        np.testing.assert_array_equal(tensor.numpy(), expected[name].numpy(), err_msg=name)


def test_torch_weights_gather_sharded_leaves_and_cast(tmp_path):
    reference = make_torch_model("qwen2")
    reference.save_pretrained(str(tmp_path))
    model = hf.load_model(str(tmp_path))
    mesh = S.make_mesh({"dp": 1, "fsdp": 4, "tp": 1}, devices=jax.devices()[:4])
    state = S.shard_tree(nnx.state(model), mesh, S.qwen_rules(model.config.num_key_value_heads, 1))
    kernel = state["model"]["layers"][0]["mlp"]["up_proj"]["kernel"][...]
    assert len(kernel.sharding.device_set) > 1  # the test exercises the gather
    converted = dict(torch_weights(state, model.config, dtype=jnp.bfloat16))
    weight = converted["model.layers.0.mlp.up_proj.weight"]
    assert weight.dtype == torch.bfloat16
    expected = reference.state_dict()["model.layers.0.mlp.up_proj.weight"].to(torch.bfloat16)
    assert torch.equal(weight, expected)


@pytest.mark.parametrize("variant", ["qwen2", "qwen3"])
def test_torch_weights_without_jax_side_copies(variant, tmp_path):
    """With `transpose_in_torch` every tensor is a view of its parameter's JAX buffer (same address: zero copies on
    the JAX side, the kernels transposed as torch views) and equals the default conversion, which copies exactly
    the transposed kernels."""
    make_torch_model(variant).save_pretrained(str(tmp_path))
    model = hf.load_model(str(tmp_path))
    state = nnx.state(model)
    table = hf.parameter_table(model.config)
    owner = {name: hf.get_path(state, spec.path).unsafe_buffer_pointer() for name, spec in table.items()}

    def copies(**kwargs):
        converted = dict(torch_weights(state, model.config, **kwargs))
        return converted, sorted(name for name, tensor in converted.items() if tensor.data_ptr() != owner[name])

    views, view_copies = copies(transpose_in_torch=True)
    default, default_copies = copies()
    assert view_copies == []
    assert default_copies == sorted(name for name, spec in table.items() if spec.transpose) != []
    for name, tensor in views.items():
        assert torch.equal(tensor, default[name]), name
