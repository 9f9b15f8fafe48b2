"""scripts/train.py --config mathrl_jax/configs/countdown.py with tiny overrides: TPPO with the rule-based process
verifier trains; a bad setting is refused before anything is written. (docs/testbed.md's countdown commands, the
recipe's GRPO run with its warm-start and both held-out sets among them, run in tests/test_docs.py.)"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join("mathrl_jax", "configs", "countdown.py")

TINY = [
    "--config.progress=False",
    "--config.warmstart.steps=20",
    "--config.n_rollout_threads=4",
    "--config.group_size=2",
    "--config.num_mini_batch=1",
    "--config.num_iterations=2",
    "--config.eval_interval=1",
    "--config.eval_n_samples=2",
    "--config.num_eval_problems=6",
    "--config.num_logged_samples=2",
    "--config.countdown.num_train=64",
    "--config.countdown.num_eval=6",
    "--config.save_interval=2",
]
"""A countdown run of seconds: a short warm-start, two small iterations, six held-out problems of each split."""


def run_train(run_dir, *flags):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return subprocess.run(
        [sys.executable, os.path.join("scripts", "train.py"), f"--config={CONFIG}", f"--config.run_dir={run_dir}"]
        + list(flags),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def records_of(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


@pytest.fixture(scope="module")
def one_layer_model(tmp_path_factory):
    from mathrl_jax.models import write_tiny_checkpoint

    directory = str(tmp_path_factory.mktemp("model") / "tiny")
    write_tiny_checkpoint(directory, seed=0, num_hidden_layers=1)
    return directory


def test_tppo_with_the_step_verifier_trains_on_countdown(one_layer_model, tmp_path):
    run_dir = tmp_path / "tppo"
    flags = ["--config.algorithm_name=tppo", "--config.prm_model_name_or_path=countdown_steps"]
    flags += [f"--config.model_name_or_path={one_layer_model}", "--config.export_final=False"]
    flags += ["--config.step_separator=,", "--config.reward_source=prm+verifier", "--config.warmstart.steps=0"]
    done = run_train(run_dir, *TINY, *flags, "--config.eval_interval=0", "--config.countdown.eval_count=0")
    assert done.returncode == 0, done.stderr[-3000:]
    records = records_of(run_dir)
    trained = [r for r in records if "train/update_step" in r]  # each iteration; policy_loss where it trained
    assert [r["step"] for r in trained] == [1, 2]
    assert all(r.get("train/policy_loss", 0.0) is not None and "rollout/accuracy" in r for r in trained)
    saved = json.load(open(run_dir / "config.json"))
    assert saved["prm_model_name_or_path"] == "countdown_steps" and saved["dataset_name"] == "countdown"


def test_a_bad_countdown_setting_is_refused_before_anything_is_written(tmp_path):
    run_dir = tmp_path / "bad"
    done = run_train(run_dir, *TINY, "--config.countdown.count=7")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "countdown.count=7: expected 3 to 6 numbers" in done.stderr.strip().splitlines()[-1]
    assert not run_dir.exists()
