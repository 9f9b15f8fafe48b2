"""`min_p` and `repetition_penalty` in the `JaxSampler` against an independent NumPy statement of vLLM's sampler
(penalties on the raw logits -> temperature -> min-p -> top-k -> top-p), and in the requests vLLM is sent."""

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import RepetitionPenaltyLogitsProcessor

from mathrl_jax.sampling import JaxSampler, SamplingParams
from mathrl_jax.sampling.decoding import filter_logits, penalize_repetitions, seen_tokens
from mathrl_jax.sampling.vllm.requests import Completion, request_fields, to_rollouts
from tests.sampling.conftest import require_vllm
from tests.sampling.test_jax_sampler import CONFIG, full_logits, peaked_model


def vllm_processed(logits, seen_ids=(), *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, penalty=1.0):
    """The probabilities vLLM samples one token from, in float64 NumPy, following vLLM's v1 `Sampler`:
    repetition penalty on the raw logits of the prompt's and output's token ids (divide if > 0, else multiply),
    temperature, min-p (drop p < min_p * max p), top-k, then top-p (keep tokens while the mass before is < top_p)."""
    logits = np.array(logits, np.float64)
    ids = np.unique(np.asarray(seen_ids, np.int64))
    if len(ids):
        logits[ids] = np.where(logits[ids] > 0, logits[ids] / penalty, logits[ids] * penalty)
    logits = logits / temperature
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    keep = probs >= min_p * probs.max()
    order = [t for t in np.argsort(-logits, kind="stable") if keep[t]]
    if top_k > 0:
        kth = logits[order[min(top_k, len(order)) - 1]]
        order = [t for t in order if logits[t] >= kth]
    probs = np.zeros_like(probs)
    probs[order] = np.exp(logits[order] - logits[order].max())
    probs /= probs.sum()
    mass, nucleus = 0.0, np.zeros(len(probs), bool)
    for token in order:
        if mass >= top_p:
            break
        nucleus[token] = True
        mass += probs[token]
    probs = np.where(nucleus, probs, 0.0)
    return probs / probs.sum()


def repetitive_prompt():
    """A prompt followed by its own greedy continuation: the peaked model repeats itself, so the most likely next
    tokens are in the prompt, where the penalty acts."""
    prompt = [5, 17, 33]
    for _ in range(8):
        prompt.append(int(np.argmax(full_logits(peaked_model(), prompt))))
    return prompt


def test_penalize_repetitions_is_transformers_repetition_penalty_processor():
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(4, 50)) * 3).astype(np.float32)
    ids = rng.integers(0, 50, size=(4, 12))
    mask = np.ones_like(ids)
    mask[:, :3] = 0  # left padding: not part of the prompt
    for penalty in (1.3, 0.6):
        seen = np.asarray(seen_tokens(ids, mask, 50))
        got = np.asarray(penalize_repetitions(logits, seen, np.float32(penalty)))
        # transformers' processor takes the prompt's real tokens (each row's, padding left out) as input_ids.
        for row in range(4):
            processor = RepetitionPenaltyLogitsProcessor(penalty)
            want = processor(torch.tensor(ids[row : row + 1, 3:]), torch.tensor(logits[row : row + 1]))[0].numpy()
            np.testing.assert_allclose(got[row], want, rtol=1e-6)
            untouched = ~np.isin(np.arange(50), ids[row, 3:])
            np.testing.assert_array_equal(got[row][untouched], logits[row][untouched])
            assert not np.allclose(got[row][~untouched], logits[row][~untouched])


def test_filter_logits_applies_min_p_before_top_k_and_top_p_as_vllm():
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(6, 40)) * 2).astype(np.float32)
    for min_p, top_k, top_p in [(0.1, 0, 1.0), (0.02, 5, 1.0), (0.05, 0, 0.6), (0.3, 3, 0.8), (1.0, 0, 1.0)]:
        filtered = np.asarray(filter_logits(logits, np.int32(top_k), np.float32(top_p), np.float32(min_p)))
        for row in range(6):
            want = vllm_processed(logits[row], top_k=top_k, top_p=top_p, min_p=min_p) > 0
            np.testing.assert_array_equal(np.isfinite(filtered[row]), want, err_msg=f"{min_p, top_k, top_p}")
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    kept = np.isfinite(np.asarray(filter_logits(logits, np.int32(0), np.float32(1.0), np.float32(0.1))))
    np.testing.assert_array_equal(kept, probs >= 0.1 * probs.max(-1, keepdims=True))  # the definition itself


