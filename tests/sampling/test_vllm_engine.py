"""`VllmSampler` on the real vLLM engine (its CPU build in CI), one worker in this process: the sync's variants
(torch views, a sharded state), the sampling controls against the `JaxSampler`, bad settings. One engine serves the
module (a start costs ~10 s); the warm-started model is `conftest.warm_tiny`'s. Parity after syncs, several syncs
and failed syncs, for this engine and the others: test_vllm_modes.py."""

import dataclasses
import os
import types

import jax
import numpy as np
import pytest

from mathrl_jax import sharding as S
from mathrl_jax.models import hf
from mathrl_jax.sampling import SamplingParams
from mathrl_jax.train.update._passes import policy_logprobs
from tests.sampling.conftest import LOGPROB_ATOL, require_vllm

require_vllm()

from mathrl_jax.sampling.vllm import VllmSampler  # noqa: E402


@pytest.fixture(scope="module")
def tiny(warm_tiny):
    engine = VllmSampler(
        warm_tiny.directory,
        config=warm_tiny.config,
        eos_token_ids=[warm_tiny.codec.eos_token_id],
        tokenizer=warm_tiny.codec,
        kv_cache_gib=0.25,
        dtype="float32",
    )
    yield types.SimpleNamespace(**vars(warm_tiny), engine=engine)
    engine.close()


def test_sampled_logprobs_equal_the_trainers_recomputed_ones(tiny):
    """At temperature 1 the engine's sampled-token log-probs are the trainer's (`passes.policy_logprobs`)."""
    tiny.engine.update_weights(tiny.state, version=1)
    rollouts = tiny.engine.generate(tiny.prompts[:16], SamplingParams(n=4, temperature=1.0, max_new_tokens=40, seed=3))
    batch = rollouts.to_batch(tiny.codec.pad_token_id)
    trainer, _ = policy_logprobs(tiny.graphdef, tiny.state, batch["input_ids"], batch["attention_mask"])
    trainer = np.asarray(trainer)
    mask = batch["response_mask"] > 0
    np.testing.assert_allclose(batch["sampler_logprobs"][mask], trainer[mask], atol=LOGPROB_ATOL)
    np.testing.assert_array_equal(batch["old_logprobs"][mask], batch["sampler_logprobs"][mask])


def test_a_sync_of_torch_views_of_the_jax_buffers(tiny):
    """The zero-copy sync (kernels as torch `.t()` views, the GPU default) loads the same weights: after it,
    from the random params, greedy decoding is the JAX sampler's on the warm-started ones again."""
    tiny.engine.update_weights(tiny.random_state, version=1)
    tiny.engine.transpose_in_torch = True
    try:
        tiny.engine.update_weights(tiny.state, version=2)
    finally:
        tiny.engine.transpose_in_torch = False
    params = SamplingParams(temperature=0.0, max_new_tokens=tiny.max_new_tokens)
    got = tiny.engine.generate(tiny.prompts[:16], params)
    want = tiny.jax_sampler(tiny.state).generate(tiny.prompts[:16], params)
    assert got.completion_ids == want.completion_ids
    for a, b in zip(got.policy_logprobs, want.policy_logprobs):
        np.testing.assert_allclose(a, b, atol=LOGPROB_ATOL)


def test_a_sync_from_a_state_sharded_over_four_devices(tiny):
    mesh = S.make_mesh({"dp": 1, "fsdp": 2, "tp": 2}, devices=jax.devices()[:4])
    config = hf.load_model(tiny.directory).config
    sharded = S.shard_tree(tiny.state, mesh, S.qwen_rules(config.num_key_value_heads, 2))
    leaves = jax.tree.leaves(sharded)
    assert any(len(x.sharding.device_set) > 1 for x in leaves)  # the sync gathers
    tiny.engine.update_weights(sharded, version=4)
    params = SamplingParams(temperature=0.0, max_new_tokens=tiny.max_new_tokens)
    got = tiny.engine.generate(tiny.prompts[:16], params)
    assert got.completion_ids == tiny.jax_sampler(tiny.state).generate(tiny.prompts[:16], params).completion_ids


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=3, temperature=1.0, max_new_tokens=6, seed=0),  # cut by the length limit
        SamplingParams(n=2, temperature=0.0, max_new_tokens=40, stop_token_ids=(5,)),  # a stop token
        SamplingParams(n=1, temperature=0.0, max_new_tokens=40, stop=("+",)),  # a stop string
        SamplingParams(n=1, temperature=0.0, max_new_tokens=40, stop=("=1", "\\b")),  # two, across tokens
    ],
    ids=["n3-length", "stop-token", "stop-string", "stop-strings"],
)
def test_n_stops_and_length_limits_end_completions_as_the_jax_sampler_does(tiny, params):
    tiny.engine.update_weights(tiny.state, version=5)
    prompts = tiny.prompts[:8]
    got = tiny.engine.generate(prompts, params)
    want = tiny.jax_sampler(tiny.state).generate(prompts, params)
    assert len(got) == len(prompts) * params.n
    np.testing.assert_array_equal(got.prompt_indices, np.repeat(np.arange(len(prompts)), params.n))
    assert got.finish_reasons == want.finish_reasons
    assert got.stop_reasons == want.stop_reasons
    if params.greedy:
        assert got.completion_ids == want.completion_ids
        assert got.texts == want.texts
    else:  # other random streams: the same limits
        assert [len(c) for c in got.completion_ids] == [len(c) for c in want.completion_ids] == [6] * len(got)
        assert all(np.all(lp <= 0) and np.all(np.isfinite(lp)) for lp in got.logprobs)


