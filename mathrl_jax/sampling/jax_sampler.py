"""A pure-JAX sampler: jitted prefill, then a `lax.while_loop` decode over a preallocated KV cache.

Layout of one `generate` call:

    prompts (left-padded to a bucket P)  ──prefill──►  KV cache [U, P + G]   (U unique prompts)
                                                       │ repeated n times (samples share the prompt's cache)
                                                       ▼
    decode: while step < limit and not all done:  sample from the last logits → write the token
            at slot P + step → one forward of [N, 1] tokens → next logits

Shapes are bucketed (prompt length and completion length to powers of two, the
number of prompts to a power of two) so a training run compiles a handful of
programs, not one per step. Finished rows keep running in the batch (their
tokens are discarded and their lengths stop counting) until every row is done.
The prefill attends over the prompt width only; with `kv_cache_gib` a batch
whose cache would not fit runs in sub-batches of prompts.

Stop strings need text, so with `SamplingParams.stop` the decode runs in chunks
of `stop_check_interval` tokens and the host checks the new text between chunks.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Optional, Sequence, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mathrl_jax.errors import MathRLError
from mathrl_jax.models.qwen import KVCache, QwenForCausalLM, default_positions, init_cache
from mathrl_jax.sampling.base import Rollouts, SamplingParams, first_stop_string
from mathrl_jax.sharding.distributed import fetch
from mathrl_jax.sharding.rules import constrain_batch, constrain_kv_cache

RUNNING, STOPPED, LENGTH = 0, 1, 2


# The decode carry's per-row results, in the order `_rollouts` takes them.
ROW_OUTPUTS = ("tokens", "logprobs", "policy_logprobs", "lengths", "finish", "stop_token")


class SamplerMemoryError(MathRLError, MemoryError):
    """The device ran out of memory generating; the message names the option that bounds it."""


MAX_STOP_TOKENS = 8  # stop-token ids travel as a fixed-size array, so their number does not recompile


def bucket(n: int, minimum: int) -> int:
    """The smallest power of two >= max(n, minimum, 1)."""
    return 1 << (max(int(n), int(minimum), 1) - 1).bit_length()


def filter_logits(logits: chex.Array, top_k: chex.Array, top_p: chex.Array) -> chex.Array:
    """Top-k then top-p (nucleus) filtering of `[N, V]` logits; removed entries become -inf.

    top-k keeps the `top_k` largest logits (ties at the threshold kept; `top_k <= 0`
    keeps all). top-p keeps the most likely tokens, in order, while the probability
    mass before each is below `top_p`, so the first is always kept (vLLM / HF).
    Both are traced scalars: changing them does not recompile.
    """
    vocab = logits.shape[-1]
    descending = -jnp.sort(-logits, axis=-1)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jnp.take_along_axis(descending, jnp.broadcast_to(k - 1, logits.shape[:-1])[..., None], axis=-1)
    logits = jnp.where(logits < kth, -jnp.inf, logits)
    descending = jnp.where(descending < kth, -jnp.inf, descending)
    probs = jax.nn.softmax(descending, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < top_p
    # The smallest kept logit is the threshold; everything below it goes.
    threshold = jnp.min(jnp.where(keep, descending, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < threshold, -jnp.inf, logits)


def sampling_distribution(logits: chex.Array, temperature, top_k, top_p, *, use_filter: bool) -> chex.Array:
    """Log-probabilities of the distribution sampled from: log_softmax(filter(logits / T))."""
    scaled = logits.astype(jnp.float32) / temperature
    if use_filter:
        scaled = filter_logits(scaled, top_k, top_p)
    return jax.nn.log_softmax(scaled, axis=-1)


@functools.partial(jax.jit, static_argnames=("graphdef", "samples_per_prompt", "cache_length"))
def prefill(state, prompt_ids, prompt_mask, *, graphdef, samples_per_prompt: int, cache_length: int):
    """Runs left-padded prompts `[U, P]` into a fresh cache; returns the decode state for `n` samples each.

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
    return dict(
        last_logits=repeat(last_logits),
        cache=cache,
        cache_mask=repeat(cache_mask),
        next_position=repeat(jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)),
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "greedy", "use_filter"), donate_argnames=("carry",))
def decode(state, carry, keys, controls, *, graphdef, greedy: bool, use_filter: bool):
    """Decodes until every row is done or `controls["until"]` tokens exist.

    carry: tokens / logprobs / policy_logprobs `[N, G]` (written at column
    `step`), lengths, finish (RUNNING / STOPPED / LENGTH), stop_token `[N]`,
    last_logits `[N, V]` (for the next token), cache, cache_mask `[N, S]`,
    next_position `[N]`, step `[]`. keys: `[N]` per-row keys;
    controls: traced scalars (temperature, top_k, top_p, max_new_tokens,
    until, prompt_bucket, pad_id) and `stop_ids [MAX_STOP_TOKENS]` (-1 = unused).
    """
    model = nnx.merge(graphdef, state)
    rows, generation_bucket = carry["tokens"].shape

    def cond(c):
        return (c["step"] < controls["until"]) & jnp.any(c["finish"] == RUNNING)

    def body(c):
        step = c["step"]
        running = c["finish"] == RUNNING
        policy_logp = jax.nn.log_softmax(c["last_logits"], axis=-1)
        if greedy:
            token = jnp.argmax(c["last_logits"], axis=-1).astype(jnp.int32)
            sample_logp = jnp.zeros((rows,), jnp.float32)
        else:
            logp = sampling_distribution(
                c["last_logits"], controls["temperature"], controls["top_k"], controls["top_p"], use_filter=use_filter
            )
            step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)
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
        return dict(
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


def row_keys(seed, num_rows: int, first_row=0) -> jax.Array:
    """One key per row from (seed, row index): a row's draws do not depend on the batch around it, nor on the
    sub-batch it runs in (rows `first_row, ..., first_row + num_rows - 1` of the whole batch)."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(seed), first_row + jnp.arange(num_rows))


_row_keys = jax.jit(row_keys, static_argnums=1)


class JaxSampler:
    """Samples from a `QwenForCausalLM` with a KV cache, on any JAX backend.

    Args:
      model: the policy (its state can be replaced with `update_weights`).
      eos_token_ids: ids that end a completion (e.g. `<|im_end|>`, `<|endoftext|>`).
      pad_token_id: fills prompts and finished rows.
      tokenizer: optional; with one, `generate` accepts strings, returns texts
        and supports stop strings (anything with `decode(ids)` and `encode` or a
        Hugging Face tokenizer).
      mesh: optional sampler mesh; params are resharded onto it with `rules`
        (tensor parallel over "tp"), rows are split over "dp"/"fsdp".
      rules: partition rules for the params on `mesh` (default: the Qwen rules).
      min_prompt_bucket, min_generation_bucket: smallest length buckets.
      stop_check_interval: decode chunk (tokens) between host checks of stop strings.
      kv_cache_gib: bound on the KV cache of one prefill + decode; a batch whose cache would exceed it runs in
        sub-batches of a power-of-two number of prompts (the same programs each, the same samples as one
        call). None: the whole batch at once. Running out of device memory raises `SamplerMemoryError`,
        which names this option.
      compact_interval: every this many decode steps, the rows still running move into a smaller batch
        (a quarter, or a quarter of that, ...) when they fit in one, so finished rows stop costing decode
        steps; each row draws what it draws without it. None: finished rows ride along to the end. Not with
        stop strings (their host checks index the rows) nor across processes.
    """

    def __init__(
        self,
        model: QwenForCausalLM,
        *,
        eos_token_ids: Sequence[int] = (),
        pad_token_id: int = 0,
        tokenizer: Any = None,
        mesh: Optional[jax.sharding.Mesh] = None,
        rules: Any = None,
        min_prompt_bucket: int = 16,
        min_generation_bucket: int = 16,
        stop_check_interval: int = 32,
        policy_version: int = 0,
        kv_cache_gib: Optional[float] = None,
        compact_interval: Optional[int] = None,
    ):
        self.config = model.config
        self.graphdef, state = nnx.split(model)
        self._prefill, self._decode = prefill, decode  # module-level jitted programs; the static arguments key them
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.tokenizer = tokenizer
        self.mesh = mesh
        if mesh is not None and rules is None:
            from mathrl_jax.sharding.rules import qwen_rules

            rules = qwen_rules(self.config.num_key_value_heads, mesh.shape.get("tp", 1))
        self.rules = rules
        self.min_prompt_bucket = min_prompt_bucket
        self.min_generation_bucket = min_generation_bucket
        self.stop_check_interval = stop_check_interval
        if kv_cache_gib is not None and not kv_cache_gib > 0:
            raise ValueError(f"JaxSampler: kv_cache_gib={kv_cache_gib} must be > 0 (GiB), or None")
        self.kv_cache_gib = kv_cache_gib
        if compact_interval is not None and compact_interval < 1:
            raise ValueError(f"JaxSampler: compact_interval={compact_interval} must be >= 1 (decode steps), or None")
        self.compact_interval = compact_interval
        self._seed_rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
        # One generate at a time, and weights never swapped in the middle of one (asynchronous training
        # calls update_weights from the learner thread while a generator thread samples).
        self._lock = threading.RLock()
        self.update_weights(state, policy_version)

    # ------------------------------------------------------------------ weights

    def update_weights(self, state: nnx.State, version: int) -> None:
        """Uses `state` (the policy's NNX state, e.g. the trainer's params) from now on."""
        if self.mesh is not None:
            from mathrl_jax.sharding.rules import shard_tree

            state = shard_tree(state, self.mesh, self.rules)
        with self._lock:
            self.state = state
            self.policy_version = int(version)

    # ------------------------------------------------------------------ host side

    def _tokenize(self, prompts: Sequence[Union[str, Sequence[int]]]) -> list:
        out = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ValueError(f"prompt {i} is a string but the sampler has no tokenizer; pass token ids")
                ids = self.tokenizer.encode(prompt)
                ids = getattr(ids, "ids", ids)  # a `tokenizers.Tokenizer` returns an Encoding
            else:
                ids = [int(t) for t in prompt]
            if not ids:
                raise ValueError(f"prompt {i} is empty")
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ValueError(f"prompt {i} has token ids outside [0, {self.config.vocab_size}): {bad[:5]}")
            out.append(list(ids))
        return out

    def _decode_text(self, ids: Sequence[int]) -> str:
        try:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)
        except TypeError:  # a `tokenizers.Tokenizer`
            return self.tokenizer.decode(list(ids))

    def _row_keys(self, seed: int, num_rows: int, first_row: int = 0) -> jax.Array:
        """`row_keys`, as one compiled program for the seeds an int32 holds (it keys exactly as the Python int)."""
        if 0 <= seed < 2**31:
            return _row_keys(jax.device_put(np.int32(seed)), num_rows, jax.device_put(np.int32(first_row)))
        return row_keys(seed, num_rows, first_row)

    def generate(self, prompts: Sequence[Union[str, Sequence[int]]], params: SamplingParams) -> Rollouts:
        """Samples `params.n` completions per prompt (token ids, or strings with a tokenizer)."""
        with self._lock:
            return self._generate(prompts, params)

    def _generate(self, prompts, params: SamplingParams) -> Rollouts:
        if not prompts:
            raise ValueError("generate() got no prompts")
        if params.stop and self.tokenizer is None:
            raise ValueError(f"stop strings {params.stop!r} need a sampler with a tokenizer")
        prompt_ids = self._tokenize(prompts)
        stop_ids = sorted(set(self.eos_token_ids) | set(params.stop_token_ids))
        if len(stop_ids) > MAX_STOP_TOKENS:
            raise ValueError(f"at most {MAX_STOP_TOKENS} stop token ids are supported, got {len(stop_ids)}: {stop_ids}")
        # One prompt bucket for every sub-batch: they all run the same programs.
        prompt_bucket = bucket(max(len(p) for p in prompt_ids), self.min_prompt_bucket)
        generation_bucket = bucket(params.max_new_tokens, self.min_generation_bucket)
        seed = params.seed if params.seed is not None else int(self._seed_rng.integers(0, 2**31 - 1))
        per_call = self.prompts_per_call(len(prompt_ids), params.n, prompt_bucket + generation_bucket)
        parts = []
        for start in range(0, len(prompt_ids), per_call):
            try:
                parts.append(
                    self._generate_part(
                        prompt_ids[start : start + per_call], params, stop_ids, seed, start, prompt_bucket, per_call
                    )
                )
            except (jax.errors.JaxRuntimeError, MemoryError) as error:  # device memory, or the host's for the rows
                if isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" not in str(error):
                    raise
                raise SamplerMemoryError(
                    f"JaxSampler: out of device memory generating {min(per_call, len(prompt_ids))} prompts x "
                    f"{params.n} samples of {prompt_bucket} + {generation_bucket} cache slots, "
                    f"{self.kv_cache_bytes(1, prompt_bucket + generation_bucket) / 2**20:.1f} MiB of KV cache per "
                    f"row: lower kv_cache_gib (now {self.kv_cache_gib}; --config.jax_sampler.kv_cache_gib in "
                    f"scripts/train.py), which bounds the rows decoded at once ({str(error).splitlines()[0]})"
                ) from error
        return Rollouts(
            prompt_ids=[p for part in parts for p in part.prompt_ids],
            completion_ids=[c for part in parts for c in part.completion_ids],
            logprobs=[x for part in parts for x in part.logprobs],
            policy_logprobs=[x for part in parts for x in part.policy_logprobs],
            finish_reasons=[r for part in parts for r in part.finish_reasons],
            stop_reasons=[r for part in parts for r in part.stop_reasons],
            prompt_indices=np.repeat(np.arange(len(prompt_ids), dtype=np.int32), params.n),
            policy_version=self.policy_version,
            texts=None if self.tokenizer is None else [t for part in parts for t in part.texts],
        )

    def kv_cache_bytes(self, rows: int, slots: int) -> int:
        """Bytes of the KV cache of `rows` rows of `slots` slots (every layer's keys and values)."""
        c = self.config
        per_slot = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * jnp.dtype(c.jnp_dtype).itemsize
        return rows * slots * per_slot

    def prompts_per_call(self, num_prompts: int, n: int, slots: int) -> int:
        """How many prompts (of `n` samples, `slots` cache slots each) one prefill + decode takes: all of them,
        or with `kv_cache_gib` the largest power of two whose cache fits it (at least 1)."""
        if self.kv_cache_gib is None:
            return num_prompts
        fit = int(self.kv_cache_gib * 2**30 // self.kv_cache_bytes(n, slots))
        return max(1, min(num_prompts, 1 << (max(fit, 1).bit_length() - 1)))

    def _generate_part(
        self, prompt_ids, params: SamplingParams, stop_ids, seed: int, first_prompt: int, prompt_bucket, per_call
    ):
        """`generate` of prompts `first_prompt, ...` of a batch in one prefill and decode: their rows draw the
        keys they draw in the whole batch. A batch's last sub-batch is padded to `per_call` prompts, so every
        sub-batch runs the same programs."""
        num_prompts, n = len(prompt_ids), params.n
        generation_bucket = bucket(params.max_new_tokens, self.min_generation_bucket)
        prompt_rows = bucket(per_call, 1)
        # Rows must divide over the batch axes (a compacted batch too).
        shards = 1 if self.mesh is None else self.mesh.shape.get("dp", 1) * self.mesh.shape.get("fsdp", 1)
        if self.mesh is not None:
            prompt_rows = max(prompt_rows, bucket(-(-shards // n), 1))
        ids = np.full((prompt_rows, prompt_bucket), self.pad_token_id, np.int32)
        mask = np.zeros((prompt_rows, prompt_bucket), np.int32)
        for i, p in enumerate(prompt_ids):
            ids[i, prompt_bucket - len(p) :] = p
            mask[i, prompt_bucket - len(p) :] = 1
        ids[num_prompts:, -1] = self.pad_token_id  # padding prompts: one token so their softmax is defined
        mask[num_prompts:, -1] = 1
        rows = prompt_rows * n

        with self._mesh_context():
            decode_state = self._prefill(
                self.state,
                *jax.device_put((ids, mask)),
                graphdef=self.graphdef,
                samples_per_prompt=n,
                cache_length=prompt_bucket + generation_bucket,
            )
            # Waited for here: a cache that does not fit fails now (`SamplerMemoryError`), not at a later use.
            jax.block_until_ready(decode_state)
            finish = np.full((rows,), RUNNING, np.int32)
            finish[num_prompts * n :] = STOPPED  # padding rows never run
            # Built in numpy and put on the device in one go: `jnp.full`, `jnp.asarray` of numpy and the like each
            # run (and on first use trace and compile) a small program.
            carry = jax.device_put(
                dict(
                    tokens=np.full((rows, generation_bucket), self.pad_token_id, np.int32),
                    logprobs=np.zeros((rows, generation_bucket), np.float32),
                    policy_logprobs=np.zeros((rows, generation_bucket), np.float32),
                    lengths=np.zeros((rows,), np.int32),
                    finish=finish,
                    stop_token=np.full((rows,), -1, np.int32),
                    step=np.zeros((), np.int32),
                )
            )
            carry.update(decode_state)
            controls = jax.device_put(
                dict(
                    temperature=np.float32(max(params.temperature, 1e-6)),
                    top_k=np.int32(params.top_k),
                    top_p=np.float32(params.top_p),
                    max_new_tokens=np.int32(params.max_new_tokens),
                    prompt_bucket=np.int32(prompt_bucket),
                    pad_id=np.int32(self.pad_token_id),
                    stop_ids=np.asarray(stop_ids + [-1] * (MAX_STOP_TOKENS - len(stop_ids)), np.int32),
                )
            )
            keys = self._row_keys(seed, rows, first_prompt * n)
            use_filter = params.top_k > 0 or params.top_p < 1.0
            compact = self.compact_interval is not None and not params.stop and jax.process_count() == 1
            chunk = self.stop_check_interval if params.stop else params.max_new_tokens
            if compact:
                chunk = self.compact_interval
            stop_strings, settled = [None] * rows, [False] * rows
            # Where each row of the carry came from (-1: a filler row), and the rows that have left it.
            origin, left = np.arange(rows), {}
            until = 0
            while True:
                until = min(until + chunk, params.max_new_tokens)
                carry = self._decode(
                    self.state,
                    carry,
                    keys,
                    dict(controls, until=jax.device_put(np.int32(until))),
                    graphdef=self.graphdef,
                    greedy=params.greedy,
                    use_filter=use_filter,
                )
                if params.stop:
                    carry = self._apply_stop_strings(carry, params.stop, stop_strings, settled, num_prompts * n)
                if until >= params.max_new_tokens or not bool(jnp.any(carry["finish"] == RUNNING)):
                    break
                if compact:
                    carry, keys, origin = self._compact(carry, keys, origin, left, shards)
        outputs = fetch(tuple(carry[k] for k in ROW_OUTPUTS))
        if left:  # the rows that left the carry, and those in it, back in their own order
            final = {int(o): tuple(x[i] for x in outputs) for i, o in enumerate(origin) if o >= 0}
            by_row = {**left, **final}
            outputs = tuple(np.stack([by_row[r][k] for r in range(rows)]) for k in range(len(ROW_OUTPUTS)))
        return self._rollouts(outputs, prompt_ids, n, stop_strings)

    def _compact(self, carry, keys, origin, left, shards):
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

    def _mesh_context(self):
        if self.mesh is None:
            import contextlib

            return contextlib.nullcontext()
        return jax.set_mesh(self.mesh)

    def _apply_stop_strings(self, carry, stops, stop_strings, settled, live_rows):
        """Ends rows whose text now contains a stop string, cutting them after the token that completes it.

        A row is checked until it is settled: finished (by a stop token, the
        length limit or a stop string) and checked once after finishing.
        """
        tokens, lengths, finish = fetch((carry["tokens"], carry["lengths"], carry["finish"]))
        finish, lengths = finish.copy(), lengths.copy()
        changed = False
        for row in range(live_rows):
            if settled[row]:
                continue
            found = first_stop_string(self._decode_text, tokens[row, : lengths[row]].tolist(), stops)
            if found is not None:
                # A stop string ends the row even if a stop token or the length limit came later.
                lengths[row], stop_strings[row] = found
                finish[row] = STOPPED
                changed = True
            settled[row] = finish[row] != RUNNING
        if changed:
            carry = dict(carry, finish=jnp.asarray(finish), lengths=jnp.asarray(lengths))
        return carry

    def _rollouts(self, outputs, prompt_ids, n, stop_strings) -> Rollouts:
        """Rollouts from the host values of `ROW_OUTPUTS` (`fetch`: across processes each holds its rows' shards;
        every process gets every row)."""
        tokens, logprobs, policy_logprobs, lengths, finish, stop_token = outputs
        num_rows = len(prompt_ids) * n
        completions, lps, plps, reasons, stop_reasons = [], [], [], [], []
        for row in range(num_rows):
            length = int(lengths[row])
            completions.append(tokens[row, :length].tolist())
            lps.append(np.asarray(logprobs[row, :length], np.float32))
            plps.append(np.asarray(policy_logprobs[row, :length], np.float32))
            if stop_strings[row] is not None:
                reasons.append("stop")
                stop_reasons.append(stop_strings[row])
            elif finish[row] == STOPPED:
                reasons.append("stop")
                stop_reasons.append(int(stop_token[row]))
            else:  # LENGTH, or still running when max_new_tokens was reached
                reasons.append("length")
                stop_reasons.append(None)
        texts = [self._decode_text(c) for c in completions] if self.tokenizer is not None else None
        return Rollouts(
            prompt_ids=[list(p) for p in prompt_ids for _ in range(n)],
            completion_ids=completions,
            logprobs=lps,
            policy_logprobs=plps,
            finish_reasons=reasons,
            stop_reasons=stop_reasons,
            prompt_indices=np.repeat(np.arange(len(prompt_ids), dtype=np.int32), n),
            policy_version=self.policy_version,
            texts=texts,
        )
