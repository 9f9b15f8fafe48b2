"""The sizes a model config may have: a larger one is a broken file, refused before anything is allocated."""

from __future__ import annotations

import numbers
from typing import Optional

SIZE_LIMITS = dict(
    vocab_size=2**24,
    hidden_size=2**17,
    intermediate_size=2**20,
    num_hidden_layers=2**12,
    num_attention_heads=2**12,
    num_key_value_heads=2**12,
    head_dim=2**12,
    max_position_embeddings=2**31 - 1,
)
"""The largest value of each size of a config.json (a few times the largest released models'): a larger one is a
broken file, refused before anything is allocated for it."""

MAX_PARAMETERS = 2**41
"""The most parameters a config may describe (2.2 trillion): sizes each in their limit can still multiply past any
memory."""


def size_error(config) -> Optional[str]:
    """Why `config`'s sizes cannot be a model (one line naming the field: `num_hidden_layers: 1e6` in a
    config.json), or None: each a whole number in [1, SIZE_LIMITS], their parameters at most MAX_PARAMETERS.
    Checked by `QwenConfig`, before any array exists."""
    for name, limit in SIZE_LIMITS.items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return f"{name}={value!r}: expected a whole number"
        if not 1 <= value <= limit:
            return f"{name}={value} is out of range: expected 1 to {limit} (SIZE_LIMITS, models/sizes.py)"
    c = config
    attention = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    per_layer = attention + 3 * c.hidden_size * c.intermediate_size
    total = c.num_hidden_layers * per_layer + c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    if total > MAX_PARAMETERS:
        return (
            f"num_hidden_layers={c.num_hidden_layers}, hidden_size={c.hidden_size}, intermediate_size="
            f"{c.intermediate_size}, vocab_size={c.vocab_size} make {total:.3g} parameters, over the limit of "
            f"{MAX_PARAMETERS:.3g} (MAX_PARAMETERS, models/sizes.py)"
        )
    return None
