"""The algorithms, one record each: how advantages are made, which policy loss trains, what a run needs.

| `algorithm_name` | advantages (`rollout.compute_advantages`)              | policy loss (`losses.registry`) |
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
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """What one algorithm is made of.

    advantages: the estimator `rollout.compute_advantages` applies: "group", "group_mean", "rloo", "rebn" (one
      sequence advantage broadcast over its tokens), "reinforce_pp_baseline" (per token, whitened over the batch),
      "gae", "action_gae", "action_decomposed_gae" (with a critic).
    policy_loss: a name in `losses.registry.POLICY_LOSSES`.
    critic: trains a value model.
    groups: compares the samples of one prompt (needs group_size >= 2).
    """

    advantages: str
    policy_loss: str
    critic: bool = False
    groups: bool = False


ALGORITHMS = {
    "grpo": Algorithm("group", "ppo", groups=True),
    "drgrpo": Algorithm("group_mean", "ppo", groups=True),
    "dapo": Algorithm("group", "ppo", groups=True),
    "ppo": Algorithm("gae", "ppo", critic=True),
    "appo": Algorithm("action_gae", "action_ppo", critic=True),
    "tppo": Algorithm("action_decomposed_gae", "ppo", critic=True),
    "reinforce_rebn": Algorithm("rebn", "reinforce"),
    "async_ppo": Algorithm("group", "decoupled_ppo", groups=True),
    # verl's adv_estimator=rloo and reinforce_plus_plus_baseline, with its PPO actor loss; TRL's RLOOTrainer too.
    "rloo": Algorithm("rloo", "ppo", groups=True),
    "reinforce_pp": Algorithm("reinforce_pp_baseline", "ppo", groups=True),
}
NAMES = tuple(ALGORITHMS)


def algorithm(name: str) -> Algorithm:
    """The record of `name`; a ValueError naming the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; expected one of {', '.join(NAMES)}")
    return ALGORITHMS[name]
