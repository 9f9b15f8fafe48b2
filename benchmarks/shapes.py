"""The one table of model shapes the benchmarks run at: `QwenConfig` keyword arguments by name.

"tiny" is `mathrl_jax.models.tiny`'s offline model (no overrides); the Qwen2.5 rows are the real architectures
(random weights) with their 151,936-token vocabulary.
"""

QWEN_VOCAB = dict(vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768)
SHAPES = {
    "tiny": {},
    # Qwen2.5-0.5B: hidden 896, 24 layers, 14 heads / 2 KV heads (head_dim 64), intermediate 4864.
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        **QWEN_VOCAB,
    ),
    # Qwen2.5-1.5B: hidden 1536, 28 layers, 12 heads / 2 KV heads (head_dim 128), intermediate 8960.
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        **QWEN_VOCAB,
    ),
}
