"""Critics and process reward models built on the Qwen trunk.

A critic is the Qwen trunk plus a scalar head on every position's final
hidden state. In Hugging Face terms it is `Qwen2ForTokenClassification` /
`Qwen3ForTokenClassification` with one label (head `score`), so it exports
and reloads through the same table as the causal LM. A PRM is an ordinary
causal LM; `prm_step_scores` reads its verdict at the step tags.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from mathrl_jax.models import hf, lora, safetensors_io
from mathrl_jax.models.attention import full_sequence_attention
from mathrl_jax.models.hf_config import config_to_dict, load_config
from mathrl_jax.models.qwen import (
    QwenConfig,
    QwenForCausalLM,
    QwenModel,
)


class QwenCritic(nnx.Module):
    """Per-token values V_t = w . h_t + b from the Qwen trunk's final hidden states."""

    def __init__(self, config: QwenConfig, rngs: nnx.Rngs):
        self.config = config
        self.model = QwenModel(config, rngs)
        # Zero-initialised head: a new critic predicts 0 everywhere, which keeps
        # the first advantages equal to the rewards.
        self.score = nnx.Linear(
            config.hidden_size,
            1,
            use_bias=True,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
            kernel_init=nnx.initializers.zeros,
            rngs=rngs,
        )

    def __call__(self, input_ids: chex.Array, **inputs: Optional[chex.Array]) -> chex.Array:
        """`[B, T]` float32 values, one per position (value of the prefix up to and including it).

        `inputs` are the causal LM's cache-less keywords, with the same meaning (`attention_mask`, `positions`,
        `segment_ids`: see `QwenForCausalLM.__call__`); any other raises a TypeError naming it.
        """
        positions, allowed = full_sequence_attention(input_ids, **inputs)
        hidden, _ = self.model(input_ids, positions, allowed)
        return self.score(hidden.astype(jnp.float32))[..., 0]


OPENR_HEAD_WIDTHS = (1024, 512)
"""The hidden widths of OpenR's value head (`mat/models/critic.py`, `APPOCritic` / `TPPOCritic`: `v_head_mlp1`
hidden -> 1024, `v_head_mlp2` 1024 -> 512, `v_head_mlp3` 512 -> 1, ReLU between, no biases)."""


class MLPValueHead(nnx.Module):
    """OpenR's value head: `V = w3 . relu(W2 relu(W1 h))`, float32, no biases. Initialised as torch's
    `nn.Linear` is (what OpenR leaves it at): each kernel uniform in +-1/sqrt(fan_in)."""

    def __init__(self, hidden_size: int, rngs: nnx.Rngs, widths: Sequence[int] = OPENR_HEAD_WIDTHS):
        sizes = (hidden_size, *widths, 1)
        self.layers = nnx.List(
            [
                nnx.Linear(
                    n_in,
                    n_out,
                    use_bias=False,
                    dtype=jnp.float32,
                    param_dtype=jnp.float32,
                    kernel_init=lora.a_initializer,  # torch's nn.Linear init, as PEFT's A
                    rngs=rngs,
                )
                for n_in, n_out in zip(sizes[:-1], sizes[1:])
            ]
        )

    def __call__(self, hidden: chex.Array) -> chex.Array:
        x = hidden.astype(jnp.float32)
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)[..., 0]


class FrozenBaseCritic(nnx.Module):
    """A LoRA run's critic as OpenR builds it: the policy's frozen base (its adapters off: the plain trunk, never
    trained) under `MLPValueHead`. Its `model` sits where a causal LM's trunk does, so the policy's frozen base
    (`frozen_trunk`) fills it, and the critic holds (and its optimizer trains) the head alone."""

    def __init__(self, config: QwenConfig, rngs: nnx.Rngs):
        self.config = config
        self.model = QwenModel(config, rngs)
        self.value_head = MLPValueHead(config.hidden_size, rngs)

    def __call__(self, input_ids: chex.Array, **inputs: Optional[chex.Array]) -> chex.Array:
        """`[B, T]` float32 values, as `QwenCritic`'s."""
        positions, allowed = full_sequence_attention(input_ids, **inputs)
        hidden, _ = self.model(input_ids, positions, allowed)
        return self.value_head(hidden)