@pytest.mark.parametrize(
    "temperature,top_k,min_p,penalty",
    [(1.0, 0, 0.1, 1.0), (1.0, 0, 0.0, 1.5), (0.8, 20, 0.05, 0.7), (1.3, 0, 0.02, 2.0)],
)
def test_first_token_distribution_is_vllms(temperature, top_k, min_p, penalty):
    """Chi-square of 4000 first tokens against the NumPy statement; the sampled log-probs are that distribution's,
    the policy log-probs the raw logits'."""
    model = peaked_model()
    prompt = repetitive_prompt()
    num = 4000
    params = SamplingParams(
        n=num, temperature=temperature, top_k=top_k, min_p=min_p, repetition_penalty=penalty, max_new_tokens=1, seed=4
    )
    rollouts = JaxSampler(model, pad_token_id=0).generate([prompt], params)
    raw = full_logits(model, prompt)
    expected = vllm_processed(raw, prompt, temperature=temperature, top_k=top_k, min_p=min_p, penalty=penalty)
    plain = vllm_processed(raw, temperature=temperature, top_k=top_k)
    assert 0.5 * np.abs(expected - plain).sum() > 0.05  # the knobs change this distribution: something to test
    tokens = np.array([c[0] for c in rollouts.completion_ids])
    counts = np.bincount(tokens, minlength=CONFIG.vocab_size)
    assert counts[expected == 0].sum() == 0, "sampled a token min_p / top_k remove"
    big = expected * num >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expect = np.append(expected[big], expected[~big].sum()) * num
    observed, expect = observed[expect > 0], expect[expect > 0]
    assert stats.chisquare(observed, expect).pvalue > 1e-3, (observed, expect)
    np.testing.assert_allclose(np.exp(np.concatenate(rollouts.logprobs)), expected[tokens], rtol=1e-4, atol=1e-6)
    policy = raw - raw.max() - np.log(np.exp(raw - raw.max()).sum())
    np.testing.assert_allclose(np.concatenate(rollouts.policy_logprobs), policy[tokens], atol=1e-4)


def test_greedy_with_a_repetition_penalty_takes_the_penalized_argmax_at_every_step():
    """Greedy decoding penalizes too (vLLM applies penalties before its argmax), over the prompt's tokens and every
    token generated so far: the stepwise argmax of the penalized full-forward logits, and not the plain greedy."""
    model = peaked_model()
    prompts = [[5, 17, 33, 9], [40, 41], repetitive_prompt()]
    plain = JaxSampler(model, pad_token_id=0).generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=12))
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, max_new_tokens=12)
    penalized = JaxSampler(model, pad_token_id=0).generate(prompts, params)
    changed = 0
    for prompt, completion, before in zip(prompts, penalized.completion_ids, plain.completion_ids):
        ids = list(prompt)
        for token in completion:
            raw = full_logits(model, ids)
            want = int(np.argmax(vllm_processed(raw, ids, penalty=2.0)))
            assert token == want
            changed += want != int(np.argmax(raw))
            ids.append(token)
        assert completion != before
    assert changed > 0
    # The plain greedy repeats tokens; the penalized one repeats fewer.
    repeats = lambda cs: sum(len(c) - len(set(c)) for c in cs)  # noqa: E731
    assert repeats(penalized.completion_ids) < repeats(plain.completion_ids)


