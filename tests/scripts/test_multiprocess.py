"""`scripts/train.py` over two processes joined by jax.distributed (localhost, gloo), each with two simulated CPU
devices: it trains as one process on four devices with the same mesh, only process 0 writes, bad input stops
every process, and a lost process stops the other, the job resuming from its last complete checkpoint."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "scripts", "train.py")
GRADER_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess_grader_worker.py")
LATE_TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess_late_train.py")
SPLIT_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess_split_worker.py")

# A short offline run on a (dp=1, fsdp=2, tp=2) mesh. The tiny model is not warm-started long enough to answer,
# so the verifier's rewards are all 0: entropy_coef and a large lr make the update move the weights anyway.
SHORT_RUN = [
    "--config.warmstart.steps=2",
    "--config.warmstart.batch_size=8",
    "--config.num_iterations=2",
    "--config.n_rollout_threads=4",
    "--config.group_size=4",
    "--config.num_mini_batch=2",
    "--config.max_new_tokens=8",
    "--config.arithmetic.num_train=64",
    "--config.arithmetic.num_eval=8",
    "--config.num_eval_problems=8",
    "--config.num_logged_samples=2",
    "--config.eval_interval=2",
    "--config.eval_n_samples=2",
    "--config.save_interval=1",
    "--config.progress=False",
    "--config.mesh.dp=1",
    "--config.mesh.fsdp=2",
    "--config.mesh.tp=2",
    "--config.entropy_coef=0.01",
    "--config.lr=1e-3",
    "--config.heartbeat_timeout_s=10",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(devices: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") and k != "XLA_FLAGS"}
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **extra
    )
    return env


def launch(script, args, processes: int = 2, per_process_args=None):
    """`processes` copies of `script args` joined by jax.distributed, two simulated devices each."""
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, script, *args, *((per_process_args or {}).get(pid, []))],
            cwd=ROOT,
            env=environment(
                2,
                JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAX_NUM_PROCESSES=str(processes),
                JAX_PROCESS_ID=str(pid),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(processes)
    ]


def finish(workers, timeout=600):
    outputs = []
    for worker in workers:
        try:
            out, err = worker.communicate(timeout=timeout)
        finally:
            worker.kill()
        outputs.append((worker.returncode, out, err))
    return outputs


def train_two_processes(run_dir, *flags):
    outputs = finish(launch(TRAIN, [f"--config.run_dir={run_dir}", *SHORT_RUN, *flags]))
    for code, out, err in outputs:
        assert code == 0, err[-3000:]
    return outputs


def train_one_process(run_dir, *flags):
    done = subprocess.run(
        [sys.executable, TRAIN, f"--config.run_dir={run_dir}", *SHORT_RUN, *flags],
        cwd=ROOT,
        env=environment(4),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def records(run_dir):
    """{step: merged record} of metrics.jsonl, and the number of lines per step."""
    merged, lines = {}, {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            merged.setdefault(record["step"], {}).update(record)
            lines[record["step"]] = lines.get(record["step"], 0) + 1
    return merged, lines


def comparable(record):
    """The values that do not measure time."""
    return {k: v for k, v in record.items() if not k.startswith("perf/") and k not in ("time", "warmstart/seconds")}


def final_weights(run_dir):
    return load_file(os.path.join(run_dir, "final_model", "model.safetensors"))


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(["--config.warmstart.steps=0", "--config.num_iterations=1", "--config.eval_interval=0"], id="rl"),
        pytest.param([], id="warm-start-and-rl", marks=pytest.mark.slow),
    ],
)
def test_two_processes_train_as_one_process_on_four_devices(tmp_path, flags):
    """Same mesh, same program: the metrics and final weights agree to float32 rounding. They are not bitwise equal
    because the fsdp / tp reductions cross processes over gloo, which sums in another order than one process."""
    two, one = tmp_path / "two", tmp_path / "one"
    outputs = train_two_processes(two, *flags)
    train_one_process(one, *flags)
    iterations = 1 if flags else 2

    assert "run directory" in outputs[0][1] and "run directory" not in outputs[1][1]  # process 0 prints the summary
    two_records, lines = records(two)
    one_records, one_lines = records(one)
    assert lines == one_lines  # process 1 wrote no metrics: each record once
    assert sorted(two_records) == list(range(1 if flags else 0, iterations + 1))
    for step in one_records:
        a, b = comparable(one_records[step]), comparable(two_records[step])
        assert sorted(a) == sorted(b)
        for key in a:
            # Rounding-level quantities (e.g. sampler vs trainer log-prob gaps ~1e-7) compare absolutely.
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (step, key)
    if not flags:  # the warm-start, its evaluations, and the RL run's evaluations and samples
        assert "warmstart/eval_accuracy_after" in two_records[0] and "eval/pass@2" in two_records[iterations]
        assert sorted(os.listdir(two / "samples")) == sorted(os.listdir(one / "samples"))

    a, b = final_weights(one), final_weights(two)
    initial = load_file(os.path.join(one, "warmstart_model" if not flags else "initial_model", "model.safetensors"))
    moved = max(float(np.abs(a[k] - initial[k]).max()) for k in a)
    assert moved > 1e-4  # the update changed the weights, so agreeing means something
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-5, err_msg=name)
    assert sorted(os.listdir(two / "checkpoints")) == [str(i) for i in range(1, iterations + 1)]


@pytest.mark.parametrize("where", ["engine", pytest.param("server", marks=pytest.mark.slow)])
def test_two_processes_with_the_vllm_sampler_train_as_one(tmp_path, where):
    """`sampler="vllm"` over two processes: each samples its share of every batch (its own in-process engine, or a
    server they share, synced by process 0 alone) with the seeds the one-process run gives those prompts, and the
    shares are gathered. Two iterations (the second samples after a sync) train as one process does: the same
    rollouts, so the metrics and weights agree to the rounding of the cross-process reductions, as the JAX
    sampler's two-process run does."""
    from tests.sampling.conftest import free_port, require_vllm

    require_vllm()
    from mathrl_jax.models import write_tiny_checkpoint
    from mathrl_jax.sampling.vllm import start_server

    flags = [
        "--config.warmstart.steps=0", "--config.num_iterations=2", "--config.eval_interval=0",
        "--config.sampler=vllm", "--config.vllm.kv_cache_gib=0.25",
    ]  # fmt: skip
    server = None
    if where == "server":
        write_tiny_checkpoint(str(tmp_path / "tiny"), seed=0)  # the architecture; the weights are synced
        server = start_server(str(tmp_path / "tiny"), port=free_port(), log_path=str(tmp_path / "server.log"))
        flags.append(f"--config.vllm.server_url={server.url}")
    try:
        two, one = tmp_path / "two", tmp_path / "one"
        train_two_processes(two, *flags)
        train_one_process(one, *flags)
    finally:
        if server is not None:
            server.stop()
    two_records, lines = records(two)
    one_records, one_lines = records(one)
    assert lines == one_lines and sorted(two_records) == [1, 2]
    for step in one_records:
        a, b = comparable(one_records[step]), comparable(two_records[step])
        assert sorted(a) == sorted(b)
        assert b["async/policy_version"] == a["async/policy_version"] == step - 1  # sampled after each sync
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (step, key)
    a, b = final_weights(one), final_weights(two)
    initial = load_file(os.path.join(one, "initial_model", "model.safetensors"))
    assert max(float(np.abs(a[k] - initial[k]).max()) for k in a) > 1e-4
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-5, err_msg=name)


