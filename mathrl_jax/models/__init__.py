"""Qwen2 / Qwen2.5 / Qwen3 models in Flax NNX, with Hugging Face checkpoint interop.

from mathrl_jax.models import load_model, export_checkpoint
model = load_model("/path/to/Qwen2.5-1.5B-Instruct", param_dtype="bfloat16", dtype="bfloat16")
logits, _ = model(input_ids, attention_mask=mask)
"""

from mathrl_jax.models.attention import default_positions
from mathrl_jax.models.hf import export_checkpoint, load_model, load_state, parameter_table
from mathrl_jax.models.hf_config import config_from_dict, config_to_dict, load_config
from mathrl_jax.models.qwen import (
    ConfigError,
    KVCache,
    QwenConfig,
    QwenForCausalLM,
    forward,
    init_cache,
)
from mathrl_jax.models.safetensors_io import ModelCheckpointError
from mathrl_jax.models.tiny import tiny_config, write_tiny_checkpoint
from mathrl_jax.models.value_head import (
    QwenCritic,
    export_critic,
    load_critic,
    prm_scores,
    prm_step_scores,
)

__all__ = [name for name in dir() if not name.startswith("_")]
