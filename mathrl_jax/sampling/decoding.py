"""The device side of `JaxSampler`: the jitted `prefill` and `decode` programs and what they use.

`prefill` runs left-padded prompts into a fresh KV cache; `decode` samples token after token in a `lax.while_loop`
(`token_filter.filter_logits` and `draw_in_two_stages`, or `sampling_distribution` unfiltered, give each token;
`row_keys` each row's draws). Its carry holds each row's state (RUNNING, STOPPED, LENGTH) and results
(`ROW_OUTPUTS`); between decode calls, `compact_carry` moves the running rows into a smaller batch. The programs are
module-level objects, jitted once: the jit cache is keyed on them and their static arguments, so the samplers of one
architecture share the compiled programs.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mathrl_jax.models.attention import default_positions
from mathrl_jax.models.qwen import KVCache, init_cache
from mathrl_jax.sampling.token_filter import filter_logits
from mathrl_jax.sharding.distributed import fetch
from mathrl_jax.sharding.rules import constrain_batch, constrain_kv_cache

RUNNING, STOPPED, LENGTH = 0, 1, 2


# The decode carry's per-row results, in the order `_rollouts` takes them.
ROW_OUTPUTS = ("tokens", "logprobs", "policy_logprobs", "lengths", "finish", "stop_token")


MAX_STOP_TOKENS = 8  # stop-token ids travel as a fixed-size array, so their number does not recompile


def penalize_repetitions(logits: chex.Array, seen: chex.Array, penalty) -> chex.Array:
    """The repetition penalty on `[N, V]` raw logits: where `seen` (`[N, V]` bool: the token is in the row's prompt
    or completion so far), `logit / p` if `logit > 0` else `logit * p`; elsewhere unchanged.

    vLLM's `apply_repetition_penalties` (CTRL, Keskar et al. 2019; transformers' `RepetitionPenaltyLogitsProcessor`),
    applied before temperature; like vLLM's, it scales by `1 / p` for positive logits. `penalty` is traced.
    """
    scaling = jnp.where(seen, jnp.where(logits > 0, 1.0 / penalty, penalty), 1.0)
    return logits * scaling


def seen_tokens(prompt_ids: chex.Array, prompt_mask: chex.Array, vocab_size: int) -> chex.Array:
    """`[U, V]` bool: which token ids each left-padded prompt `[U, P]` holds (its mask's tokens only)."""
    rows = jnp.broadcast_to(jnp.arange(prompt_ids.shape[0])[:, None], prompt_ids.shape)
    return jnp.zeros((prompt_ids.shape[0], vocab_size), bool).at[rows, prompt_ids].max(prompt_mask > 0)


def sampling_distribution(logits: chex.Array, temperature, top_k, top_p, min_p=0.0, *, use_filter: bool):
    """Log-probabilities of the distribution sampled from: log_softmax(filter(logits / T)) (`filter_logits`)."""
    scaled = logits.astype(jnp.float32) / temperature
    if use_filter:
        scaled = filter_logits(scaled, top_k, top_p, min_p)
    return jax.nn.log_softmax(scaled, axis=-1)


DRAW_BLOCK = 128  # tokens per block of `draw_in_two_stages`: 151,936 = 1,187 blocks of 128


def draw_in_two_stages(logits: chex.Array, keys: chex.Array) -> tuple[chex.Array, chex.Array]:
    """One token per row of `[N, V]` logits (-inf: removed) drawn from their softmax, and its log-probability.

    First a block of `DRAW_BLOCK` consecutive token ids by the block's probability mass W_b, then a token within
    it by its own: P(token j in block b) = W_b / W x w_j / W_b = w_j / W, the softmax exactly. Each stage is a
    Gumbel-max draw over V / 128 or 128 values (Gumbel 1954; Maddison et al. 2014), where one over all V values
    costs V noise draws and 2 V logarithms at every decoded token: at V = 151,936 most of a filtered step's
    sampling cost. `keys [N]`: one key per row (the row's draws depend on its key alone).
    """
    rows, vocab = logits.shape
    blocks = -(-vocab // DRAW_BLOCK)
    padded = jnp.pad(logits, ((0, 0), (0, blocks * DRAW_BLOCK - vocab)), constant_values=-jnp.inf)
    top = jnp.max(padded, axis=-1, keepdims=True)
    padded = padded.reshape(rows, blocks, DRAW_BLOCK)
    block_mass = jnp.sum(jnp.exp(padded - top[:, :, None]), axis=-1)  # [N, blocks]
    block_keys, token_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    gumbel = jax.vmap(lambda key, n: jax.random.gumbel(key, (n,), jnp.float32), in_axes=(0, None))
    block = jnp.argmax(jnp.log(block_mass) + gumbel(block_keys, blocks), axis=-1)
    within = jnp.take_along_axis(padded, block[:, None, None], axis=1)[:, 0]  # [N, DRAW_BLOCK]
    offset = jnp.argmax(within + gumbel(token_keys, DRAW_BLOCK), axis=-1)
    token = (block * DRAW_BLOCK + offset).astype(jnp.int32)
    chosen = jnp.take_along_axis(within, offset[:, None], axis=-1)[:, 0]
    logp = chosen - top[:, 0] - jnp.log(jnp.sum(block_mass, axis=-1))
    return token, logp


@functools.partial(jax.jit, static_argnames=("graphdef", "samples_per_prompt", "cache_length", "track_seen"))
def prefill(
    state, prompt_ids, prompt_mask, *, graphdef, samples_per_prompt: int, cache_length: int, track_seen: bool = False
):
    """Runs left-padded prompts `[U, P]` into a fresh cache; returns the decode state for `n` samples each
    (with `track_seen`, also `seen [U * n, V]`: the prompt's token ids, for the repetition penalty).

    Module-level and keyed on the (hashable) graphdef, so every sampler of the
    same architecture shares the compiled programs.
    """
    model = nnx.merge(graphdef, state)
    config = model.config
    num_prompts, prompt_len = prompt_ids.shape
    # The prompts attend over their own width only: a cache of P slots, widened to P + G for the decode after.
    cache = init_cache(config, num_prompts, prompt_len)
    cache = KVCache(*(tuple(constrain_kv_cache(a) for a in part) for part in cache))
    positions = default_positions(prompt_mask)
    hidden, cache = model(
        prompt_ids, attention_mask=prompt_mask, positions=positions, cache=cache, cache_index=0, return_hidden=True
    )
    cache_mask = jnp.zeros((num_prompts, cache_length), jnp.int32).at[:, :prompt_len].set(prompt_mask)
    # Left padding puts every prompt's last token in the last column.
    last_logits = model.logits_from_hidden(hidden[:, -1:])[:, 0].astype(jnp.float32)

    def repeat(x):
        return constrain_batch(jnp.repeat(x, samples_per_prompt, axis=0))

    def widen(a):  # [U, K, P, d] -> [U * n, K, P + G, d]
        a = jnp.pad(a, ((0, 0), (0, 0), (0, cache_length - prompt_len), (0, 0)))
        return constrain_kv_cache(jnp.repeat(a, samples_per_prompt, axis=0))

    cache = KVCache(*(tuple(widen(a) for a in part) for part in cache))
    out = dict(
        last_logits=repeat(last_logits),
        cache=cache,
        cache_mask=repeat(cache_mask),
        next_position=repeat(jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)),
    )
    if track_seen:
        out["seen"] = repeat(seen_tokens(prompt_ids, prompt_mask, last_logits.shape[-1]))
    return out


@functools.partial(
    jax.jit, static_argnames=("graphdef", "greedy", "use_filter", "penalize"), donate_argnames=("carry",)
)
def decode(state, carry, keys, controls, *, graphdef, greedy: bool, use_filter: bool, penalize: bool = False):
    """Decodes until every row is done or `controls["until"]` tokens exist.

    carry: tokens / logprobs / policy_logprobs `[N, G]` (written at column
    `step`), lengths, finish (RUNNING / STOPPED / LENGTH), stop_token `[N]`,
    last_logits `[N, V]` (for the next token), cache, cache_mask `[N, S]`,
    next_position `[N]`, step `[]`; with `penalize`, seen `[N, V]` bool (the
    prompt's and completion's token ids, each sampled token added).
    keys: `[N]` per-row keys; controls: traced scalars (temperature, top_k,
    top_p, min_p, repetition_penalty, max_new_tokens, until, prompt_bucket,
    pad_id) and `stop_ids [MAX_STOP_TOKENS]` (-1 = unused).

    Each token, as vLLM's sampler: raw logits -> repetition penalty (`penalize`) -> greedy argmax, or
    temperature -> min-p -> top-k -> top-p (`use_filter`) -> a draw. logprobs hold the sampled token's log-prob
    under that processed distribution (0 under greedy), policy_logprobs its log-prob under the raw logits.
    """
    model = nnx.merge(graphdef, state)
    rows, generation_bucket = carry["tokens"].shape

    def cond(c):
        return (c["step"] < controls["until"]) & jnp.any(c["finish"] == RUNNING)

    def body(c):
        step = c["step"]
        running = c["finish"] == RUNNING
        policy_logp = jax.nn.log_softmax(c["last_logits"], axis=-1)
        logits = c["last_logits"]
        if penalize:
            logits = penalize_repetitions(logits, c["seen"], controls["repetition_penalty"])
        if greedy:
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            sample_logp = jnp.zeros((rows,), jnp.float32)
        else:
            step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)
            if use_filter:
                scaled = logits.astype(jnp.float32) / controls["temperature"]
                filtered = filter_logits(scaled, *(controls[k] for k in ("top_k", "top_p", "min_p")))
                token, sample_logp = draw_in_two_stages(filtered, step_keys)
            else:  # the draws of every run before the two-stage draw: kept, so an unfiltered run repeats them
                logp = sampling_distribution(logits, controls["temperature"], 0, 1.0, use_filter=False)
                gumbel = jax.vmap(lambda k: jax.random.gumbel(k, logp.shape[-1:], jnp.float32))(step_keys)
                token = jnp.argmax(logp + gumbel, axis=-1).astype(jnp.int32)
                sample_logp = jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
        token = jnp.where(running, token, controls["pad_id"])
        token_policy_logp = jnp.take_along_axis(policy_logp, token[:, None], axis=-1)[:, 0]
        write = lambda buf, value: jax.lax.dynamic_update_slice_in_dim(buf, value[:, None], step, axis=1)  # noqa: E731
        zero = jnp.zeros((), jnp.float32)
        tokens = write(c["tokens"], token)
        logprobs = write(c["logprobs"], jnp.where(running, sample_logp, zero))
        policy_logprobs = write(c["policy_logprobs"], jnp.where(running, token_policy_logp, zero))
        lengths = c["lengths"] + running.astype(jnp.int32)
        is_stop = jnp.any(token[:, None] == controls["stop_ids"][None, :], axis=-1) & running
        at_limit = running & ~is_stop & (lengths >= controls["max_new_tokens"])
        finish = jnp.where(is_stop, STOPPED, jnp.where(at_limit, LENGTH, c["finish"]))
        stop_token = jnp.where(is_stop, token, c["stop_token"])

        slot = controls["prompt_bucket"] + step
        cache_mask = jax.lax.dynamic_update_slice_in_dim(c["cache_mask"], jnp.ones((rows, 1), jnp.int32), slot, axis=1)
        hidden, cache = model(
            token[:, None],
            attention_mask=cache_mask,
            positions=c["next_position"][:, None],
            cache=c["cache"],
            cache_index=slot,
            return_hidden=True,
        )
        last_logits = model.logits_from_hidden(hidden)[:, 0].astype(jnp.float32)
        seen = {}
        if penalize:  # a finished row's pad token too: it samples no more
            seen["seen"] = c["seen"].at[jnp.arange(rows), token].set(True)
        return dict(
            **seen,
            tokens=tokens,
            logprobs=logprobs,
            policy_logprobs=policy_logprobs,
            lengths=lengths,
            finish=finish,
            stop_token=stop_token,
            last_logits=constrain_batch(last_logits),
            cache=cache,
            cache_mask=cache_mask,
            next_position=c["next_position"] + 1,
            step=step + 1,
        )

    del generation_bucket
    return jax.lax.while_loop(cond, body, carry)