def test_a_sampler_is_shared_out_over_processes_and_gathered_in_order(tmp_path):
    """`ProcessSplitSampler` over two processes, around samplers whose draws are a formula of prompt and seed: each
    is asked its contiguous share (3 prompts: 2 + 1; 1 prompt: 1 + none) with the seeds those prompts have in one
    process, every process gets the whole batch in order, process 0 alone syncs (the other expects its version,
    under process 0's tag), and a request that fails on process 1 stops both with its message."""
    outputs = finish(launch(SPLIT_WORKER, [str(tmp_path)]), timeout=300)
    for code, out, err in outputs:
        assert code == 0, err[-3000:]
    shares = [json.loads((tmp_path / f"split{pid}.json").read_text()) for pid in (0, 1)]
    assert shares[0]["asked"][:2] == [[[1], [2, 3]], [[5]]] and shares[1]["asked"][:1] == [[[4]]]
    one_process = [[10 + i * 2 + j, s] for i, s in enumerate([1, 5, 4]) for j in range(2)]  # seed + i n + j
    for share in shares:
        assert share["three"] == {"ids": one_process, "prompts": [0, 0, 1, 1, 2, 2], "version": 7}
        assert share["one"] == {"ids": [[10, 5], [11, 5]], "prompts": [0, 0]}
        assert np.isnan(share["logprobs"][0][0]) and share["logprobs"][0][1] == -0.25  # NaN crosses the gather
        assert share["tag"] == "own-0"  # process 0's
        failure = share["failure"]
        assert failure and "did not answer generation request 0" in failure["message"]
    assert shares[0]["synced"] == [6.0, 7] and shares[0]["expected"] is None
    assert shares[1]["synced"] is None and shares[1]["expected"] == 7
    assert shares[1]["failure"]["type"] == "ServerError"  # its own error
    assert (
        shares[0]["failure"]["type"] == "PeerSamplerError" and "process 1's sampler" in shares[0]["failure"]["message"]
    )


