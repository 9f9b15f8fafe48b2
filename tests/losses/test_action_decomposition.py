"""POAD / TPPO token-level credit assignment (`mathrl_jax.losses.action_decomposition`).

The backup is checked against two independent float64 NumPy references: the
per-token form (gamma only on action ends, inside masked GAE) and OpenR's nested
form (loop over actions backwards, then over each action's tokens backwards).
Its reductions are checked too: single-token actions give action-level GAE,
all-ends gives token GAE, gamma = 1 gives the naive token GAE, and with lam = 1
the first token of each action carries the action-level advantage.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mathrl_jax.losses import (
    action_decomposed_gae,
    action_ends_from_index,
    gae_advantages,
    naive_token_gae,
    scatter_action_rewards,
)
from tests.losses import np_reference_advantages as ref
from tests.losses.np_reference_advantages import MASK_KINDS, garbage_like, pad_columns, random_mask

B, T = 4, 14  # tokens
NA = 6  # action slots per row
PAD_L, PAD_R = 3, 2

seeds = st.integers(0, 2**31 - 1)
mask_kinds = st.sampled_from(MASK_KINDS)
unit = st.floats(0.0, 1.0, allow_nan=False)
gammas = st.one_of(st.just(1.0), st.floats(0.5, 1.0, allow_nan=False))
proper = st.floats(0.3, 0.99, allow_nan=False)  # strictly inside (0, 1)

TOL = dict(rtol=1e-4, atol=1e-4)


def close(actual, expected, **kw):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, **{**TOL, **kw})


adgae_jit = jax.jit(
    lambda r, v, e, m, gamma, lam, boot: action_decomposed_gae(r, v, e, m, gamma=gamma, lam=lam, bootstrap_value=boot)
)
naive_jit = jax.jit(
    lambda r, v, m, gamma, lam, boot: naive_token_gae(r, v, m, gamma=gamma, lam=lam, bootstrap_value=boot)
)
gae_jit = jax.jit(lambda r, v, m, gamma, lam, boot: gae_advantages(r, v, m, gamma=gamma, lam=lam, bootstrap_value=boot))
ends_jit = jax.jit(action_ends_from_index)
scatter_jit = jax.jit(scatter_action_rewards)


def step_data(seed, kind, new_action_p=0.35, monotone=True, batch=B, length=T):
    """Token rows split into multi-token actions.

    Returns (rng, action_index [B,T] int32, mask, action_rewards [B,NA], values,
    bootstrap). Action indices grow along the counted tokens of a row (capped at
    NA - 1); uncounted tokens carry garbage indices.
    """
    rng = np.random.RandomState(seed)
    mask = random_mask(rng, batch, length, kind)
    index = rng.randint(-5, 50, size=(batch, length)).astype(np.int32)  # garbage
    for b in range(batch):
        current = 0
        first = True
        for t in range(length):
            if mask[b, t] > 0:
                if monotone:
                    if not first and rng.rand() < new_action_p:
                        current = min(current + 1, NA - 1)
                else:
                    current = rng.randint(0, 3)
                index[b, t] = current
                first = False
    action_rewards = rng.randn(batch, NA).astype(np.float32)
    values = rng.randn(batch, length).astype(np.float32)
    bootstrap = rng.randn(batch).astype(np.float32)
    return rng, index, mask, action_rewards, values, bootstrap


# ---------------------------------------------------------------------------
# action ends and reward placement
# ---------------------------------------------------------------------------


def test_action_ends_hand_computed():
    index = np.array([[0, 0, 9, 0, 1, 1, 2, 7]], np.int32)
    mask = np.array([[1, 1, 0, 1, 1, 1, 1, 0]], np.float32)  # hole at 2, pad at 7
    close(action_ends_from_index(index, mask), [[0, 0, 0, 1, 0, 1, 1, 0]], atol=0)
    rewards = np.array([[10.0, 20.0, 30.0]], np.float32)
    ends = action_ends_from_index(index, mask)
    close(scatter_action_rewards(rewards, index, ends), [[0, 0, 0, 10, 0, 20, 30, 0]], atol=0)


@given(seed=seeds, kind=mask_kinds, monotone=st.booleans())
def test_action_ends_matches_reference(seed, kind, monotone):
    _, index, mask, _, _, _ = step_data(seed, kind, monotone=monotone)
    ends = np.asarray(ends_jit(index, mask))
    assert ends.dtype == np.float32
    close(ends, ref.action_ends(index, mask), atol=0)
    # ends lie on counted tokens, one per action (maximal run of one index)
    assert np.all(ends[mask == 0] == 0.0)
    runs = ref.split_actions(index, mask)
    close(ends.sum(axis=1), [len(actions) for actions in runs], atol=0)


@given(seed=seeds, kind=mask_kinds)
def test_scatter_action_rewards_matches_reference(seed, kind):
    _, index, mask, action_rewards, _, _ = step_data(seed, kind)
    ends = ref.action_ends(index, mask).astype(np.float32)
    out = scatter_jit(action_rewards, index, ends)
    assert out.dtype == jnp.float32
    close(out, ref.scatter_action_rewards(action_rewards, index, ends), atol=0)


@given(seed=seeds, kind=mask_kinds)
def test_action_ends_and_rewards_padding_invariance(seed, kind):
    rng, index, mask, action_rewards, _, _ = step_data(seed, kind)
    ends = np.asarray(ends_jit(index, mask))
    p_index = np.concatenate([rng.randint(-5, 50, (B, PAD_L)), index, rng.randint(-5, 50, (B, PAD_R))], axis=1).astype(
        np.int32
    )
    p_mask = pad_columns(rng, mask, PAD_L, PAD_R, fill=0.0)
    p_ends = np.asarray(ends_jit(p_index, p_mask))
    close(p_ends[:, PAD_L : PAD_L + T], ends, atol=0)
    assert np.all(p_ends[:, :PAD_L] == 0) and np.all(p_ends[:, PAD_L + T :] == 0)
    close(
        scatter_jit(action_rewards, p_index, p_ends)[:, PAD_L : PAD_L + T],
        scatter_jit(action_rewards, index, ends),
        atol=0,
    )


# ---------------------------------------------------------------------------
# action_decomposed_gae vs references
# ---------------------------------------------------------------------------


@given(seed=seeds, kind=mask_kinds, gamma=gammas, lam=unit, use_bootstrap=st.booleans())
def test_matches_per_token_reference(seed, kind, gamma, lam, use_bootstrap):
    """Arbitrary ends and rewards on every token (e.g. a per-token KL penalty)."""
    rng = np.random.RandomState(seed)
    mask = random_mask(rng, B, T, kind)
    rewards = rng.randn(B, T).astype(np.float32)
    values = rng.randn(B, T).astype(np.float32)
    ends = (rng.rand(B, T) < 0.4).astype(np.float32)
    boot = rng.randn(B).astype(np.float32) if use_bootstrap else None
    adv, ret = adgae_jit(rewards, values, ends, mask, gamma, lam, boot)
    assert adv.dtype == jnp.float32 and ret.dtype == jnp.float32
    ref_adv, ref_ret = ref.action_decomposed_gae_flat(
        rewards, values, ends, mask, gamma=gamma, lam=lam, bootstrap_value=boot
    )
    close(adv, ref_adv)
    close(ret, ref_ret)


@given(seed=seeds, kind=mask_kinds, gamma=proper, lam=proper, use_bootstrap=st.booleans())
def test_matches_nested_openr_reference(seed, kind, gamma, lam, use_bootstrap):
    """Multi-token actions, gamma < 1, lam < 1: the full pipeline (ends from the
    index, rewards scattered to the ends, backup) against OpenR's nested loops."""
    _, index, mask, action_rewards, values, bootstrap = step_data(seed, kind)
    boot = bootstrap if use_bootstrap else None
    ends = ends_jit(index, mask)
    token_rewards = scatter_jit(action_rewards, index, ends)
    adv, ret = adgae_jit(token_rewards, values, ends, mask, gamma, lam, boot)
    ref_adv, ref_ret = ref.action_decomposed_gae_nested(
        action_rewards, values, index, mask, gamma=gamma, lam=lam, bootstrap_value=boot
    )
    close(adv, ref_adv)
    close(ret, ref_ret)


