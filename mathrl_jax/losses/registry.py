"""Losses and estimators by name, so a config can pick them.

    loss_fn = get_policy_loss(config.policy_loss)       # e.g. "ppo"
    estimator = get_advantage_estimator("grpo")

Policy losses share the signature `(logprobs, old_logprobs, advantages, mask, **kwargs)`;
advantage estimators have the signatures documented in `advantages.py` and
`action_decomposition.py`. `register_*` lets a user add their own.
"""

from __future__ import annotations

from typing import Callable, Dict

from mathrl_jax.losses import action_decomposition, advantages, kl, policy, value

POLICY_LOSSES: Dict[str, Callable] = {
    "ppo": policy.ppo_clip_loss,
    "action_ppo": policy.action_ppo_loss,
    "decoupled_ppo": policy.decoupled_ppo_loss,
    "gspo": policy.gspo_loss,
    "reinforce": policy.reinforce_loss,
}

VALUE_LOSSES: Dict[str, Callable] = {
    "clipped": value.clipped_value_loss,
}

ADVANTAGE_ESTIMATORS: Dict[str, Callable] = {
    "gae": advantages.gae_advantages,
    "grpo": advantages.group_relative_advantages,
    "drgrpo": advantages.dr_grpo_advantages,
    "rloo": advantages.rloo_advantages,
    "reinforce_plus_plus": advantages.reinforce_plus_plus_advantages,
    "reinforce_plus_plus_baseline": advantages.reinforce_plus_plus_baseline_advantages,
    "rebn": advantages.rebn_advantages,
    "batch_norm": advantages.batch_normalized_advantages,
    "action_decomposed_gae": action_decomposition.action_decomposed_gae,
    "action_level_gae": action_decomposition.action_level_gae,
    "naive_token_gae": action_decomposition.naive_token_gae,
}


def _lookup(table: Dict[str, Callable], kind: str, name: str) -> Callable:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; expected one of {', '.join(sorted(table))}") from None


def _register(table: Dict[str, Callable], kind: str, name: str, fn: Callable) -> Callable:
    if name in table and table[name] is not fn:
        raise ValueError(f"{kind} {name!r} is already registered")
    table[name] = fn
    return fn


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as `name` (see `POLICY_LOSSES`)."""
    return _lookup(POLICY_LOSSES, "policy loss", name)


def get_value_loss(name: str) -> Callable:
    """The value loss registered as `name` (see `VALUE_LOSSES`)."""
    return _lookup(VALUE_LOSSES, "value loss", name)


def get_advantage_estimator(name: str) -> Callable:
    """The advantage estimator registered as `name` (see `ADVANTAGE_ESTIMATORS`)."""
    return _lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def get_kl_estimator(name: str) -> Callable:
    """Per-token KL estimator `(logprobs, ref_logprobs) -> [B, T]` by name (k1, abs, k2, k3 or an alias)."""
    if name not in kl.KL_KINDS:
        raise ValueError(f"unknown KL estimator {name!r}; expected one of {', '.join(kl.KL_KINDS)}")
    return lambda logprobs, ref_logprobs: kl.kl_penalty(logprobs, ref_logprobs, name)


def register_policy_loss(name: str, fn: Callable) -> Callable:
    """Adds a policy loss under `name`; raises if the name is taken by another function."""
    return _register(POLICY_LOSSES, "policy loss", name, fn)


def register_advantage_estimator(name: str, fn: Callable) -> Callable:
    """Adds an advantage estimator under `name`; raises if the name is taken by another function."""
    return _register(ADVANTAGE_ESTIMATORS, "advantage estimator", name, fn)
