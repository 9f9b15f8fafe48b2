"""Multi-turn rollouts from GEM-style environments, with ReBN advantages (GEM's REINFORCE).

Each iteration plays one episode in each of `n_rollout_threads` environments
for at most `episode_length` turns. At every turn the policy sees the whole
conversation so far (observations as user turns, its earlier actions as
assistant turns, through the tokenizer's chat template or plain newlines; the
latest `max_prompt_length` tokens of it) and writes one action. Every turn is
one training row (its prompt is the conversation before it, its completion the
action); the turn's advantage is ReBN's: per-turn discounted return with
`gamma`, normalised over all turns of the batch (`losses.rebn_advantages`).

Also here: the game's held-out evaluation (greedy games on seeds the training
never draws: the success rate and turns per game), the control (each turn's
reward given to another turn of the batch) and the warm-start's examples (the
turns of a teacher's games, `envs.guess_number_teacher`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from mathrl_jax import losses
from mathrl_jax.envs import MULTI_TURN_ENVS, Episode, VectorEnv, guess_number_teacher, run_episodes
from mathrl_jax.sampling import Rollouts, SamplingParams
from mathrl_jax.train.rollouts._collect import Collected, RolloutMaker, SyncRollouts, iteration_seed

ENVS = MULTI_TURN_ENVS
TEACHERS = {"guess_number": guess_number_teacher.teacher_games}
"""The envs whose games a warm-start can imitate (`warmstart.targets="teacher"` with `env_name`)."""

TEACHER_GAMES = 2000
"""Teacher games a multi-turn warm-start imitates (about 4 turns each)."""

SEED_BLOCK = 1 << 29
"""The games' seeds in three disjoint blocks: training [0, 2**29), the warm-start's teacher [2**29, 2**30), the
held-out evaluation from 2**30 on."""
WARMSTART_SEED_OFFSET = SEED_BLOCK
EVAL_SEED_OFFSET = 2 * SEED_BLOCK


def warmstart_seeds(seed: int, games: int) -> List[int]:
    """The seeds of the warm-start teacher's games (in the warm-start block)."""
    return [WARMSTART_SEED_OFFSET + (seed * games + g) % SEED_BLOCK for g in range(games)]


def training_seeds(seed: int, iteration: int, games: int) -> List[int]:
    """The seeds of an iteration's games (in the training block)."""
    return [(iteration_seed(seed, iteration) + e) % SEED_BLOCK for e in range(games)]


@dataclasses.dataclass(frozen=True)
class GameSettings:
    """The multi-turn section of the run's settings (made by the build).

    env_name: a key of `ENVS`; env_kwargs: its constructor's arguments (`config.<env_name>`, e.g. the range and the
    turn budget of guess_number); gamma: ReBN's discount; shuffle_rewards: the control (each turn's reward given to
    another turn of the batch before the returns); eval_games: greedy games of the held-out evaluation."""

    env_name: str
    gamma: float = 1.0
    env_kwargs: Tuple[Tuple[str, Any], ...] = ()
    shuffle_rewards: bool = False
    eval_games: int = 0

    def __post_init__(self):
        if self.env_name not in ENVS:
            raise ValueError(f"unknown env_name {self.env_name!r}; expected one of {', '.join(ENVS)}")
        if not 0.0 <= self.gamma <= 1.0 or self.eval_games < 0:
            raise ValueError(f"gamma={self.gamma}, eval_games={self.eval_games}: out of range")

    def make_env(self):
        return ENVS[self.env_name](**dict(self.env_kwargs))


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


def turn_prompt(codec, episode, prompts) -> List[int]:
    """The ids of the next turn's prompt: the conversation's latest `prompts.max_length` tokens."""
    return codec.encode(conversation_prompt(codec, episode, prompts.template))[-prompts.max_length :]


def won(episode: Episode) -> bool:
    """The episode ended in a win: its last step's outcome says so (GuessTheNumber), else it ended on a positive
    reward. (GEM's last-turn partial credit is a positive reward for a wrong guess: not a win.)"""
    last = episode.infos[-1] if len(episode.infos) > 1 else {}
    if "outcome" in last:
        return last["outcome"] == "success"
    return bool(episode.terminated and episode.rewards and episode.rewards[-1] > 0)


def play(maker: RolloutMaker, game: GameSettings, seeds: Sequence[int], params_at: Callable[[int], SamplingParams]):
    """One episode per seed with the sampler's current weights: (episodes, per-episode turns as (prompt ids,
    completion ids, sampler log-probs, policy log-probs), the policy versions of the calls)."""
    s = maker.settings
    turns: Dict[int, List] = {}
    versions: List[int] = []

    def policy(episodes):
        prompts = [turn_prompt(maker.codec, episode, s.prompts) for episode in episodes]
        out = maker.sampler.generate(prompts, params_at(len(versions)))
        versions.append(out.policy_version)
        texts = out.texts or [maker.codec.decode(ids) for ids in out.completion_ids]
        for row, episode in enumerate(episodes):
            turns.setdefault(id(episode), []).append(
                (prompts[row], out.completion_ids[row], out.logprobs[row], out.policy_logprobs[row])
            )
        return texts

    vector_env = VectorEnv([game.make_env for _ in seeds])
    episodes = run_episodes(vector_env, policy, list(seeds), s.episode_length)
    return episodes, [turns.get(id(e), [])[: len(e.rewards)] for e in episodes], versions


