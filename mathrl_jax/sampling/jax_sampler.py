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

import dataclasses
import functools
import os
import threading
from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mathrl_jax.errors import MathRLError
from mathrl_jax.models import lora
from mathrl_jax.models.qwen import QwenForCausalLM
from mathrl_jax.sampling.base import (
    LORA_SYNCS,
    Rollouts,
    SamplingParams,
    decode_text,
    first_stop_string,
    prompt_token_ids,
)
from mathrl_jax.sampling.decoding import (
    MAX_STOP_TOKENS,
    ROW_OUTPUTS,
    RUNNING,
    STOPPED,
    compact_carry,
    decode,
    decode_controls,
    jitted_row_keys,
    prefill,
    row_keys,
)
from mathrl_jax.sharding.distributed import fetch


class SamplerMemoryError(MathRLError, MemoryError):
    """The device ran out of memory generating; the message names the option that bounds it."""


def bucket(n: int, minimum: int) -> int:
    """The smallest power of two >= max(n, minimum, 1)."""
    return 1 << (max(int(n), int(minimum), 1) - 1).bit_length()


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
      lora_sync: for a LoRA model (`config.lora_rank > 0`), "merged" (each `update_weights` merges the adapters
        into their kernels, `lora.merge_adapters`, in the compute dtype, and the sampler decodes a plain model:
        one matmul per projection; a copy of each adapted kernel) or "adapter" (the adapters applied in every
        projection, the trainer's arrays shared). Measured in docs/training.md#lora: merged is as fast or faster.
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
        lora_sync: str = "merged",
    ):
        if lora_sync not in LORA_SYNCS:
            raise ValueError(f"JaxSampler: lora_sync={lora_sync!r}; expected one of {LORA_SYNCS}")
        self.config = model.config
        self.graphdef, state = nnx.split(model)
        # A LoRA model merged at each sync decodes as the plain model of its shape (its graph, no adapters).
        self._merge_scaling = self._merged_from = None
        if model.config.lora_rank > 0 and lora_sync == "merged":
            self._merge_scaling = model.config.lora_alpha / model.config.lora_rank
            plain = dataclasses.replace(model.config, lora_rank=0)
            self.graphdef = nnx.graphdef(nnx.eval_shape(lambda: QwenForCausalLM(plain, rngs=nnx.Rngs(0))))
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
        """Uses `state` (the policy's NNX state, e.g. the trainer's params) from now on.

        Under the lock throughout: a generate in another thread never sees the weights half replaced (a LoRA
        policy's last merged copy is dropped before the next is made)."""
        with self._lock:
            source = state
            if self._merge_scaling is not None:
                if source is self._merged_from and version == self.policy_version:
                    return  # the same weights again (an asynchronous generator syncs before each batch)
                self.state = self._merged_from = None
                state = lora.merge_adapters(source, self._merge_scaling, self.config.jnp_dtype)
            if self.mesh is not None:
                from mathrl_jax.sharding.rules import shard_tree

                state = shard_tree(state, self.mesh, self.rules)
            self.state, self._merged_from = state, source
            self.policy_version = int(version)

    # ------------------------------------------------------------------ host side

    def _row_keys(self, seed: int, num_rows: int, first_row: int = 0) -> jax.Array:
        """`row_keys`, as one compiled program for the seeds an int32 holds (it keys exactly as the Python int)."""
        if 0 <= seed < 2**31:
            return jitted_row_keys(jax.device_put(np.int32(seed)), num_rows, jax.device_put(np.int32(first_row)))
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
        prompt_ids = prompt_token_ids(prompts, self.tokenizer, self.config.vocab_size)
        stop_ids = sorted(set(self.eos_token_ids) | set(params.stop_token_ids))
        if len(stop_ids) > MAX_STOP_TOKENS:
            raise ValueError(f"at most {MAX_STOP_TOKENS} stop token ids are supported, got {len(stop_ids)}: {stop_ids}")
        # One prompt bucket for every sub-batch: they all run the same programs.
        prompt_bucket = bucket(max(len(p) for p in prompt_ids), self.min_prompt_bucket)
        generation_bucket = bucket(params.max_new_tokens, self.min_generation_bucket)
        seed = params.seed if params.seed is not None else int(self._seed_rng.integers(0, 2**31 - 1))
        seen = self.config.vocab_size if params.penalizes else 0  # the repetition penalty's bool mask, per row
        per_call = self.prompts_per_call(len(prompt_ids), params.n, prompt_bucket + generation_bucket, seen)
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

    def prompts_per_call(self, num_prompts: int, n: int, slots: int, row_bytes: int = 0) -> int:
        """How many prompts (of `n` samples, `slots` cache slots each, `row_bytes` more per row: the repetition
        penalty's mask) one prefill + decode takes: all of them, or with `kv_cache_gib` the largest power of two
        whose cache fits it (at least 1)."""
        if self.kv_cache_gib is None:
            return num_prompts
        fit = int(self.kv_cache_gib * 2**30 // (self.kv_cache_bytes(n, slots) + n * row_bytes))
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
                track_seen=params.penalizes,
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
            controls = jax.device_put(decode_controls(params, prompt_bucket, self.pad_token_id, stop_ids))
            keys = self._row_keys(seed, rows, first_prompt * n)
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
                    use_filter=params.filters,
                    penalize=params.penalizes,
                )
                if params.stop:
                    carry = self._apply_stop_strings(carry, params.stop, stop_strings, settled, num_prompts * n)
                if until >= params.max_new_tokens or not bool(jnp.any(carry["finish"] == RUNNING)):
                    break
                if compact:
                    carry, keys, origin = compact_carry(carry, keys, origin, left, shards)
        outputs = fetch(tuple(carry[k] for k in ROW_OUTPUTS))
        if left:  # the rows that left the carry, and those in it, back in their own order
            final = {int(o): tuple(x[i] for x in outputs) for i, o in enumerate(origin) if o >= 0}
            by_row = {**left, **final}
            outputs = tuple(np.stack([by_row[r][k] for r in range(rows)]) for k in range(len(ROW_OUTPUTS)))
        return self._rollouts(outputs, prompt_ids, n, stop_strings)

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
        text_of = functools.partial(decode_text, self.tokenizer)
        for row in range(live_rows):
            if settled[row]:
                continue
            found = first_stop_string(text_of, tokens[row, : lengths[row]].tolist(), stops)
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
        texts = [decode_text(self.tokenizer, c) for c in completions] if self.tokenizer is not None else None
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
