"""A run directory's layout, written down once: what a run writes under `run_dir`, by name.

    run_dir/
      config.json        the config the run trains with (a resume is checked against it)
      .lock              one process (group) per run directory (train/setup's run lock)
      initial_model/     the tiny offline model, when model_name_or_path is "" (Hugging Face format)
      warmstart_model/   the policy after the supervised warm-start (Hugging Face format)
      checkpoints/       Orbax checkpoints, one folder per step (train/checkpoint)
      metrics.jsonl      every logged metric, one JSON object per step (and tensorboard's event files beside it)
      completions.jsonl  with log_completions: tables of training prompts, completions, rewards, one row a line
      wandb/             the wandb run, when report_to includes wandb
      samples/           held-out prompts with their completions, one file per evaluation
      final_model/       the final policy (Hugging Face format), with export_final
      final_adapter/     a LoRA run's final adapters alone (PEFT's layout), beside final_model

Every module that reads or writes one of these takes its name from here.
"""

from __future__ import annotations

import os

CONFIG = "config.json"
LOCK = ".lock"
INITIAL_MODEL = "initial_model"
WARMSTART_MODEL = "warmstart_model"
CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
COMPLETIONS = "completions.jsonl"
WANDB = "wandb"
SAMPLES = "samples"
FINAL_MODEL = "final_model"
FINAL_ADAPTER = "final_adapter"


def path(run_dir: str, name: str) -> str:
    """`run_dir/name` for one of the names above."""
    if name not in LAYOUT:
        raise ValueError(f"{name!r} is not part of a run directory; expected one of {sorted(LAYOUT)}")
    return os.path.join(run_dir, name)


LAYOUT = (
    CONFIG,
    LOCK,
    INITIAL_MODEL,
    WARMSTART_MODEL,
    CHECKPOINTS,
    METRICS,
    COMPLETIONS,
    WANDB,
    SAMPLES,
    FINAL_MODEL,
    FINAL_ADAPTER,
)
