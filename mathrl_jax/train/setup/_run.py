"""`Run`: everything one training run holds, built by `setup.build_run`, and `RunSettings`, the loop's section."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional

from mathrl_jax.evaluation import EvalSettings
from mathrl_jax.train import state as state_lib
from mathrl_jax.train.batch import BatchMaker
from mathrl_jax.train.checkpoint import Checkpointer
from mathrl_jax.train.reporting import MetricsLogger
from mathrl_jax.train.rollouts import GameSettings, RolloutMaker

RewardFn = Callable[[List[str], List[str]], Any]


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The loop's section of the run's settings (made by the build): where the run lives, how long it runs, what
    it logs and evaluates, and what an iteration does with the rewards before the batch.

    max_staleness: the oldest policy version a batch may come from, in versions behind the learner
      (`max_head_offpolicyness`).
    step_rewards_only: the PRM's step scores are the whole reward (`reward_source="prm"`): the verifier's are
      zeroed.
    shuffle_rewards: the control run (`batch.control_rewards`).
    max_new_tokens, prompts_per_iteration: named by the out-of-memory message, beside the batch's settings (the
      options that size the trainer's passes).
    log_completions_every: a completion table every this many iterations (`log_completions`), 0 for none;
      num_completions_to_print rows each.
    """

    run_dir: str
    total_iterations: int
    seed: int = 0
    eval_interval: int = 0
    log_interval: int = 1
    progress: bool = True
    export_final: bool = True
    max_staleness: int = 0
    step_rewards_only: bool = False
    shuffle_rewards: bool = False
    max_new_tokens: int = 1
    prompts_per_iteration: int = 1
    log_completions_every: int = 0
    num_completions_to_print: int = 8

    def __post_init__(self):
        if self.total_iterations < 0 or self.eval_interval < 0 or self.log_interval < 1 or self.max_staleness < 0:
            raise ValueError(
                f"total_iterations={self.total_iterations}, eval_interval={self.eval_interval}, log_interval="
                f"{self.log_interval}, max_staleness={self.max_staleness}: out of range"
            )


@dataclasses.dataclass
class Run:
    """Set once by `build_run`, never written after: `state` and `host` are where the run starts (a checkpoint's,
    when it resumes); the loop carries its own, each iteration returning the next (`loop.train_iteration`)."""

    settings: RunSettings
    graphdef: Any
    state: Optional[state_lib.TrainState]  # where the run starts; None in the loop's copy (it carries its own)
    rollouts: RolloutMaker  # the sampler, tokenizer, problems and rewards
    batches: BatchMaker  # the trainer's passes, the reference, the shapes the batches have grown to
    update: Callable
    evaluation: EvalSettings
    eval_prompts: List[List[int]]
    eval_golds: List[str]
    checkpointer: Checkpointer
    logger: MetricsLogger
    start_iteration: int
    warmstart_metrics: Dict[str, float]
    source_kind: str = "sync"  # which `loop.ROLLOUT_SOURCES` makes the batches
    game: Optional[GameSettings] = None  # multi-turn: the environment, ReBN's discount, the held-out games
    model_dir: str = ""  # the checkpoint the policy started from (tokenizer files for the export)
    pending_rollouts: List[Any] = dataclasses.field(default_factory=list)  # resumed async batches (`Collected`)
    host: state_lib.HostState = state_lib.HostState()  # the data position and batch shapes it starts from
    lora_base: Optional[Dict[str, str]] = None  # a LoRA run's base: path and hash, in each checkpoint
    recorded_settings: Dict[str, Any] = dataclasses.field(default_factory=dict)  # in each checkpoint (`SETTINGS_KEY`)
    # The second held-out set (arithmetic.eval_digits, countdown.eval_count), beside the first as eval_hard/*; [] = none
    hard_eval_prompts: List[List[int]] = dataclasses.field(default_factory=list)
    hard_eval_golds: List[str] = dataclasses.field(default_factory=list)