def game_metrics(episodes: Sequence[Episode], prefix: str) -> Dict[str, float]:
    return {
        f"{prefix}/accuracy": float(np.mean([won(e) for e in episodes])),
        f"{prefix}/episode_return": float(np.mean([e.total_reward for e in episodes])),
        f"{prefix}/episode_turns": float(np.mean([e.num_turns for e in episodes])),
    }


def evaluate_games(maker: RolloutMaker, game: GameSettings, max_new_tokens: int) -> Dict[str, float]:
    """Greedy play of `game.eval_games` held-out games: `eval/accuracy` (the success rate), `eval/episode_return`,
    `eval/episode_turns`."""
    seeds = [EVAL_SEED_OFFSET + g for g in range(game.eval_games)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    episodes, _, _ = play(maker, game, seeds, lambda call: greedy)
    return game_metrics(episodes, "eval")


def shuffled_turn_rewards(turn_rewards: np.ndarray, turn_mask: np.ndarray, seed: int) -> np.ndarray:
    """The control's rewards: the real turns' rewards permuted among the real turns of the batch (the same rewards,
    given to turns they say nothing about)."""
    real = turn_mask > 0
    shuffled = turn_rewards.copy()
    shuffled[real] = np.random.default_rng(seed).permutation(turn_rewards[real])
    return shuffled


def game_warmstart_examples(game: GameSettings, codec, prompts, *, games: int, slip_rate: float, seed: int):
    """(prompt ids, action ids + EOS) of every turn of `games` teacher games, prompted as the RL (`turn_prompt`)."""
    if game.env_name not in TEACHERS:
        raise ValueError(f"no teacher plays env_name={game.env_name!r}; expected one of {', '.join(TEACHERS)}")
    episodes = TEACHERS[game.env_name](
        warmstart_seeds(seed, games), slip_rate=slip_rate, rng_seed=seed, **dict(game.env_kwargs)
    )
    return [
        (turn_prompt(codec, seen, prompts), codec.encode(action) + [codec.eos_token_id])
        for episode in episodes
        for seen, action in guess_number_teacher.turn_histories(episode)
    ]


class EnvRollouts(SyncRollouts):
    """A rollout source that plays multi-turn episodes; rows are turns, padded to a fixed count."""

    def __init__(self, maker: RolloutMaker, game: GameSettings):
        self.maker = maker
        self.game = game
        s = maker.settings
        self.rows = s.prompts_per_iteration * s.episode_length  # fixed: one compiled update

    def get(self, iteration: int):
        maker, s = self.maker, self.maker.settings
        start = time.perf_counter()

        def params_at(call: int) -> SamplingParams:
            return dataclasses.replace(s.sampling, n=1, seed=iteration_seed(s.seed, iteration * 1000 + call))

        seeds = training_seeds(s.seed, iteration, s.prompts_per_iteration)
        episodes, turns, versions = play(maker, self.game, seeds, params_at)
        turn_rewards = np.zeros((len(episodes), s.episode_length), np.float32)
        turn_mask = np.zeros_like(turn_rewards)
        for e, episode in enumerate(episodes):
            k = len(episode.rewards)
            turn_rewards[e, :k] = episode.rewards
            turn_mask[e, :k] = 1.0
        if self.game.shuffle_rewards:
            turn_rewards = shuffled_turn_rewards(turn_rewards, turn_mask, iteration_seed(s.seed + 1, iteration))
        advantages = np.asarray(losses.rebn_advantages(turn_rewards, turn_mask, gamma=self.game.gamma))
        rows = {"prompt": [], "completion": [], "lp": [], "plp": [], "adv": [], "score": []}
        for e, episode_turns in enumerate(turns):
            for k, (prompt, completion, lp, plp) in enumerate(episode_turns):
                values = (prompt, completion, lp, plp, advantages[e, k], turn_rewards[e, k])
                for key, value in zip(rows, values):
                    rows[key].append(value)
        real = len(rows["adv"])
        empty = ([maker.codec.pad_token_id], [], np.zeros(0, np.float32), np.zeros(0), 0.0, 0.0)
        for _ in range(self.rows - real):  # empty rows: no response tokens, no effect on the loss
            for key, value in zip(rows, empty):
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
        played = game_metrics(episodes, "rollout")
        metrics = {"reward/accuracy": played.pop("rollout/accuracy"), **played}
        row_mask = np.zeros(self.rows, np.float32)
        row_mask[:real] = 1.0
        scores = np.asarray(rows["score"], np.float32)
        collected = Collected(rollouts, scores, metrics, maker.loader.state(), time.perf_counter() - start)
        collected.row_advantages = np.asarray(rows["adv"], np.float32)
        collected.row_mask = row_mask
        return collected
