"""The jitted update: exact micro-batch accumulation, the optimizer step count, non-finite skips,
the approx-KL early stop, the critic update; and the per-algorithm advantages of train/batch/_advantages.py."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from mathrl_jax import losses
from mathrl_jax.models import QwenCritic, QwenForCausalLM, tiny_config
from mathrl_jax.train.batch import _advantages as advantages_lib
from mathrl_jax.train.state import create_train_state, learning_rate_schedule, make_optimizer
from mathrl_jax.train.update._passes import compute_logprobs_fn, compute_values_fn
from mathrl_jax.train.update._step import UpdateConfig, make_update_fn

CONFIG = tiny_config(num_hidden_layers=1)
N, L = 8, 10


@functools.lru_cache(maxsize=None)
def split_policy():
    return nnx.split(QwenForCausalLM(CONFIG, rngs=nnx.Rngs(0)))


def make_batch(seed=0):
    graphdef, params = split_policy()
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, CONFIG.vocab_size, (N, L)).astype(np.int32)
    attention = np.ones((N, L), np.int32)
    attention[1, :3] = 0  # left padding
    response = np.zeros((N, L), np.float32)
    response[:, 5:] = 1.0
    response[2, 8:] = 0.0  # a short response
    old = compute_logprobs_fn(graphdef)(params, ids, attention) * response
    advantages = rng.normal(size=(N, 1)).astype(np.float32) * response
    return {
        "input_ids": jnp.asarray(ids),
        "attention_mask": jnp.asarray(attention),
        "response_mask": jnp.asarray(response),
        "old_logprobs": old + 0.05 * jnp.asarray(rng.normal(size=(N, L)), jnp.float32) * response,
        "advantages": jnp.asarray(advantages),
        "ref_logprobs": old,
    }


def run_update(cfg, batch, optimizer=None, state=None):
    graphdef, params = split_policy()
    optimizer = optimizer or make_optimizer(1e-2, max_grad_norm=None)
    state = state or create_train_state(params, optimizer, seed=0)
    return make_update_fn(graphdef, optimizer, cfg, donate=False)(state, batch)


def assert_trees_close(a, b, **kw):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kw)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_accumulation_is_exact(mode):
    batch = make_batch()
    # Plain SGD: the params move by exactly -grad, so equal params mean equal gradients (Adam's first step,
    # lr * g / |g|, would amplify rounding noise of gradients near 0).
    sgd = optax.sgd(1.0)
    whole, m1 = run_update(UpdateConfig(num_mini_batch=2, loss_agg_mode=mode, kl_coef=0.1), batch, sgd)
    cfg = UpdateConfig(num_mini_batch=2, micro_batch_size=1, loss_agg_mode=mode, kl_coef=0.1)
    micro, m2 = run_update(cfg, batch, sgd)
    assert_trees_close(whole.params, micro.params, atol=2e-6)
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-5)
    # Every metric too: loss shares summed over micro-batches, maxima maxed, means weighted by tokens.
    assert set(m1) == set(m2)
    for key in m1:
        np.testing.assert_allclose(m1[key], m2[key], rtol=1e-4, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("whitening", [None, "actions"])
def test_micro_batch_accumulation_is_exact_for_the_action_level_loss(whitening):
    batch = make_batch()
    rng = np.random.default_rng(1)
    steps = np.cumsum(rng.random((N, L)) < 0.4, axis=1).astype(np.int32)  # random step boundaries
    batch["action_index"] = jnp.asarray(steps * np.asarray(batch["response_mask"] > 0))
    sgd = optax.sgd(1.0)
    settings = dict(policy_loss="action_ppo", num_mini_batch=2, entropy_coef=0.01, minibatch_whitening=whitening)
    whole, m1 = run_update(UpdateConfig(**settings), batch, sgd)
    micro, m2 = run_update(UpdateConfig(micro_batch_size=1, **settings), batch, sgd)
    assert_trees_close(whole.params, micro.params, atol=2e-6)
    np.testing.assert_allclose(m1["approx_kl"], m2["approx_kl"], rtol=1e-5, atol=1e-9)


def test_epochs_times_minibatches_optimizer_steps_and_version():
    optimizer = make_optimizer(1e-2, max_grad_norm=1.0)
    state, metrics = run_update(UpdateConfig(ppo_epoch=3, num_mini_batch=2), make_batch(), optimizer)
    adam_state = state.opt_state[1][0]  # chain(clip, adamw): adamw's scale_by_adam state
    assert int(adam_state.count) == 6
    assert int(state.step) == 1 and int(state.policy_version) == 1
    assert metrics["applied_fraction"] == 1.0 and metrics["skipped_updates"] == 0.0


def test_non_finite_loss_skips_the_step_without_touching_params():
    batch = make_batch()
    batch["advantages"] = batch["advantages"].at[0, 6].set(jnp.nan)
    graphdef, params = split_policy()
    optimizer = make_optimizer(1e-2)
    state = create_train_state(params, optimizer, seed=0)
    new_state, metrics = run_update(UpdateConfig(num_mini_batch=1), batch, optimizer, state)
    assert int(new_state.skipped_updates) == 1 and metrics["applied_fraction"] == 0.0
    for a, b in zip(
        jax.tree.leaves((state.params, state.opt_state)), jax.tree.leaves((new_state.params, new_state.opt_state))
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_approx_kl_guard_skips_the_policy_step_of_each_minibatch_over_it():
    batch = make_batch()
    batch["old_logprobs"] = batch["old_logprobs"] - 1.0 * batch["response_mask"]  # far from the current policy
    graphdef, params = split_policy()
    optimizer = make_optimizer(1e-2)
    state = create_train_state(params, optimizer, seed=0)
    new_state, metrics = run_update(UpdateConfig(num_mini_batch=2, target_kl=0.02), batch, optimizer, state)
    assert metrics["kl_skipped_fraction"] == 1.0 and metrics["applied_fraction"] == 0.0
    assert_trees_close(state.params, new_state.params, atol=0)
    kept, kept_metrics = run_update(UpdateConfig(num_mini_batch=2, target_kl=1e6), batch, optimizer, state)
    assert kept_metrics["applied_fraction"] == 1.0


def test_critic_update_fits_returns():
    graphdef, params = split_policy()
    critic_graphdef, critic_params = nnx.split(QwenCritic(CONFIG, rngs=nnx.Rngs(1)))
    batch = make_batch()
    values = compute_values_fn(critic_graphdef)
    returns = batch["response_mask"] * 0.7
    batch.update(
        returns=returns,
        old_values=values(critic_params, batch["input_ids"], batch["attention_mask"]),
        value_mask=batch["response_mask"],
    )
    optimizer, critic_optimizer = make_optimizer(1e-3), make_optimizer(3e-2)
    state = create_train_state(
        params, optimizer, seed=0, critic_params=critic_params, critic_optimizer=critic_optimizer
    )
    update = make_update_fn(
        graphdef,
        optimizer,
        UpdateConfig(value_clip=None),
        critic_graphdef=critic_graphdef,
        critic_optimizer=critic_optimizer,
        donate=False,
    )
    first = None
    for _ in range(15):
        state, metrics = update(state, batch)
        first = metrics["value_loss"] if first is None else first
    assert metrics["value_loss"] < 0.2 * first


def test_learning_rate_schedules():
    schedule = learning_rate_schedule(1.0, schedule="cosine", warmup_steps=4, total_steps=14)
    np.testing.assert_allclose([schedule(i) for i in (0, 2, 4, 9, 14)], [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)
    linear = learning_rate_schedule(2.0, schedule="linear", total_steps=10)
    np.testing.assert_allclose([linear(0), linear(5), linear(10)], [2.0, 1.0, 0.0], atol=1e-6)
    with pytest.raises(ValueError, match="schedule 'step'"):
        learning_rate_schedule(1.0, schedule="step")


def _adafactor_reference(params, grads_per_step, lr, weight_decay):
    """Shazeer & Stern (2018), Algorithm 4 with Hugging Face's fine-tuning settings, in numpy: second-moment decay
    1 - t^-0.8, a factored estimate for matrices with both sides >= 128, updates clipped to RMS 1, then decoupled
    weight decay and the learning rate."""
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    moments = {}
    for t, grads in enumerate(grads_per_step, start=1):
        decay = 1.0 - t**-0.8
        for k, g in grads.items():
            g = np.asarray(g, np.float64)
            square = g * g + 1e-30
            if g.ndim == 2 and min(g.shape) >= 128:
                row, col = moments.get(k, (np.zeros(g.shape[0]), np.zeros(g.shape[1])))
                row = decay * row + (1 - decay) * square.mean(axis=1)
                col = decay * col + (1 - decay) * square.mean(axis=0)
                moments[k] = (row, col)
                v = np.outer(row, col) / row.mean()
            else:
                v = decay * moments.get(k, np.zeros_like(g)) + (1 - decay) * square
                moments[k] = v
            u = g / np.sqrt(v)
            u = u / max(1.0, np.sqrt(np.mean(u * u)))
            params[k] = params[k] - lr * (u + weight_decay * params[k])
    return params


def test_adafactor_follows_its_formula_and_keeps_a_factored_state():
    rng = np.random.default_rng(0)
    params = {"matrix": rng.normal(size=(128, 160)).astype(np.float32), "vector": rng.normal(size=7).astype(np.float32)}
    grads = [{k: rng.normal(size=v.shape).astype(np.float32) * (1 + i) for k, v in params.items()} for i in range(3)]
    optimizer = make_optimizer(1e-2, name="adafactor", max_grad_norm=None, weight_decay=0.1)
    state = optimizer.init(params)
    current = {k: jnp.asarray(v) for k, v in params.items()}
    for g in grads:
        updates, state = optimizer.update(g, state, current)
        current = optax.apply_updates(current, updates)
    expected = _adafactor_reference(params, grads, 1e-2, 0.1)
    for k in params:
        np.testing.assert_allclose(current[k], expected[k], rtol=1e-5, atol=1e-6)

    # The matrix's second moment is a row and a column vector; AdamW keeps two full copies of the params.
    def floats(tree):
        return sum(x.size for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating))

    assert floats(state) < 0.02 * floats(params)
    assert floats(make_optimizer(1e-2).init(params)) >= 2 * floats(params)


def test_an_unknown_optimizer_is_named():
    with pytest.raises(ValueError, match="optimizer 'sgd'"):
        make_optimizer(1e-2, name="sgd")


# ----------------------------------------------------------------------------- advantages


def test_last_token_rewards_and_action_indices():
    mask = jnp.asarray([[0, 1, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]], jnp.float32)
    rewards = losses.last_token_rewards(jnp.asarray([2.0, 5.0, -1.0]), mask)
    np.testing.assert_array_equal(rewards, [[0, 0, 0, 2, 0], [0, 0, 0, 0, 0], [0, -1, 0, 0, 0]])
    ids = jnp.asarray([[9, 4, 7, 4, 5, 5]])
    index = losses.action_index_from_separators(ids, jnp.ones((1, 6)), [4])
    np.testing.assert_array_equal(index, [[0, 0, 1, 1, 2, 2]])  # a separator ends its own step


def test_dapo_filter_and_overlong_penalty_formulas():
    scores = np.array([1, 1, 0, 1, 0, 0, 1, 0], np.float32)
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    keep = advantages_lib.dapo_group_filter(np.where(np.arange(8) < 2, 1.0, scores), groups)
    np.testing.assert_array_equal(keep, [False, False, True, True, False, False, True, True])
    penalty = advantages_lib.overlong_penalty(
        np.array([10, 12, 14, 16]), max_new_tokens=16, buffer_len=4, penalty_factor=2.0
    )
    np.testing.assert_allclose(penalty, [0.0, 0.0, -1.0, -2.0])


def numpy_gae(rewards, values, gamma, lam):
    adv, running = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(rewards) else 0.0
        running = rewards[t] + gamma * next_value - values[t] + gamma * lam * running
        adv[t] = running
    return adv


def test_action_level_gae_matches_a_per_action_numpy_recursion():
    rng = np.random.default_rng(0)
    index = jnp.asarray([[0, 0, 0, 1, 1, 2, 2, 2, 0, 0]])
    mask = jnp.asarray([[1, 1, 1, 1, 1, 1, 1, 1, 0, 0]], jnp.float32)
    values = jnp.asarray(rng.normal(size=(1, 10)), jnp.float32)
    token_rewards = losses.last_token_rewards(jnp.asarray([1.5]), mask)
    adv, ret, value_mask = losses.action_level_gae(
        token_rewards, values, index, mask, max_actions=4, gamma=0.9, lam=0.8
    )
    action_values = np.asarray(values)[0, [0, 3, 5]]
    expected = numpy_gae(np.array([0.0, 0.0, 1.5]), action_values, 0.9, 0.8)
    np.testing.assert_allclose(np.asarray(adv)[0, :8], np.repeat(expected, [3, 2, 3]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ret)[0, :8], np.repeat(expected + action_values, [3, 2, 3]), rtol=1e-5)
    np.testing.assert_array_equal(value_mask, [[1, 0, 0, 1, 0, 1, 0, 0, 0, 0]])


def test_group_advantages_respect_the_row_mask():
    batch = {"response_mask": jnp.ones((4, 3)), "input_ids": jnp.zeros((4, 3), jnp.int32)}
    scores = jnp.asarray([1.0, 0.0, 1.0, 1.0])
    out = advantages_lib.compute_advantages(
        "grpo", batch, scores, group_ids=jnp.asarray([0, 0, 1, 1]), num_groups=2, row_mask=jnp.asarray([1, 1, 0, 0])
    )
    expected = losses.group_relative_advantages(scores[:2], jnp.asarray([0, 0]), num_groups=1)
    np.testing.assert_allclose(out["advantages"][:2, 0], expected, rtol=1e-6)
    np.testing.assert_array_equal(out["advantages"][2:], 0.0)
    np.testing.assert_array_equal(out["response_mask"][2:], 0.0)
    with pytest.raises(ValueError, match="algorithm 'sft'"):
        advantages_lib.compute_advantages("sft", batch, scores)


def test_log_probs_and_values_in_row_chunks_equal_the_whole_batch():
    graphdef, params = split_policy()
    critic_graphdef, critic_params = nnx.split(QwenCritic(CONFIG, rngs=nnx.Rngs(1)))
    batch = make_batch(3)
    args = (batch["input_ids"], batch["attention_mask"])
    whole = compute_logprobs_fn(graphdef)(params, *args)
    for rows in (1, 2, 4, 3):  # 3 does not divide 8: all rows at once
        np.testing.assert_allclose(compute_logprobs_fn(graphdef, chunk_rows=rows)(params, *args), whole, atol=1e-5)
    remat_graphdef = nnx.graphdef(QwenForCausalLM(tiny_config(num_hidden_layers=1, remat=True), rngs=nnx.Rngs(0)))
    chunked_remat = compute_logprobs_fn(remat_graphdef, chunk_rows=2)(params, *args)  # NNX remat inside the loop
    np.testing.assert_allclose(chunked_remat, whole, atol=1e-5)
    values = compute_values_fn(critic_graphdef)(critic_params, *args)
    np.testing.assert_allclose(compute_values_fn(critic_graphdef, 2)(critic_params, *args), values, atol=1e-5)
    assert not np.allclose(whole[1:], whole[:-1])  # rows differ: a chunk mix-up would show


def test_padding_rows_do_not_dilute_the_metrics():
    # Multi-turn and DAPO batches carry rows with no response token; whole micro-batches of them must not
    # pull the token-mean metrics towards 0 (they used to read 1/2 and 3/4 of their values).
    batch = make_batch(4)
    padded = {k: jnp.concatenate([v, jnp.zeros_like(v) if k == "response_mask" else v]) for k, v in batch.items()}
    cfg = UpdateConfig(num_mini_batch=1, kl_coef=0.1)
    _, plain = run_update(cfg, batch, optax.sgd(0.0))
    _, split = run_update(dataclasses.replace(cfg, micro_batch_size=2), padded, optax.sgd(0.0))
    for key in ("entropy", "importance_weight", "approx_kl", "kl", "clip_fraction"):
        np.testing.assert_allclose(split[key], plain[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert float(plain["entropy"]) > 1.0
    np.testing.assert_allclose(split["grad_norm"], plain["grad_norm"], rtol=1e-5)


def test_the_hosts_minibatch_order_is_the_one_the_update_draws():
    """The loop draws each update's minibatch order on the host (`host_minibatch_order` from the state's key) and
    passes it with the batch: the update given it ends bit for bit where the update drawing its own does, its
    state's key included, over several updates; an order of the wrong shape is refused."""
    from mathrl_jax.train.update._minibatches import ORDER, host_minibatch_order

    graphdef, params = split_policy()
    optimizer = make_optimizer(1e-2, max_grad_norm=None)
    cfg = UpdateConfig(ppo_epoch=2, num_mini_batch=2)
    update = make_update_fn(graphdef, optimizer, cfg, donate=False)
    drawn = given = create_train_state(params, optimizer, seed=7)
    for step in range(3):
        batch = make_batch(step)
        order = host_minibatch_order(np.asarray(given.rng), N, cfg.ppo_epoch, cfg.num_mini_batch)
        drawn, drawn_metrics = update(drawn, batch)
        given, given_metrics = update(given, {**batch, ORDER: order})
        for a, b in zip(jax.tree.leaves(drawn), jax.tree.leaves(given)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert float(given_metrics["loss"]) == float(drawn_metrics["loss"])
    # Another order is another update: the given one is the one used.
    other = host_minibatch_order(np.asarray(drawn.rng)[::-1].copy(), N, cfg.ppo_epoch, cfg.num_mini_batch)
    assert not np.array_equal(other, host_minibatch_order(np.asarray(given.rng), N, cfg.ppo_epoch, cfg.num_mini_batch))
    moved, _ = update(given, {**make_batch(3), ORDER: other})
    kept, _ = update(given, make_batch(3))
    assert any(
        not np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(moved.params), jax.tree.leaves(kept.params))
    )


