"""The small offline checkpoint: a Qwen2-architecture model and its character tokenizer.

The default config trains this model on procedural arithmetic on a laptop CPU,
and the tests load it. It is a real Hugging Face checkpoint directory
(`config.json`, `model.safetensors`, tokenizer files): `transformers` and
vLLM load it like any Qwen2 model.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from flax import nnx

from mathrl_jax.models import char_tokenizer, hf
from mathrl_jax.models.qwen import QwenConfig, QwenForCausalLM

# About 0.8M parameters: small enough to train on 2 CPU cores in minutes,
# large enough to learn multi-digit arithmetic.
TINY_ARCHITECTURE = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)


def tiny_config(**overrides) -> QwenConfig:
    """The tiny Qwen2 config over the character vocabulary; fields can be overridden."""
    vocab = char_tokenizer.vocab()
    fields = dict(
        TINY_ARCHITECTURE,
        vocab_size=char_tokenizer.vocab_size(),
        architecture="Qwen2ForCausalLM",
        eos_token_id=vocab[char_tokenizer.EOS_TOKEN],
        pad_token_id=vocab[char_tokenizer.PAD_TOKEN],
    )
    fields.update(overrides)
    return QwenConfig(**fields)


def write_tiny_checkpoint(
    directory: str,
    *,
    seed: int = 0,
    state: Optional[nnx.State] = None,
    **config_overrides,
) -> QwenConfig:
    """Writes the tiny model (random weights from `seed`, or the given `state`) and tokenizer.

    Returns the model's config. The directory is then a complete local
    Hugging Face checkpoint.
    """
    config = tiny_config(**config_overrides)
    if state is None:
        state = nnx.state(QwenForCausalLM(config, rngs=nnx.Rngs(seed)))
    os.makedirs(directory, exist_ok=True)
    char_tokenizer.save_char_tokenizer(directory)
    hf.export_checkpoint(state, config, directory)
    generation = {"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id, "do_sample": False}
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)
    return config
