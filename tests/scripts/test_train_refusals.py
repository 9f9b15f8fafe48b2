"""scripts/train.py refusing runs that would train nothing or resume the wrong thing (issue 60, points 2 and 4).

Point 2: a model checkpoint with a NaN weight or a NaN config value is refused before anything is written, naming
the tensor or key; a run whose every update step is skipped as non-finite, or whose only reward function returns
None for every response, stops with exit 2 and one line instead of a summary of success.

Point 4: a checkpoint step directory renamed (2 -> 5), or a step of another run (another seed) copied in, is
refused in one line naming it; a resume without config.json is checked against the settings the checkpoint
recorded (a changed setting refused, the same settings resumed).
"""

import json
import os
import shutil

import numpy as np
import pytest

from tests.scripts.test_train_cli import run_train
from tests.scripts.test_train_faults import FLAGS, copy_of, error_line, steps_in, trained_run  # noqa: F401

SUMMARY = "run directory:"  # the first line of train.py's summary of a finished run (stdout)


def tiny_model(tmp_path, name="model"):
    from mathrl_jax.models import write_tiny_checkpoint

    directory = tmp_path / name
    write_tiny_checkpoint(str(directory), seed=0)
    return directory


def reward_file(tmp_path):
    """Reward functions in TRL's convention: `noise` scores every response (a spread of rewards, so every group
    trains), `nothing` returns None for each (TRL's "not scored")."""
    path = tmp_path / "my_rewards.py"
    path.write_text(
        "import random\n\n\n"
        "def noise(completions, **kwargs):\n"
        "    return [random.random() for _ in completions]\n\n\n"
        "def nothing(completions, **kwargs):\n"
        "    return [None] * len(completions)\n"
    )
    return path


# ---- point 2: runs that report success when nothing trained ----


def test_a_model_checkpoint_with_a_nan_weight_is_refused_naming_the_tensor(tmp_path):
    """Before: exit 0 and a success summary, every update skipped (each loss NaN)."""
    from mathrl_jax.models.safetensors_io import SafetensorsFile, write_safetensors

    model = tiny_model(tmp_path)
    path = str(model / "model.safetensors")
    file = SafetensorsFile(path)
    tensors = {name: np.array(file.get(name)) for name in file.keys()}
    del file
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name].reshape(-1)[3] = np.nan
    write_safetensors(path, tensors)
    run_dir = tmp_path / "run"
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=1", f"--config.model_name_or_path={model}")
    assert done.returncode == 2, done.stderr[-3000:]
    line = error_line(done)
    assert line.startswith("train.py: error: model_name_or_path") and f"tensor {name!r}" in line, line
    assert "1 non-finite value (NaN or inf)" in line, line
    assert not run_dir.exists()  # refused before anything is written


def test_a_model_config_with_a_nan_rms_norm_eps_is_refused_naming_the_key(tmp_path):
    """Before: exit 0 and a success summary (every activation NaN, every update skipped)."""
    model = tiny_model(tmp_path)
    config_path = model / "config.json"
    config = json.loads(config_path.read_text())
    config["rms_norm_eps"] = float("nan")
    config_path.write_text(json.dumps(config))  # json writes NaN, as transformers' config.json may hold it
    run_dir = tmp_path / "run"
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=1", f"--config.model_name_or_path={model}")
    assert done.returncode == 2, done.stderr[-3000:]
    line = error_line(done)
    assert line.startswith("train.py: error: model_name_or_path") and "rms_norm_eps=nan" in line, line
    assert not run_dir.exists()


