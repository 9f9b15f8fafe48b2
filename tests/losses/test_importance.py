"""Sampler-trainer mismatch metrics and truncated importance sampling (TIS), against float64 NumPy, and TIS as
the trainer applies it (weights on the advantages) against a per-token weighted PPO loss computed independently."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mathrl_jax.losses import ppo_clip_loss, reinforce_loss, sampler_mismatch_metrics, truncated_importance_weights
from tests.losses import np_reference_policy as ref

B, T = 5, 9


def arrays(seed, spread=1.0):
    rng = np.random.RandomState(seed)
    trainer = -rng.exponential(1.0, (B, T))
    sampler = trainer + rng.normal(0.0, spread, (B, T))  # a sampler that disagrees, sometimes a lot
    mask = (rng.rand(B, T) < 0.7).astype(np.float32)
    mask[0] = 0.0  # an empty row
    return trainer.astype(np.float32), sampler.astype(np.float32), mask


def np_weights(trainer, sampler, mask, cap):
    out = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                log_ratio = min(max(float(trainer[b, t]) - float(sampler[b, t]), -20.0), 20.0)
                out[b, t] = min(math.exp(log_ratio), cap)
    return out


@given(seed=st.integers(0, 2**31 - 1), cap=st.sampled_from([0.5, 1.0, 2.0, 5.0]))
def test_weights_are_the_truncated_ratio_on_masked_tokens(seed, cap):
    trainer, sampler, mask = arrays(seed)
    weights, metrics = truncated_importance_weights(trainer, sampler, mask, cap=cap)
    want = np_weights(trainer, sampler, mask, cap)
    np.testing.assert_allclose(np.asarray(weights), want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(metrics["weight_mean"]), (want * mask).sum() / (mask.sum() + 1e-8), rtol=1e-5)
    ratio = np.exp(trainer.astype(np.float64) - sampler)
    truncated = ((ratio > cap) * mask).sum() / (mask.sum() + 1e-8)
    np.testing.assert_allclose(float(metrics["truncated_fraction"]), truncated, rtol=1e-5, atol=1e-7)


def test_weights_carry_no_gradient():
    trainer, sampler, mask = arrays(0)
    grads = jax.grad(lambda t, s: truncated_importance_weights(t, s, mask, cap=2.0)[0].sum(), argnums=(0, 1))(
        jnp.asarray(trainer), jnp.asarray(sampler)
    )
    assert all(float(jnp.abs(g).max()) == 0.0 for g in grads)


def test_a_bad_cap_is_refused():
    trainer, sampler, mask = arrays(0)
    with pytest.raises(ValueError, match="cap=0"):
        truncated_importance_weights(trainer, sampler, mask, cap=0)


@given(seed=st.integers(0, 2**31 - 1))
def test_mismatch_metrics(seed):
    trainer, sampler, mask = arrays(seed, spread=0.8)
    got = sampler_mismatch_metrics(trainer, sampler, mask)
    on = mask > 0
    diff = trainer.astype(np.float64) - sampler
    np.testing.assert_allclose(float(got["logprob_diff"]), np.abs(diff[on]).mean(), rtol=1e-5)
    ratio = np.exp(diff[on])
    np.testing.assert_allclose(float(got["ratio_outside"]), ((ratio < 0.5) | (ratio > 2.0)).mean(), rtol=1e-5)
    np.testing.assert_allclose(float(got["kl_sampler_trainer"]), (-diff[on]).mean(), rtol=1e-4, atol=1e-6)


@given(
    seed=st.integers(0, 2**31 - 1),
    clip_c=st.sampled_from([None, 3.0]),
    mode=st.sampled_from(["token-mean", "seq-mean-token-mean"]),
)
def test_weighted_advantages_are_the_per_token_weighted_ppo_loss(seed, clip_c, mode):
    """How the trainer applies TIS (`train.batch.sampler_correction`): w * A in the loss equals sum_t w_t l_t
    aggregated as the loss is, with l_t the PPO token loss of the unweighted advantage (float64 reference)."""
    rng = np.random.RandomState(seed)
    trainer, sampler, mask = arrays(seed)
    logprobs = trainer + rng.normal(0.0, 0.3, (B, T)).astype(np.float32)
    advantages = rng.normal(0.0, 1.0, (B, T)).astype(np.float32)
    weights = np_weights(trainer, sampler, mask, 2.0)
    loss, _ = ppo_clip_loss(
        logprobs, trainer, advantages * weights.astype(np.float32), mask, clip_c=clip_c, loss_agg_mode=mode
    )
    per_token = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            r = math.exp(min(max(float(logprobs[b, t]) - float(trainer[b, t]), -20.0), 20.0))
            per_token[b, t] = weights[b, t] * ref._surrogate(r, float(advantages[b, t]), 0.2, 0.2, clip_c)[0]
    np.testing.assert_allclose(float(loss), ref.aggregate(per_token, mask, mode, None, None), rtol=2e-5, atol=1e-6)
    # REINFORCE: -A logp per token, weighted the same way.
    loss, _ = reinforce_loss(logprobs, trainer, advantages * weights.astype(np.float32), mask)
    want = ref.aggregate(-weights * advantages * logprobs, mask, "token-mean", None, None)
    np.testing.assert_allclose(float(loss), want, rtol=2e-5, atol=1e-6)


def test_the_trainer_applies_the_weights_to_the_advantages_and_logs_the_mismatch():
    """`train.batch.sampler_correction`: advantages times the weights with `tis_cap`, untouched without; the
    mismatch metrics only where the sampler filters no token (top_p 1, no top_k)."""
    from mathrl_jax.train import algorithms
    from mathrl_jax.train.batch import BatchSettings
    from mathrl_jax.train.batch._prepare import sampler_correction

    trainer, sampler, mask = arrays(4)
    advantages = np.random.RandomState(5).normal(size=(B, T)).astype(np.float32) * mask
    batch = {"response_mask": jnp.asarray(mask), "advantages": jnp.asarray(advantages)}

    def config(top_p=1.0, tis_cap=None):  # the batch's section, as the build makes it from these settings
        return BatchSettings(algorithms.ALGORITHMS["grpo"], 32, tis_cap=tis_cap, sampler_filters=top_p < 1.0)

    out, metrics = sampler_correction(config(tis_cap=2.0), batch, trainer, sampler)
    np.testing.assert_allclose(
        np.asarray(out["advantages"]), advantages * np_weights(trainer, sampler, mask, 2.0), rtol=1e-5, atol=1e-7
    )
    assert {"rollout/tis_weight_mean", "rollout/tis_truncated_fraction", "rollout/sampler_logprob_diff"} <= set(metrics)
    out, metrics = sampler_correction(config(), batch, trainer, sampler)
    np.testing.assert_array_equal(np.asarray(out["advantages"]), advantages)
    assert "rollout/sampler_ratio_outside" in metrics and not any(k.startswith("rollout/tis") for k in metrics)
    out, metrics = sampler_correction(config(top_p=0.9, tis_cap=2.0), batch, trainer, sampler)
    assert "rollout/sampler_logprob_diff" not in metrics and "rollout/tis_weight_mean" in metrics
