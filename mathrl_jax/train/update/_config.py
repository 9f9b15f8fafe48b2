"""The update's static settings (`UpdateConfig`, one compiled program per config) and how the update calls each
registered policy loss (`PolicyLossUse`), so that no module compares a loss's name."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

from mathrl_jax import losses

WHITENING = (None, "actions", "nonzero")


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    """Static settings of the update (one compiled program per config)."""

    ppo_epoch: int = 1  # OpenR's names, as the config's
    num_mini_batch: int = 1
    micro_batch_size: Optional[int] = None  # rows per gradient-accumulation chunk; None (or >= the minibatch): all
    policy_loss: str = "ppo"
    clip_low: float = 0.2
    clip_high: Optional[float] = None  # DAPO clip-higher: 0.28
    clip_c: Optional[float] = None  # dual clip
    behaviour_weight_cap: Optional[float] = None  # decoupled loss
    loss_agg_mode: str = "token-mean"
    norm_constant: Optional[float] = None
    entropy_coef: float = 0.0
    kl_coef: float = 0.0  # KL to the reference in the loss (GRPO); 0 disables
    kl_kind: str = "k3"
    value_clip: Optional[float] = 0.2
    value_loss_type: str = "mse"  # or "huber", "huber_one_sided" (OpenR's)
    huber_delta: float = 10.0
    target_kl: Optional[float] = None  # OpenR: a minibatch over it does not step the policy
    # Standardise advantages per minibatch, as OpenR: over its actions (APPO, unbiased std) or over its non-zero
    # token advantages (TPPO, biased std); None leaves them as given.
    minibatch_whitening: Optional[str] = None
    temperature: float = 1.0  # log-probs at the sampler's temperature
    # Rows whose every advantage is 0 are no term of the loss and no metric's (the denominator still counts them);
    # only where that changes no gradient (`zero_advantage_rows_are_inert`).
    skip_zero_advantage: bool = False
    # PEFT's lora_dropout on the adapters' inputs in the policy loss's passes (a LoRA policy); 0: none, and the
    # update's program is the one without it.
    lora_dropout: float = 0.0

    def __post_init__(self):
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout={self.lora_dropout}: expected a probability in [0, 1)")
        if self.policy_loss not in losses.POLICY_LOSSES:
            raise ValueError(f"policy_loss={self.policy_loss!r}: expected one of {tuple(losses.POLICY_LOSSES)}")
        if self.ppo_epoch < 1 or self.num_mini_batch < 1:
            raise ValueError(f"ppo_epoch={self.ppo_epoch}, num_mini_batch={self.num_mini_batch}: must be >= 1")
        if self.loss_agg_mode not in losses.LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode={self.loss_agg_mode!r}: expected one of {losses.LOSS_AGG_MODES}")
        if self.minibatch_whitening not in WHITENING:
            raise ValueError(f"minibatch_whitening={self.minibatch_whitening!r}: expected one of {WHITENING}")
        if self.value_loss_type not in losses.value.VALUE_LOSS_TYPES:
            raise ValueError(
                f"value_loss_type={self.value_loss_type!r}: expected one of {losses.value.VALUE_LOSS_TYPES}"
            )
        if self.skip_zero_advantage and not zero_advantage_rows_are_inert(self):
            raise ValueError(
                f"skip_zero_advantage=True needs a loss that a zero-advantage row adds nothing to: policy_loss in "
                f"{inert_at_zero_advantage_losses()} (got {self.policy_loss!r}), kl_coef=0 (got {self.kl_coef}), "
                f"entropy_coef=0 (got {self.entropy_coef}), minibatch_whitening=None (got "
                f"{self.minibatch_whitening!r}), target_kl=None (got {self.target_kl})"
            )


def _clipped_args(cfg: UpdateConfig, mb, denominator) -> Dict[str, Any]:
    clip = dict(clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_c=cfg.clip_c)
    return dict(**clip, **_aggregation_args(cfg, mb, denominator))


def _aggregation_args(cfg: UpdateConfig, mb=None, denominator=None) -> Dict[str, Any]:
    return dict(loss_agg_mode=cfg.loss_agg_mode, norm_constant=cfg.norm_constant, denominator=denominator)


def _action_args(cfg: UpdateConfig, mb, denominator) -> Dict[str, Any]:
    """APPO as OpenR: one ratio per action, averaged over the actions."""
    index = mb["action_index"]
    return dict(action_index=index, clip_low=cfg.clip_low, clip_high=cfg.clip_high, denominator=denominator)


def _sequence_clipped_args(cfg: UpdateConfig, mb, denominator) -> Dict[str, Any]:
    """GSPO: the clip range on the sequence ratio is the config's (TRL's epsilon / epsilon_high, verl's
    clip_ratio_low / high); no dual clip."""
    clip_high = cfg.clip_low if cfg.clip_high is None else cfg.clip_high
    return dict(clip_low=cfg.clip_low, clip_high=clip_high, **_aggregation_args(cfg, mb, denominator))


def _decoupled_args(cfg: UpdateConfig, mb, denominator) -> Dict[str, Any]:
    return dict(
        proximal_logprobs=mb["proximal_logprobs"],
        behaviour_weight_cap=cfg.behaviour_weight_cap,
        **_clipped_args(cfg, mb, denominator),
    )


@dataclasses.dataclass(frozen=True)
class PolicyLossUse:
    """How the update calls a registered policy loss (`losses.registry`), so that nothing compares its name.

    args: `(cfg, minibatch, denominator) -> kwargs` beyond `(logprobs, old_logprobs, advantages, mask)`.
    per_action: one ratio per action (OpenR's APPO): the loss, its entropy term and its denominator are over each
      action's first token, the batch needs `action_index`.
    inert_at_zero_advantage: 0 with zero gradient on a token whose advantage is 0 (`skip_zero_advantage`).
    token_weighted: a weight w >= 0 on a token's advantage is w times the token's loss (truncated importance
      sampling, `tis_cap`, is allowed).
    """

    args: Callable[..., Dict[str, Any]] = _aggregation_args
    per_action: bool = False
    inert_at_zero_advantage: bool = False
    token_weighted: bool = False


POLICY_LOSS_USES: Dict[str, PolicyLossUse] = {
    "ppo": PolicyLossUse(_clipped_args, inert_at_zero_advantage=True, token_weighted=True),
    "action_ppo": PolicyLossUse(_action_args, per_action=True, inert_at_zero_advantage=True),
    "decoupled_ppo": PolicyLossUse(_decoupled_args, inert_at_zero_advantage=True),
    "gspo": PolicyLossUse(_sequence_clipped_args, inert_at_zero_advantage=True),
    "reinforce": PolicyLossUse(inert_at_zero_advantage=True, token_weighted=True),
}


def policy_loss_use(name: str) -> PolicyLossUse:
    """The use of policy loss `name`: `POLICY_LOSS_USES`'s, or the aggregation arguments alone (a loss of the
    user's, registered with `losses.register_policy_loss`)."""
    return POLICY_LOSS_USES.get(name, PolicyLossUse())


def register_policy_loss_use(name: str, use: PolicyLossUse) -> PolicyLossUse:
    """How the update calls a policy loss of the user's registered as `name` (default: `PolicyLossUse()`)."""
    POLICY_LOSS_USES[name] = use
    return use


def inert_at_zero_advantage_losses() -> Tuple[str, ...]:
    """The policy losses that are 0, with zero gradient, on a token whose advantage is 0."""
    return tuple(name for name, use in POLICY_LOSS_USES.items() if use.inert_at_zero_advantage)


def zero_advantage_rows_are_inert(cfg: UpdateConfig, has_critic: bool = False) -> bool:
    """Whether a row whose every advantage is 0 adds nothing to the update's gradient: the policy loss is
    `inert_at_zero_advantage`, and no other term reads the row (a KL or entropy term in the loss, a critic,
    per-minibatch whitening, which moves its zeros, or `target_kl`, whose approx-KL averages its ratios)."""
    return (
        policy_loss_use(cfg.policy_loss).inert_at_zero_advantage
        and not cfg.kl_coef
        and not cfg.entropy_coef
        and cfg.minibatch_whitening is None
        and cfg.target_kl is None
        and not has_critic
    )