def test_seeded_sampling_of_a_batch_over_the_steps_token_budget(tiny):
    """64 prompts of ~90 tokens: more than a step's 4096-token budget, so prompts wait for later steps. On the CPU
    build a prefill split over steps crashed seeded sampling (its generator cannot rewind)."""
    tiny.engine.update_weights(tiny.state, version=9)
    prompts = [p * 12 for p in tiny.prompts]
    assert sum(len(p) for p in prompts) > 4096
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=11)
    first = tiny.engine.generate(prompts, params)
    assert len(first) == 128 and all(len(c) >= 1 for c in first.completion_ids)
    assert tiny.engine.generate(prompts, params).completion_ids == first.completion_ids  # the seed decides


def test_each_prompt_samples_with_its_own_seeds(tiny):
    """Equal prompts, one seed for the call: vLLM seeds sample j of a request with seed + j, so a shared seed gave
    every prompt the same noise and equal prompts equal completions. Near-uniform (random) weights: any two rows
    with their own noise differ."""
    tiny.engine.update_weights(tiny.random_state, version=12)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=3)
    rollouts = tiny.engine.generate([tiny.prompts[0]] * 6, params)
    assert len({tuple(c) for c in rollouts.completion_ids}) == 12
    assert tiny.engine.generate([tiny.prompts[0]] * 6, params).completion_ids == rollouts.completion_ids


def test_sampled_logprobs_are_the_tempered_distributions_and_policy_logprobs_wait_for_the_trainer(tiny):
    tiny.engine.update_weights(tiny.state, version=6)
    rollouts = tiny.engine.generate(tiny.prompts[:4], SamplingParams(n=2, temperature=0.7, max_new_tokens=16, seed=1))
    batch = rollouts.to_batch(tiny.codec.pad_token_id)
    trainer, _ = policy_logprobs(tiny.graphdef, tiny.state, batch["input_ids"], batch["attention_mask"], 0.7)
    trainer = np.asarray(trainer)
    mask = batch["response_mask"] > 0
    np.testing.assert_allclose(batch["sampler_logprobs"][mask], trainer[mask], atol=LOGPROB_ATOL)
    assert all(np.isnan(lp).all() for lp in rollouts.policy_logprobs)


def test_bad_settings_are_refused_with_their_value(tiny, tmp_path):
    config = hf.load_model(tiny.directory).config
    cases = [
        (dict(kv_cache_gib=0), "kv_cache_gib=0"),
        (dict(dtype="int8"), "dtype='int8'"),
        (dict(tensor_parallel_size=0), "tensor_parallel_size=0"),
        (dict(tensor_parallel_size=2, transfer="carrier-pigeon"), "carrier-pigeon"),
    ]
    if tiny.engine.on_cpu:
        cases.append((dict(enable_sleep_mode=True), "enable_sleep_mode=True: vLLM's CPU build has no sleep mode"))
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            VllmSampler(tiny.directory, config=config, **kwargs)
    with pytest.raises(FileNotFoundError, match="not a local checkpoint"):
        VllmSampler(str(tmp_path / "missing"), config=config)
    with pytest.raises(RuntimeError, match="enable_sleep_mode"):
        tiny.engine.sleep()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_greedy_with_a_repetition_penalty_is_the_jax_samplers(tiny):
    """vLLM penalizes the prompt's and the output's tokens before its greedy argmax, as the `JaxSampler` does: the
    same completions, which the penalty changed; vLLM's log-probs there are the penalized ones, so no policy's."""
    tiny.engine.update_weights(tiny.state, version=13)
    prompts = tiny.prompts[:8]
    params = SamplingParams(temperature=0.0, max_new_tokens=tiny.max_new_tokens, repetition_penalty=1.5)
    got = tiny.engine.generate(prompts, params)
    want = tiny.jax_sampler(tiny.state).generate(prompts, params)
    assert got.completion_ids == want.completion_ids
    assert got.finish_reasons == want.finish_reasons
    plain = tiny.jax_sampler(tiny.state).generate(prompts, dataclasses.replace(params, repetition_penalty=1.0))
    assert got.completion_ids != plain.completion_ids
    assert all(np.isnan(lp).all() for lp in got.policy_logprobs)
