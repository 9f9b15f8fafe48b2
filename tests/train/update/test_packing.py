"""Sequence packing: the planner's invariants, and packed passes and updates equal to padded ones (every loss
aggregation mode, with and without a critic, the action-level and decoupled losses, token-budget micro-batches)."""

import functools

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings

from mathrl_jax import losses
from mathrl_jax.models import QwenCritic, QwenForCausalLM, tiny_config
from mathrl_jax.models.attention import default_positions
from mathrl_jax.train.state import create_train_state
from mathrl_jax.train.update import _packing as packing
from mathrl_jax.train.update._minibatches import PACKED, with_packing
from mathrl_jax.train.update._passes import compute_logprobs_fn, compute_values_fn, packed_inputs, unpack
from mathrl_jax.train.update._step import UpdateConfig, make_update_fn

CONFIG = tiny_config(num_hidden_layers=1)
N, P, L = 12, 6, 18  # rows, prompt column, width


@functools.lru_cache(maxsize=None)
def split(kind):
    model = (QwenForCausalLM if kind == "policy" else QwenCritic)(CONFIG, rngs=nnx.Rngs(0 if kind == "policy" else 1))
    return nnx.split(model)


def ragged_layout(seed, rows=N):
    """`[pad | prompt]` ending at column P, then `[completion | pad]`: prompts of 1..P, completions of 0..L-P."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, P + 1, rows)
    completions = rng.integers(0, L - P + 1, rows)
    completions[0] = L - P  # one full row
    columns = np.arange(L)
    attention = ((columns >= P - prompts[:, None]) & (columns < P + completions[:, None])).astype(np.int32)
    response = ((columns >= P) & (columns < P + completions[:, None])).astype(np.float32)
    return attention, response


def make_batch(seed=0, critic=False, actions=False):
    attention, response = ragged_layout(seed)
    rng = np.random.default_rng(seed + 100)
    ids = rng.integers(3, CONFIG.vocab_size, (N, L)).astype(np.int32) * attention
    graphdef, params = split("policy")
    old = np.asarray(compute_logprobs_fn(graphdef)(params, ids, attention)) * response
    batch = {
        "input_ids": ids,
        "attention_mask": attention,
        "response_mask": response,
        "old_logprobs": (old + 0.1 * rng.normal(size=(N, L)) * response).astype(np.float32),
        "proximal_logprobs": (old + 0.05 * rng.normal(size=(N, L)) * response).astype(np.float32),
        "ref_logprobs": (old - 0.1 * rng.normal(size=(N, L)) * response).astype(np.float32),
        "advantages": (rng.normal(size=(N, L)) * response).astype(np.float32),
    }
    if critic:
        batch["value_mask"] = response * (rng.random((N, L)) < 0.7)
        batch["returns"] = (rng.normal(size=(N, L)) * response).astype(np.float32)
        batch["old_values"] = (0.1 * rng.normal(size=(N, L)) * response).astype(np.float32)
    if actions:
        batch["action_index"] = (np.cumsum(rng.random((N, L)) < 0.3, axis=1) * response).astype(np.int32)
    return {k: jnp.asarray(v) for k, v in batch.items()}


def run(cfg, batch, critic=False, packed=None):
    """(state, metrics) of one update, padded or (`packed` = with_packing's keyword arguments) packed."""
    graphdef, params = split("policy")
    sgd = optax.sgd(0.1)  # params move by exactly -0.1 grad: equal params are equal gradients
    critic_sgd = optax.sgd(0.01)  # the critic's summed losses are larger
    critic_graphdef, critic_params = split("critic") if critic else (None, None)
    state = create_train_state(
        params, sgd, seed=3, critic_params=critic_params, critic_optimizer=critic_sgd if critic else None
    )
    if packed is not None:
        batch = with_packing(batch, state.rng, ppo_epoch=cfg.ppo_epoch, num_mini_batch=cfg.num_mini_batch, **packed)
    update = make_update_fn(
        graphdef,
        sgd,
        cfg,
        critic_graphdef=critic_graphdef,
        critic_optimizer=critic_sgd if critic else None,
        donate=False,
    )
    return update(state, batch)


def assert_same_update(a, b):
    """Equal parameter changes, to float32 rounding relative to the change (SGD at lr 0.1 over several steps
    moves weights by up to ~2 here, and summation order differs between the layouts), and equal metrics."""
    (state_a, metrics_a), (state_b, metrics_b) = a, b
    for trees in (
        (state_a.params, state_b.params, split("policy")[1]),
        (state_a.critic_params, state_b.critic_params, split("critic")[1]),
    ):
        if trees[0] is None:
            continue
        for x, y, start in zip(*(jax.tree.leaves(t) for t in trees)):
            x, y, start = np.asarray(x), np.asarray(y), np.asarray(start)
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-4 * np.abs(x - start).max() + 1e-6)
    assert set(metrics_a) == set(metrics_b)
    for key in metrics_a:
        np.testing.assert_allclose(metrics_a[key], metrics_b[key], rtol=1e-4, atol=1e-6, err_msg=key)


