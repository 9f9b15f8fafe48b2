"""docs/vllm.md's commands beyond one in-process worker, as a user runs them (vLLM's CPU build, localhost):
`scripts/train.py --config.vllm.tensor_parallel_size=2`, and the server mode, `scripts/vllm_server.py` in one
process and `scripts/train.py --config.vllm.server_url=...` in another. A server that dies mid-run stops the run
with exit status 2 and one line naming it; the checkpoints are intact, and the same command, rerun against a new
server, resumes from the last one."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from tests.sampling.conftest import free_port, require_vllm

require_vllm()

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = [
    "--config.sampler=vllm",
    "--config.warmstart.steps=0",
    "--config.n_rollout_threads=4",
    "--config.group_size=2",
    "--config.num_mini_batch=1",
    "--config.max_new_tokens=8",
    "--config.eval_interval=0",
    "--config.arithmetic.num_train=64",
    "--config.arithmetic.num_eval=4",
    "--config.num_eval_problems=4",
    "--config.save_interval=1",
    "--config.max_to_keep=100",
    "--config.progress=False",
    "--config.vllm.timeout_s=20",
]


def serve(tmp_path, port):
    """The documented command, in its own session (vLLM's engine core is its child: killed with it)."""
    log = open(tmp_path / f"server_{port}.log", "ab")
    server = subprocess.Popen(
        [sys.executable, "scripts/vllm_server.py", "--model", "tiny", "--tiny-dir", str(tmp_path / "tiny"),
         "--port", str(port), "--kv-cache-gib", "0.25"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert server.poll() is None, (tmp_path / f"server_{port}.log").read_text()[-3000:]
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return server
        except requests.RequestException:
            time.sleep(1)
    raise AssertionError("the server did not start")


def train(run_dir, url, iterations, **popen):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    command = [sys.executable, "scripts/train.py", f"--config.run_dir={run_dir}", f"--config.vllm.server_url={url}"]
    return subprocess.Popen(
        [*command, f"--config.num_iterations={iterations}", *RUN],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen,
    )  # fmt: skip


def steps(run_dir):
    directory = os.path.join(run_dir, "checkpoints")
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit()) if os.path.isdir(directory) else []


def test_the_documented_print_command_is_the_one_that_runs():
    done = subprocess.run(
        [sys.executable, "scripts/vllm_server.py", "--model", "tiny", "--port", "8123", "--print"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("VLLM_SERVER_DEV_MODE=1 ")
    for flag in ("--enable-scale-out", "--port 8123", "mathrl_shared_memory", "--logprobs-mode processed_logprobs"):
        assert flag in done.stdout


@pytest.mark.parametrize(
    "bad, named",
    [
        (["--model", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
        (["--model", "tiny", "--tensor-parallel-size", "0"], "--tensor-parallel-size 0"),
    ],
)
def test_the_server_script_refuses_bad_input_in_one_line(bad, named):
    done = subprocess.run([sys.executable, "scripts/vllm_server.py", *bad], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and named in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "inference.example", ""])
def test_a_host_beyond_localhost_is_refused_in_one_line_unless_allowed(tmp_path, host):
    """vLLM's development routes have no authentication: serving them beyond this machine takes an explicit flag,
    and the refusal comes before anything is written."""
    tiny = tmp_path / "tiny"
    command = [sys.executable, "scripts/vllm_server.py", "--model", "tiny", "--tiny-dir", str(tiny), "--print"]
    done = subprocess.run([*command, "--host", host], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert f"--host {host!r}" in done.stderr and "unauthenticated" in done.stderr
    assert "--allow-remote-unauthenticated" in done.stderr
    assert not tiny.exists()
    if host == "0.0.0.0":
        allowed = [*command, "--host", host, "--allow-remote-unauthenticated"]
        done = subprocess.run(allowed, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "--host 0.0.0.0" in done.stdout and "--allow-remote-unauthenticated" not in done.stdout  # ours alone


def test_without_vllm_the_server_script_says_so_in_one_line(tmp_path):
    """vLLM missing from the Python that runs the script (here: a `vllm` on the path that fails to import, as an
    absent one does)."""
    stub = tmp_path / "no_vllm" / "vllm"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'vllm'\", name='vllm')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "no_vllm"))
    tiny = tmp_path / "tiny"
    done = subprocess.run(
        [sys.executable, "scripts/vllm_server.py", "--model", "tiny", "--tiny-dir", str(tiny), "--port", "8123"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "vLLM is not installed" in done.stderr and "install_vllm_cpu.sh" in done.stderr
    assert not tiny.exists()


def test_the_tiny_model_goes_into_a_new_private_directory_not_a_planted_link(tmp_path):
    """Without --tiny-dir the tiny model is written into a new directory of its own (mode 0700) in the temporary
    directory: a link planted there under the old fixed name is not followed."""
    shared = tmp_path / "shared_tmp"  # the machine's shared temporary directory, as another user could plant in it
    shared.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (shared / "mathrl_jax_tiny_model").symlink_to(victim, target_is_directory=True)
    env = dict(os.environ, TMPDIR=str(shared))
    runs = [
        subprocess.run(
            [sys.executable, "scripts/vllm_server.py", "--model", "tiny", "--port", "8123", "--print"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        for _ in range(2)
    ]
    models = []
    for done in runs:
        assert done.returncode == 0, done.stderr
        argv = done.stdout.split()
        models.append(argv[argv.index("--model") + 1])
    assert os.listdir(victim) == []
    assert models[0] != models[1]  # each start its own
    for model in models:
        assert os.path.dirname(model) == str(shared) and not os.path.islink(model)
        assert os.stat(model).st_mode & 0o777 == 0o700 and os.stat(model).st_uid == os.geteuid()
        assert os.path.isfile(os.path.join(model, "config.json"))


def test_a_server_killed_mid_run_stops_it_in_one_line_and_the_rerun_resumes(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run_dir = tmp_path / "run"
    server = serve(tmp_path, port)
    try:
        trainer = train(run_dir, url, iterations=200)
        deadline = time.monotonic() + 300
        while len(steps(run_dir)) < 2 and trainer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(steps(run_dir)) >= 2, trainer.communicate()[1][-3000:]
        os.killpg(server.pid, signal.SIGKILL)
        killed_at = time.time()
        out, err = trainer.communicate(timeout=120)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert trainer.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("train.py: error:") and f"the vLLM server at {url}" in last, err[-3000:]
    assert "Traceback" not in err
    saved = steps(run_dir)
    assert saved and saved[-1] < 200

    server = serve(tmp_path, port)  # the same command, again
    try:
        rerun = train(run_dir, url, iterations=saved[-1] + 2)
        out, err = rerun.communicate(timeout=600)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert rerun.returncode == 0, err[-3000:]
    assert steps(run_dir)[-1] == saved[-1] + 2
    with open(run_dir / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    trained = sorted({r["step"] for r in records if "rollout/rewards" in r})
    assert trained == list(range(1, saved[-1] + 3))  # every iteration once: the rerun went on from the checkpoint
    assert all(r["time"] < killed_at for r in records if r["step"] <= saved[-1])  # kept from before the kill
    assert all(r["time"] > killed_at for r in records if r["step"] > saved[-1])


def test_the_tensor_parallel_command_trains_with_a_sync_every_iteration(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    flags = [f for f in RUN if not f.startswith(("--config.save_interval", "--config.max_to_keep"))]
    done = subprocess.run(
        [sys.executable, "scripts/train.py", f"--config.run_dir={tmp_path / 'run'}", "--config.num_iterations=2",
         "--config.vllm.tensor_parallel_size=2", "--config.vllm.kv_cache_gib=0.25", *flags],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        trained = [r for r in map(json.loads, f) if "rollout/rewards" in r]
    assert [r["step"] for r in trained] == [1, 2]
    for record in trained:
        assert record["async/policy_version"] == record["step"] - 1  # sampled with the weights synced before it
        assert record["perf/sync_time"] > 0
        assert record["rollout/sampler_logprob_diff"] < 1e-5  # the workers hold the trainer's params
