"""The sort-free filter (`token_filter.filter_logits`) keeps exactly the tokens a sorted filter keeps, and the
two-stage draw (`decoding.draw_in_two_stages`) samples the softmax of what is kept.

The reference sorts each row in float64 NumPy (vLLM's order: min-p, top-k, then top-p: keep tokens while the mass
before them is below top_p, ties kept together). The check is exact: a filter that keeps or drops one token more
than the reference fails it (tested with two such filters)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from mathrl_jax.sampling import filter_logits
from mathrl_jax.sampling.decoding import DRAW_BLOCK, draw_in_two_stages
from mathrl_jax.sampling.token_filter import CANDIDATES, ordered_keys

REAL_VOCAB = 151_936


def sorted_reference(logits, top_k, top_p, min_p):
    """`[N, V]` bool: the tokens a sorted filter keeps, in float64, and each row's nucleus margin: how far the
    mass before the boundary tokens lies from top_p (a row within float32 rounding of it is ambiguous)."""
    logits = np.asarray(logits, np.float64)
    keep = np.zeros(logits.shape, bool)
    margins = []
    for row, x in enumerate(logits):
        probs = np.exp(x - x.max())
        x = np.where(probs / probs.sum() < min_p * (probs.max() / probs.sum()), -np.inf, x)
        order = np.argsort(-x, kind="stable")
        descending = x[order]
        if top_k > 0:
            kth = descending[min(top_k, len(x)) - 1]
            x = np.where(x < kth, -np.inf, x)
            descending = np.where(descending < kth, -np.inf, descending)
        probs = np.exp(descending - descending[0])
        probs /= probs.sum()
        before = np.cumsum(probs) - probs
        # ties: a value's mass before is that of its first (largest-mass-before-free) occurrence
        first = np.searchsorted(-descending, -descending, side="left")
        before = before[first]
        kept = before < top_p if top_p < 1.0 else np.ones_like(before, bool)
        threshold = descending[kept].min()
        keep[row] = (x >= threshold) & np.isfinite(x)
        if top_p < 1.0:
            margins.append(np.abs(before[np.isfinite(descending)] - top_p).min())
    return keep, (min(margins) if margins else np.inf)


def assert_filters_as_sorted(filter_fn, logits, top_k, top_p, min_p=0.0):
    want, margin = sorted_reference(logits, top_k, top_p, min_p)
    assert margin > 1e-6, "a case on float32 rounding's edge tests nothing: change the seed"
    got = np.isfinite(np.asarray(filter_fn(jnp.asarray(logits), np.int32(top_k), np.float32(top_p), np.float32(min_p))))
    mismatched = np.flatnonzero((got != want).any(-1))
    assert not len(mismatched), (
        f"rows {mismatched.tolist()}: kept {got[mismatched].sum(-1).tolist()}, sorted keeps {want[mismatched].sum(-1)}"
    )
    return want


def random_logits(rows, vocab, scale, seed, ties=False):
    logits = np.random.default_rng(seed).normal(size=(rows, vocab)) * scale
    if ties:  # few distinct values: whole groups of equal logits sit at each threshold
        logits = np.round(logits * 2) / 2
    return logits.astype(np.float32)


CASES = [  # (top_k, top_p, min_p)
    (0, 0.9, 0.0),
    (0, 0.3, 0.0),
    (0, 0.95, 0.02),
    (1, 1.0, 0.0),
    (7, 1.0, 0.0),
    (CANDIDATES, 0.99, 0.0),
    (CANDIDATES + 1, 1.0, 0.0),  # past the candidates: the k-th largest found by bisection
    (2000, 0.8, 0.0),
    (40, 0.7, 0.05),
    (0, 1.0, 0.1),
]


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0], ids=["flat", "spread", "peaked"])
def test_the_sort_free_filter_keeps_what_a_sorted_filter_keeps(scale, ties):
    logits = random_logits(6, 3000, scale, seed=int(scale * 10) + ties, ties=ties)
    for top_k, top_p, min_p in CASES:
        assert_filters_as_sorted(jax.jit(filter_logits), logits, top_k, top_p, min_p)


def test_at_the_real_vocabulary_both_ways_of_finding_the_nucleus_agree_with_sorting():
    """V = 151,936: a flat row's nucleus holds far more tokens than the candidates (found by bisection), a
    peaked row's lies among them; one batch holds both."""
    flat = random_logits(2, REAL_VOCAB, 0.5, seed=3)
    peaked = random_logits(2, REAL_VOCAB, 0.5, seed=2)
    peaked[:, :20] += 14.0  # 20 tokens hold nearly all the mass
    logits = np.concatenate([flat, peaked])
    for top_k, top_p in [(0, 0.9), (0, 0.5), (50, 0.95), (CANDIDATES + 44, 1.0)]:
        kept = assert_filters_as_sorted(jax.jit(filter_logits), logits, top_k, top_p)
        if top_k == 0:
            assert kept[:2].sum(-1).min() > 10 * CANDIDATES and kept[2:].sum(-1).max() <= 20


