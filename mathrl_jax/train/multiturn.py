"""Multi-turn rollouts from GEM-style environments, with ReBN advantages (GEM's REINFORCE).

Each iteration plays one episode in each of `n_rollout_threads` environments
for at most `episode_length` turns. At every turn the policy sees the whole
conversation so far (observations as user turns, its earlier actions as
assistant turns, through the tokenizer's chat template or plain newlines) and
writes one action. Every turn is one training row (its prompt is the
conversation before it, its completion the action); the turn's advantage is
ReBN's: per-turn discounted return with `gamma`, normalised over all turns of
the batch (`losses.rebn_advantages`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, List

import numpy as np

from mathrl_jax import losses
from mathrl_jax.envs import GuessTheNumberEnv, VectorEnv, run_episodes
from mathrl_jax.sampling import Rollouts
from mathrl_jax.train.collect import Collected, RolloutMaker, SyncRollouts, iteration_seed

ENVS = {"guess_number": GuessTheNumberEnv}


def conversation_prompt(codec, episode, template: str) -> str:
    """The text the policy continues at the episode's next turn."""
    if template.startswith("chat"):
        messages = []
        for i, observation in enumerate(episode.observations):
            messages.append({"role": "user", "content": observation})
            if i < len(episode.actions):
                messages.append({"role": "assistant", "content": episode.actions[i]})
        return codec.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    parts = []
    for i, observation in enumerate(episode.observations):
        parts.append(observation)
        if i < len(episode.actions):
            parts.append(episode.actions[i])
    return "\n".join(parts) + "\n"


class EnvRollouts(SyncRollouts):
    """A rollout source that plays multi-turn episodes; rows are turns, padded to a fixed count."""

    def __init__(self, maker: RolloutMaker, env_name: str, gamma: float):
        self.maker = maker
        self.env_fn = ENVS[env_name]
        self.gamma = gamma
        s = maker.settings
        self.rows = s.prompts_per_iteration * s.episode_length  # fixed: one compiled update

    def get(self, iteration: int):
        maker, s = self.maker, self.maker.settings
        start = time.perf_counter()
        vector_env = VectorEnv([self.env_fn for _ in range(s.prompts_per_iteration)])
        turns: Dict[int, List] = {}
        versions = []

        def policy(episodes):
            prompts = []
            for episode in episodes:
                ids = maker.codec.encode(conversation_prompt(maker.codec, episode, s.prompts.template))
                prompts.append(ids[-s.prompts.max_length :])  # keep the latest context within the budget
            params = dataclasses.replace(s.sampling, n=1, seed=iteration_seed(s.seed, iteration * 1000 + len(versions)))
            out = maker.sampler.generate(prompts, params)
            versions.append(out.policy_version)
            texts = out.texts or [maker.codec.decode(ids) for ids in out.completion_ids]
            for row, episode in enumerate(episodes):
                turns.setdefault(id(episode), []).append(
                    (prompts[row], out.completion_ids[row], out.logprobs[row], out.policy_logprobs[row])
                )
            return texts

        seeds = [iteration_seed(s.seed, iteration) + e for e in range(s.prompts_per_iteration)]
        episodes = run_episodes(vector_env, policy, seeds, s.episode_length)
        turn_rewards = np.zeros((len(episodes), s.episode_length), np.float32)
        turn_mask = np.zeros_like(turn_rewards)
        for e, episode in enumerate(episodes):
            k = len(episode.rewards)
            turn_rewards[e, :k] = episode.rewards
            turn_mask[e, :k] = 1.0
        advantages = np.asarray(losses.rebn_advantages(turn_rewards, turn_mask, gamma=self.gamma))
        rows = {"prompt": [], "completion": [], "lp": [], "plp": [], "adv": []}
        for e, episode in enumerate(episodes):
            for k, (prompt, completion, lp, plp) in enumerate(turns.get(id(episode), [])[: len(episode.rewards)]):
                for key, value in zip(rows, (prompt, completion, lp, plp, advantages[e, k])):
                    rows[key].append(value)
        real = len(rows["adv"])
        for _ in range(self.rows - real):  # empty rows: no response tokens, no effect on the loss
            for key, value in zip(rows, ([maker.codec.pad_token_id], [], np.zeros(0, np.float32), np.zeros(0), 0.0)):
                rows[key].append(value)
        rollouts = Rollouts(
            prompt_ids=rows["prompt"],
            completion_ids=rows["completion"],
            logprobs=rows["lp"],
            policy_logprobs=rows["plp"],
            finish_reasons=["stop"] * self.rows,
            stop_reasons=[None] * self.rows,
            prompt_indices=np.arange(self.rows, dtype=np.int32),
            policy_version=min(versions) if versions else 0,
        )
        returns = np.array([e.total_reward for e in episodes], np.float32)
        metrics = {
            "reward/accuracy": float(
                np.mean([bool(e.terminated and e.rewards and e.rewards[-1] > 0) for e in episodes])
            ),
            "rollout/episode_return": float(returns.mean()),
            "rollout/episode_turns": float(np.mean([e.num_turns for e in episodes])),
        }
        row_mask = np.zeros(self.rows, np.float32)
        row_mask[:real] = 1.0
        scores = np.zeros(self.rows, np.float32)
        scores[:real] = [turn_rewards[e, k] for e, ep in enumerate(episodes) for k in range(len(ep.rewards))][:real]
        collected = Collected(rollouts, scores, metrics, maker.loader.state(), time.perf_counter() - start)
        collected.row_advantages = np.asarray(rows["adv"], np.float32)
        collected.row_mask = row_mask
        return collected
