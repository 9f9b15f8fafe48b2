"""JaxSampler against the full forward pass: greedy decoding, log-probs, the sampling
distribution (chi-square), stopping, reproducibility, bucketing and sharding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from mathrl_jax import sharding as S
from mathrl_jax.models import QwenForCausalLM, char_tokenizer, tiny_config
from mathrl_jax.sampling import JaxSampler, Rollouts, SamplingParams, filter_logits
from mathrl_jax.sampling.decoding import decode, prefill
from mathrl_jax.sampling.jax_sampler import SamplerMemoryError

CONFIG = tiny_config(num_hidden_layers=2)
PROMPTS = [[5, 17, 33, 9], [40, 41], [7, 8, 9, 10, 11, 12, 13]]


@functools.lru_cache(maxsize=None)
def peaked_model():
    """The tiny model with weights scaled up so its next-token distributions are far from uniform
    (the 0.02 init gives nearly flat logits, where argmax ties would make greedy tests fragile)."""
    model = QwenForCausalLM(CONFIG, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda x: x * 8.0 if x.ndim == 2 else x, state)
    return nnx.merge(graphdef, state)


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids):
    logits, _ = nnx.merge(graphdef, state)(ids)
    return logits


def full_logits(model, ids, width=64):
    """Next-token logits `[V]` after `ids`, from a cache-less forward of the whole sequence.

    The sequence is right-padded to a fixed width (causal attention: padding after
    the last token cannot change its logits), so every call reuses one program.
    """
    padded = np.zeros((1, width), np.int32)
    padded[0, : len(ids)] = ids
    graphdef, state = nnx.split(model)
    logits = _forward(graphdef, state, jnp.asarray(padded))
    return np.asarray(logits[0, len(ids) - 1], np.float64)


def test_greedy_equals_stepwise_argmax_of_full_forward():
    model = peaked_model()
    sampler = JaxSampler(model, pad_token_id=0)
    rollouts = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12))
    assert rollouts.finish_reasons == ["length"] * len(PROMPTS)
    for prompt, completion in zip(PROMPTS, rollouts.completion_ids):
        ids = list(prompt)
        for token in completion:
            assert token == int(np.argmax(full_logits(model, ids)))
            ids.append(token)
    assert all(np.all(lp == 0.0) for lp in rollouts.logprobs)  # greedy: a point mass


def trainer_logprobs(model, rollouts: Rollouts):
    """Log-probs of the completions recomputed as the trainer does: one padded forward pass."""
    batch = rollouts.to_batch(pad_id=0)
    logits, _ = model(jnp.asarray(batch["input_ids"]), attention_mask=jnp.asarray(batch["attention_mask"]))
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    token_logp = jnp.take_along_axis(logp, jnp.asarray(batch["input_ids"])[:, 1:, None], axis=-1)[..., 0]
    token_logp = np.pad(np.asarray(token_logp), ((0, 0), (1, 0)))  # column c holds log p(token c)
    return batch, token_logp


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_match_trainer_recomputation(temperature, top_p):
    model = peaked_model()
    sampler = JaxSampler(model, pad_token_id=0, eos_token_ids=[2])
    params = SamplingParams(n=3, temperature=temperature, top_p=top_p, max_new_tokens=10, seed=3)
    rollouts = sampler.generate(PROMPTS, params)
    batch, token_logp = trainer_logprobs(model, rollouts)
    mask = batch["response_mask"] > 0
    np.testing.assert_allclose(batch["old_logprobs"][mask], token_logp[mask], atol=1e-4)
    if temperature == 1.0 and top_p == 1.0:  # the sampling distribution is the policy itself
        np.testing.assert_allclose(batch["sampler_logprobs"][mask], batch["old_logprobs"][mask], atol=1e-5)
    else:  # sampler log-probs come from the tempered, filtered distribution: never below the policy's mass
        assert np.all(batch["sampler_logprobs"][mask] <= 0.0)
        assert not np.allclose(batch["sampler_logprobs"][mask], batch["old_logprobs"][mask], atol=1e-3)


def intended_distribution(logits, temperature, top_k, top_p):
    """Independent NumPy statement of temperature -> top-k -> top-p, as vLLM / HF define them."""
    scaled = logits / temperature
    order = np.argsort(-scaled, kind="stable")
    keep = np.zeros_like(scaled, bool)
    k = len(scaled) if top_k <= 0 else top_k
    keep[order[:k]] = True
    probs = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
    probs /= probs.sum()
    mass = 0.0
    nucleus = np.zeros_like(keep)
    for token in order:
        if not keep[token] or mass >= top_p:
            break
        nucleus[token] = True
        mass += probs[token]
    probs = np.where(nucleus, probs, 0.0)
    return probs / probs.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 0, 0.9), (1.3, 5, 1.0), (1.0, 20, 0.7)])
def test_sampled_token_distribution_matches_intended(temperature, top_k, top_p):
    model = peaked_model()
    sampler = JaxSampler(model, pad_token_id=0)
    num = 4000
    prompt = [5, 17, 33]
    params = SamplingParams(n=num, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=1, seed=11)
    rollouts = sampler.generate([prompt], params)
    counts = np.bincount([c[0] for c in rollouts.completion_ids], minlength=CONFIG.vocab_size)
    expected = intended_distribution(full_logits(model, prompt), temperature, top_k, top_p)
    assert counts[expected == 0].sum() == 0, "sampled a token the filters remove"
    # Chi-square over bins with enough expected mass; the rare tail is merged into one bin.
    big = expected * num >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expect = np.append(expected[big], expected[~big].sum()) * num
    observed, expect = observed[expect > 0], expect[expect > 0]
    p_value = stats.chisquare(observed, expect).pvalue
    assert p_value > 1e-3, (p_value, observed, expect)
    # And the returned sampling log-probs are those of the intended distribution.
    tokens = np.array([c[0] for c in rollouts.completion_ids])
    np.testing.assert_allclose(np.exp(np.concatenate(rollouts.logprobs)), expected[tokens], rtol=1e-4, atol=1e-6)


def test_filter_logits_keeps_first_token_and_matches_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 30)).astype(np.float32) * 3
    for top_k, top_p in [(0, 0.05), (3, 1.0), (7, 0.6), (0, 1.0)]:
        filtered = np.asarray(filter_logits(jnp.asarray(logits), jnp.int32(top_k), jnp.float32(top_p)))
        for row in range(6):
            expected = intended_distribution(logits[row].astype(np.float64), 1.0, top_k, top_p) > 0
            np.testing.assert_array_equal(np.isfinite(filtered[row]), expected)
            assert np.isfinite(filtered[row, np.argmax(logits[row])])


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch():
    sampler = JaxSampler(peaked_model(), pad_token_id=0)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=7)
    first = sampler.generate(PROMPTS, params)
    again = sampler.generate(PROMPTS, params)
    assert first.completion_ids == again.completion_ids
    alone = sampler.generate(PROMPTS[:1], params)  # a smaller batch bucket, same rows for prompt 0
    assert alone.completion_ids == first.completion_ids[:4]
    other = sampler.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=8))
    assert other.completion_ids != first.completion_ids
    np.testing.assert_array_equal(first.prompt_indices, np.repeat(np.arange(3), 4))


def greedy_reference(max_new_tokens=12):
    sampler = JaxSampler(peaked_model(), pad_token_id=0)
    return sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)).completion_ids


def test_per_sample_stop_on_eos_and_length():
    reference = greedy_reference()
    eos = reference[0][4]  # prompt 0 emits this token 5th; other prompts may or may not
    sampler = JaxSampler(peaked_model(), pad_token_id=0, eos_token_ids=[eos])
    rollouts = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12))
    for ref, completion, reason, stop in zip(
        reference, rollouts.completion_ids, rollouts.finish_reasons, rollouts.stop_reasons
    ):
        if eos in ref:
            cut = ref.index(eos) + 1
            assert (completion, reason, stop) == (ref[:cut], "stop", eos)
        else:
            assert (completion, reason, stop) == (ref, "length", None)
    assert rollouts.finish_reasons[0] == "stop" and len(rollouts.completion_ids[0]) == 5
    short = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=3, stop_token_ids=[eos]))
    assert short.finish_reasons == ["length"] * 3 and list(short.completion_lengths) == [3, 3, 3]


class CharTokenizer:
    """The project's real character tokenizer, with the `decode(ids, skip_special_tokens)` of HF."""

    def __init__(self):
        self.tokenizer = char_tokenizer.build_char_tokenizer()

    def encode(self, text):
        return self.tokenizer.encode(text).ids

    def decode(self, ids, skip_special_tokens=True):
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_stop_strings_cut_after_the_completing_token():
    tokenizer = CharTokenizer()
    reference = greedy_reference(max_new_tokens=40)
    text = tokenizer.decode(reference[1])
    stop = text[9:11]  # a 2-character string that first appears somewhere in prompt 1's greedy text
    sampler = JaxSampler(peaked_model(), pad_token_id=0, tokenizer=tokenizer, stop_check_interval=4)
    rollouts = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=40, stop=[stop]))
    for ref, completion, reason, stop_reason, completion_text in zip(
        reference, rollouts.completion_ids, rollouts.finish_reasons, rollouts.stop_reasons, rollouts.texts
    ):
        ref_text = tokenizer.decode(ref)
        if stop in ref_text:
            end = ref_text.index(stop) + len(stop)  # one token per character here
            assert (completion, reason, stop_reason) == (ref[:end], "stop", stop)
            assert completion_text.endswith(stop) and completion_text.count(stop) == 1
        else:
            assert (completion, reason, stop_reason) == (ref, "length", None)
    assert rollouts.finish_reasons[1] == "stop"


