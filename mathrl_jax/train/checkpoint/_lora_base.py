"""The base weights a LoRA run's adapters belong to, recorded in every checkpoint and checked on resume.

A LoRA checkpoint holds the adapters and their optimizer state, not the base (gigabytes, unchanged by training):
the base is the checkpoint directory the run started from, named by its path and a SHA-256 of its weight files
and `config.json`. Adapters applied to other weights would run without an error and mean nothing, so a resume
whose base differs from the saved one stops (exit status 2) before anything is written. Hashing reads the files
once per run start (about 3 GB for a 1.5B model in float16).
"""

from __future__ import annotations

import hashlib
import os
from typing import Dict, Optional

from mathrl_jax.errors import TrainingError

LORA_BASE_KEY = "lora_base"
"""Checkpoint metadata: {"path", "sha256"} of a LoRA run's base (absent for a run that trains every weight)."""
_CHUNK = 16 * 1024 * 1024


def lora_base_record(directory: str) -> Dict[str, str]:
    """{"path": absolute path, "sha256": digest of the directory's `*.safetensors` (sorted by name) and its
    `config.json`, each name hashed before its bytes}."""
    digest = hashlib.sha256()
    names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors")) + ["config.json"]
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(os.path.join(directory, name), "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return {"path": os.path.abspath(directory), "sha256": digest.hexdigest()}


def check_lora_base(saved: Optional[Dict[str, str]], current: Optional[Dict[str, str]], step: int) -> None:
    """Raises TrainingError (exit status 2) when checkpoint `step`'s adapters were trained on another base than
    the run's, or one of the two trains adapters and the other every weight."""
    if saved is None and current is None:
        return
    if saved is None or current is None:
        have = "LoRA adapters" if saved is not None else "every weight"
        want = "LoRA adapters" if current is not None else "every weight"
        raise TrainingError(
            f"checkpoint {step} trained {have}, this run trains {want} (lora.rank): resume it with its own "
            "settings, or start a new run_dir"
        )
    if saved["sha256"] != current["sha256"]:
        raise TrainingError(
            f"checkpoint {step} holds LoRA adapters trained on the base {saved['path']} (sha256 "
            f"{saved['sha256'][:16]}...); the base this run loads, {current['path']}, differs (sha256 "
            f"{current['sha256'][:16]}...): the adapters would apply to other weights. Restore that base, or start "
            "a new run_dir"
        )
