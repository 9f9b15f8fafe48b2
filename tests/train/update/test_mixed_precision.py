"""Mixed precision that trains: every recipe's own update (its optimizer, lr and warm-up, its loss settings, its
param_dtype / dtype) moves every parameter leaf of the policy within three updates, and with bfloat16 compute
moves it as float32 compute does. Master weights in bfloat16 (what the Qwen recipes had) do not move: a 1e-6
step is below bfloat16's resolution at the weights' magnitude, so the update rounds away."""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mathrl_jax.models import QwenForCausalLM, tiny_config
from mathrl_jax.train.setup import _sections as sections
from mathrl_jax.train.state import create_train_state, make_optimizer, model_params
from mathrl_jax.train.update._passes import compute_logprobs_fn
from mathrl_jax.train.update._step import make_update_fn

RECIPES = ("default", "grpo_qwen_math", "dapo_qwen_math", "openr_appo", "openr_tppo", "areal_async", "gem_guess_number")
ROWS, LENGTH, UPDATES = 16, 24, 3


def recipe(name):
    return importlib.import_module(f"mathrl_jax.configs.{name}").get_config()


@functools.lru_cache(maxsize=None)
def initial(param_dtype: str, dtype: str, lora: tuple = ()):
    """(graphdef, trained params, frozen base or None): a LoRA recipe (`lora`, its `lora_settings`) trains its
    adapters alone."""
    config = tiny_config(num_hidden_layers=1, param_dtype=param_dtype, dtype=dtype, **dict(lora))
    model = QwenForCausalLM(config, rngs=nnx.Rngs(0))
    return nnx.split(model, nnx.LoRAParam, ...) if lora else (*nnx.split(model), None)


def make_batch(graphdef, params, seed=0):
    """Random sequences, a response after column 8 with per-row advantages, and every key any loss reads."""
    rng = np.random.default_rng(seed)
    vocab = tiny_config().vocab_size
    ids = jnp.asarray(rng.integers(3, vocab, (ROWS, LENGTH)), jnp.int32)
    attention = jnp.ones((ROWS, LENGTH), jnp.int32)
    response = np.zeros((ROWS, LENGTH), np.float32)
    response[:, 8:] = 1.0
    old = compute_logprobs_fn(graphdef)(params, ids, attention) * response
    steps = np.cumsum(np.ones((ROWS, LENGTH)), axis=1) // 4  # four-token actions (APPO's action-level ratio)
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "response_mask": jnp.asarray(response),
        "old_logprobs": old,
        "proximal_logprobs": old,
        "ref_logprobs": old,
        "advantages": jnp.asarray(rng.normal(size=(ROWS, 1)).astype(np.float32) * response),
        "action_index": jnp.asarray((steps * response).astype(np.int32)),
    }


def train(config, param_dtype: str, dtype: str):
    """The policy's params after UPDATES of the recipe's updates (its optimizer and update settings)."""
    graphdef, params, frozen = initial(param_dtype, dtype, tuple(sections.lora_settings(config).items()))
    optimizer = make_optimizer(**sections.optimizer_settings_of(config)[0])
    update = make_update_fn(graphdef, optimizer, sections.update_config(config), donate=False)
    state = create_train_state(params, optimizer, seed=0)
    for seed in range(UPDATES):
        state, metrics = update(state, make_batch(graphdef, model_params(state.params, frozen), seed), frozen)
        assert int(state.skipped_updates) == 0
    return params, state.params


def moved_fraction(before, after):
    """Per parameter leaf, the fraction of its entries that changed."""
    return {
        jax.tree_util.keystr(path): float(np.mean(np.asarray(a) != np.asarray(b)))
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(before), jax.tree.leaves(after))
    }


def deltas(before, after):
    return np.concatenate(
        [
            (np.asarray(b, np.float64) - np.asarray(a, np.float64)).ravel()
            for a, b in zip(*map(jax.tree.leaves, (before, after)))
        ]
    )


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_moves_every_parameter_leaf(name):
    """Every leaf it trains: a LoRA recipe's adapters (OpenR's), every weight of the others."""
    config = recipe(name)
    assert config.param_dtype == "float32"  # the master precision of every recipe
    before, after = train(config, config.param_dtype, config.dtype)
    fractions = moved_fraction(before, after)
    # A LoRA adapter's A has the gradient s G B^T: zero at the first step (B = 0) and, at OpenR's lr 1e-6 and Adam
    # eps 1e-5, below eps while B is small, so only part of A moves in three updates; B moves whole.
    wanted = {leaf: 0.1 if "lora_a" in leaf else 0.5 for leaf in fractions}
    still = {leaf: f for leaf, f in fractions.items() if f < wanted[leaf]}
    assert not still, still  # (bfloat16 master weights: 0% of the norm weights moved, 2% of the kernels)
    if config.lora.rank:
        assert all("/lora/" in leaf.replace("']['", "/") for leaf in fractions)  # the adapters alone train


def test_adafactor_moves_every_parameter_leaf_at_the_recipes_settings():
    """The memory-lean optimizer (what fits a 1.5B update on 24 GB) trains too: lr 1e-6, bf16 compute."""
    config = recipe("grpo_qwen_math")
    config.optimizer = "adafactor"
    before, after = train(config, config.param_dtype, config.dtype)
    still = {leaf: f for leaf, f in moved_fraction(before, after).items() if f < 0.5}
    assert not still, still


def test_bfloat16_compute_updates_as_float32_compute():
    """The GRPO recipe's update with bfloat16 compute against float32 compute, both on float32 master weights:
    the parameter steps agree in direction and size."""
    config = recipe("grpo_qwen_math")
    assert config.dtype == "bfloat16"
    before, bf16 = train(config, "float32", "bfloat16")
    _, fp32 = train(config, "float32", "float32")
    a, b = deltas(before, bf16), deltas(before, fp32)
    cosine = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    assert cosine > 0.99, cosine  # 0.9999 here
    assert np.linalg.norm(a) == pytest.approx(np.linalg.norm(b), rel=0.01)


def test_bfloat16_master_weights_lose_the_recipes_steps():
    """What the float32 master weights fix: the same update on bfloat16 weights leaves most entries unchanged."""
    config = recipe("grpo_qwen_math")
    before, after = train(config, "bfloat16", "bfloat16")
    fractions = moved_fraction(before, after)
    # The weights away from 0 (every kernel, embedding and norm weight; the biases start at 0, where bfloat16 is
    # fine-grained enough) keep almost every entry.
    nonzero = [jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_leaves_with_path(before) if np.any(x != 0)]
    assert len(nonzero) >= 10 and max(fractions[leaf] for leaf in nonzero) < 0.05