def test_every_algorithm_record_names_a_registered_estimator_and_loss_use():
    """The algorithm record does the dispatch (nothing below the build compares names): each record's estimator
    is in the losses registry and has a way to be called (`FROM_SCORES` / `FROM_VALUES`, a critic's estimators
    with a critic), its policy loss is registered with a `PolicyLossUse`, and the OpenR whitening is one the
    update knows."""
    from mathrl_jax.losses import registry
    from mathrl_jax.train import algorithms
    from mathrl_jax.train.update import _config as update_lib

    for name, record in algorithms.ALGORITHMS.items():
        assert record.advantages in registry.ADVANTAGE_ESTIMATORS, name
        assert (record.advantages in advantages_lib.FROM_VALUES) == record.critic, name
        assert record.advantages in advantages_lib.FROM_SCORES or record.critic, name
        assert record.policy_loss in registry.POLICY_LOSSES and record.policy_loss in update_lib.POLICY_LOSS_USES
        assert record.openr_whitening in update_lib.WHITENING, name
        assert not record.actions or record.critic, name  # the actions are the critic's (APPO, TPPO)
    assert update_lib.policy_loss_use("a loss of the user's") == update_lib.PolicyLossUse()


def test_an_order_of_the_wrong_shape_is_refused():
    from mathrl_jax.train.update._minibatches import ORDER

    with pytest.raises(ValueError, match="minibatch order has shape"):
        run_update(UpdateConfig(num_mini_batch=2), {**make_batch(), ORDER: np.zeros((1, N), np.int32)})


