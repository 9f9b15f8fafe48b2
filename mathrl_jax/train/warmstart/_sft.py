"""Supervised warm-start: a short phase of next-token cross-entropy on (prompt, target) pairs before RL.

The offline default run starts from a randomly initialised tiny model, which
never produces a boxed answer, so no RL reward would ever be non-zero. A few
hundred supervised steps on "3+5=" -> "\\boxed{8}<|im_end|>" teach the format and
part of the arithmetic; RL then has to supply the rest (its gain is reported
separately from this phase's).

Loss (the causal-LM SFT objective of verl's `trainer/fsdp_sft_trainer.py`:
`sum(loss * loss_mask) / (sum(loss_mask) + 1e-8)`): with `m[b, c] = 1` on target tokens,

    L = - sum_{b, c} m[b, c] log p(x[b, c] | x[b, < c]) / (sum_{b, c} m[b, c] + eps)

a token-mean over the target tokens of the whole batch, the log-prob of the token
at column `c` coming from the logits at column `c - 1`. Prompt tokens and padding
are never scored.

Rows use the layout of `Rollouts.to_batch` (`mathrl_jax.sampling.base`), built by the
same function (`pad_prompt_completion`): `[pad ... prompt | target ... pad]`,
prompts left-padded to end at a common column `P`, so a target token `t` sits at
column `P + t`, exactly where a sampled completion token would. The log-probs
are the trainer's (`train.update.shifted_logprobs`), the optimizer is the RL
phase's factory (`train.state.make_optimizer`) with the warm-start's settings.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mathrl_jax.losses import masked_mean
from mathrl_jax.sampling.base import pad_prompt_completion
from mathrl_jax.train.state import learning_rate_schedule, make_optimizer
from mathrl_jax.train.update import shifted_logprobs

Example = Tuple[List[int], List[int]]
LogFn = Callable[[int, Dict[str, float]], None]
EvalFn = Callable[[int, nnx.State], Optional[bool]]

SCHEDULES = ("cosine", "constant")
BOXED_COMPLETION = "\\boxed{{{answer}}}"
"""The completion text of the arithmetic task: the gold answer in a `\\boxed{}` (then the eos token)."""


# --------------------------------------------------------------------------------------------- batches


def _check_ids(name: str, index: int, ids: Sequence[int], allow_empty: bool = False) -> List[int]:
    try:
        out = [int(t) for t in ids]
    except (TypeError, ValueError):
        raise ValueError(f"{name}[{index}]={ids!r}: expected a sequence of integer token ids") from None
    if not out and not allow_empty:
        raise ValueError(f"{name}[{index}] is empty: every example needs at least one token there")
    negative = [t for t in out if t < 0]
    if negative:
        raise ValueError(f"{name}[{index}] has negative token ids {negative[:5]}")
    return out


def sft_batch(
    prompt_ids: Sequence[Sequence[int]],
    target_ids: Sequence[Sequence[int]],
    pad_id: int,
    *,
    prompt_length: Optional[int] = None,
    max_length: Optional[int] = None,
) -> Dict[str, np.ndarray]:
    """Padded arrays of (prompt, target) pairs, in the row layout of `Rollouts.to_batch`
    (both are `sampling.base.pad_prompt_completion`; the ids are checked here first).

    Row i: `[pad ... prompt_i | target_i ... pad]`, every prompt ending at column
    `P` (`prompt_length`, default the longest prompt), so target token `t` sits at
    column `P + t`; the width is `max_length` (default `P` + the longest target).
    Fixed `prompt_length` / `max_length` give every batch of a run the same shape.

    Args:
      prompt_ids: N non-empty token-id lists.
      target_ids: N non-empty token-id lists (the supervised completion, eos included).
      pad_id: the id that fills padding (never scored: its masks are 0).
      prompt_length: the common prompt column `P` (>= the longest prompt).
      max_length: the row width `L` (>= `P` + the longest target).

    Returns:
      input_ids `[N, L]` int32, attention_mask `[N, L]` int32 (1 on prompt and
      target tokens), response_mask `[N, L]` float32 (1 on target tokens),
      prompt_length `P` (an int32 scalar).
    """
    if len(prompt_ids) != len(target_ids):
        raise ValueError(f"sft_batch: {len(prompt_ids)} prompts but {len(target_ids)} targets")
    if not len(prompt_ids):
        raise ValueError("sft_batch: got no examples")
    prompts = [_check_ids("prompt_ids", i, p) for i, p in enumerate(prompt_ids)]
    targets = [_check_ids("target_ids", i, t) for i, t in enumerate(target_ids)]
    return pad_prompt_completion(
        prompts, targets, pad_id, prompt_length=prompt_length, max_length=max_length, caller="sft_batch"
    )


def sft_examples(
    problems: Sequence[Any],
    tokenizer: Any,
    eos_token_id: int,
    *,
    completion_format: str = BOXED_COMPLETION,
) -> List[Example]:
    """(prompt ids, target ids) of problems with `.question` and `.answer` (e.g. `data.Problem`).

    prompt = encode(question); target = encode(completion_format.format(answer=answer)) + [eos_token_id].
    With the arithmetic task's `question_format="{expr}="`: "3+5=" -> "\\boxed{8}" + eos.
    `tokenizer` is a `tokenizers.Tokenizer` or anything whose `encode(text)` returns ids.
    """
    if "{answer}" not in completion_format:
        raise ValueError(f"completion_format must contain '{{answer}}', got {completion_format!r}")

    def encode(text: str) -> List[int]:
        ids = tokenizer.encode(text)
        return list(getattr(ids, "ids", ids))

    examples = []
    for i, problem in enumerate(problems):
        prompt = encode(problem.question)
        if not prompt:
            raise ValueError(f"problem {i} has an empty question {problem.question!r}")
        examples.append((prompt, encode(completion_format.format(answer=problem.answer)) + [int(eos_token_id)]))
    return examples


# --------------------------------------------------------------------------------------------- loss


def _model_sft_loss(model: nnx.Module, batch: Dict[str, chex.Array], eps: float) -> Tuple[jax.Array, Dict]:
    input_ids = batch["input_ids"]
    attention_mask = batch["attention_mask"]
    response_mask = batch["response_mask"]
    chex.assert_rank([input_ids, attention_mask, response_mask], 2)
    chex.assert_equal_shape([input_ids, attention_mask, response_mask])
    if input_ids.shape[1] < 2:
        raise ValueError(f"sft_loss: rows of {input_ids.shape[1]} column(s); next-token prediction needs >= 2")
    logits, _ = model(input_ids, attention_mask=attention_mask)
    # Logits at column c - 1 score the token at column c. Column 0 (a prompt token or padding, never a target) has
    # no log-prob: it is dropped, so the sums below run over the columns 1 ... L - 1 they always have.
    logprobs = shifted_logprobs(logits, input_ids)[0][:, 1:]
    logits, tokens, mask = logits[:, :-1], input_ids[:, 1:], jnp.asarray(response_mask[:, 1:], jnp.float32)
    loss = -masked_mean(logprobs, mask, eps=eps)
    correct = (jnp.argmax(logits, axis=-1) == tokens).astype(jnp.float32)
    # A row is all-correct when no counted token is wrong (rows without targets are left out).
    has_target = jnp.sum(mask, axis=-1) > 0
    row_correct = jnp.all((correct > 0) | (mask == 0), axis=-1) & has_target
    metrics = {
        "loss": loss,
        "token_accuracy": masked_mean(correct, mask, eps=eps),
        "sequence_accuracy": jnp.sum(row_correct) / jnp.maximum(jnp.sum(has_target), 1),
        "num_tokens": jnp.sum(mask),
    }
    return loss, metrics


def sft_loss(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    batch: Dict[str, chex.Array],
    *,
    eps: float = 1e-8,
) -> Tuple[jax.Array, Dict[str, jax.Array]]:
    """Masked mean next-token cross-entropy over target tokens (module doc), float32.

    Args:
      graphdef, state: the split model (`nnx.split(model)`); `state` is differentiated.
      batch: `sft_batch` arrays: input_ids / attention_mask `[B, L]` int,
        response_mask `[B, L]` float (1 on target tokens).
      eps: added to the token count of the masked mean (verl's `masked_mean`).

    Returns:
      (loss, metrics): loss the float32 scalar L; metrics loss, token_accuracy
      (teacher-forced argmax == target over target tokens), sequence_accuracy (rows
      whose every target token is the argmax), num_tokens.
    """
    return _model_sft_loss(nnx.merge(graphdef, state), batch, eps)


# --------------------------------------------------------------------------------------------- training


def _schedule_settings(steps: int, warmup_steps: int, schedule: str, final_fraction: float) -> Dict[str, Any]:
    """The `learning_rate_schedule` / `make_optimizer` keywords of the warm-start's schedule."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")
    return dict(
        schedule=schedule,
        warmup_steps=warmup_steps,
        # A constant schedule does not depend on its length: callers may pass 0 (one compile for any length).
        total_steps=max(int(steps), 1) if schedule == "constant" else steps,
        end_factor=final_fraction,
    )


def sft_schedule(
    learning_rate: float, steps: int, warmup_steps: int, schedule: str = "cosine", final_fraction: float = 0.1
) -> optax.Schedule:
    """Linear warmup from 0 to `learning_rate` over `warmup_steps`, then cosine decay to
    `final_fraction * learning_rate` at `steps` ("cosine") or constant ("constant"):
    `train.state.learning_rate_schedule` restricted to the warm-start's two schedules."""
    return learning_rate_schedule(learning_rate, **_schedule_settings(steps, warmup_steps, schedule, final_fraction))


def sft_optimizer(
    learning_rate: float,
    steps: int,
    warmup_steps: int = 0,
    schedule: str = "cosine",
    final_lr_fraction: float = 0.1,
    weight_decay: float = 0.0,
    max_grad_norm: Optional[float] = 1.0,
) -> Tuple[optax.GradientTransformation, optax.Schedule]:
    """(optimizer, learning-rate schedule) of the warm-start: `train.state.make_optimizer` at `sft_schedule`,
    i.e. global-norm clipping to `max_grad_norm` (None: none), then AdamW (b1 0.9, b2 0.999, eps 1e-8,
    decoupled `weight_decay`)."""
    settings = _schedule_settings(steps, warmup_steps, schedule, final_lr_fraction)
    return make_optimizer(
        learning_rate, **settings, weight_decay=weight_decay, max_grad_norm=max_grad_norm, return_schedule=True
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer_args"))
def _train_step(graphdef, optimizer_args, params, rest, opt_state, step, batch):
    """One optimizer step on `sft_loss`. Module-level and keyed on the (hashable) graphdef and
    optimizer settings, so runs of the same architecture and settings share the compiled program."""
    optimizer, lr = sft_optimizer(*optimizer_args)

    def loss_fn(p):
        return _model_sft_loss(nnx.merge(graphdef, p, rest), batch, 1e-8)

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads), learning_rate=lr(step))
    return params, opt_state, metrics