def test_nested_reference_has_multi_token_actions():
    """Guards the generator: the nested-reference test does see multi-token
    actions, holes inside actions, and several actions per row."""
    sizes, holes, per_row = [], 0, []
    for seed in range(20):
        _, index, mask, _, _, _ = step_data(seed, "holes")
        for actions in ref.split_actions(index, mask):
            per_row.append(len(actions))
            for tokens in actions:
                sizes.append(len(tokens))
                holes += int(tokens[-1] - tokens[0] + 1 > len(tokens))
    assert max(sizes) >= 3 and max(per_row) >= 3 and holes > 0


# ---------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------


def _single_token_layout(seed, kind):
    """Per-action arrays [B, NA] and the same actions laid out one token each at
    random positions of a [B, T] row, the other tokens uncounted garbage."""
    rng = np.random.RandomState(seed)
    a_mask = random_mask(rng, B, NA, kind)
    a_rewards = rng.randn(B, NA).astype(np.float32)
    a_values = rng.randn(B, NA).astype(np.float32)
    mask = np.zeros((B, T), np.float32)
    index = rng.randint(-5, 50, size=(B, T)).astype(np.int32)
    values = garbage_like(rng, (B, T))
    positions = np.zeros((B, NA), np.int64)
    for b in range(B):
        positions[b] = np.sort(rng.choice(T, NA, replace=False))
        for a in range(NA):
            t = positions[b, a]
            mask[b, t] = a_mask[b, a]
            index[b, t] = a
            values[b, t] = a_values[b, a]
    return rng, a_rewards, a_values, a_mask, index, mask, values, positions