def nudged(filter_fn, by):
    """`filter_fn`, then one token more (`by=+1`: the largest removed one) or fewer (`by=-1`: the smallest kept
    one, unless it is the only one) per row: the filters the test must catch."""

    def nudged_filter(logits, *settings):
        out = filter_fn(logits, *settings)
        kept = jnp.isfinite(out)
        if by > 0:
            pick = jnp.argmax(jnp.where(kept, -jnp.inf, logits), axis=-1)
            kept = kept.at[jnp.arange(len(logits)), pick].set(True)
        else:
            pick = jnp.argmin(jnp.where(kept, logits, jnp.inf), axis=-1)
            kept = kept.at[jnp.arange(len(logits)), pick].set(kept.sum(-1) == 1)
        return jnp.where(kept, logits, -jnp.inf)

    return nudged_filter


@pytest.mark.parametrize("by", [1, -1], ids=["one_too_many", "one_too_few"])
def test_the_check_fails_on_a_filter_off_by_one_token(by):
    logits = random_logits(4, 3000, 3.0, seed=5)
    with pytest.raises(AssertionError, match="sorted keeps"):
        assert_filters_as_sorted(nudged(filter_logits, by), logits, 0, 0.9)
    with pytest.raises(AssertionError, match="sorted keeps"):
        assert_filters_as_sorted(nudged(filter_logits, by), logits, 20, 1.0)


def test_ordered_keys_follow_the_float_order():
    values = np.array([-np.inf, -3.5e38, -2.0, -1e-30, -0.0, 0.0, 1e-30, 0.5, 2.0, 3.4e38, np.inf], np.float32)
    keys = np.asarray(ordered_keys(jnp.asarray(values))).astype(np.int64)
    with np.errstate(invalid="ignore"):  # inf - inf
        larger = np.diff(values) > 0
    assert (np.diff(keys) >= 0).all() and (np.diff(keys)[larger] > 0).all()


@functools.partial(jax.jit, static_argnums=2)
def draws(logits, seed, num):
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(seed), jnp.arange(num))
    return draw_in_two_stages(jnp.broadcast_to(logits, (num, logits.shape[-1])), keys)


def test_the_two_stage_draw_samples_the_softmax_of_the_kept_tokens():
    """Chi-square of 20,000 draws over a vocabulary of 3 blocks and a part (the last block padded), with removed
    tokens in every block; the returned log-probs are log_softmax's."""
    vocab = 3 * DRAW_BLOCK + 37
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=vocab) * 2).astype(np.float32)
    logits[rng.choice(vocab, vocab // 3, replace=False)] = -np.inf
    logits[-1] = logits.max() + 1.0  # the padded block's one real token is the likeliest
    num = 20_000
    tokens, logp = map(np.asarray, draws(jnp.asarray(logits), 3, num))
    probs = np.exp(logits.astype(np.float64) - logits.max())
    probs /= probs.sum()
    assert np.isfinite(logits[tokens]).all(), "drew a removed token"
    np.testing.assert_allclose(logp, np.log(probs[tokens]), rtol=1e-5, atol=1e-5)
    counts = np.bincount(tokens, minlength=vocab)
    big = probs * num >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expect = np.append(probs[big], probs[~big].sum())
    expect *= num / expect.sum()
    assert stats.chisquare(observed, expect).pvalue > 1e-3


def test_a_rows_draw_depends_on_its_key_alone():
    logits = jnp.asarray(random_logits(1, 1000, 2.0, seed=3))[0]
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(9), jnp.arange(16))
    alone = [int(draw_in_two_stages(logits[None], keys[i : i + 1])[0][0]) for i in (0, 5)]
    together = np.asarray(draw_in_two_stages(jnp.broadcast_to(logits, (16, 1000)), keys)[0])
    assert alone == [together[0], together[5]] and len(set(together.tolist())) > 1
