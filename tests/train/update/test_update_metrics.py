"""The update's dashboard metrics: `minibatches_trained`, the measurements left out of an update that trained no
token (they were logged as 0.0 as if measured), averages over the minibatches that trained only, and `lr`, the
learning rate its optimizer steps used, against the schedule's formula."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mathrl_jax.train.reporting import measured_update_metrics as measured_metrics
from mathrl_jax.train.state import create_train_state, make_optimizer
from mathrl_jax.train.update import ORDER, UpdateConfig, make_update_fn
from tests.train.update.test_update import N, make_batch, split_policy

MEASURED = ("loss", "policy_loss", "entropy", "approx_kl", "ppo_kl", "clip_fraction", "importance_weight", "grad_norm")


def update_with(cfg, batch, optimizer, schedule=None, state=None, times=1):
    graphdef, params = split_policy()
    state = state or create_train_state(params, optimizer, seed=0)
    update = make_update_fn(graphdef, optimizer, cfg, donate=False, learning_rate=schedule)
    for _ in range(times):
        state, metrics = update(state, batch)
    return state, {k: np.asarray(v) for k, v in metrics.items()}


def test_an_update_that_trains_no_token_reports_none_of_its_measurements():
    """Every advantage 0 with skip_zero_advantage: no row trains. The update used to report entropy_loss 0.0,
    grad_norm 0.0, importance_weight 0.0; now it counts 0 minibatches trained and the measurements are absent."""
    batch = make_batch()
    batch["advantages"] = jnp.zeros_like(batch["advantages"])
    cfg = UpdateConfig(num_mini_batch=2, skip_zero_advantage=True)
    _, metrics = update_with(cfg, batch, optax.sgd(0.1))
    assert metrics["minibatches_trained"] == 0 and metrics["trained_token_fraction"] == 0.0
    kept = measured_metrics(metrics)
    for name in MEASURED:
        assert name in metrics and name not in kept, name
    assert set(kept) == {"minibatches_trained", "trained_token_fraction", "skipped_updates", "kl_skipped_fraction"}

    # The same batch without skipping: every row's passes ran, so entropy and ratios are measured (and kept).
    _, plain = update_with(UpdateConfig(num_mini_batch=2), batch, optax.sgd(0.1))
    assert plain["minibatches_trained"] == 2 and measured_metrics(plain).keys() == plain.keys()
    assert plain["entropy"] > 1.0 and plain["importance_weight"] > 0.5


def test_a_minibatch_that_trains_nothing_weighs_nothing():
    """Two minibatches, the first of rows with zero advantages (skipped): the update's loss, gradient norm and
    entropy are those of the second alone, an update of its rows by themselves (SGD on a zero gradient leaves the
    params where they were, so the second step starts from the same params)."""
    batch = make_batch()
    half = N // 2
    batch["advantages"] = batch["advantages"].at[:half].set(0.0)
    batch[ORDER] = jnp.arange(N, dtype=jnp.int32).reshape(2, half)
    cfg = UpdateConfig(num_mini_batch=2, skip_zero_advantage=True)
    _, both = update_with(cfg, batch, optax.sgd(0.1))
    second = {k: v[half:] for k, v in batch.items() if k != ORDER}
    _, alone = update_with(UpdateConfig(num_mini_batch=1), second, optax.sgd(0.1))
    assert both["minibatches_trained"] == 1 and alone["minibatches_trained"] == 1
    for name in ("loss", "grad_norm", "policy_loss", "entropy", "approx_kl", "importance_weight"):
        np.testing.assert_allclose(both[name], alone[name], rtol=1e-5, atol=1e-7, err_msg=name)
    assert both["applied_fraction"] == 1.0


@pytest.mark.parametrize("epochs, minibatches", [(1, 1), (2, 2)])
def test_lr_is_the_schedules_rate_at_each_step_averaged(epochs, minibatches):
    """Linear warm-up over 10 steps from 0 to 1e-2: step c (counted from 0) uses 1e-2 * c / 10. After two updates
    of S = epochs x minibatches steps, the second's steps are S .. 2S - 1."""
    optimizer, schedule = make_optimizer(1e-2, warmup_steps=10, total_steps=100, return_schedule=True)
    cfg = UpdateConfig(ppo_epoch=epochs, num_mini_batch=minibatches)
    _, metrics = update_with(cfg, make_batch(), optimizer, schedule, times=2)
    steps = epochs * minibatches
    expected = np.mean([1e-2 * c / 10 for c in range(steps, 2 * steps)])
    np.testing.assert_allclose(metrics["lr"], expected, rtol=1e-6)
    _, without = update_with(cfg, make_batch(), optimizer)  # no schedule given: no lr
    assert "lr" not in without


def test_a_skipped_step_does_not_advance_the_schedule():
    """A non-finite loss skips the step (params and optimizer state untouched): the next update's rate is the
    one the skipped step would have used."""
    optimizer, schedule = make_optimizer(1e-2, warmup_steps=10, total_steps=100, return_schedule=True)
    bad = make_batch()
    bad["advantages"] = bad["advantages"].at[0, 6].set(jnp.nan)
    state, first = update_with(UpdateConfig(num_mini_batch=1), bad, optimizer, schedule)
    assert first["skipped_updates"] == 1 and first["lr"] == 0.0
    _, second = update_with(UpdateConfig(num_mini_batch=1), make_batch(), optimizer, schedule, state=state)
    assert second["lr"] == 0.0  # still step 0 of the warm-up
