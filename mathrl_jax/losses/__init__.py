"""Pure, jittable loss functions and advantage estimators for RL on language models.

Nothing here imports the rest of the package, reads a config or does I/O:
every function maps arrays to arrays and can be used in a loop of your own.
Shapes are batch-major (`[B, T]` tokens, `[B]` sequences); see each docstring.
"""

from mathrl_jax.losses.action_decomposition import (
    action_decomposed_gae,
    action_ends_from_index,
    action_index_from_separators,
    action_level_gae,
    action_means,
    action_starts_from_index,
    action_sums,
    naive_token_gae,
    scatter_action_rewards,
)
from mathrl_jax.losses.advantages import (
    batch_normalized_advantages,
    broadcast_to_tokens,
    discounted_returns,
    dr_grpo_advantages,
    gae_advantages,
    group_relative_advantages,
    group_statistics,
    last_token_rewards,
    masked_gae_scan,
    masked_standardize,
    masked_whiten,
    rebn_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_advantages,
)
from mathrl_jax.losses.aggregate import (
    LOSS_AGG_MODE_NAMES,
    LOSS_AGG_MODES,
    TRL_LOSS_TYPES,
    aggregate_loss,
    canonical_loss_agg_mode,
    loss_denominator,
    loss_numerator,
    masked_mean,
    masked_sum,
    masked_var,
)
from mathrl_jax.losses.guards import approx_kl_exceeds, importance_ratio_exceeds
from mathrl_jax.losses.importance import sampler_mismatch_metrics, truncated_importance_weights
from mathrl_jax.losses.kl import (
    KL_KINDS,
    kl_abs,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_loss,
    kl_penalized_rewards,
    kl_penalty,
)
from mathrl_jax.losses.logprobs import token_logprobs_from_hidden, token_logprobs_from_logits
from mathrl_jax.losses.policy import (
    action_ppo_loss,
    clamped_log_ratio,
    decoupled_ppo_loss,
    gspo_loss,
    ppo_clip_loss,
    reinforce_loss,
)
from mathrl_jax.losses.registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    VALUE_LOSSES,
    get_advantage_estimator,
    get_kl_estimator,
    get_policy_loss,
    get_value_loss,
    register_advantage_estimator,
    register_policy_loss,
)
from mathrl_jax.losses.value import clipped_value_loss, explained_variance, huber, huber_one_sided

__all__ = [name for name in dir() if not name.startswith("_")]
