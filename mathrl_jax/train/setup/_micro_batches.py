"""The update's micro-batch rows when `micro_batch_size` is 0: the most rows whose activations fit
`micro_batch_gib`, estimated from the model's shape.

A minibatch run in one forward and backward pass holds every layer's activations for all its rows at once. At
Qwen2.5-0.5B's shape, float32, 16 rows of 152 tokens, XLA's memory analysis of the update counts 9.9 GiB of
temporaries (4.9 GiB at 4 rows), which put the GRPO benchmark's peak 3 GiB above TRL's. Splitting the minibatch
into micro-batches whose gradients are summed (gradient accumulation, as TRL's `gradient_accumulation_steps` and
verl's `ppo_micro_batch_size_per_gpu`) gives the same step with the activations of one micro-batch. The rows
depend on the config and the model's shape (and, with unrolled remat, on whether the backend is a CPU), not on
the machine's memory, so a run repeats itself anywhere.
"""

from __future__ import annotations

from typing import Optional

import jax

from mathrl_jax.sharding.distributed import note

GIB = 2**30


def activation_bytes(model_config, tokens: int, width: int, *, remat: bool, policy: str = "nothing_saveable") -> int:
    """Estimate of the bytes a forward + backward pass over `tokens` tokens in rows of `width` keeps for the
    backward: per token and layer, 6 intermediate-sized values in the compute dtype (the MLP's gate, up, their
    product, the activation's input and their gradients' staging) and 12 hidden-sized values plus 2 attention rows
    of `width` per head (scores, probabilities) in float32 (norms and softmax run in float32 whatever the compute).

    Fitted to XLA's memory analysis of the update: within 0.95-1.04x of its temporaries' growth per token at two
    small shapes in float32 and bfloat16 (tested), 1.15x at the 0.5B shape with 152-token rows (4.24 MB a token
    against 3.7). With `remat` the pass keeps each layer's input, what the remat `policy` saves of each layer
    (`saved_by_policy`) and one layer's activations at a time.
    """
    c = model_config
    itemsize = 2 if c.dtype in ("bfloat16", "float16") else 4
    per_layer = itemsize * 6 * c.intermediate_size + 4 * (12 * c.hidden_size + 2 * c.num_attention_heads * width)
    layers = c.num_hidden_layers
    if remat:
        return tokens * (layers * (4 * c.hidden_size + saved_by_policy(c, width, policy)) + per_layer)
    return tokens * layers * per_layer


def saved_by_policy(model_config, width: int, policy: str) -> int:
    """Bytes per token and layer that a remat policy (`models.qwen.REMAT_POLICIES`) keeps beyond the layer's input,
    counted in float32: "dots_with_no_batch_dims_saveable" the projections the backward reads (q, k, v, gate, up),
    "dots_saveable" also attention's scores and output (`width` + head_dim values a head). Within 0.9-1.1x of
    the growth of XLA's memory analysis per token at a small scanned shape, float32 and bfloat16 (tested)."""
    c = model_config
    if policy == "nothing_saveable":
        return 0
    kept = c.num_attention_heads * c.head_dim + 2 * c.num_key_value_heads * c.head_dim + 2 * c.intermediate_size
    if policy == "dots_saveable":
        kept += c.num_attention_heads * (width + c.head_dim)
    return 4 * kept


def micro_batch_rows(config, model_config, batch_shards: int) -> Optional[int]:
    """`micro_batch_size` if set; else the most rows of a minibatch (a divisor of it, split evenly over the mesh's
    `batch_shards` where the minibatch is) whose `activation_bytes` at the longest row (max_prompt_length +
    max_new_tokens) fit `micro_batch_gib`; None when the whole minibatch fits (one pass, as before). Says what it
    chose when it splits."""
    if config.micro_batch_size:
        return config.micro_batch_size
    rows = config.n_rollout_threads * (config.episode_length if config.env_name else config.group_size)
    mini = rows // config.num_mini_batch
    width = config.max_prompt_length + config.max_new_tokens
    budget = config.micro_batch_gib * GIB

    # XLA:CPU merges an unrolled remat's recomputed forward into the first one (docs/real_shapes.md): there only
    # scanned layers hold remat's saving.
    remat = config.remat and (config.scan_layers or jax.default_backend() != "cpu")

    def need(micro: int) -> int:
        return activation_bytes(model_config, micro * width, width, remat=remat, policy=config.remat_policy)

    if need(mini) <= budget:
        return None
    shards = batch_shards if mini % batch_shards == 0 else 1
    choices = [d for d in range(shards, mini + 1, shards) if mini % d == 0]
    fitting = [d for d in choices if need(d) <= budget]
    micro = max(fitting) if fitting else choices[0]
    if micro == mini:  # no smaller micro-batch splits over the mesh's batch shards
        return None
    note(
        f"micro-batches of {micro} rows: a minibatch of {mini} rows of up to {width} tokens is estimated at "
        f"{need(mini) / GIB:.1f} GiB of activations, over --config.micro_batch_gib={config.micro_batch_gib:g} "
        f"({need(micro) / GIB:.2f} GiB each); --config.micro_batch_size sets the rows"
    )
    return micro