def test_grading_is_shared_out_and_gathered_in_order(tmp_path):
    """Each process grades its contiguous share of a batch; every process gets the whole batch's verdicts, in the
    batch's order, equal to grading it in one process."""
    outputs = finish(launch(GRADER_WORKER, [str(tmp_path)]), timeout=300)
    for code, out, err in outputs:
        assert code == 0, err[-3000:]
    shares = [json.loads((tmp_path / f"grader{pid}.json").read_text()) for pid in (0, 1)]
    assert shares[0]["graded"] == 4 and shares[1]["graded"] == 3  # 7 responses: 4 + 3
    assert shares[0]["verdicts"] == shares[1]["verdicts"] == shares[0]["expected"]
    assert shares[0]["rewards"] == shares[1]["rewards"] == shares[0]["expected_rewards"]


MISSING_DATA = ["--config.dataset_name=math500", "--config.dataset_path=/nonexistent/math500.jsonl"]


@pytest.mark.parametrize(
    "bad, expected, joined",
    [
        # refused before the processes join
        (["--config.algorithm_name=nope"], "unknown algorithm_name 'nope'", False),
        # found after they joined (the data are read then): process 0, which hosts jax.distributed's coordination
        # service, must not take it down while the other is still stopping (that aborted it: SIGABRT, not 2)
        (MISSING_DATA, "/nonexistent/math500.jsonl", True),
    ],
    ids=["config", "data"],
)
def test_bad_input_stops_every_process_with_the_same_message(tmp_path, bad, expected, joined):
    outputs = finish(launch(LATE_TRAIN, [f"--config.run_dir={tmp_path / 'run'}", *bad]))  # process 1 late
    messages = set()
    for code, out, err in outputs:
        assert code == 2, err[-2000:]
        assert ("joins the others" in err) == joined
        messages.add(re.sub(r" \(process \d of 2\)", "", err.strip().splitlines()[-1]))
    assert len(messages) == 1 and expected in messages.pop()
    assert not (tmp_path / "run").exists()  # nothing written


def test_a_process_alone_with_bad_data_stops_the_other(tmp_path):
    """Process 1 fails on its data, after the processes joined; process 0 goes on to its first collective, where
    it would wait forever: it is aborted within the heartbeat timeout instead, its log naming process 1."""
    start = time.monotonic()
    workers = launch(
        TRAIN,
        [f"--config.run_dir={tmp_path / 'run'}", *SHORT_RUN, "--config.heartbeat_timeout_s=5"],
        per_process_args={1: MISSING_DATA},
    )
    (code0, _, err0), (code1, _, err1) = finish(workers, timeout=240)
    assert code1 == 2 and "/nonexistent/math500.jsonl" in err1
    assert code0 != 0 and time.monotonic() - start < 200
    assert re.search(r"stopped sending heartbeats\):\s*1\b", err0), err0[-2000:]


