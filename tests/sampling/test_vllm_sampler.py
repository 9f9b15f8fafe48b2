"""The vLLM weight sync's conversion (CPU) and, where vLLM and a GPU exist, the sampler itself."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mathrl_jax import sharding as S
from mathrl_jax.models import hf
from mathrl_jax.sampling.vllm_sampler import torch_weights
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


def _gpu_and_vllm():
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install -e '.[vllm]' on a GPU machine)"
    if not torch.cuda.is_available():
        return "no CUDA GPU: the vLLM sampler runs on GPUs only"
    return None


@pytest.mark.skipif(_gpu_and_vllm() is not None, reason=str(_gpu_and_vllm()))
def test_vllm_greedy_matches_jax_after_weight_sync(tmp_path):
    from mathrl_jax.models import write_tiny_checkpoint
    from mathrl_jax.sampling import JaxSampler, SamplingParams
    from mathrl_jax.sampling.vllm_sampler import VllmSampler

    config = write_tiny_checkpoint(str(tmp_path), seed=0)
    model = hf.load_model(str(tmp_path))
    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda x: x * 8.0 if x.ndim == 2 else x, state)  # perturbed, peaked weights
    vllm_sampler = VllmSampler(str(tmp_path), config=config, dtype="float32", gpu_memory_utilization=0.2)
    vllm_sampler.update_weights(state, version=3)
    params = SamplingParams(temperature=0.0, max_new_tokens=16)
    prompts = [[5, 17, 33, 9], [40, 41], [7, 8, 9, 10, 11, 12, 13]]
    got = vllm_sampler.generate(prompts, params)
    want = JaxSampler(nnx.merge(graphdef, state), pad_token_id=0).generate(prompts, params)
    assert got.policy_version == 3
    assert got.completion_ids == want.completion_ids
    for a, b in zip(got.policy_logprobs, want.policy_logprobs):
        np.testing.assert_allclose(a, b, atol=1e-3)