def test_a_run_whose_every_update_is_skipped_stops_with_exit_2(tmp_path):
    """lr 1e30 from the first step: the first update makes the weights overflow, every later loss is non-finite and
    every later update skipped. Before: exit 0 and a success summary after all 5 iterations."""
    run_dir = tmp_path / "run"
    done = run_train(
        run_dir,
        *FLAGS,
        "--config.num_iterations=5",
        "--config.lr=1e30",
        "--config.warmup_steps=0",
        "--config.reward_source=functions",
        f"--config.reward.functions={reward_file(tmp_path)}:noise",
    )
    assert done.returncode == 2, done.stderr[-3000:]
    line = error_line(done)
    assert line.startswith("train.py: error: iterations 2-4: every update step (1 per iteration) was skipped for a")
    assert "non-finite loss or gradient" in line and "trains nothing" in line, line
    assert SUMMARY not in done.stdout
    assert steps_in(run_dir) == [2, 3]  # stopped at iteration 4, before its save (max_to_keep 2)


def test_a_run_whose_only_reward_function_returns_none_fails_naming_it(tmp_path):
    """Before: exit 0 and a success summary, every reward 0 (None adds 0), nothing trained, not a word said."""
    run_dir = tmp_path / "run"
    done = run_train(
        run_dir,
        *FLAGS,
        "--config.num_iterations=2",
        "--config.reward_source=functions",
        f"--config.reward.functions={reward_file(tmp_path)}:nothing",
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "reward function 'nothing' returned None for every response of iteration 1" in done.stderr
    line = error_line(done)
    expected = "train.py: error: iterations 1-2: the reward function 'nothing', the run's only reward, returned None"
    assert line.startswith(expected), line
    assert SUMMARY not in done.stdout


# ---- point 4: checkpoints of the wrong step or of another run ----


@pytest.fixture(scope="module")
def other_seed_run(tmp_path_factory):
    """The run of `trained_run` with seed 1: checkpoints 1 and 2 of the same shapes."""
    run_dir = tmp_path_factory.mktemp("other_seed") / "run"
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=2", "--config.seed=1")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_a_renamed_step_is_refused_naming_its_directory(trained_run, tmp_path):  # noqa: F811
    """Before: step 2 renamed 5 resumed at iteration 2 (its metadata's), the saves of 3 and 4 were skipped
    silently (5 "existed"), and the run ended with exit 0."""
    run_dir = copy_of(trained_run, tmp_path)
    checkpoints = run_dir / "checkpoints"
    os.rename(checkpoints / "2", checkpoints / "5")
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=6")
    assert done.returncode == 2, done.stderr[-3000:]
    line = error_line(done)
    assert line.startswith(f"train.py: error: checkpoint {checkpoints}/5 ") and "renamed" in line, line
    assert "rename it back to 2" in line, line
    assert steps_in(run_dir) == [1, 5]


def test_a_step_of_another_run_is_refused_naming_the_setting(trained_run, other_seed_run, tmp_path):  # noqa: F811
    """Another seed's step 2 copied over this run's. Before: restored silently (the same shapes), exit 0."""
    run_dir = copy_of(trained_run, tmp_path)
    checkpoints = run_dir / "checkpoints"
    shutil.rmtree(checkpoints / "2")
    shutil.copytree(other_seed_run / "checkpoints" / "2", checkpoints / "2")
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=3")
    assert done.returncode == 2, done.stderr[-3000:]
    line = error_line(done)
    assert line.startswith(f"train.py: error: checkpoint {checkpoints}/2 was saved by a run with other settings ")
    assert "seed: 1 -> 0" in line, line
    assert steps_in(run_dir) == [1, 2]


def test_a_resume_without_config_json_checks_the_settings_the_checkpoint_recorded(trained_run, tmp_path):  # noqa: F811
    """Before: without config.json the check was skipped, and another lr resumed silently."""
    run_dir = copy_of(trained_run, tmp_path)
    os.remove(run_dir / "config.json")
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=3", "--config.lr=1e-4")
    assert done.returncode == 2, done.stderr[-3000:]
    line = error_line(done)
    assert "checkpoints/2 was saved by a run with other settings (lr: 3e-05 -> 0.0001)" in line, line
    assert steps_in(run_dir) == [1, 2] and not (run_dir / "config.json").exists()
    done = run_train(run_dir, *FLAGS, "--config.num_iterations=3")  # the same settings: resumed
    assert done.returncode == 0, done.stderr[-3000:]
    assert steps_in(run_dir)[-1] == 3