def test_a_process_alone_with_a_bad_config_stops_the_other(tmp_path):
    """Process 1 refuses its config before joining; process 0 waits for it to join for join_timeout_s, then stops
    (jax.distributed aborts it), its log saying what it waited for."""
    start = time.monotonic()
    workers = launch(
        TRAIN,
        [f"--config.run_dir={tmp_path / 'run'}", *SHORT_RUN, "--config.join_timeout_s=5"],
        per_process_args={1: ["--config.lr=-1"]},
    )
    (code0, _, err0), (code1, _, err1) = finish(workers, timeout=240)
    assert code1 == 2 and "lr=-1" in err1 and "joins the others" not in err1  # it never tried to join
    assert code0 != 0 and time.monotonic() - start < 120
    assert "process 0 of 2 joins the others" in err0 and "join_timeout_s=5" in err0, err0[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_lost_process_stops_the_other_and_the_job_resumes_from_its_last_checkpoint(tmp_path):
    """SIGKILL process 1 once checkpoint 2 of 4 is complete: process 0 exits non-zero within the heartbeat timeout
    naming process 1; the same command resumes from checkpoint 2 and ends as the uninterrupted two-process run,
    bit for bit (same processes, same programs)."""
    flags = ["--config.num_iterations=4", "--config.save_interval=2", "--config.eval_interval=0"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train_two_processes(straight, *flags)

    workers = launch(TRAIN, [f"--config.run_dir={killed}", *SHORT_RUN, *flags])
    checkpoints = killed / "checkpoints"
    deadline = time.monotonic() + 600
    while not (checkpoints.is_dir() and "2" in os.listdir(checkpoints)):  # Orbax renames a checkpoint when complete
        assert time.monotonic() < deadline and all(w.poll() is None for w in workers)
        time.sleep(0.05)
    workers[1].kill()
    lost = time.monotonic()
    (code0, _, err0), _ = finish(workers, timeout=120)
    assert code0 != 0 and time.monotonic() - lost < 60  # heartbeat_timeout_s=10, plus the abort
    assert re.search(r"stopped sending heartbeats\):\s*1\b", err0), err0[-2000:]
    assert not (killed / "final_model").exists()

    train_two_processes(killed, *flags)
    a, b = records(straight)[0], records(killed)[0]
    for step in (3, 4):  # the iterations after the resume
        assert comparable(b[step]) == comparable(a[step]), step
    x, y = final_weights(straight), final_weights(killed)
    for name in x:
        np.testing.assert_array_equal(y[name], x[name], err_msg=name)


@pytest.mark.slow  # 40 s; the same sampler mesh and grading as the default-suite training run
def test_evaluate_across_two_processes_prints_what_one_process_does(tmp_path):
    from mathrl_jax.models import write_tiny_checkpoint

    model = tmp_path / "tiny"
    write_tiny_checkpoint(str(model), num_hidden_layers=2)
    args = [f"--model={model}", "--num-problems=12", "--max-new-tokens=6", "--n-samples=2"]
    script = os.path.join(ROOT, "scripts", "evaluate.py")
    outputs = finish(launch(script, args), timeout=300)
    for code, out, err in outputs:
        assert code == 0, err[-3000:]
    one = subprocess.run(
        [sys.executable, script, *args], cwd=ROOT, env=environment(1), capture_output=True, text=True, timeout=300
    )
    assert one.returncode == 0, one.stderr[-3000:]
    expected = json.loads(one.stdout[one.stdout.index("{") :])
    assert json.loads(outputs[0][1][outputs[0][1].index("{") :]) == expected
    assert "{" not in outputs[1][1]  # process 1 prints nothing of its own
