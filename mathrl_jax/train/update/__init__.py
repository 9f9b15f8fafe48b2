"""The jitted update and what it reads: `make_update_fn` (ppo_epoch x num_mini_batch minibatch steps of a
`losses.*` function through optax), its `UpdateConfig` (how each policy loss is called), the log-prob and value
passes (padded or packed), the minibatch order and packing plans drawn on the host.

Behind the door: `_step` (the update), `_config` (UpdateConfig, policy-loss uses), `_metrics` (how the update's
metrics combine), `_passes` (the forward passes), `_minibatches` (the host's minibatch order), `_packing` (first-fit
packing plans).
"""

from mathrl_jax.train.update._config import (
    POLICY_LOSS_USES,
    WHITENING,
    PolicyLossUse,
    UpdateConfig,
    policy_loss_use,
    zero_advantage_rows_are_inert,
)
from mathrl_jax.train.update._minibatches import ORDER, PACKED, host_minibatch_order, minibatch_order, with_packing
from mathrl_jax.train.update._packing import first_fit, plan_passes, plan_shape, plan_update, token_extents
from mathrl_jax.train.update._passes import (
    compute_logprobs_fn,
    compute_values_fn,
    critic_values,
    packed_inputs,
    policy_logprobs,
    shifted_logprobs,
    unpack,
)
from mathrl_jax.train.update._step import make_update_fn

__all__ = [
    "ORDER",
    "PACKED",
    "POLICY_LOSS_USES",
    "PolicyLossUse",
    "UpdateConfig",
    "WHITENING",
    "compute_logprobs_fn",
    "compute_values_fn",
    "critic_values",
    "first_fit",
    "host_minibatch_order",
    "make_update_fn",
    "minibatch_order",
    "packed_inputs",
    "plan_passes",
    "plan_shape",
    "plan_update",
    "policy_logprobs",
    "policy_loss_use",
    "shifted_logprobs",
    "token_extents",
    "unpack",
    "with_packing",
    "zero_advantage_rows_are_inert",
]
