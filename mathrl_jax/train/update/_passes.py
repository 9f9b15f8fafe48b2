"""The trainer's forward passes: shifted log-probs and critic values of a batch, on padded rows or packed ones.

    logprobs = compute_logprobs_fn(graphdef, temperature, chunk_rows)   # old / reference / proximal log-probs
    old = logprobs(params, input_ids, attention_mask, plan)              # plan: packing.plan_passes, or None

Column c of every result scores token c, from the logits at column c - 1 (the layout of `Rollouts.to_batch`).
With a packing plan the rows run packed (whole sequences first-fit into rows, attending within their segment)
and come back in the padded layout. No pass forms a batch's `[rows, L, V]` logits: they are made from the final
hidden states a chunk of positions at a time (`hidden_logprobs`); `chunk_rows` rows at a time bound the rest.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from mathrl_jax import losses
from mathrl_jax.models import lora

# Positions x vocabulary entries of one chunk of logits in `hidden_logprobs`: 64 MiB of float32 (110 positions
# at Qwen's V = 151,936), whatever the batch; the whole `[N, L, V]` logits of a batch are never formed.
LOGIT_CHUNK_ELEMENTS = 2**24


def shifted_logprobs(logits: jax.Array, input_ids: jax.Array, temperature: float = 1.0) -> Tuple[jax.Array, jax.Array]:
    """(log-prob, entropy) `[N, L]` with column c scoring token c from the logits at c - 1; column 0 is 0."""
    return _shifted(*losses.token_logprobs_from_logits(logits[:, :-1], input_ids[:, 1:], temperature=temperature))


def _shifted(*per_token: jax.Array) -> Tuple[jax.Array, ...]:
    """`[N, L - 1]` results of tokens 1.. moved to columns 1.., column 0 (no token before it) 0."""
    return tuple(jnp.pad(x, ((0, 0), (1, 0))) for x in per_token)


def hidden_logprobs(model, hidden: jax.Array, input_ids: jax.Array, temperature: float = 1.0):
    """`shifted_logprobs` from the final hidden states `[N, L, D]`, through `losses.token_logprobs_from_hidden`:
    a chunk of LOGIT_CHUNK_ELEMENTS logits at a time, recomputed in the backward pass. The unembedding runs in
    the model's compute dtype, as its `logits_from_hidden` does."""
    weight, layout = model.unembedding()
    vocab = weight.shape[1 if layout == "dv" else 0]
    return _shifted(
        *losses.token_logprobs_from_hidden(
            hidden[:, :-1],
            weight.astype(hidden.dtype),
            input_ids[:, 1:],
            temperature=temperature,
            chunk_size=max(8, min(512, LOGIT_CHUNK_ELEMENTS // vocab)),
            weight_layout=layout,
        )
    )


def policy_logprobs(
    graphdef, params, input_ids, attention_mask, temperature: float = 1.0, packing=None, *, dropout=None
):
    """The policy's shifted (log-prob, entropy) of a batch: what the trainer recomputes. With `packing`
    (`segment_ids`, `positions`), `input_ids` are packed rows, scored within their sequences. The logits are
    made a chunk at a time from the final hidden states (`hidden_logprobs`). `dropout`: (rate, key data) of the
    LoRA adapters' dropout (`lora.with_dropout`), the update's passes alone; None: none."""
    model = nnx.merge(graphdef, params)
    if dropout is not None:
        lora.with_dropout(model, dropout[0], jax.random.wrap_key_data(dropout[1]))
    hidden, _ = model(input_ids, return_hidden=True, **_model_inputs(attention_mask, packing))
    return hidden_logprobs(model, hidden, input_ids, temperature)


def critic_values(graphdef, params, input_ids, attention_mask, packing=None):
    """Critic values aligned like the log-probs: column c is V(prefix before token c) (verl's alignment)."""
    values = nnx.merge(graphdef, params)(input_ids, **_model_inputs(attention_mask, packing))
    return jnp.pad(values[:, :-1], ((0, 0), (1, 0)))


def _model_inputs(attention_mask, packing) -> Dict[str, jax.Array]:
    if packing is None:
        return dict(attention_mask=attention_mask)
    segments = packing["segment_ids"]
    return dict(attention_mask=(segments > 0).astype(jnp.int32), positions=packing["positions"], segment_ids=segments)


def packed_inputs(input_ids: jax.Array, source: jax.Array, pad_id: int = 0) -> jax.Array:
    """`[..., R, T]` packed token ids: `input_ids` (padded, `[N, L]`) at the flat indices `source` (-1: `pad_id`)."""
    flat = input_ids.reshape(-1)
    return jnp.where(source >= 0, flat[jnp.maximum(source, 0)], pad_id).astype(input_ids.dtype)


def unpack(packed: jax.Array, packing: Dict[str, jax.Array]) -> jax.Array:
    """Per-token results of packed rows `[R, T]` back in the padded layout `[K, L]` (0 where no token)."""
    flat = jnp.concatenate([packed.reshape(-1), jnp.zeros((1,), packed.dtype)])
    return flat[packing["unpack"]]


def _in_row_chunks(fn: Callable, chunk_rows: Optional[int]) -> Callable:
    """`fn(params, *arrays [N, ...]) -> [N, ...]` computed `chunk_rows` rows at a time (a `lax.scan` over
    `[N / chunk_rows, chunk_rows, ...]`), so the activations of one chunk are all that is live at
    once. Rows are independent, so the result is the same; None, or N not a multiple, runs all rows at once.
    With `live` (`[N]` bool), a chunk with no live row is not computed: its result is zeros."""

    def chunked(params, *arrays, live=None):
        rows = arrays[0].shape[0]
        if not chunk_rows or chunk_rows >= rows or rows % chunk_rows:
            return fn(params, *arrays)
        split = lambda x: x.reshape(rows // chunk_rows, chunk_rows, *x.shape[1:])  # noqa: E731
        chunks = tuple(split(x) for x in arrays)

        # The params ride in the scan's carry rather than the closure: the model is then built from values of
        # the loop body's own trace, which NNX's lifted transforms (remat) require.
        def compute(p, xs):
            return p, fn(p, *xs)

        body = compute
        if live is not None:
            result = jax.eval_shape(fn, params, *(x[0] for x in chunks))

            def nothing(p, xs):
                return p, jnp.zeros(result.shape, result.dtype)

            def body(p, live_and_xs):
                chunk_live, xs = live_and_xs
                return jax.lax.cond(chunk_live, compute, nothing, p, xs)

            chunks = (jnp.any(split(live), axis=1), chunks)
        _, out = jax.lax.scan(body, params, chunks)
        return out.reshape(rows, *out.shape[2:])

    return chunked


def _pass_fn(per_row: Callable, chunk_rows: Optional[int], compiler_options: Optional[dict] = None) -> Callable:
    """Jitted `(params, input_ids [N, L], attention_mask [N, L], packing=None) -> [N, L]` of
    `per_row(params, ids, packing-or-None, attention_mask)`, on the padded rows or, with `packing`
    (`packing.plan_passes`), on the packed rows and brought back to the padded layout; `chunk_rows` rows
    (padded or packed) at a time."""

    def padded(params, input_ids, attention_mask):
        return per_row(params, input_ids, attention_mask, None)

    def packed(params, input_ids, segment_ids, positions):
        return per_row(params, input_ids, None, dict(segment_ids=segment_ids, positions=positions))

    def trainer_pass(params, input_ids, attention_mask, packing=None):
        if packing is None:
            return _in_row_chunks(padded, chunk_rows)(params, input_ids, attention_mask)
        # `[chunks, rows, T]` plans (`packing.plan_passes(max_rows_per_chunk=...)`) run a chunk of rows at a time.
        row_tokens = packing["source"].shape[-1]
        chunk = packing["source"].shape[1] if packing["source"].ndim == 3 else None
        flat = lambda x: x.reshape(-1, row_tokens)  # noqa: E731
        ids = packed_inputs(input_ids, flat(packing["source"]))
        segment_ids = flat(packing["segment_ids"])
        live = jnp.any(segment_ids > 0, axis=1)  # the plan's spare chunks (a bucketed count) hold no token
        out = _in_row_chunks(packed, chunk)(params, ids, segment_ids, flat(packing["positions"]), live=live)
        return unpack(out, packing)

    return jax.jit(trainer_pass, compiler_options=compiler_options)


def compute_logprobs_fn(
    graphdef, temperature: float = 1.0, chunk_rows: Optional[int] = None, compiler_options: Optional[dict] = None
) -> Callable:
    """Jitted `(params, input_ids, attention_mask, packing=None) -> [N, L] log-probs` (old / reference /
    proximal log-probs), `chunk_rows` rows at a time if given (the loop passes the update's micro-batch:
    the memory the update needs); `compiler_options`: XLA's (`mathrl_jax.compile_options`)."""

    def per_row(params, input_ids, attention_mask, packing):
        return policy_logprobs(graphdef, params, input_ids, attention_mask, temperature, packing)[0]

    return _pass_fn(per_row, chunk_rows, compiler_options)


def compute_values_fn(
    critic_graphdef, chunk_rows: Optional[int] = None, compiler_options: Optional[dict] = None
) -> Callable:
    """Jitted `(critic_params, input_ids, attention_mask, packing=None) -> [N, L]` aligned values, `chunk_rows`
    rows at a time."""
    return _pass_fn(functools.partial(critic_values, critic_graphdef), chunk_rows, compiler_options)