# --- the planner ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=40), st.integers(20, 64))
def test_first_fit_places_every_item_once_within_capacity(lengths, capacity):
    bins = packing.first_fit(lengths, capacity)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)
    # First-fit decreasing never leaves two bins that could have been one bin's worth of the smallest items:
    # at most one bin is half empty or less.
    assert sum(sum(lengths[i] for i in b) * 2 <= capacity for b in bins) <= 1


def test_first_fit_refuses_a_sequence_longer_than_a_row():
    with pytest.raises(ValueError, match="33 tokens does not fit in rows of 32"):
        packing.first_fit([3, 33], 32)


def test_bucket_counts_are_few_and_waste_at_most_a_quarter():
    sizes = {packing.bucket_count(n) for n in range(1, 1025)}
    assert len(sizes) <= 8 + 4 * 7
    for n in range(1, 1025):
        b = packing.bucket_count(n)
        assert n <= b <= max(8, int(n * 1.25) + 1)
        assert packing.bucket_count(n, 4) % 4 == 0 and packing.bucket_count(n, 4) >= n


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 24), min_size=4, max_size=24),
    st.sampled_from([(1, 1), (2, 1), (3, 1), (4, 2)]),
    st.integers(0, 2**16),
)
def test_micro_batches_never_compute_more_rows_than_filling_the_budget(lengths, budget_and_multiple, seed):
    max_rows, multiple = budget_and_multiple
    rows = len(lengths) - len(lengths) % 2
    lengths = lengths[:rows]
    attention = (np.arange(24) < np.asarray(lengths)[:, None]).astype(np.int32)
    order = np.random.default_rng(seed).permutation(rows).reshape(2, rows // 2)
    plan = packing.plan_update(
        attention, np.ones(rows, bool), order, 24, max_rows_per_micro=max_rows, rows_multiple=multiple
    )
    steps, _, per_micro, _ = plan["segment_ids"].shape
    assert per_micro <= max(max_rows, multiple) and per_micro % multiple == 0
    # Each sequence exactly once, in its own step.
    for s in range(steps):
        assert sorted(set(plan["rows"][s].ravel().tolist()) - {rows}) == sorted(order[s].tolist())
    # Rows computed (the update skips a micro-batch with no token) against micro-batches filled to the budget.
    computed = per_micro * int((plan["segment_ids"] > 0).any(axis=(2, 3)).sum())
    filled = max(max_rows, multiple)
    needed = [len(packing.first_fit([lengths[r] for r in order[s]], 24)) for s in range(steps)]
    assert computed <= sum(-(-n // filled) * filled for n in needed)
    assert computed >= sum(needed)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 24), st.booleans()), min_size=4, max_size=24),
    st.sampled_from([(None, 1), (None, 2), (1, 1), (2, 1), (4, 2)]),
    st.integers(0, 2**16),
)
def test_a_plan_shaped_by_every_row_holds_each_trained_row_once_whichever_train(rows, budget_and_multiple, seed):
    max_rows, multiple = budget_and_multiple
    rows = rows[: len(rows) - len(rows) % 2]
    lengths = np.asarray([n for n, _ in rows])
    attention = (np.arange(24) < lengths[:, None]).astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(rows)).reshape(2, -1)
    shape_rows = lengths > 0
    trained = shape_rows & np.asarray([t for _, t in rows])
    plans = [
        packing.plan_update(
            attention, subset, order, 24, max_rows_per_micro=max_rows, rows_multiple=multiple, shape_rows=shape_rows
        )
        for subset in (trained, shape_rows, np.zeros_like(shape_rows))
    ]
    assert len({tuple(v.shape for _, v in sorted(p.items())) for p in plans}) == 1  # one shape whichever train
    plan = plans[0]
    assert plan["segment_ids"].shape[2] % multiple == 0
    for s in range(2):  # each trained row of the step exactly once, and nothing else
        held = plan["rows"][s].ravel().tolist()
        expected = [r for r in order[s].tolist() if trained[r]]
        assert sorted(r for r in held if r != len(rows)) == sorted(expected)
        tokens = sorted(plan["source"][s][plan["segment_ids"][s] > 0].tolist())
        assert tokens == sorted(r * 24 + c for r in expected for c in range(lengths[r]))


