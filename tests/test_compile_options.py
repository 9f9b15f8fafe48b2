"""`compile_options.trainer_pass_options`: on a CPU, a real vocabulary's trainer passes keep each dot a library
call of its own (the same numbers, the head no longer fused with its reductions); the tiny model's programs
compile as before."""

import jax
import numpy as np

from mathrl_jax.compile_options import INDIVIDUAL_DOT, LARGE_VOCAB, YNN_FUSION_OPTION, trainer_pass_options
from mathrl_jax.losses import token_logprobs_from_hidden


def dot_fused_with_a_reduction(compiled_text: str) -> bool:
    """Whether one computation of the optimized HLO holds a dot and a reduction together (a fused library call)."""
    blocks = compiled_text.split("\n\n")
    return any(" dot(" in block and " reduce(" in block for block in blocks if "ENTRY" not in block)


def test_only_a_real_vocabulary_on_a_cpu_gets_the_option():
    assert trainer_pass_options(100) == {} and trainer_pass_options(LARGE_VOCAB - 1) == {}
    assert trainer_pass_options(151_936) == (
        {YNN_FUSION_OPTION: INDIVIDUAL_DOT} if jax.default_backend() == "cpu" else {}
    )


def test_the_option_keeps_the_head_s_dot_apart_and_its_numbers():
    """The log-prob head at a real vocabulary: with the option no fusion holds the dot and a reduction, and the
    log-probs and entropies equal the default program's to float rounding."""
    vocab, dim = 151_936, 64
    key = jax.random.key(0)
    hidden = jax.random.normal(key, (1, 40, dim))
    table = jax.random.normal(jax.random.key(1), (vocab, dim)) * 0.1
    tokens = jax.random.randint(jax.random.key(2), (1, 40), 0, vocab)
    head = lambda h, e, t: token_logprobs_from_hidden(h, e, t, chunk_size=20, weight_layout="vd")  # noqa: E731
    default = jax.jit(head)
    apart = jax.jit(head, compiler_options=trainer_pass_options(vocab))
    for got, want in zip(apart(hidden, table, tokens), default(hidden, table, tokens)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    if jax.default_backend() == "cpu" and trainer_pass_options(vocab):
        assert dot_fused_with_a_reduction(default.lower(hidden, table, tokens).compile().as_text())
        assert not dot_fused_with_a_reduction(apart.lower(hidden, table, tokens).compile().as_text())