def test_string_prompts_need_a_tokenizer_and_bad_ids_are_named():
    sampler = JaxSampler(peaked_model(), pad_token_id=0)
    with pytest.raises(ValueError, match="no tokenizer"):
        sampler.generate(["1+1="], SamplingParams())
    with pytest.raises(ValueError, match="prompt 1 has token ids outside"):
        sampler.generate([[1, 2], [3, 100000]], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


def test_shapes_are_bucketed_so_new_lengths_do_not_recompile():
    sampler = JaxSampler(peaked_model(), pad_token_id=0)
    sampler.generate([[1, 2, 3]], SamplingParams(n=2, max_new_tokens=10, seed=0))
    sampler.generate([[1, 2, 3]], SamplingParams(n=2, max_new_tokens=10, temperature=0.5, top_p=0.8, seed=1))
    compiled = prefill._cache_size(), decode._cache_size()
    # Other prompt lengths, lengths limits, temperatures, top-p and seeds within the same buckets:
    sampler.generate([[4, 5, 6, 7, 8, 9]], SamplingParams(n=2, max_new_tokens=13, temperature=0.5, top_p=0.8, seed=1))
    sampler.generate([[4, 5]], SamplingParams(n=2, max_new_tokens=16, temperature=0.9, top_p=0.7, seed=2))
    sampler.generate([[4, 5, 6, 7, 8]], SamplingParams(n=2, max_new_tokens=9, temperature=1.1, seed=3))
    assert (prefill._cache_size(), decode._cache_size()) == compiled


def test_update_weights_changes_outputs_and_version():
    model = peaked_model()
    sampler = JaxSampler(model, pad_token_id=0)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    before = sampler.generate(PROMPTS, params)
    other = nnx.state(QwenForCausalLM(CONFIG, rngs=nnx.Rngs(1)))
    other = jax.tree.map(lambda x: x * 8.0 if x.ndim == 2 else x, other)
    sampler.update_weights(other, version=5)
    after = sampler.generate(PROMPTS, params)
    assert after.policy_version == 5 and before.policy_version == 0
    assert after.completion_ids != before.completion_ids
    expected = JaxSampler(nnx.merge(nnx.graphdef(model), other), pad_token_id=0).generate(PROMPTS, params)
    assert after.completion_ids == expected.completion_ids


@pytest.mark.parametrize(
    "shape", [(2, 1, 2), pytest.param((1, 2, 4), marks=pytest.mark.slow)], ids=lambda s: "dp{}-fsdp{}-tp{}".format(*s)
)
def test_sharded_sampler_matches_single_device(shape):
    mesh = S.make_mesh(dict(zip(S.AXES, shape)), devices=jax.devices()[: int(np.prod(shape))])
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=5)
    reference = JaxSampler(peaked_model(), pad_token_id=0).generate(PROMPTS, params)
    sampler = JaxSampler(peaked_model(), pad_token_id=0, mesh=mesh)
    rollouts = sampler.generate(PROMPTS, params)
    q_kernel = sampler.state["model"]["layers"][0]["self_attn"]["q_proj"]["kernel"][...]
    assert q_kernel.sharding.spec == S.spec_for(
        "model/layers/0/self_attn/q_proj/kernel", q_kernel.shape, sampler.rules, mesh
    )
    assert rollouts.completion_ids == reference.completion_ids
    for a, b in zip(rollouts.policy_logprobs, reference.policy_logprobs):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_to_batch_aligns_completion_tokens_and_logprobs():
    rollouts = Rollouts(
        prompt_ids=[[1, 2, 3], [4]],
        completion_ids=[[5, 6], [7, 8, 9]],
        logprobs=[np.array([-0.1, -0.2], np.float32), np.array([-0.3, -0.4, -0.5], np.float32)],
        policy_logprobs=[np.array([-1.0, -2.0], np.float32), np.array([-3.0, -4.0, -5.0], np.float32)],
        finish_reasons=["stop", "length"],
        stop_reasons=[6, None],
        prompt_indices=np.array([0, 1], np.int32),
        policy_version=0,
    )
    batch = rollouts.to_batch(pad_id=0)
    np.testing.assert_array_equal(batch["input_ids"], [[1, 2, 3, 5, 6, 0], [0, 0, 4, 7, 8, 9]])
    np.testing.assert_array_equal(batch["attention_mask"], [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(batch["response_mask"], [[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(batch["old_logprobs"][1, 3:], [-3.0, -4.0, -5.0])
    assert batch["prompt_length"] == 3
    with pytest.raises(ValueError, match="finish_reasons"):
        Rollouts([[1]], [[2]], [np.zeros(1)], [np.zeros(1)], ["eos"], [None], np.zeros(1, np.int32), 0)


def test_padding_of_prompts_does_not_change_greedy_output():
    sampler = JaxSampler(peaked_model(), pad_token_id=0, min_prompt_bucket=16)
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    alone = sampler.generate([PROMPTS[1]], params).completion_ids[0]
    wide = JaxSampler(peaked_model(), pad_token_id=0, min_prompt_bucket=64).generate(PROMPTS, params)
    assert wide.completion_ids[1] == alone


def test_a_remat_model_samples_as_the_plain_one():
    # Remat applies to cache-less (training) passes only: inside the decode loop nnx.remat would update the
    # module from another trace level (the recipes' remat=True crashed there).
    plain = peaked_model()
    graphdef, state = nnx.split(QwenForCausalLM(tiny_config(num_hidden_layers=2, remat=True), rngs=nnx.Rngs(0)))
    remat = nnx.merge(graphdef, nnx.state(plain))
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=3)
    got = JaxSampler(remat, pad_token_id=0).generate(PROMPTS, params)
    want = JaxSampler(plain, pad_token_id=0).generate(PROMPTS, params)
    assert [list(c) for c in got.completion_ids] == [list(c) for c in want.completion_ids]
    for a, b in zip(got.policy_logprobs, want.policy_logprobs):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_kv_cache_budget_runs_sub_batches_that_sample_as_the_whole_batch():
    """With `kv_cache_gib` below the batch's cache, the prompts run a power-of-two number at a time; every row
    draws what it draws in one call (its keys come from its row in the whole batch)."""
    model = peaked_model()
    prompts = PROMPTS * 3  # 9 prompts
    params = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, seed=3)
    whole = JaxSampler(model, pad_token_id=0).generate(prompts, params)
    slots = 16 + 16  # the minimum prompt and generation buckets
    probe = JaxSampler(model, pad_token_id=0)
    sampler = JaxSampler(model, pad_token_id=0, kv_cache_gib=probe.kv_cache_bytes(2 * 2 + 1, slots) / 2**30)
    assert sampler.prompts_per_call(len(prompts), 2, slots) == 2
    # A row's repetition-penalty mask counts too: a mask the size of a row's cache halves what fits.
    assert sampler.prompts_per_call(len(prompts), 2, slots, probe.kv_cache_bytes(1, slots)) == 1
    calls = []
    prefill_program = sampler._prefill
    sampler._prefill = lambda *a, **k: calls.append(a[1].shape) or prefill_program(*a, **k)
    split = sampler.generate(prompts, params)
    assert calls == [(2, 16)] * 5  # 2 + 2 + 2 + 2 + 1 prompts, the last padded to the same shape
    assert split.completion_ids == whole.completion_ids
    assert split.finish_reasons == whole.finish_reasons
    np.testing.assert_array_equal(split.prompt_indices, whole.prompt_indices)
    for a, b in zip(split.logprobs + split.policy_logprobs, whole.logprobs + whole.policy_logprobs):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_prefill_attends_over_the_prompt_width_only():
    """The prefill's cost does not grow with the generation bucket: the prompts attend over their own P slots,
    not the P + G of the cache the decode fills."""
    graphdef, state = nnx.split(peaked_model())
    ids = jnp.ones((2, 16), jnp.int32)

    def flops(generation_bucket):
        lowered = prefill.lower(
            state, ids, ids, graphdef=graphdef, samples_per_prompt=1, cache_length=16 + generation_bucket
        )
        return lowered.compile().cost_analysis()["flops"]

    assert flops(2048) < 1.01 * flops(16)


def test_running_out_of_device_memory_names_the_option_that_bounds_it():
    sampler = JaxSampler(peaked_model(), pad_token_id=0)
    slots = 2**50 // sampler.kv_cache_bytes(1, 1)  # a cache of a PiB per row: no allocator grants it
    with pytest.raises(SamplerMemoryError, match=r"kv_cache_gib \(now None"):
        sampler.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=int(slots)))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_compaction_drops_finished_rows_and_samples_as_without_it(temperature):
    """With `compact_interval`, the decode moves the running rows into a batch a quarter as large once they fit:
    later steps compute fewer rows, and every row's completion, log-probs and finish are those without it."""
    model = peaked_model()
    prompts = [[5 + i, 17, 33 + i, 9] for i in range(16)]
    # Common tokens as stop ids: rows end at different steps, most early.
    stops = [int(t) for t in np.argsort(-full_logits(model, [5, 17, 33, 9]))[:4]]
    params = SamplingParams(temperature=temperature, max_new_tokens=48, stop_token_ids=stops, seed=2)
    plain = JaxSampler(model, pad_token_id=0).generate(prompts, params)
    sampler = JaxSampler(model, pad_token_id=0, compact_interval=4)
    rows = []
    decode_program = sampler._decode
    sampler._decode = lambda state, carry, *a, **k: (
        rows.append(carry["tokens"].shape[0]) or decode_program(state, carry, *a, **k)
    )
    compacted = sampler.generate(prompts, params)
    lengths = plain.completion_lengths
    assert lengths.min() <= 4 and lengths.max() > 8  # rows end at different steps: something to compact
    assert rows[0] == 16 and min(rows) < 16 and rows == sorted(rows, reverse=True), rows
    assert compacted.completion_ids == plain.completion_ids
    assert compacted.finish_reasons == plain.finish_reasons and compacted.stop_reasons == plain.stop_reasons
    for a, b in zip(compacted.logprobs + compacted.policy_logprobs, plain.logprobs + plain.policy_logprobs):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _lora_model(seed):
    """The peaked tiny model with LoRA adapters on q, v and down, moved off B = 0 (`seed` draws them)."""
    config = tiny_config(num_hidden_layers=2, lora_rank=4, lora_alpha=8.0, lora_targets="q_proj,v_proj,down_proj")
    graphdef, adapters, base = nnx.split(QwenForCausalLM(config, rngs=nnx.Rngs(0)), nnx.LoRAParam, ...)
    base = jax.tree.map(lambda x: x * 8.0 if x.ndim == 2 else x, base)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    adapters = jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    return nnx.merge(graphdef, adapters, base)


def test_a_lora_policy_merged_at_each_sync_samples_as_the_adapted_model():
    """`lora_sync="merged"` decodes a plain model (no adapter left in its graph) whose kernels are W + s A B; it
    draws the tokens the adapted model draws, with its log-probs, and follows new adapters at each sync."""
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
    first, second = _lora_model(1), _lora_model(2)
    merged = JaxSampler(first, pad_token_id=0, lora_sync="merged")
    adapted = JaxSampler(first, pad_token_id=0, lora_sync="adapter")
    assert not any(isinstance(v, nnx.LoRAParam) for _, v in nnx.iter_graph(nnx.merge(merged.graphdef, merged.state)))
    for version, model in enumerate((first, second)):
        for sampler in (merged, adapted):
            sampler.update_weights(nnx.state(model), version)
        got, want = merged.generate(PROMPTS, params), adapted.generate(PROMPTS, params)
        assert got.completion_ids == want.completion_ids and got.policy_version == version
        for a, b in zip(got.policy_logprobs, want.policy_logprobs):
            np.testing.assert_allclose(a, b, atol=2e-5)
    fresh = JaxSampler(first, pad_token_id=0).generate(PROMPTS, params)
    assert fresh.completion_ids != got.completion_ids  # the second adapters changed what is drawn
    with pytest.raises(ValueError, match="lora_sync='both'"):
        JaxSampler(first, pad_token_id=0, lora_sync="both")


def test_a_generate_during_a_merged_sync_waits_for_the_new_weights(monkeypatch):
    """A sync holds the sampler's lock from the merge to the new weights' placement: a generate that comes in
    between (another thread, as in asynchronous training) waits and samples with them. (Before: the merged copy was
    dropped and remade under the lock, placed on the mesh outside it, and such a generate found no weights.)"""
    import threading

    from mathrl_jax.sharding import rules

    mesh = S.make_mesh({"dp": 1, "fsdp": 1, "tp": 2}, devices=jax.devices()[:2])
    sampler = JaxSampler(_lora_model(1), pad_token_id=0, mesh=mesh)
    placing, release = threading.Event(), threading.Event()
    place = rules.shard_tree

    def slow_place(*args):
        placing.set()
        release.wait(30)
        return place(*args)

    monkeypatch.setattr(rules, "shard_tree", slow_place)
    sync = threading.Thread(target=sampler.update_weights, args=(nnx.state(_lora_model(2)), 1))
    sync.start()
    assert placing.wait(30)
    got = {}

    def generate():
        try:
            got["rollouts"] = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=4))
        except Exception as error:  # noqa: BLE001  (reported below)
            got["error"] = error

    reader = threading.Thread(target=generate)
    reader.start()
    reader.join(1.0)  # it waits on the lock
    release.set()
    sync.join(30)
    reader.join(60)
    assert "error" not in got, got.get("error")
    assert got["rollouts"].policy_version == 1