@pytest.mark.parametrize("micro_batch_size", [0, 2], ids=["whole minibatch", "micro-batches"])
def test_a_lora_step_is_the_chain_rule_of_the_full_step(micro_batch_size):
    """One SGD step of a LoRA policy against one of the same model training every weight. At B = 0 the two
    models are the same function, so the loss's gradient G with respect to a projection's kernel is the same,
    and the chain rule through W + s A B gives dL/dB = s A^T G and dL/dA = s G B^T = 0: the adapters' step is the
    full step's kernel step projected through A, and the base (passed as `frozen`) does not move."""
    lora = dict(lora_rank=4, lora_alpha=8.0, lora_targets=("q_proj", "up_proj"))
    graphdef, params = split_policy()
    adapted = QwenForCausalLM(dataclasses.replace(CONFIG, **lora), rngs=nnx.Rngs(0))
    adapted_graphdef, adapters, frozen = nnx.split(adapted, nnx.LoRAParam, ...)
    nnx.replace_by_pure_dict(frozen, nnx.to_pure_dict(params))  # the same base weights as the full model's
    batch, sgd = make_batch(), optax.sgd(1.0)
    cfg = UpdateConfig(num_mini_batch=1, micro_batch_size=micro_batch_size or None, kl_coef=0.1)
    full, full_metrics = run_update(cfg, batch, sgd)
    state = create_train_state(adapters, sgd, seed=0)
    update = make_update_fn(adapted_graphdef, sgd, cfg, donate=False)
    new, metrics = update(state, batch, frozen)
    np.testing.assert_allclose(metrics["loss"], full_metrics["loss"], rtol=1e-6)
    before, after, full_after = nnx.to_pure_dict(adapters), nnx.to_pure_dict(new.params), nnx.to_pure_dict(full.params)
    start = nnx.to_pure_dict(params)
    for block, name in (("self_attn", "q_proj"), ("mlp", "up_proj")):
        kernel_step = (
            full_after["model"]["layers"][0][block][name]["kernel"] - start["model"]["layers"][0][block][name]["kernel"]
        )
        a = before["model"]["layers"][0][block][name]["lora"]["lora_a"]
        b_step = after["model"]["layers"][0][block][name]["lora"]["lora_b"]  # B was 0
        want = 2.0 * a.T @ kernel_step  # s = alpha / r = 2
        np.testing.assert_allclose(b_step, want, atol=1e-6 * float(np.abs(want).max()) + 1e-9)
        assert np.abs(want).max() > 1e-4
        np.testing.assert_array_equal(after["model"]["layers"][0][block][name]["lora"]["lora_a"], a)