def test_three_long_rows_under_a_budget_of_two_run_as_three_micro_batches_of_one():
    attention = (np.arange(600) < np.full((6, 1), 500)).astype(np.int32)
    order = np.arange(6).reshape(2, 3)
    plan = packing.plan_update(attention, np.ones(6, bool), order, 600, max_rows_per_micro=2)
    assert plan["segment_ids"].shape[1:3] == (3, 1)  # 3 rows computed per step, not 2 micro-batches of 2
    # Short rows: a micro-batch's fixed cost outweighs one spare row, so the budget is filled.
    plan = packing.plan_update(attention[:, :24] * 0 + 1, np.ones(6, bool), order, 40, max_rows_per_micro=2)
    assert plan["segment_ids"].shape[1:3] == (2, 2)


def test_the_passes_plan_holds_each_token_once_at_its_padded_position():
    attention, _ = ragged_layout(1)
    ids = np.arange(N * L, dtype=np.int32).reshape(N, L) + 1  # every token its own id
    plan = packing.plan_passes(attention, row_tokens=24, rows_multiple=2)
    assert plan["source"].shape[0] % 2 == 0 and plan["source"].shape[1] == 24
    packed = np.asarray(packed_inputs(jnp.asarray(ids), jnp.asarray(plan["source"])))
    real = plan["segment_ids"] > 0
    assert sorted(packed[real]) == sorted(ids[attention > 0])  # each real token exactly once
    assert (packed[~real] == 0).all()
    # Back in the padded layout: the same token at the same place, and the positions the padded rows use.
    back = np.asarray(unpack(jnp.asarray(packed), {"unpack": jnp.asarray(plan["unpack"])}))
    np.testing.assert_array_equal(back, ids * attention)
    positions = np.asarray(unpack(jnp.asarray(plan["positions"]), {"unpack": jnp.asarray(plan["unpack"])}))
    np.testing.assert_array_equal(
        positions * attention, np.asarray(default_positions(jnp.asarray(attention))) * attention
    )
    assert real.sum() / real.size > (attention > 0).sum() / attention.size  # denser than the padded rows


def test_packing_refuses_rows_it_cannot_score_the_same():
    attention, response = ragged_layout(2)
    holed = attention.copy()
    holed[0, P] = 0  # row 0 has a prompt and a full completion: a hole between them
    with pytest.raises(ValueError, match="row 0's tokens are not contiguous"):
        packing.token_extents(holed)
    opens = response.copy()
    opens[5, P - 1] = 1  # a response token at the prompt's first column when the prompt has one token
    attention[5, : P - 1] = 0
    with pytest.raises(ValueError, match="row 5 starts with a response token"):
        packing.token_extents(attention, opens)


# --- packed passes and updates equal padded ones ------------------------------------------------------------