def frozen_base_critic(policy_config: QwenConfig, seed: int = 0) -> Tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, head state) of a `FrozenBaseCritic` on a LoRA policy's base: the head made from `seed`, the trunk
    left abstract (its weights are the policy's frozen base: `frozen_trunk`)."""
    config = dataclasses.replace(policy_config, lora_rank=0)  # the base's graph: the adapters off
    abstract = nnx.eval_shape(lambda: FrozenBaseCritic(config, rngs=nnx.Rngs(seed)))
    graphdef, _ = nnx.split(abstract)
    head = nnx.state(MLPValueHead(config.hidden_size, rngs=nnx.Rngs(seed)))
    return graphdef, nnx.State({"value_head": head})


def frozen_trunk(frozen: nnx.State) -> nnx.State:
    """The trunk part (`model/...`) of a LoRA policy's frozen base: what `FrozenBaseCritic` shares with it (not
    copied). Pure: it runs inside the jitted update on the base passed in."""
    return nnx.State({"model": frozen["model"]})


def critic_table(config: QwenConfig):
    """HF names of a critic: the causal LM's trunk tensors plus `score.weight` / `score.bias`."""
    table = {name: spec for name, spec in hf.parameter_table(config).items() if name.startswith("model.")}
    table["score.weight"] = hf.TensorSpec(("score", "kernel"), True, (1, config.hidden_size))
    table["score.bias"] = hf.TensorSpec(("score", "bias"), False, (1,))
    return table


def load_critic(
    directory: str, sharding_fn: Optional[hf.ShardingFn] = None, seed: int = 0, **config_overrides
) -> QwenCritic:
    """A critic from a local HF checkpoint.

    From a causal LM checkpoint (the usual case: the critic starts from the
    policy's weights) the trunk is loaded and the value head is new; from a
    token-classification checkpoint written by `export_critic` the head is
    loaded too.
    """
    config = load_config(directory, **config_overrides)
    table = critic_table(config)
    has_head = "score.weight" in safetensors_io.checkpoint_tensors(directory)
    if not has_head:
        table = {n: s for n, s in table.items() if not n.startswith("score.")}
    pure = hf.read_tensors(
        directory, table, config.jnp_param_dtype, sharding_fn, ignore=lambda name: name == "lm_head.weight"
    )
    abstract = nnx.eval_shape(lambda: QwenCritic(config, rngs=nnx.Rngs(seed)))
    graphdef, state = nnx.split(abstract)
    if not has_head:
        fresh_head = nnx.Linear(
            config.hidden_size, 1, use_bias=True, kernel_init=nnx.initializers.zeros, rngs=nnx.Rngs(seed)
        )
        pure["score"] = {"kernel": fresh_head.kernel[...], "bias": fresh_head.bias[...]}
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)


def export_critic(critic: QwenCritic, directory: str, tokenizer_dir: Optional[str] = None) -> None:
    """Writes the critic as a HF `Qwen{2,3}ForTokenClassification` checkpoint with one label."""
    config = critic.config
    tensors = hf.hf_tensors(nnx.state(critic), critic_table(config))
    hf_config = config_to_dict(config)
    hf_config["architectures"] = [config.architecture.replace("ForCausalLM", "ForTokenClassification")]
    hf_config["num_labels"] = 1
    hf.write_checkpoint(tensors, hf_config, directory, config.jnp_param_dtype, tokenizer_dir)


def prm_step_scores(
    logits: chex.Array,
    input_ids: chex.Array,
    step_tag_id: int,
    candidate_token_ids: Sequence[int],
) -> Tuple[chex.Array, chex.Array]:
    """Probability of the "good" candidate at each step tag (Math-Shepherd / OpenR PRMs).

      score_t = softmax(logits_t[candidates])[0]   at positions t with input_ids_t == step_tag

    Args:
      logits: `[B, T, V]` PRM logits.
      input_ids: `[B, T]` the scored sequence, each reasoning step followed by the tag.
      step_tag_id: the token id of the step tag (e.g. "ки" for Math-Shepherd).
      candidate_token_ids: (good, bad, ...) ids; the score is the first's
        probability renormalised over the candidates.

    Returns:
      (`[B, T]` float32 scores, 0 off the tags; `[B, T]` float32 tag mask).
    """
    chex.assert_rank(logits, 3)
    chex.assert_rank(input_ids, 2)
    if len(candidate_token_ids) < 2:
        raise ValueError(f"candidate_token_ids needs a good and at least one other token, got {candidate_token_ids}")
    candidates = logits[..., jnp.asarray(candidate_token_ids)].astype(jnp.float32)
    good = jax.nn.softmax(candidates, axis=-1)[..., 0]
    tags = (input_ids == step_tag_id).astype(jnp.float32)
    return good * tags, tags


def prm_scores(
    prm: QwenForCausalLM,
    input_ids: chex.Array,
    attention_mask: chex.Array,
    step_tag_id: int,
    candidate_token_ids: Sequence[int],
) -> Tuple[chex.Array, chex.Array]:
    """Runs the PRM on `[B, T]` sequences and returns `prm_step_scores` of its logits."""
    logits, _ = prm(input_ids, attention_mask=attention_mask)
    tags_counted = (input_ids == step_tag_id) & (attention_mask > 0)
    scores, _ = prm_step_scores(logits, input_ids, step_tag_id, candidate_token_ids)
    tags = tags_counted.astype(jnp.float32)
    return scores * tags, tags