def _check_positive(name: str, value, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"{name}={value!r}: expected a {'non-negative' if allow_zero else 'positive'} number")


def _check_int(name: str, value, minimum: int, note: str = "") -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}={value!r}: expected an integer >= {minimum}{note}")


def example_order(num_examples: int, steps: int, batch_size: int, seed: int) -> np.ndarray:
    """`[steps, batch_size]` example indices: epochs of random permutations, read in order.

    Epoch e is `jax.random.permutation(fold_in(key(seed), e), num_examples)`; step s
    takes items `s * batch_size ... (s + 1) * batch_size - 1` of the concatenated
    epochs, so every example is seen once per epoch and the order depends on the seed only.
    """
    _check_int("num_examples", num_examples, 1)
    _check_int("steps", steps, 0)
    _check_int("batch_size", batch_size, 1)
    total = steps * batch_size
    epochs = max(-(-total // num_examples), 1)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(seed), jnp.arange(epochs))
    order = jax.vmap(lambda k: jax.random.permutation(k, num_examples))(keys)
    return np.asarray(order).reshape(-1)[:total].reshape(steps, batch_size)


def supervised_warmstart(
    model: Union[nnx.Module, Tuple[nnx.GraphDef, nnx.State]],
    examples: Sequence[Example],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    warmup_steps: int = 0,
    schedule: str = "cosine",
    final_lr_fraction: float = 0.1,
    weight_decay: float = 0.0,
    max_grad_norm: Optional[float] = 1.0,
    pad_id: int = 0,
    log_every: int = 50,
    log_fn: Optional[LogFn] = None,
    eval_every: int = 0,
    eval_fn: Optional[EvalFn] = None,
) -> nnx.State:
    """Fine-tunes a causal LM on (prompt ids, target ids) pairs with `sft_loss`; returns the new state.

    `steps` jitted AdamW steps (`sft_optimizer`: global-norm clipping to
    `max_grad_norm`, then optax `adamw`), learning rate from `sft_schedule`. Batches of
    `batch_size` examples follow `example_order(len(examples), steps, batch_size,
    seed)`; every batch is padded to one shape (the longest prompt and target of
    all examples), so the step compiles once. The result depends only on the
    inputs and `seed`.

    Args:
      model: a `QwenForCausalLM` (left unchanged) or its `(graphdef, state)`.
      examples: (prompt ids, target ids) pairs, e.g. from `sft_examples`.
      steps: optimizer steps (>= 0; 0 returns the state unchanged).
      batch_size: examples per step (may exceed the number of examples).
      learning_rate: the peak learning rate.
      seed: fixes the example order.
      warmup_steps, schedule, final_lr_fraction: see `sft_schedule`.
      weight_decay: AdamW's decoupled weight decay.
      max_grad_norm: global gradient-norm clip; None disables it.
      pad_id: the padding token id.
      log_every: `log_fn(step, metrics)` runs after steps log_every, 2 log_every,
        ... and after the last step, with host floats: loss, token_accuracy,
        sequence_accuracy, num_tokens (of that step's batch), grad_norm, learning_rate.
      log_fn: the logging callback; None logs nothing (and never syncs the host).
      eval_every, eval_fn: `eval_fn(step, state)` runs with the model state after
        steps eval_every, 2 eval_every, ... (0: never), e.g. to measure greedy
        accuracy along the way. If it returns True, training stops there and that
        state is returned (early stopping at a target accuracy: use
        `schedule="constant"`, since a cosine schedule is laid out over `steps`).

    Returns:
      The trained `nnx.State` of the model: `nnx.update(model, state)` or
      `nnx.merge(graphdef, state)`.
    """
    if isinstance(model, nnx.Module):
        graphdef, state = nnx.split(model)
    else:
        try:
            graphdef, state = model
        except (TypeError, ValueError):
            raise ValueError(
                f"model must be an nnx.Module or a (graphdef, state) pair, got {type(model).__name__}"
            ) from None
    _check_int("steps", steps, 0)
    _check_int("batch_size", batch_size, 1)
    _check_int("warmup_steps", warmup_steps, 0)
    _check_int("log_every", log_every, 1)
    _check_int("eval_every", eval_every, 0, " (0: never)")
    _check_positive("learning_rate", learning_rate)
    _check_positive("weight_decay", weight_decay, allow_zero=True)
    _check_positive("final_lr_fraction", final_lr_fraction, allow_zero=True)
    if max_grad_norm is not None:
        _check_positive("max_grad_norm", max_grad_norm)
    if not len(examples):
        raise ValueError("supervised_warmstart: got no examples")
    for i, example in enumerate(examples):
        if not (isinstance(example, (tuple, list)) and len(example) == 2):
            raise ValueError(f"examples[{i}]={example!r}: expected a (prompt ids, target ids) pair")
    prompts = [p for p, _ in examples]
    targets = [t for _, t in examples]
    everything = sft_batch(prompts, targets, pad_id)  # validates every example once; fixes the shapes
    merged = nnx.merge(graphdef, state)
    vocab = getattr(getattr(merged, "config", None), "vocab_size", None)
    if vocab is not None and int(everything["input_ids"].max()) >= vocab:
        bad = next(i for i, (p, t) in enumerate(examples) if max(list(p) + list(t)) >= vocab)
        raise ValueError(f"examples[{bad}] has token ids >= the model's vocab_size {vocab}")
    if steps == 0:
        return state

    optimizer_args = (
        float(learning_rate),
        int(steps) if schedule == "cosine" else 0,  # a constant schedule does not depend on it: one compile
        int(warmup_steps),
        schedule,
        float(final_lr_fraction),
        float(weight_decay),
        None if max_grad_norm is None else float(max_grad_norm),
    )
    optimizer, _ = sft_optimizer(*optimizer_args)
    # Only parameters are trained; any other variable (none in a Qwen model) is carried along.
    split_graphdef, params, rest = nnx.split(merged, nnx.Param, ...)
    opt_state = optimizer.init(params)

    order = example_order(len(examples), steps, batch_size, seed)
    arrays = {k: everything[k] for k in ("input_ids", "attention_mask", "response_mask")}
    for step in range(steps):
        batch = {k: v[order[step]] for k, v in arrays.items()}
        params, opt_state, metrics = _train_step(
            split_graphdef, optimizer_args, params, rest, opt_state, jnp.int32(step), batch
        )
        done = step + 1
        if log_fn is not None and (done % log_every == 0 or done == steps):
            log_fn(done, {k: float(v) for k, v in jax.device_get(metrics).items()})
        if eval_fn is not None and eval_every and done % eval_every == 0:
            if eval_fn(done, nnx.state(nnx.merge(split_graphdef, params, rest))) is True:
                break
    return nnx.state(nnx.merge(split_graphdef, params, rest))
