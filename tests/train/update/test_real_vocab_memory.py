"""At Qwen's vocabulary (V = 151,936) no trainer pass forms a batch's `[B, T, V]` logits: XLA's memory analysis of
the compiled update and log-prob pass (2 layers, hidden 64, 4 x 512 tokens) shows temporaries far below one
float32 logits tensor. (With the logits formed, the update's temporaries were 3x that tensor.)"""

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from mathrl_jax.models import QwenForCausalLM, tiny_config
from mathrl_jax.train.state import create_train_state, make_optimizer
from mathrl_jax.train.update._passes import compute_logprobs_fn
from mathrl_jax.train.update._step import UpdateConfig, make_update_fn

VOCAB = 151_936  # Qwen2 / Qwen2.5 / Qwen3
ROWS, LENGTH = 4, 512
LOGITS_BYTES = ROWS * LENGTH * VOCAB * 4  # one float32 logits tensor of the batch: 1.2 GB
BOUND = 0.35


@functools.lru_cache(maxsize=None)
def model(tie: bool, dtype: str):
    config = tiny_config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=tie,
        dtype=dtype,
    )
    # Abstract params: nothing of V x D is allocated to compile.
    return nnx.eval_shape(lambda: nnx.split(QwenForCausalLM(config, rngs=nnx.Rngs(0))))


def abstract(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def batch():
    tokens = abstract((ROWS, LENGTH), jnp.int32)
    values = abstract((ROWS, LENGTH), jnp.float32)
    return {
        "input_ids": tokens,
        "attention_mask": tokens,
        "response_mask": values,
        "old_logprobs": values,
        "advantages": values,
        "ref_logprobs": values,
    }


def temporaries(compiled) -> int:
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("tie, dtype", [(False, "float32"), (True, "float32"), (False, "bfloat16")])
def test_the_update_forms_no_full_vocabulary_logits(tie, dtype):
    graphdef, params = model(tie, dtype)
    optimizer = make_optimizer(1e-6)
    state = jax.eval_shape(lambda p: create_train_state(p, optimizer, seed=0), params)
    cfg = UpdateConfig(num_mini_batch=2, kl_coef=0.001, entropy_coef=0.001)
    compiled = make_update_fn(graphdef, optimizer, cfg, donate=False).lower(state, batch()).compile()
    assert temporaries(compiled) < BOUND * LOGITS_BYTES, temporaries(compiled) / LOGITS_BYTES


@pytest.mark.parametrize("tie", [False, True])
def test_the_logprob_pass_forms_no_full_vocabulary_logits(tie):
    graphdef, params = model(tie, "float32")
    tokens = abstract((ROWS, LENGTH), jnp.int32)
    compiled = compute_logprobs_fn(graphdef).lower(params, tokens, tokens).compile()
    assert temporaries(compiled) < BOUND * LOGITS_BYTES, temporaries(compiled) / LOGITS_BYTES
