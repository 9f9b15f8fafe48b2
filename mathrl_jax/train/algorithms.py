"""The algorithms, one record each: how advantages are made, which policy loss trains, what a run needs.

| `algorithm_name` | advantages (`advantages.compute_advantages`)          | policy loss (`losses.registry`) |
|------------------|--------------------------------------------------------|---------------------------------|
| `grpo`           | group-relative, (s - mean_g) / (std_g + eps)           | `ppo`                           |
| `drgrpo`         | group mean removed, no std (Dr. GRPO)                  | `ppo`                           |
| `dapo`           | group-relative after DAPO's filter and overlong shaping | `ppo` (clip-higher)             |
| `ppo`            | token-level GAE with a critic                          | `ppo`                           |
| `appo`           | action-level GAE over reasoning steps (OpenR)          | `action_ppo` (one ratio a step) |
| `tppo`           | POAD's action-decomposed token backup (OpenR)          | `ppo`                           |
| `reinforce_rebn` | per-turn returns, batch-normalised (GEM)               | `reinforce`                     |
| `async_ppo`      | group-relative (AReaL's default)                       | `decoupled_ppo` (AReaL)         |
| `rloo`           | leave-one-out baseline, n/(n-1) (s - mean_g) (RLOO)    | `ppo`                           |
| `reinforce_pp`   | group mean removed, whitened over the batch's tokens   | `ppo`                           |
|                  | (REINFORCE++-baseline, verl's estimator)               |                                 |
| `gspo`           | group-relative, as `grpo`                              | `gspo` (one length-normalised   |
|                  |                                                        | ratio per sequence, clipped)    |

`gspo` is GSPO (Zheng et al. 2025): TRL's GRPOTrainer with `importance_sampling_level="sequence"`, verl's
`policy_loss.loss_mode=gspo` (`compute_policy_loss_gspo`). It clips at `clip_low` / `clip_high` as they do (the
paper's 3e-4 / 4e-4 are `--config.clip_low=3e-4 --config.clip_high=4e-4`; its aggregation
`--config.loss_agg_mode=seq-mean-token-mean`, TRL's `grpo`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """What one algorithm is made of; the build and the batch read these fields, never the algorithm's name.

    advantages: the advantage estimator, by its `losses.registry` name, as `advantages.compute_advantages` applies
      it: "grpo", "drgrpo", "rloo", "rebn" (one sequence advantage broadcast over its tokens),
      "reinforce_plus_plus_baseline" (per token, whitened over the batch), "gae", "action_level_gae",
      "action_decomposed_gae" (with a critic).
    policy_loss: a name in `losses.registry.POLICY_LOSSES`.
    critic: trains a value model.
    groups: compares the samples of one prompt (needs group_size >= 2).
    actions: trains on reasoning steps (the actions of `step_separator`; OpenR's APPO and TPPO).
    openr_whitening: with `advantage_whitening="openr"`, how OpenR standardises each minibatch's advantages
      (`UpdateConfig.minibatch_whitening`: "actions" or "nonzero"); None: this algorithm has no such option.
    dynamic_sampling: DAPO's group filter and overlong shaping of the rewards.
    decoupled: AReaL's decoupled loss: behaviour log-probs from the sampler, proximal ones recomputed, rollouts from
      a generator thread running ahead (bounded staleness).
    multi_turn: trains on the turns of multi-turn episodes (`env_name`).
    """

    advantages: str
    policy_loss: str
    critic: bool = False
    groups: bool = False
    actions: bool = False
    openr_whitening: Optional[str] = None
    dynamic_sampling: bool = False
    decoupled: bool = False
    multi_turn: bool = False


ALGORITHMS = {
    "grpo": Algorithm("grpo", "ppo", groups=True),
    "drgrpo": Algorithm("drgrpo", "ppo", groups=True),
    "dapo": Algorithm("grpo", "ppo", groups=True, dynamic_sampling=True),
    "ppo": Algorithm("gae", "ppo", critic=True),
    "appo": Algorithm("action_level_gae", "action_ppo", critic=True, actions=True, openr_whitening="actions"),
    "tppo": Algorithm("action_decomposed_gae", "ppo", critic=True, actions=True, openr_whitening="nonzero"),
    "reinforce_rebn": Algorithm("rebn", "reinforce", multi_turn=True),
    "async_ppo": Algorithm("grpo", "decoupled_ppo", groups=True, decoupled=True),
    # verl's adv_estimator=rloo and reinforce_plus_plus_baseline, with its PPO actor loss; TRL's RLOOTrainer too.
    "rloo": Algorithm("rloo", "ppo", groups=True),
    "reinforce_pp": Algorithm("reinforce_plus_plus_baseline", "ppo", groups=True),
    # GSPO: GRPO's advantages, the sequence-level ratio (TRL importance_sampling_level="sequence", verl gspo).
    "gspo": Algorithm("grpo", "gspo", groups=True),
}
NAMES = tuple(ALGORITHMS)


def algorithm(name: str) -> Algorithm:
    """The record of `name`; a ValueError naming the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; expected one of {', '.join(NAMES)}")
    return ALGORITHMS[name]