@given(seed=seeds, kind=mask_kinds, gamma=gammas, lam=unit, use_bootstrap=st.booleans())
def test_single_token_actions_reduce_to_action_level_gae(seed, kind, gamma, lam, use_bootstrap):
    rng, a_rewards, a_values, a_mask, index, mask, values, pos = _single_token_layout(seed, kind)
    boot = rng.randn(B).astype(np.float32) if use_bootstrap else None
    ends = ends_jit(index, mask)
    close(ends, mask, atol=0)  # every counted token is its own action
    token_rewards = scatter_jit(a_rewards, index, ends)
    adv, ret = adgae_jit(token_rewards, values, ends, mask, gamma, lam, boot)
    a_adv, a_ret = gae_jit(a_rewards, a_values, a_mask, gamma, lam, boot)
    adv, ret = np.asarray(adv), np.asarray(ret)
    rows = np.arange(B)[:, None]
    close(adv[rows, pos], a_adv, rtol=1e-5, atol=1e-5)
    close(ret[rows, pos], a_ret, rtol=1e-5, atol=1e-5)
    assert np.count_nonzero(adv * (1 - mask)) == 0
    close(a_adv, ref.gae(a_rewards, a_values, a_mask, gamma=gamma, lam=lam, bootstrap_value=boot)[0])


@given(seed=seeds, kind=mask_kinds, gamma=gammas, lam=unit, ends_on=st.sampled_from(["ones", "mask"]))
def test_all_tokens_action_ends_equals_token_gae(seed, kind, gamma, lam, ends_on):
    rng = np.random.RandomState(seed)
    mask = random_mask(rng, B, T, kind)
    rewards = rng.randn(B, T).astype(np.float32)
    values = rng.randn(B, T).astype(np.float32)
    boot = rng.randn(B).astype(np.float32)
    ends = np.ones((B, T), np.float32) if ends_on == "ones" else mask
    adv, ret = adgae_jit(rewards, values, ends, mask, gamma, lam, boot)
    g_adv, g_ret = gae_jit(rewards, values, mask, gamma, lam, boot)
    close(adv, g_adv, rtol=1e-6, atol=1e-6)
    close(ret, g_ret, rtol=1e-6, atol=1e-6)


@given(seed=seeds, kind=mask_kinds, lam=unit, use_bootstrap=st.booleans())
def test_naive_token_gae_equals_action_decomposed_when_gamma_is_one(seed, kind, lam, use_bootstrap):
    _, index, mask, action_rewards, values, bootstrap = step_data(seed, kind)
    boot = bootstrap if use_bootstrap else None
    ends = ends_jit(index, mask)
    token_rewards = scatter_jit(action_rewards, index, ends)
    adv, ret = adgae_jit(token_rewards, values, ends, mask, 1.0, lam, boot)
    n_adv, n_ret = naive_jit(token_rewards, values, mask, 1.0, lam, boot)
    close(adv, n_adv, rtol=1e-6, atol=1e-6)
    close(ret, n_ret, rtol=1e-6, atol=1e-6)


@given(seed=seeds, kind=mask_kinds, gamma=proper, lam=proper)
def test_naive_token_gae_discounts_every_token(seed, kind, gamma, lam):
    """NTPO = plain token GAE; with gamma < 1 and multi-token actions it differs
    from the action-decomposed backup."""
    _, index, mask, action_rewards, values, bootstrap = step_data(seed, kind)
    ends = np.asarray(ends_jit(index, mask))
    token_rewards = scatter_jit(action_rewards, index, ends)
    n_adv, _ = naive_jit(token_rewards, values, mask, gamma, lam, bootstrap)
    close(n_adv, ref.gae(token_rewards, values, mask, gamma=gamma, lam=lam, bootstrap_value=bootstrap)[0])
    inner = (mask > 0) & (ends == 0)
    if inner.any() and gamma < 0.95:
        adv, _ = adgae_jit(token_rewards, values, ends, mask, gamma, lam, bootstrap)
        assert not np.allclose(np.asarray(adv), np.asarray(n_adv), rtol=1e-4, atol=1e-4)


