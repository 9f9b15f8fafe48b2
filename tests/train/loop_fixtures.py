"""Shared helpers of the training-loop tests (test_loop, test_batch, test_validation and others): a one-layer tiny
checkpoint (the `model_dir` fixture: import it by name into the test module that uses it), a small fast config, a
dense learnable reward, and a run that records its metrics."""

import functools
import os

import numpy as np
import pytest

from mathrl_jax.configs import default
from mathrl_jax.models import write_tiny_checkpoint
from mathrl_jax.train import loop

DIGITS = set("0123456789")


def first_char_reward(texts, golds):
    """The fraction of digits in the completion: dense (10% for a random policy) and learnable in a few steps."""
    scores = np.array([sum(ch in DIGITS for ch in t) / max(len(t), 1) for t in texts], np.float32)
    return scores, {"reward/accuracy": float(np.mean(scores > 0.5))}


@functools.lru_cache(maxsize=None)
def tiny_dir(root):
    directory = os.path.join(root, "tiny1")
    if not os.path.isdir(directory):
        write_tiny_checkpoint(directory, seed=0, num_hidden_layers=1)
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_dir(str(tmp_path_factory.mktemp("model")))


def small_config(model_dir, run_dir, **overrides):
    config = default.get_config()
    config.model_name_or_path = model_dir
    config.run_dir = str(run_dir)
    config.warmstart.steps = 0
    config.arithmetic.num_train = 64
    config.arithmetic.num_eval = 8
    config.num_eval_problems = 8
    config.n_rollout_threads = 8
    config.group_size = 4
    config.max_new_tokens = 4
    config.num_iterations = 6
    config.eval_interval = 0
    config.save_interval = 0
    config.progress = False
    config.lr = 1e-2
    config.critic_lr = 3e-3
    config.reward.num_workers = 1
    for key, value in overrides.items():
        target = config
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return config


def run_and_record(config, reward_fn=first_char_reward):
    history = []
    summary = loop.train(config, reward_fn=reward_fn, on_metrics=lambda i, m: history.append((i, m)))
    return summary, history