@pytest.mark.parametrize("layout", ["one call", "compacted", "sub-batches"])
def test_sampled_logprobs_follow_the_penalty_over_the_generated_tokens(layout):
    """Every sampled token's log-prob is vLLM's processed one given the prompt and the tokens before it: the
    `seen` mask follows each row through compaction and sub-batches, which sample as one call does."""
    model = peaked_model()
    prompts = [[5 + i, 17, 33 + i, 9] for i in range(8)]
    knobs = dict(temperature=0.9, min_p=0.05, penalty=1.8)
    stops = tuple(int(t) for t in np.argsort(-full_logits(model, [5, 17, 33, 9]))[:4])  # rows end at various steps
    params = SamplingParams(
        n=2, temperature=0.9, min_p=0.05, repetition_penalty=1.8, max_new_tokens=10, seed=6, stop_token_ids=stops
    )
    probe = JaxSampler(model, pad_token_id=0)
    args = {
        "one call": {},
        "compacted": dict(compact_interval=3),
        "sub-batches": dict(kv_cache_gib=probe.kv_cache_bytes(2 * 2, 32) / 2**30),
    }[layout]
    rollouts = JaxSampler(model, pad_token_id=0, **args).generate(prompts, params)
    reference = probe.generate(prompts, params)
    assert rollouts.completion_ids == reference.completion_ids
    assert min(rollouts.completion_lengths) < 3 < max(rollouts.completion_lengths)  # rows left the batch early
    for prompt, completion, logprobs in zip(rollouts.prompt_ids, rollouts.completion_ids, rollouts.logprobs):
        ids = list(prompt)
        for token, logprob in zip(completion, logprobs):
            expected = vllm_processed(full_logits(model, ids), ids, **knobs)
            np.testing.assert_allclose(np.exp(logprob), expected[token], rtol=1e-4, atol=1e-6)
            ids.append(token)


@pytest.mark.parametrize(
    "field,value", [("min_p", 1.5), ("min_p", -0.1), ("repetition_penalty", 0.0), ("repetition_penalty", -1.0)]
)
def test_bad_values_are_named(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}={value}"):
        SamplingParams(**{field: value})


def test_vllm_requests_carry_the_knobs_and_policy_logprobs_only_where_they_are_the_policys():
    params = SamplingParams(n=2, temperature=1.0, min_p=0.1, repetition_penalty=1.3, max_new_tokens=4, seed=0)
    fields = request_fields(params, eos_token_ids=[2], seed=0)
    assert (fields["min_p"], fields["repetition_penalty"]) == (0.1, 1.3)
    defaults = request_fields(SamplingParams(), eos_token_ids=[2], seed=None)
    assert (defaults["min_p"], defaults["repetition_penalty"]) == (0.0, 1.0)
    sample = Completion([7, 8], np.array([-0.5, -0.25], np.float32), "length", None, ["1@t"])
    cases = [
        (SamplingParams(temperature=1.0, max_new_tokens=2), False),  # the policy's own log-probs
        (SamplingParams(temperature=1.0, min_p=0.1, max_new_tokens=2), True),
        (SamplingParams(temperature=1.0, repetition_penalty=1.3, max_new_tokens=2), True),
        (SamplingParams(temperature=0.0, max_new_tokens=2), False),  # greedy: the step's log-probs
        (SamplingParams(temperature=0.0, repetition_penalty=1.3, max_new_tokens=2), True),  # penalized ones
    ]
    for p, unknown in cases:
        rollouts = to_rollouts([[1, 2]], [[sample]], p, policy_version=1)
        assert np.isnan(rollouts.policy_logprobs[0]).all() == unknown, p
        assert np.isfinite(rollouts.logprobs[0]).all()


def test_vllm_takes_the_request_fields():
    """vLLM's own `SamplingParams` accepts the fields and holds the values (its checks included: a bad value
    would raise there)."""
    vllm = require_vllm()
    params = SamplingParams(n=2, temperature=0.8, min_p=0.1, repetition_penalty=1.3, max_new_tokens=4, seed=0)
    built = vllm.SamplingParams(**request_fields(params, eos_token_ids=[2], seed=0))
    assert (built.min_p, built.repetition_penalty) == (0.1, 1.3)
