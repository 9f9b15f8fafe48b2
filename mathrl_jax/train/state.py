"""`TrainState`: everything a run needs to continue exactly, as one pytree.

The reference policy is not in it: it is frozen, so it is rebuilt from where
it came from (the starting checkpoint) rather than saved at every step. What
the loop keeps on the host (`HostState`: the data-loader position, the batch
shapes) is JSON and travels in the checkpoint metadata.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from mathrl_jax import sharding
from mathrl_jax.sharding import distributed


@dataclasses.dataclass(frozen=True)
class HostState:
    """What the loop keeps on the host between iterations, beside the `TrainState`, and saves with it.

    data_state: the loader's position after the last batch the learner consumed (None: the loader's own, before
      the first iteration).
    shape_floors: the batch shapes the run has grown to (the width, the packing plans' dimensions): a batch is
      planned at least as large as any before it, so the update and the passes compile once per growth, not per
      batch; a resumed run pads and packs as the uninterrupted one. `batch.prepare_batch` returns the next ones.

    A generator's batches made ahead (`async_ppo`) are its source's, saved from `source.pending(iteration)`.
    """

    data_state: Optional[Dict[str, int]] = None
    shape_floors: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@flax.struct.dataclass
class TrainState:
    """Policy (and optional critic) params with their optimizer states, step, RNG and version.

    Attributes:
      params: the policy's trained `nnx.State`: every weight, or a LoRA run's adapters alone (`model_params`
        joins them with the frozen base).
      opt_state: its optax state.
      step: `[]` int32 updates done (iterations of the loop).
      rng: `[2]` uint32 raw key data (`jax.random.key_data`): plain arrays checkpoint bit-exactly.
      policy_version: `[]` int32 version of `params` (bumped at every update; samplers record it).
      skipped_updates: `[]` int32 minibatch updates skipped for a non-finite loss or gradient.
      critic_params, critic_opt_state: the critic's, for PPO-family algorithms; None otherwise.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    policy_version: jax.Array
    skipped_updates: jax.Array
    critic_params: Any = None
    critic_opt_state: Any = None


def create_train_state(
    params: Any,
    optimizer: optax.GradientTransformation,
    *,
    seed: int,
    critic_params: Any = None,
    critic_optimizer: Optional[optax.GradientTransformation] = None,
) -> TrainState:
    if (critic_params is None) != (critic_optimizer is None):
        raise ValueError("critic_params and critic_optimizer go together: pass both or neither")
    return TrainState(
        params=params,
        opt_state=optimizer.init(params),
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.key_data(jax.random.key(seed)),
        policy_version=jnp.zeros((), jnp.int32),
        skipped_updates=jnp.zeros((), jnp.int32),
        critic_params=critic_params,
        critic_opt_state=None if critic_params is None else critic_optimizer.init(critic_params),
    )


def model_params(params: Any, frozen: Any = None) -> Any:
    """The policy's whole `nnx.State`: the trained `params` (`TrainState.params`) joined with the `frozen` part a
    LoRA run does not train (its base weights), or `params` alone (None: every weight trains). No array is
    copied: the base is held once, beside the state, never donated and never checkpointed."""
    if frozen is None:
        return params
    # Rebuilt leaf by leaf: `merge_state` hands back the Variables of its inputs, and a model merged from Variables
    # made at an outer trace level cannot be split again inside a lifted transform (remat's `nnx.remat`: flax's
    # TraceContextError "Cannot mutate Param from a different trace level").
    return jax.tree.map(lambda x: x, nnx.merge_state(frozen, params))


SCHEDULES = ("constant", "linear", "cosine")


def learning_rate_schedule(
    learning_rate: float,
    *,
    schedule: str = "constant",
    warmup_steps: int = 0,
    total_steps: int = 1,
    end_factor: float = 0.0,
) -> optax.Schedule:
    """Linear warm-up from 0 over `warmup_steps`, then constant, linear or cosine decay to `end_factor * lr`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"lr schedule {schedule!r}: expected one of {SCHEDULES}")
    if learning_rate <= 0 or warmup_steps < 0 or total_steps < 1:
        raise ValueError(
            f"learning_rate={learning_rate}, warmup_steps={warmup_steps}, total_steps={total_steps}: "
            "expected lr > 0, warmup >= 0, total >= 1"
        )
    decay_steps = max(total_steps - warmup_steps, 1)
    if schedule == "constant":
        main = optax.constant_schedule(learning_rate)
    elif schedule == "linear":
        main = optax.linear_schedule(learning_rate, learning_rate * end_factor, decay_steps)
    else:
        main = optax.cosine_decay_schedule(learning_rate, decay_steps, alpha=end_factor)
    if warmup_steps == 0:
        return main
    return optax.join_schedules([optax.linear_schedule(0.0, learning_rate, warmup_steps), main], [warmup_steps])


OPTIMIZERS = ("adamw", "adafactor")


def make_optimizer(
    learning_rate: float,
    *,
    name: str = "adamw",
    schedule: str = "constant",
    warmup_steps: int = 0,
    total_steps: int = 1,
    end_factor: float = 0.0,
    weight_decay: float = 0.0,
    max_grad_norm: Optional[float] = 1.0,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    return_schedule: bool = False,
) -> Union[optax.GradientTransformation, Tuple[optax.GradientTransformation, optax.Schedule]]:
    """AdamW (or Adafactor) with global-norm clipping (verl / OpenR defaults: clip 1.0) and a schedule counted in
    optimizer steps.

    `name="adafactor"` keeps a factored second moment (a row and a column vector per matrix, Shazeer & Stern 2018)
    and no first moment, where AdamW keeps two float32 moments the size of the params: at the Qwen2.5-1.5B shape
    12.3 GB of state fall to a few MB, which is what lets that model's update run on a 24 GB machine. It is
    Hugging Face's `Adafactor(scale_parameter=False, relative_step=False)` in optax's parts: an absolute learning
    rate (no parameter-scale multiplication), updates clipped to RMS 1, decay rate 0.8; `weight_decay` decoupled
    and scaled by the learning rate, as in AdamW. One difference: optax factors a matrix only when both its sides
    are >= 128 (`scale_by_factored_rms`' default), Hugging Face every matrix; a smaller one keeps a full second
    moment. The moments take the params' dtype (float32 master weights: float32). `b1`, `b2` and `eps` are
    AdamW's. The supervised warm-start keeps AdamW whatever this says.

    The learning rate follows `learning_rate_schedule(learning_rate, schedule=..., warmup_steps=...,
    total_steps=..., end_factor=...)`; `max_grad_norm` None or 0 clips nothing. With `return_schedule`,
    returns (optimizer, that schedule), e.g. to log the learning rate of a step.
    """
    lr = learning_rate_schedule(
        learning_rate, schedule=schedule, warmup_steps=warmup_steps, total_steps=total_steps, end_factor=end_factor
    )
    parts = [] if not max_grad_norm else [optax.clip_by_global_norm(max_grad_norm)]
    if name == "adamw":
        parts.append(optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
    elif name == "adafactor":
        parts += [
            optax.scale_by_factored_rms(decay_rate=0.8),
            optax.clip_by_block_rms(1.0),
            optax.add_decayed_weights(weight_decay),
            optax.scale_by_learning_rate(lr),
        ]
    else:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")
    optimizer = optax.chain(*parts)
    return (optimizer, lr) if return_schedule else optimizer


def place_state(state: TrainState, mesh, rules) -> TrainState:
    """Every leaf on the mesh: params and optimizer states by the partition rules, scalars replicated.

    Done before a restore too, so restored leaves land on the same shardings (the checkpoint takes the
    target's) and the jitted update sees one device set.
    """
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def put(tree):
        return None if tree is None else sharding.shard_tree(tree, mesh, rules)

    def put_optimizer_state(tree):
        return None if tree is None else distributed.put(tree, sharding.optimizer_state_shardings(tree, mesh, rules))

    return state.replace(
        params=put(state.params),
        opt_state=put_optimizer_state(state.opt_state),
        critic_params=put(state.critic_params),
        critic_opt_state=put_optimizer_state(state.critic_opt_state),
        **{
            k: distributed.put(getattr(state, k), replicated)
            for k in ("step", "rng", "policy_version", "skipped_updates")
        },
    )
