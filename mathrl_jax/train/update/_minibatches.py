"""The update's minibatches, drawn where the host can see them: each epoch's permutation of the rows
(`minibatch_order`, also on the host's CPU: `host_minibatch_order`) and the packing plan of its micro-batches
(`with_packing`), both passed with the batch to `update.make_update_fn`'s update."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

import mathrl_jax.train.update._packing as packing

PACKED = "packed"  # the batch key of a packing plan (`packing.plan_update`); micro-batches hold packed inputs
ORDER = "minibatch_order"  # the batch key of the minibatch order drawn by the host (`host_minibatch_order`)


def minibatch_order(rng: jax.Array, rows: int, epochs: int, num_mini_batch: int) -> Tuple[jax.Array, jax.Array]:
    """(the next RNG key, `[epochs * num_mini_batch, rows / num_mini_batch]` row indices): each epoch a fresh
    permutation of the rows, cut into minibatches in order. `rng` is the TrainState's raw key data."""
    key, perm_key = jax.random.split(jax.random.wrap_key_data(rng))
    perms = jnp.stack([jax.random.permutation(k, rows) for k in jax.random.split(perm_key, epochs)])
    return key, perms.reshape(epochs * num_mini_batch, rows // num_mini_batch)


_minibatch_order = jax.jit(minibatch_order, static_argnums=(1, 2, 3))  # one program on the host's side


def _host_device():
    """This process's CPU device, where the host draws; the default device where JAX has no CPU backend
    (`JAX_PLATFORMS=cuda`): threefry draws the same bits on every backend."""
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return jax.local_devices()[0]


def host_minibatch_order(rng, rows: int, ppo_epoch: int, num_mini_batch: int) -> np.ndarray:
    """`minibatch_order`'s rows, drawn on the host's CPU from the raw key data `rng` (numpy, or a device array,
    then fetched): what the update draws from a state of that `rng`, bit for bit (threefry is the same on every
    backend). Pass it in the batch under `ORDER` and the update takes it instead of drawing its own, so the host's
    packing plan and the device's minibatches come from one draw that crosses to the device once."""
    with jax.default_device(_host_device()):
        _, order = _minibatch_order(np.asarray(rng), rows, ppo_epoch, num_mini_batch)
    return np.asarray(order)


def with_packing(
    batch: Dict[str, Any],
    rng: jax.Array,
    *,
    ppo_epoch: int,
    num_mini_batch: int,
    row_tokens: int,
    max_rows_per_micro: Optional[int] = None,
    rows_multiple: int = 1,
    skip_zero_advantage: bool = False,
    min_shape: Optional[Tuple[int, int, int]] = None,
    order: Optional[np.ndarray] = None,
) -> Dict[str, Any]:
    """`batch` with the minibatch order of `rng` (`host_minibatch_order`, under `ORDER`) and a packing plan
    (`packing.plan_update`, under `PACKED`): the update then runs each of those minibatches on packed micro-batches
    of at most `max_rows_per_micro` rows of `row_tokens` tokens (None: one micro-batch per minibatch). `rng`: the
    TrainState's, the one the update is given (or `order`, drawn already); `ppo_epoch` and `num_mini_batch`: its
    `UpdateConfig`'s.

    `skip_zero_advantage` leaves out of the plan the rows whose every advantage is 0 (pass the update's
    `UpdateConfig.skip_zero_advantage`: an update without it would give those rows' metrics no value).
    `min_shape`: the plan's dimensions at least (`packing.plan_update`). The masks and advantages are read from
    the host's copies where the batch holds numpy arrays (no transfer back from the device)."""
    keys = ("attention_mask", "response_mask") + (("value_mask",) * ("value_mask" in batch))
    host = {k: np.asarray(batch[k]) for k in keys + (("advantages",) * skip_zero_advantage)}
    with_response = (host["response_mask"] > 0).any(axis=1)
    if "value_mask" in host:
        with_response |= host["value_mask"].sum(axis=1) > 0
    trained, shape_rows = with_response, None
    if skip_zero_advantage:  # the plan keeps the shape of training every row: no program per trained-row count
        trained = with_response & ((host["response_mask"] > 0) & (host["advantages"] != 0)).any(axis=1)
        shape_rows = with_response
    rows = host["attention_mask"].shape[0]
    if order is None:
        order = host_minibatch_order(rng, rows, ppo_epoch, num_mini_batch)
    plan = packing.plan_update(
        host["attention_mask"],
        trained,
        order,
        row_tokens,
        max_rows_per_micro=max_rows_per_micro,
        rows_multiple=rows_multiple,
        response_mask=host["response_mask"],
        shape_rows=shape_rows,
        min_shape=min_shape,
    )
    return {**batch, ORDER: order, PACKED: plan}
