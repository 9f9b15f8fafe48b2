"""A run whose response lengths change compiles its update and its log-prob pass a bounded number of times: the
batch width and the packing plans keep the largest shape so far, so shorter batches reuse the programs.
Counted from JAX's own compile events (`jax.monitoring`), through the training loop users run."""

import jax
import numpy as np

from mathrl_jax.train import loop
from mathrl_jax.train.checkpoint._checkpointer import Checkpointer
from tests.train.loop_fixtures import model_dir, small_config  # noqa: F401  (the fixture)

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
HEAVY = ("jit(update)", "jit(trainer_pass)")  # the programs that are the whole model at a real shape
MAX_NEW_TOKENS = 48


def shortness_reward(texts, golds):
    """1 for an immediate end of text, 0 for a completion that runs to the limit: the policy learns to stop
    early, so the batches' lengths fall over the run (as a real run's drift, here within 20 iterations)."""
    scores = np.array([1.0 - len(t) / MAX_NEW_TOKENS for t in texts], np.float32)
    return scores, {"reward/accuracy": float(np.mean(scores > 0.5))}


def test_a_run_with_changing_lengths_compiles_its_update_and_passes_a_bounded_number_of_times(model_dir, tmp_path):  # noqa: F811
    config = small_config(
        model_dir, tmp_path / "run", num_iterations=20, max_new_tokens=MAX_NEW_TOKENS, lr=3e-2, kl_coef=0.01
    )
    done = [0]  # iterations done
    compiles = []

    def on_compile(event, duration, **kwargs):
        if event == COMPILE_EVENT and kwargs.get("fun_name") in HEAVY:
            compiles.append((done[0], kwargs["fun_name"]))

    lengths = []

    def on_metrics(i, metrics):
        done[0] = i
        lengths.append(metrics["rollout/response_length"])

    jax.monitoring.register_event_duration_secs_listener(on_compile)
    try:
        loop.train(config, reward_fn=shortness_reward, on_metrics=on_metrics)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_compile)
    # The lengths did change, across the batch-width buckets (16, 32, 64 columns with the 16-token prompts).
    assert max(lengths[:3]) > 32 > min(lengths[-5:]), lengths
    first = [name for i, name in compiles if i == 0]
    later = [(i, name) for i, name in compiles if i > 0]
    assert sorted(set(first)) == sorted(HEAVY)  # the first iteration compiled both (kl_coef: reference log-probs)
    assert len(later) <= 2, later  # a larger batch may grow a shape; a shorter one never compiles


def test_a_resumed_run_pads_and_packs_as_the_uninterrupted_one(model_dir, tmp_path):  # noqa: F811
    """The shapes the run grew to travel with its checkpoints: stopped after iteration 6 of 12 while its
    batches shrink, it resumes bit-identical (a fresh start would plan the shorter batches narrower)."""

    def config(run_dir, iterations):
        return small_config(
            model_dir, run_dir, num_iterations=iterations, max_new_tokens=MAX_NEW_TOKENS, lr=3e-2, save_interval=6
        )

    def trained(run_dir, iterations):
        history = []
        summary = loop.train(
            config(run_dir, iterations), reward_fn=shortness_reward, on_metrics=lambda i, m: history.append(m)
        )
        return summary["state"], history

    straight, history = trained(tmp_path / "a", 12)
    assert (
        max(m["rollout/response_length"] for m in history[:3])
        > 32
        > min(m["rollout/response_length"] for m in history[6:])
    )
    trained(tmp_path / "b", 6)
    resumed, _ = trained(tmp_path / "b", 12)
    for a, b in zip(jax.tree.leaves(jax.device_get(straight)), jax.tree.leaves(jax.device_get(resumed))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The shapes it had grown to, saved with checkpoint 12, are the uninterrupted run's (the batches after the
    # resume alone were planned smaller).
    floors = [
        Checkpointer(str(tmp_path / run / "checkpoints"), save_interval=6).read_metadata(12)["shape_floors"]
        for run in "ab"
    ]
    assert floors[0] == floors[1] and floors[0]["width"] == 64
