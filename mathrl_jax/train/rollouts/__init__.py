"""Rollouts for the update: the problems and their prompts, graded single-turn rollouts (`SyncRollouts`),
AReaL's asynchronous generator (`AsyncRollouts`), multi-turn episodes (`EnvRollouts`) and their held-out games.

Behind the door: `_problems` (the run's data and prompts), `_collect` (sample and grade), `_async` (the generator
running ahead), `_multiturn` (episodes, games, the control).
"""

from mathrl_jax.train.rollouts._async import AsyncRollouts, pending_from_checkpoint, pending_to_checkpoint
from mathrl_jax.train.rollouts._collect import (
    Collected,
    RolloutMaker,
    RolloutSettings,
    SyncRollouts,
    collect,
    iteration_seed,
    with_logprob_noise,
)
from mathrl_jax.train.rollouts._multiturn import (
    TEACHER_GAMES,
    EnvRollouts,
    GameSettings,
    evaluate_games,
    game_warmstart_examples,
)
from mathrl_jax.train.rollouts._problems import (
    PromptSettings,
    check_prompts,
    check_warmstart_data,
    encode_prompts,
    load_data,
    load_hard_eval,
    prompt_settings,
)

__all__ = [
    "AsyncRollouts",
    "Collected",
    "EnvRollouts",
    "GameSettings",
    "PromptSettings",
    "RolloutMaker",
    "RolloutSettings",
    "SyncRollouts",
    "TEACHER_GAMES",
    "check_prompts",
    "check_warmstart_data",
    "collect",
    "encode_prompts",
    "evaluate_games",
    "iteration_seed",
    "load_data",
    "load_hard_eval",
    "pending_from_checkpoint",
    "pending_to_checkpoint",
    "prompt_settings",
    "game_warmstart_examples",
    "with_logprob_noise",
]
