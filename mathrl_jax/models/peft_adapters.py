"""LoRA adapters in PEFT's layout: `adapter_config.json` and `adapter_model.safetensors`, which
`peft.PeftModel.from_pretrained` loads onto the transformers model and vLLM serves as a `LoRARequest`.

Tensor names are the Hugging Face projection's with PEFT's prefix and its A/B suffixes
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`, `[r, in]`; `lora_B.weight`, `[out, r]`:
ours transposed). Written float32, as the adapters are trained.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Iterator, Optional, Tuple

import jax
import numpy as np

from mathrl_jax.models import hf
from mathrl_jax.models.qwen import QwenConfig
from mathrl_jax.models.safetensors_io import ModelCheckpointError, SafetensorsFile, write_safetensors

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."


def _adapted(config: QwenConfig) -> Iterator[Tuple[str, hf.TensorSpec]]:
    """(PEFT module name, spec) of every adapted projection."""
    for name, spec in hf.parameter_table(config).items():
        if spec.adapter is not None:
            yield PREFIX + name[: -len(".weight")], spec


def adapter_tensors(state, config: QwenConfig) -> Iterator[Tuple[str, jax.Array]]:
    """(PEFT tensor name, array in PEFT's layout) of every adapter of `state`."""
    for module, spec in _adapted(config):
        yield f"{module}.lora_A.weight", hf.get_path(state, spec.adapter.a).T
        yield f"{module}.lora_B.weight", hf.get_path(state, spec.adapter.b).T


def peft_config(config: QwenConfig, base_model_name_or_path: Optional[str] = None) -> Dict:
    """PEFT's `LoraConfig` of `config`'s adapters, as `adapter_config.json` holds it."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": config.lora_rank,
        "lora_alpha": config.lora_alpha,
        "target_modules": list(config.lora_targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "inference_mode": True,
    }


def export_adapters(state, config: QwenConfig, directory: str, base_model_name_or_path: Optional[str] = None) -> None:
    """Writes `state`'s adapters as a PEFT adapter directory."""
    if not config.lora_rank:
        raise ValueError("the model has no LoRA adapters to export (lora_rank=0)")
    os.makedirs(directory, exist_ok=True)
    arrays = {name: np.asarray(jax.device_get(value), np.float32) for name, value in adapter_tensors(state, config)}
    write_safetensors(os.path.join(directory, WEIGHTS_FILE), arrays)
    with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(peft_config(config, base_model_name_or_path), f, indent=2)


def read_adapter_config(directory: str) -> Dict:
    """A PEFT directory's `adapter_config.json`, checked to be LoRA without what this model does not run
    (DoRA, rsLoRA, biases, saved modules); ModelCheckpointError names the field."""
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ModelCheckpointError(f"no {CONFIG_FILE} in adapter directory {directory!r}")
    with open(path, encoding="utf-8") as f:
        try:
            cfg = json.load(f)
        except json.JSONDecodeError as e:
            raise ModelCheckpointError(f"{path} is not valid JSON: {e}") from None
    unsupported = {
        "peft_type": ("LORA",),
        "use_dora": (False, None),
        "use_rslora": (False, None),
        "bias": ("none", None),
        "modules_to_save": (None, []),
    }
    for key, allowed in unsupported.items():
        if cfg.get(key, allowed[0]) not in allowed:
            raise ModelCheckpointError(f"{path}: {key}={cfg.get(key)!r} is not supported (expected {allowed[0]!r})")
    return cfg


def read_adapters(directory: str, config: QwenConfig) -> dict:
    """A PEFT adapter directory's tensors as a nested pure dict of `config`'s adapter paths (our layout), to
    `nnx.replace_by_pure_dict` into a model made with the same rank and targets. ModelCheckpointError names a
    missing, unexpected or mis-shaped tensor."""
    path = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.isfile(path):
        raise ModelCheckpointError(f"no {WEIGHTS_FILE} in adapter directory {directory!r}")
    file = SafetensorsFile(path)
    located = {name: file for name in file.entries}
    pure: dict = {}
    expected = set()
    for module, spec in _adapted(config):
        kernel_out, kernel_in = spec.shape
        for suffix, path, shape in (
            ("lora_A.weight", spec.adapter.a, (config.lora_rank, kernel_in)),
            ("lora_B.weight", spec.adapter.b, (kernel_out, config.lora_rank)),
        ):
            name = f"{module}.{suffix}"
            expected.add(name)
            if name not in located:
                raise ModelCheckpointError(f"{directory}: missing adapter tensor {name}")
            array = located[name].get(name)
            if tuple(array.shape) != shape:
                raise ModelCheckpointError(f"{directory}: {name} has shape {tuple(array.shape)}, expected {shape}")
            node = pure
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = np.ascontiguousarray(np.asarray(array, np.float32).T)
    unexpected = sorted(set(located) - expected)
    if unexpected:
        raise ModelCheckpointError(
            f"{directory}: adapter tensors this model does not have: {', '.join(unexpected[:5])}"
        )
    return pure
