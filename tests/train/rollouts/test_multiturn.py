"""The multi-turn pieces around the rollouts (train/rollouts/_multiturn.py): what counts as a win, the control's
shuffled turn rewards, and the warm-start's examples prompted exactly as the RL prompts the policy."""

from __future__ import annotations

import numpy as np
import pytest

from mathrl_jax.envs import Episode, guess_number_teacher
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.train.rollouts import _multiturn as multiturn
from mathrl_jax.train.rollouts._problems import PromptSettings
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
    examples = multiturn.game_warmstart_examples(game, codec, prompts, games=6, slip_rate=0.5, seed=2)
    seeds = multiturn.warmstart_seeds(2, 6)
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


def test_training_warmstart_and_evaluation_games_never_share_a_seed():
    blocks = {
        "training": {s for i in range(200) for s in multiturn.training_seeds(3, i, 64)},
        "training, another seed": {s for i in range(200) for s in multiturn.training_seeds(10**6, i, 64)},
        "evaluation": {multiturn.EVAL_SEED_OFFSET + g for g in range(500)},
    }
    assert all(0 <= s < 2**29 for s in blocks["training"] | blocks["training, another seed"])
    assert min(blocks["evaluation"]) >= 2**30
    warm = [s for seed in (0, 7, 10**6) for s in multiturn.warmstart_seeds(seed, 2000)]
    assert all(2**29 <= s < 2**30 for s in warm) and len(set(multiturn.warmstart_seeds(7, 2000))) == 2000


def test_a_reused_warmstart_of_another_task_is_refused(tmp_path):
    """A run directory's warm-start is reused only for the task that made it: an arithmetic warm-start is not the
    game's, nor is a game's of another range or turn budget."""
    import json

    from mathrl_jax.configs import default, guess_number_tiny
    from mathrl_jax.errors import TrainingError
    from mathrl_jax.train.setup import _sections as sections
    from mathrl_jax.train.warmstart import _warmstart as warmstart

    def record_of(config):
        directory = tmp_path / str(len(list(tmp_path.iterdir())))
        directory.mkdir()
        (directory / warmstart.WARMSTART_RECORD).write_text(json.dumps(sections.warmstart_settings(config).record()))
        return str(directory)

    arithmetic, game = default.get_config(), guess_number_tiny.get_config()
    other_game = guess_number_tiny.get_config()
    other_game.guess_number.max_turns = 20
    for made, used in ((arithmetic, game), (game, arithmetic), (game, other_game)):
        directory = record_of(made)
        warmstart.check_reused_warmstart(sections.warmstart_settings(made), directory)  # its own: reused
        with pytest.raises(TrainingError, match="task"):
            warmstart.check_reused_warmstart(sections.warmstart_settings(used), directory)
