"""Hugging Face `config.json` <-> `QwenConfig`.

`config_from_dict` / `load_config` read a `config.json` (transformers 4 or 5
layout: `rope_theta` at the top level or in `rope_parameters`; token-classifier
critics read as their causal-LM trunk) and raise `ConfigError` naming any field
this implementation cannot represent (other architectures, activations, RoPE
scaling, sliding-window attention) or that is missing. `config_to_dict` writes
the `config.json` of a `QwenConfig` back.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict

from mathrl_jax.models.qwen import ARCHITECTURES, ConfigError, QwenConfig

# Other heads on the same trunk (critics are saved as token classifiers).
_TRUNK_OF = {"Qwen2ForTokenClassification": "Qwen2ForCausalLM", "Qwen3ForTokenClassification": "Qwen3ForCausalLM"}


def _non_finite(value: Any, key: str):
    """The first `key=value` in `value` (a config.json dict, list or number) that is a NaN or inf float, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key}={value!r}"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for name, item in items:
        found = _non_finite(item, f"{key}.{name}" if key else str(name))
        if found:
            return found
    return None


def config_from_dict(hf: Dict[str, Any], **overrides) -> QwenConfig:
    """Reads a `config.json` dict (transformers 4 or 5 layout); unsupported features raise, and so does a NaN or inf
    value (JSON's `NaN`, `Infinity`: an `rms_norm_eps` of NaN makes every activation NaN), naming the key."""
    bad = _non_finite(hf, "")
    if bad:
        raise ConfigError(f"config.json has {bad}: expected a finite number")
    architectures = hf.get("architectures") or []
    if architectures:
        architecture = _TRUNK_OF.get(architectures[0], architectures[0])
    else:
        by_type = {v: k for k, v in ARCHITECTURES.items()}
        architecture = by_type.get(hf.get("model_type"), hf.get("model_type"))
    if architecture not in ARCHITECTURES:
        raise ConfigError(
            f"architectures={architectures or hf.get('model_type')!r} is not supported; "
            f"expected one of {sorted(ARCHITECTURES)}"
        )
    family = ARCHITECTURES[architecture]
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act={hf['hidden_act']!r} is not supported; expected 'silu'")
    if hf.get("use_sliding_window", False):
        raise ConfigError("use_sliding_window=True is not supported (Qwen2.5 checkpoints use full attention)")
    rope = hf.get("rope_parameters") or {}
    rope_scaling = hf.get("rope_scaling")
    rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type")) or rope.get(
        "rope_type", "default"
    )
    if rope_type != "default":
        raise ConfigError(f"rope_scaling / rope_type={rope_type!r} is not supported; expected 'default'")
    rope_theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
    try:
        heads = hf["num_attention_heads"]
        fields = dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        )
    except KeyError as missing:
        raise ConfigError(f"config.json has no field {missing.args[0]!r}") from None
    fields.update(
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=True if family == "qwen2" else bool(hf.get("attention_bias", False)),
        qk_norm=family == "qwen3",
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
        architecture=architecture,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"),
    )
    fields.update(overrides)
    return QwenConfig(**fields)


def load_config(directory: str, **overrides) -> QwenConfig:
    """`config_from_dict` of the `config.json` in a checkpoint directory."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"no config.json in checkpoint directory {directory!r}")
    with open(path) as f:
        try:
            hf = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
    return config_from_dict(hf, **overrides)


def config_to_dict(config: QwenConfig) -> Dict[str, Any]:
    """The `config.json` of this architecture (transformers 4 field names, read by 4 and 5)."""
    family = ARCHITECTURES[config.architecture]
    hf = dict(
        architectures=[config.architecture],
        model_type=family,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act="silu",
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        rope_scaling=None,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        use_sliding_window=False,
        attention_dropout=0.0,
        torch_dtype=config.param_dtype,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    if family == "qwen3":
        hf["attention_bias"] = config.attention_bias
    return hf
