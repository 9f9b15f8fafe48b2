"""`Run`: everything one training run holds, built by `build.build_run`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional

from mathrl_jax.data import sources
from mathrl_jax.rewards.math_grader import MathGrader
from mathrl_jax.train import state as state_lib
from mathrl_jax.train.checkpoint import Checkpointer
from mathrl_jax.train.codec import TextCodec
from mathrl_jax.train.metrics import MetricsLogger

RewardFn = Callable[[List[str], List[str]], Any]


@dataclasses.dataclass
class Run:
    """Set once by `build_run`; during the run the loop replaces only `state` (each update) and `data_state`
    (the data position of the last batch the learner consumed, saved with each checkpoint)."""

    config: Any
    run_dir: str
    codec: TextCodec
    graphdef: Any
    state: state_lib.TrainState
    ref_params: Any
    critic_graphdef: Any
    sampler: Any
    grader: MathGrader
    loader: sources.ProblemLoader
    eval_prompts: List[List[int]]
    eval_golds: List[str]
    update: Callable
    skip_zero_advantage: bool  # the update's: its packing plans leave out the rows with no non-zero advantage
    logprobs: Callable
    values: Optional[Callable]
    checkpointer: Checkpointer
    logger: MetricsLogger
    mesh: Any
    total_iterations: int
    start_iteration: int
    warmstart_metrics: Dict[str, float]
    reward_fn: Optional[RewardFn] = None  # (texts, golds) -> (scores [N], metrics); default: the math grader
    reward_functions: Any = None  # rewards.functions.RewardFunctions (reward_source with "functions")
    data_state: Optional[Dict[str, int]] = None  # loader position after the last consumed batch
    prm: Any = None  # rewards.prm.ProcessRewardModel with reward_source "prm" / "prm+verifier"
    model_dir: str = ""  # the checkpoint the policy started from (tokenizer files for the export)
    pending_rollouts: List[Dict[str, Any]] = dataclasses.field(default_factory=list)  # resumed async batches
    # High-water marks of the batch's shapes (its width, the packing plans' dimensions): a batch is planned at
    # least as large as any before it, so the update and the passes compile once per growth, not per batch.
    # Saved with each checkpoint, so a resumed run pads and packs as the uninterrupted one.
    shape_floors: Dict[str, Any] = dataclasses.field(default_factory=dict)
