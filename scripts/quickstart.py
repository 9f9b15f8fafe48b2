"""A GRPO step in your own jax.jit loop, with mathrl_jax.losses.

A toy policy (one row of logits per position, standing in for your model)
learns to emit the token TARGET; the mean reward printed every 10 steps rises
from about 1/V towards 1.
"""

import jax
import jax.numpy as jnp

from mathrl_jax import losses

V, T, G, N = 8, 6, 4, 8  # vocabulary, response length, prompts, samples per prompt
TARGET = 3  # reward of a response: the fraction of its tokens equal to TARGET


def policy_logits(params, batch):  # stands in for your model: [B, T, V] logits
    return jnp.broadcast_to(params["logits"], (batch, T, V))


@jax.jit
def train_step(params, key):
    batch = G * N
    logits = policy_logits(params, batch)
    tokens = jax.random.categorical(key, logits)  # [B, T] samples
    mask = jnp.ones((batch, T))
    old_logprobs, _ = losses.token_logprobs_from_logits(logits, tokens)
    scores = jnp.mean(tokens == TARGET, axis=-1)  # [B] one reward per response
    group_ids = jnp.repeat(jnp.arange(G), N)  # responses to the same prompt share a group
    advantages = losses.broadcast_to_tokens(losses.group_relative_advantages(scores, group_ids), mask)

    def loss_fn(p):
        logprobs, entropy = losses.token_logprobs_from_logits(policy_logits(p, batch), tokens)
        loss, metrics = losses.ppo_clip_loss(logprobs, old_logprobs, advantages, mask, clip_low=0.2, clip_high=0.28)
        return loss - 1e-3 * losses.masked_mean(entropy, mask), metrics

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    params = jax.tree.map(lambda p, g: p - 20.0 * g, params, grads)
    return params, jnp.mean(scores), metrics


params = {"logits": jnp.zeros((T, V))}
key = jax.random.PRNGKey(0)
rewards = []
for step in range(40):
    key, step_key = jax.random.split(key)
    params, reward, metrics = train_step(params, step_key)
    rewards.append(float(reward))
    if step % 10 == 0 or step == 39:
        print(f"step {step:3d}  reward {reward:.3f}  clip_fraction {metrics['clip_fraction']:.3f}")
