"""XLA compile options for the trainer's passes (the update, the log-prob and value passes) on a CPU.

XLA:CPU hands dots to YNNPACK, and by default fuses a dot with the reduction that reads it into one library
call. At a real vocabulary that is the log-prob head: the `[chunk, D] x [D, V]` logits and their max / logsumexp.
Fused, the head ran 3.8x slower than the dot and the reductions apart (2.22 s against 0.59 s for 576 tokens at
Qwen2.5-0.5B's shape, 2026-11-29), and the 0.5B log-prob pass reached 0.50 of the machine's float32 matmul rate
instead of 0.89. `xla_cpu_experimental_ynn_fusion_type = INDIVIDUAL_DOT` keeps each dot a library call of its
own. It is set per program (`jax.jit(compiler_options=...)`), only on a CPU backend and for vocabularies of
`LARGE_VOCAB` or more, where the head dominates: the tiny offline model's programs compile as before. An XLA that
does not know the option gets none (checked once by compiling a trivial program with it).
"""

from __future__ import annotations

import functools

import jax

YNN_FUSION_OPTION = "xla_cpu_experimental_ynn_fusion_type"
INDIVIDUAL_DOT = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
LARGE_VOCAB = 16_384  # below it the vocabulary head is a small part of a pass: the default fusion is kept


def trainer_pass_options(vocab_size: int) -> dict:
    """The compile options of a trainer pass over a model with `vocab_size` tokens: {} where none applies."""
    if jax.default_backend() != "cpu" or vocab_size < LARGE_VOCAB or not _option_known():
        return {}
    return {YNN_FUSION_OPTION: INDIVIDUAL_DOT}


@functools.cache
def _option_known() -> bool:
    try:
        jax.jit(lambda x: x + 1, compiler_options={YNN_FUSION_OPTION: INDIVIDUAL_DOT}).lower(1.0).compile()
    except Exception:  # noqa: BLE001  an XLA without the option (renamed, removed): compile as by default
        return False
    return True
