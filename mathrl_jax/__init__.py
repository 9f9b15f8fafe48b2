"""mathrl_jax: reinforcement learning for math reasoning with Qwen models, in JAX."""

__version__ = "0.1.0"
