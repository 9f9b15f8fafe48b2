"""The run's final export: the policy as a Hugging Face checkpoint (run_dir/final_model), a LoRA run's adapters in
PEFT's layout beside it (run_dir/final_adapter), each written whole; a full disk is a `TrainingError` naming the
directory, the checkpoints kept."""

from __future__ import annotations

import os
from typing import Callable

from flax import nnx

from mathrl_jax import files
from mathrl_jax.errors import TrainingError
from mathrl_jax.models import hf, peft_adapters
from mathrl_jax.sharding import distributed
from mathrl_jax.train import run_directory
from mathrl_jax.train.checkpoint import DISK_ERRNOS
from mathrl_jax.train.state import TrainState, model_params


def export_final_model(state: TrainState, frozen, graphdef, model_dir: str, final: str) -> None:
    """`final` (run_dir/final_model): the policy as a Hugging Face checkpoint, a LoRA run's adapters merged into
    its base (`frozen`: the base's weights beside `state.params`; `graphdef` the policy's NNX graph); a LoRA run
    also writes its adapters alone in PEFT's layout beside it (run_dir/final_adapter, whose
    `base_model_name_or_path` is `model_dir`, the base the run trained on, whose tokenizer both take)."""
    params = model_params(state.params, frozen)
    model_config = nnx.merge(graphdef, params).config
    params = distributed.fetch(params)  # every process takes part in gathering the shards
    distributed.on_main_process(
        "final_model",
        lambda: _write_export(
            "the final model",
            final,
            lambda d: hf.export_checkpoint(params, model_config, d, tokenizer_dir=model_dir),
        ),
    )
    if model_config.lora_rank:
        adapter_dir = os.path.join(os.path.dirname(final), run_directory.FINAL_ADAPTER)
        distributed.on_main_process(
            run_directory.FINAL_ADAPTER,
            lambda: _write_export(
                "the final adapters",
                adapter_dir,
                lambda d: peft_adapters.export_adapters(params, model_config, d, model_dir),
            ),
        )


def _write_export(what: str, directory: str, write: Callable[[str], None]) -> None:
    """`files.write_directory(directory, write)`; a disk that refuses the write (full, read-only: `DISK_ERRNOS`) is
    a `TrainingError` naming the directory (the OS's error names only the errno), the previous export kept."""
    try:
        files.write_directory(directory, write)
    except OSError as error:
        if error.errno not in DISK_ERRNOS:
            raise
        raise TrainingError(
            f"cannot write {what} to {directory}: {error.strerror or error}; the checkpoints are kept: free the "
            "disk and rerun the same command, which exports it"
        ) from error