def decode_controls(params, prompt_bucket: int, pad_id: int, stop_ids) -> dict:
    """`decode`'s traced controls (numpy scalars) from a `SamplingParams`: changing them does not recompile."""
    return dict(
        temperature=np.float32(max(params.temperature, 1e-6)),
        top_k=np.int32(params.top_k),
        top_p=np.float32(params.top_p),
        min_p=np.float32(params.min_p),
        repetition_penalty=np.float32(params.repetition_penalty),
        max_new_tokens=np.int32(params.max_new_tokens),
        prompt_bucket=np.int32(prompt_bucket),
        pad_id=np.int32(pad_id),
        stop_ids=np.asarray(list(stop_ids) + [-1] * (MAX_STOP_TOKENS - len(stop_ids)), np.int32),
    )


def row_keys(seed, num_rows: int, first_row=0) -> jax.Array:
    """One key per row from (seed, row index): a row's draws do not depend on the batch around it, nor on the
    sub-batch it runs in (rows `first_row, ..., first_row + num_rows - 1` of the whole batch)."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(seed), first_row + jnp.arange(num_rows))


jitted_row_keys = jax.jit(row_keys, static_argnums=1)


def compact_carry(carry, keys, origin, left, shards):
    """The carry's running rows in a batch a quarter (a sixteenth, ...) as large, when they fit in one (and
    it splits over the mesh's `shards`); the finished rows' outputs go to `left` (by their row in the
    sub-batch). A quarter at a time keeps the decode programs few. Returns (carry, keys, origin)."""
    finish = np.asarray(fetch(carry["finish"]))
    running = np.flatnonzero(finish == RUNNING)
    size = len(finish)
    while size % 4 == 0 and (size // 4) % shards == 0 and size // 4 >= max(len(running), 1):
        size //= 4
    if size == len(finish):
        return carry, keys, origin
    leaving = [i for i in np.flatnonzero(finish != RUNNING) if origin[i] >= 0]
    outputs = fetch(tuple(carry[k] for k in ROW_OUTPUTS))
    for i in leaving:
        left[int(origin[i])] = tuple(x[i] for x in outputs)
    # Filler rows, copies of a finished row (so not running), make up the smaller batch.
    filler = int(np.flatnonzero(finish != RUNNING)[0])
    keep = np.concatenate([running, np.full(size - len(running), filler)]).astype(np.int32)
    index = jax.device_put(keep)
    take = lambda x: jnp.take(x, index, axis=0)  # noqa: E731
    step = carry["step"]
    carry = jax.tree.map(take, {k: v for k, v in carry.items() if k != "step"})
    carry["step"] = step
    origin = np.concatenate([origin[running], np.full(size - len(running), -1)])
    return carry, take(keys), origin