@given(seed=seeds, kind=mask_kinds, gamma=gammas, use_bootstrap=st.booleans())
def test_lam_one_first_token_carries_action_level_advantage(seed, kind, gamma, use_bootstrap):
    """With lam = 1 the inner deltas telescope: A at the first token of action t is
    r_t + gamma V_{t+1,0} - V_{t,0} + gamma A_{t+1,0}, action-level GAE (lam = 1)
    on first-token values."""
    _, index, mask, action_rewards, values, bootstrap = step_data(seed, kind)
    boot = bootstrap if use_bootstrap else None
    ends = ends_jit(index, mask)
    adv, _ = adgae_jit(scatter_jit(action_rewards, index, ends), values, ends, mask, gamma, 1.0, boot)
    adv = np.asarray(adv)
    a_rewards = np.zeros((B, T), np.float32)
    a_values = np.zeros((B, T), np.float32)
    a_mask = np.zeros((B, T), np.float32)
    firsts = []
    for b, actions in enumerate(ref.split_actions(index, mask)):
        for a, tokens in enumerate(actions):
            a_rewards[b, a] = action_rewards[b, index[b, tokens[-1]]]
            a_values[b, a] = values[b, tokens[0]]
            a_mask[b, a] = 1.0
            firsts.append((b, a, tokens[0]))
    a_adv, _ = gae_jit(a_rewards, a_values, a_mask, gamma, 1.0, boot)
    a_adv = np.asarray(a_adv)
    for b, a, t in firsts:
        np.testing.assert_allclose(adv[b, t], a_adv[b, a], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# padding invariance
# ---------------------------------------------------------------------------


@given(seed=seeds, kind=mask_kinds, gamma=gammas, lam=unit)
def test_action_decomposed_gae_padding_invariance(seed, kind, gamma, lam):
    rng, index, mask, action_rewards, values, bootstrap = step_data(seed, kind)
    ends = np.asarray(ends_jit(index, mask))
    rewards = np.asarray(scatter_jit(action_rewards, index, ends))
    # garbage on the uncounted tokens inside the window too
    rewards = np.where(mask > 0, rewards, garbage_like(rng, mask.shape))
    values = np.where(mask > 0, values, garbage_like(rng, mask.shape))
    adv, ret = adgae_jit(rewards, values, ends, mask, gamma, lam, bootstrap)
    assert np.all(np.isfinite(adv)) and np.all(np.isfinite(ret))
    p_rewards = pad_columns(rng, rewards, PAD_L, PAD_R)
    p_values = pad_columns(rng, values, PAD_L, PAD_R)
    p_ends = np.concatenate([rng.randint(0, 2, (B, PAD_L)), ends, rng.randint(0, 2, (B, PAD_R))], axis=1).astype(
        np.float32
    )
    p_mask = pad_columns(rng, mask, PAD_L, PAD_R, fill=0.0)
    p_adv, p_ret = adgae_jit(p_rewards, p_values, p_ends, p_mask, gamma, lam, bootstrap)
    for full, core in ((p_adv, adv), (p_ret, ret)):
        full = np.asarray(full)
        close(full[:, PAD_L : PAD_L + T], core, rtol=1e-6, atol=1e-6)
        assert np.all(full[:, :PAD_L] == 0) and np.all(full[:, PAD_L + T :] == 0)


# ---------------------------------------------------------------------------
# jit and bfloat16
# ---------------------------------------------------------------------------


def _cases():
    _, index, mask, action_rewards, values, bootstrap = step_data(1, "holes")
    ends = ref.action_ends(index, mask).astype(np.float32)
    rewards = ref.scatter_action_rewards(action_rewards, index, ends).astype(np.float32)
    return {
        "action_ends_from_index": (lambda m: action_ends_from_index(index, m), (mask,)),
        "scatter_action_rewards": (
            lambda ar, e: scatter_action_rewards(ar, index, e),
            (action_rewards, ends),
        ),
        "action_decomposed_gae": (
            lambda r, v, e, m, bv: action_decomposed_gae(r, v, e, m, gamma=0.9, lam=0.8, bootstrap_value=bv),
            (rewards, values, ends, mask, bootstrap),
        ),
        "naive_token_gae": (
            lambda r, v, m, bv: naive_token_gae(r, v, m, gamma=0.9, lam=0.8, bootstrap_value=bv),
            (rewards, values, mask, bootstrap),
        ),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_matches_eager(name):
    fn, args = CASES[name]
    eager = jax.tree_util.tree_leaves(fn(*args))
    jitted = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    for e, j in zip(eager, jitted):
        assert j.dtype == jnp.float32
        close(j, np.asarray(e, np.float64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bfloat16_inputs_give_float32_outputs(name):
    fn, args = CASES[name]
    bf16 = [jnp.asarray(a, jnp.bfloat16) for a in args]
    upcast = [a.astype(jnp.float32) for a in bf16]
    for lo, hi in zip(
        jax.tree_util.tree_leaves(jax.jit(fn)(*bf16)),
        jax.tree_util.tree_leaves(jax.jit(fn)(*upcast)),
    ):
        assert lo.dtype == jnp.float32, (name, lo.dtype)
        close(lo, np.asarray(hi, np.float64), rtol=1e-5, atol=1e-5)