@pytest.mark.parametrize("chunk_rows", [None, 2])
def test_packed_log_probs_and_values_equal_the_padded_ones(chunk_rows):
    batch = make_batch(4)
    attention = np.asarray(batch["attention_mask"])
    plan = {k: jnp.asarray(v) for k, v in packing.plan_passes(attention, 24, max_rows_per_chunk=chunk_rows).items()}
    if chunk_rows:
        assert plan["source"].shape[1] <= chunk_rows
    mask = batch["attention_mask"] * jnp.roll(batch["attention_mask"], 1, axis=1)  # tokens with one before them
    graphdef, params = split("policy")
    logprobs = compute_logprobs_fn(graphdef, temperature=0.7, chunk_rows=chunk_rows)
    padded = logprobs(params, batch["input_ids"], batch["attention_mask"])
    packed = logprobs(params, batch["input_ids"], batch["attention_mask"], plan)
    np.testing.assert_allclose(np.asarray(packed * mask), np.asarray(padded * mask), rtol=1e-5, atol=1e-5)
    critic_graphdef, critic_params = split("critic")
    values = compute_values_fn(critic_graphdef, chunk_rows=chunk_rows)
    padded = values(critic_params, batch["input_ids"], batch["attention_mask"])
    packed = values(critic_params, batch["input_ids"], batch["attention_mask"], plan)
    np.testing.assert_allclose(np.asarray(packed * mask), np.asarray(padded * mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", losses.LOSS_AGG_MODES)
def test_a_packed_update_equals_the_padded_update(mode):
    batch = make_batch(5, critic=True)
    cfg = UpdateConfig(
        num_mini_batch=2,
        ppo_epoch=2,
        loss_agg_mode=mode,
        norm_constant=12.0 if "norm" in mode else None,
        kl_coef=0.1,
        entropy_coef=0.01,
    )
    # Token-budget micro-batches of one packed row each (the one-micro-batch plan: the next tests).
    assert_same_update(run(cfg, batch, True), run(cfg, batch, True, packed=dict(row_tokens=24, max_rows_per_micro=1)))


@pytest.mark.parametrize(
    "settings",
    [
        dict(policy_loss="action_ppo", minibatch_whitening="actions"),
        dict(policy_loss="ppo", minibatch_whitening="nonzero"),
        dict(policy_loss="decoupled_ppo", behaviour_weight_cap=2.0),
        pytest.param(dict(policy_loss="gspo"), marks=pytest.mark.slow),
        pytest.param(dict(policy_loss="ppo", clip_c=3.0, clip_high=0.28, target_kl=0.005), marks=pytest.mark.slow),
    ],
    ids=["appo", "tppo_whitening", "decoupled", "gspo", "dual_clip_kl_skip"],
)
def test_a_packed_update_equals_the_padded_update_for_each_policy_loss(settings):
    batch = make_batch(6, critic=True, actions=True)
    cfg = UpdateConfig(num_mini_batch=3, entropy_coef=0.01, **settings)
    padded = run(cfg, batch, critic=True)
    assert_same_update(padded, run(cfg, batch, critic=True, packed=dict(row_tokens=32, max_rows_per_micro=1)))


def test_spare_micro_batches_and_chunks_are_skipped_without_changing_a_value():
    batch = make_batch(8)
    graphdef, params = split("policy")
    state = create_train_state(params, optax.sgd(0.1), seed=3)
    packed = dict(row_tokens=18, max_rows_per_micro=1)
    plan = with_packing(batch, state.rng, ppo_epoch=1, num_mini_batch=3, **packed)[PACKED]
    empty = ~(np.asarray(plan["segment_ids"]) > 0).any(axis=(2, 3))
    assert empty.any()  # the micro-batch count is bucketed, and some step needs fewer: spare micro-batches
    cfg = UpdateConfig(num_mini_batch=3, loss_agg_mode="seq-mean-token-sum")
    assert_same_update(run(cfg, batch), run(cfg, batch, packed=packed))
    # Skipped, not computed on zeros: the micro-batch's model pass sits in a `cond` branch.
    update = make_update_fn(graphdef, optax.sgd(0.1), cfg, donate=False)
    with_plan = with_packing(batch, state.rng, ppo_epoch=1, num_mini_batch=3, **packed)
    assert "cond[" in str(jax.make_jaxpr(update)(state, with_plan))
    # The passes: 9 full rows, one per chunk, in a bucketed count of 10 chunks: a spare one.
    ids, attention = batch["input_ids"][:9], jnp.ones((9, L), jnp.int32)
    chunks = packing.plan_passes(np.asarray(attention), L, max_rows_per_chunk=1)
    assert (chunks["segment_ids"] > 0).any(axis=(1, 2)).tolist() == [True] * 9 + [False]
    logprobs = compute_logprobs_fn(graphdef, chunk_rows=1)
    padded = logprobs(params, ids, attention)
    chunks = {k: jnp.asarray(v) for k, v in chunks.items()}
    packed = logprobs(params, ids, attention, chunks)
    np.testing.assert_allclose(np.asarray(packed[:, 1:]), np.asarray(padded[:, 1:]), rtol=1e-5, atol=1e-5)
    assert "cond[" in str(jax.make_jaxpr(logprobs)(params, ids, attention, chunks))


def test_rows_with_nothing_to_train_are_left_out_of_the_packed_update():
    batch = make_batch(7)
    dropped = jnp.asarray(np.arange(N) % 3 == 0)
    batch["response_mask"] = jnp.where(dropped[:, None], 0.0, batch["response_mask"])  # DAPO-filtered rows
    cfg = UpdateConfig(num_mini_batch=2, loss_agg_mode="seq-mean-token-mean")
    graphdef, params = split("policy")
    state = create_train_state(params, optax.sgd(1.0), seed=3)
    plan = with_packing(batch, state.rng, ppo_epoch=1, num_mini_batch=2, row_tokens=24)[PACKED]
    kept = set(np.asarray(plan["rows"]).ravel().tolist()) - {N}
    assert kept == set(np.flatnonzero(np.asarray(batch["response_mask"]).sum(axis=1) > 0).tolist())
    assert not kept & set(np.flatnonzero(np.asarray(dropped)).tolist())
    assert_same_update(run(cfg, batch), run(cfg, batch, packed=dict(row_tokens=24)))


# --- rows with no non-zero advantage --------------------------------------------------------------------------


def zero_advantage_batch(seed, every=3):
    """`make_batch` with every `every`-th row's advantages all 0 (a GRPO group whose samples earned one reward)."""
    batch = make_batch(seed)
    inert = jnp.asarray(np.arange(N) % every == every - 1)
    batch["advantages"] = jnp.where(inert[:, None], 0.0, batch["advantages"])
    return batch, set(np.flatnonzero(np.asarray(inert)).tolist())


@pytest.mark.parametrize(
    "settings",
    [
        dict(loss_agg_mode="token-mean"),  # a denominator of tokens
        dict(loss_agg_mode="seq-mean-token-mean"),  # of sequences
        dict(policy_loss="gspo"),  # a ratio per sequence
        dict(every=1),  # every minibatch inert: no row computed, the steps as over every row
        dict(max_rows_per_micro=1),  # a token budget: micro-batches of one packed row
        pytest.param(dict(loss_agg_mode="seq-mean-token-sum"), marks=pytest.mark.slow),
        pytest.param(dict(loss_agg_mode="seq-mean-token-sum-norm"), marks=pytest.mark.slow),
        pytest.param(dict(policy_loss="decoupled_ppo", behaviour_weight_cap=2.0), marks=pytest.mark.slow),
        pytest.param(dict(clip_c=3.0), marks=pytest.mark.slow),
    ],
    ids=["token-mean", "seq-mean-token-mean", "gspo", "every_row_inert", "budget", "seq-mean-token-sum", "norm"]
    + ["decoupled", "dual_clip"],
)
def test_leaving_out_zero_advantage_rows_changes_no_gradient(settings):
    settings = dict(settings)
    batch, inert = zero_advantage_batch(9, settings.pop("every", 3))
    budget = settings.pop("max_rows_per_micro", None)
    if settings.get("loss_agg_mode", "").endswith("norm"):
        settings = dict(settings, norm_constant=12.0)
    every_row = UpdateConfig(num_mini_batch=2, ppo_epoch=2, **settings)
    skipping = UpdateConfig(num_mini_batch=2, ppo_epoch=2, skip_zero_advantage=True, **settings)
    packed = dict(row_tokens=24, max_rows_per_micro=budget, skip_zero_advantage=True)
    graphdef, params = split("policy")
    state = create_train_state(params, optax.sgd(0.1), seed=3)
    plan = with_packing(batch, state.rng, ppo_epoch=2, num_mini_batch=2, **packed)[PACKED]
    assert not set(np.asarray(plan["rows"]).ravel().tolist()) & inert  # the rows are not computed
    full = with_packing(batch, state.rng, ppo_epoch=2, num_mini_batch=2, row_tokens=24, max_rows_per_micro=budget)
    full = full[PACKED]
    assert (np.asarray(plan["segment_ids"]) > 0).sum() < (np.asarray(full["segment_ids"]) > 0).sum()

    reference = run(every_row, batch)  # padded, every row computed, metrics over every row
    left_out = run(skipping, batch, packed=packed)
    # The same steps: the parameters (SGD: the gradients) and the loss of the update over every row.
    assert_same_update((reference[0], {}), (left_out[0], {}))
    for key in ("loss", "policy_loss", "grad_norm", "applied_fraction"):
        np.testing.assert_allclose(left_out[1][key], reference[1][key], rtol=1e-4, atol=1e-6, err_msg=key)
    # The per-token metrics are over the rows that train, in the padded layout as in the packed one.
    assert_same_update(run(skipping, batch), left_out)
    trained = np.asarray(batch["response_mask"])[[r for r in range(N) if r not in inert]].sum()
    np.testing.assert_allclose(
        left_out[1]["trained_token_fraction"], trained / np.asarray(batch["response_mask"]).sum(), rtol=1e-6
    )
    assert reference[1]["trained_token_fraction"] == 1.0


@pytest.mark.parametrize(
    "settings, named",
    [
        (dict(kl_coef=0.1), "kl_coef=0"),
        (dict(entropy_coef=0.01), "entropy_coef=0"),
        (dict(minibatch_whitening="nonzero"), "minibatch_whitening=None"),
        (dict(target_kl=0.02), "target_kl=None"),
    ],
)
def test_leaving_out_zero_advantage_rows_is_refused_where_they_train(settings, named):
    with pytest.raises(ValueError, match=named):
        UpdateConfig(skip_zero_advantage=True, **settings)
    graphdef, _ = split("policy")
    critic_graphdef, _ = split("critic")
    with pytest.raises(ValueError, match="with a critic"):
        make_update_fn(
            graphdef,
            optax.sgd(0.1),
            UpdateConfig(skip_zero_advantage=True),
            critic_graphdef=critic_graphdef,
            critic_optimizer=optax.sgd(0.1),
        )


def test_which_rows_have_an_advantage_changes_neither_the_plans_shape_nor_a_step():
    """One program for every batch of a shape (a new one per trained-row count would compile all run long), and
    a step with fewer rows to train computes fewer micro-batches."""
    graphdef, params = split("policy")
    state = create_train_state(params, optax.sgd(0.1), seed=3)
    shapes, computed = set(), []
    for every in (N + 1, 3, 2, 1):  # no row inert, a third, a half, all
        batch, _ = zero_advantage_batch(10, every)
        plan = with_packing(batch, state.rng, ppo_epoch=1, num_mini_batch=2, row_tokens=24, skip_zero_advantage=True)
        shapes.add(tuple((k, v.shape) for k, v in sorted(plan[PACKED].items())))
        computed.append(int((np.asarray(plan[PACKED]["segment_ids"]) > 0).any(axis=(2, 3)).sum()))
    assert len(shapes) == 1
    assert computed == sorted(computed, reverse=True) and computed[0] > computed[-2] and computed[-1] == 0
    cfg = UpdateConfig(num_mini_batch=2, skip_zero_advantage=True)
    assert "cond[" in str(jax.make_jaxpr(make_update_fn(graphdef, optax.sgd(0.1), cfg, donate=False))(state, plan))


# --- a run's plans only grow --------------------------------------------------------------------------------


def test_a_plan_grown_to_a_larger_shape_updates_and_scores_as_the_plain_one():
    """`min_shape` only adds empty micro-batches, rows and slots: the update and the log-prob pass are the
    plain plan's, to float rounding."""
    batch = make_batch(9)
    cfg = UpdateConfig(num_mini_batch=2, loss_agg_mode="seq-mean-token-mean")
    packed = dict(row_tokens=24, max_rows_per_micro=2)
    state = create_train_state(split("policy")[1], optax.sgd(0.1), seed=3)
    plain = with_packing(batch, state.rng, ppo_epoch=1, num_mini_batch=2, **packed)[PACKED]
    micro, rows, slots = packing.plan_shape(plain)
    grown = (micro + 3, rows, slots + 5)  # rows stay within the budget of 2
    bigger = with_packing(batch, state.rng, ppo_epoch=1, num_mini_batch=2, min_shape=grown, **packed)[PACKED]
    assert packing.plan_shape(bigger) == grown
    assert_same_update(run(cfg, batch, packed=packed), run(cfg, batch, packed=dict(packed, min_shape=grown)))
    attention = np.asarray(batch["attention_mask"])
    graphdef, params = split("policy")
    logprobs = compute_logprobs_fn(graphdef, chunk_rows=2)
    scores = []
    for min_shape in (None, (7, 2)):
        plan = packing.plan_passes(attention, 24, max_rows_per_chunk=2, min_shape=min_shape)
        scores.append(logprobs(params, batch["input_ids"], batch["attention_mask"], jax.device_put(plan)))
    assert packing.plan_shape(plan) == (7, 2)
    mask = batch["attention_mask"] * jnp.roll(batch["attention_mask"], 1, axis=1)
    np.testing.assert_allclose(np.asarray(scores[1] * mask), np.asarray(scores[0] * mask), rtol=1e-5, atol=1e-5)


def test_plans_carrying_the_runs_largest_shape_take_few_shapes_over_many_batches():
    """Forty batches of a GRPO run's size (256 rows, 4 minibatches, a budget of 4 packed rows of 512 tokens),
    response lengths from a few tokens to the limit, their scale drifting from batch to batch, and half the
    groups with no advantage: planned
    each on its own, the update's plans take many shapes (a compile each); carrying the largest shape so far,
    a handful, each one the previous grown."""
    rng = np.random.default_rng(0)
    rows, width, prompt = 256, 512, 96
    shapes = {"alone": [], "carried": []}
    floor = None
    for it in range(40):
        prompts = rng.integers(20, prompt, rows)
        scale = rng.uniform(2.5, 5.5)  # the lengths drift over a run (R1-like growth, collapse), batch to batch
        completions = np.minimum(rng.lognormal(scale, 0.9, rows).astype(int) + 1, width - prompt)
        columns = np.arange(width)
        attention = ((columns >= prompt - prompts[:, None]) & (columns < prompt + completions[:, None])).astype(int)
        response = ((columns >= prompt) & (columns < prompt + completions[:, None])).astype(np.float32)
        groups = np.repeat(rng.random(rows // 8) < 0.5, 8)
        batch = dict(attention_mask=attention, response_mask=response, advantages=response * groups[:, None])
        key = jax.random.key_data(jax.random.key(it))
        settings = dict(ppo_epoch=1, num_mini_batch=4, row_tokens=width, max_rows_per_micro=4, skip_zero_advantage=True)
        shapes["alone"].append(packing.plan_shape(with_packing(batch, key, **settings)[PACKED]))
        plan = with_packing(batch, key, min_shape=floor, **settings)[PACKED]
        floor = packing.plan_shape(plan)
        shapes["carried"].append(floor)
    alone, carried = len(set(shapes["alone"])), shapes["carried"]
    assert alone >= 10  # what a run compiled before (18 here)
    assert len(set(carried)) <= 6  # one per new largest batch (5 here)
    assert all(all(b >= a for a, b in zip(x, y)) for x, y in zip(carried, carried[1:]))  # only grows
