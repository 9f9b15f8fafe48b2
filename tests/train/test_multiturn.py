"""The multi-turn pieces around the rollouts (train/multiturn.py): what counts as a win, the control's shuffled
turn rewards, and the warm-start's examples prompted exactly as the RL prompts the policy."""

from __future__ import annotations

import numpy as np
import pytest

from mathrl_jax.envs import Episode, guess_number_teacher
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.train import multiturn
from mathrl_jax.train.problems import PromptSettings
from tests.train.loop_fixtures import model_dir  # noqa: F401


def test_last_turn_partial_credit_is_not_a_win():
    game = multiturn.GameSettings("guess_number", env_kwargs=(("max_number", 20), ("max_turns", 1), ("min_number", 1)))
    env = game.make_env()
    observation, info = env.reset(0)
    wrong = env.target % 20 + 1  # in range, not the target
    episode = Episode(observations=[observation], infos=[info])
    observation, reward, terminated, truncated, step_info = env.step(f"\\boxed{{{wrong}}}")
    episode.actions.append("a")
    episode.observations.append(observation)
    episode.rewards.append(reward)
    episode.infos.append(step_info)
    episode.terminated, episode.truncated = terminated, truncated
    assert episode.terminated and episode.rewards[-1] > 0  # GEM's partial credit
    assert not multiturn.won(episode)
    episode.infos[-1] = dict(episode.infos[-1], outcome="success")
    assert multiturn.won(episode)
    # An env that reports no outcome: a terminal positive reward is a win.
    plain = Episode(observations=["o", ""], actions=["a"], rewards=[1.0], terminated=True, infos=[{}, {}])
    assert multiturn.won(plain) and not multiturn.won(Episode(observations=["o"], infos=[{}]))


def test_the_controls_turn_rewards_are_the_same_rewards_on_other_turns():
    rng = np.random.default_rng(0)
    mask = np.zeros((16, 5), np.float32)
    for e, turns in enumerate(rng.integers(1, 6, size=16)):
        mask[e, :turns] = 1.0
    rewards = np.where(mask > 0, rng.normal(size=mask.shape), 0.0).astype(np.float32)
    shuffled = multiturn.shuffled_turn_rewards(rewards, mask, seed=3)
    assert np.all(shuffled[mask == 0] == 0)  # padding turns stay empty
    assert sorted(shuffled[mask > 0]) == sorted(rewards[mask > 0])  # the same rewards
    assert np.mean(shuffled[mask > 0] != rewards[mask > 0]) > 0.8  # given to other turns
    assert np.array_equal(shuffled, multiturn.shuffled_turn_rewards(rewards, mask, seed=3))
    assert not np.array_equal(shuffled, multiturn.shuffled_turn_rewards(rewards, mask, seed=4))


@pytest.mark.parametrize("template", ["plain", "chat"])
def test_warmstart_examples_are_the_teachers_turns_prompted_as_the_rl_prompts(template, model_dir):  # noqa: F811
    codec = TextCodec(model_dir)
    game = multiturn.GameSettings("guess_number", env_kwargs=(("max_number", 20), ("max_turns", 5), ("min_number", 1)))
    prompts = PromptSettings(template=template, max_length=96)
    examples = multiturn.warmstart_examples(game, codec, prompts, games=6, slip_rate=0.5, seed=2)
    seeds = [multiturn.WARMSTART_SEED_OFFSET + 2 * 6 + g for g in range(6)]
    episodes = guess_number_teacher.teacher_games(seeds, slip_rate=0.5, rng_seed=2, max_turns=5)
    expected = []
    for episode in episodes:
        for k, action in enumerate(episode.actions):
            history = Episode(observations=episode.observations[: k + 1], actions=episode.actions[:k])
            # The RL's prompt, built independently: the whole conversation's text, its last 96 tokens.
            text = multiturn.conversation_prompt(codec, history, template)
            expected.append((codec.encode(text)[-96:], codec.encode(action) + [codec.eos_token_id]))
    assert examples == expected
    assert all(len(prompt) <= 96 for prompt, _ in examples)
    assert len(examples) == sum(len(e.actions) for e in episodes) > 6


def test_game_settings_refuse_an_unknown_env_and_a_bad_discount():
    with pytest.raises(ValueError, match="'chess'"):
        multiturn.GameSettings("chess")
    with pytest.raises(ValueError, match="gamma=1.5"):
        multiturn.GameSettings("guess_number", gamma=1.5)
