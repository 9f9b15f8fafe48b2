"""scripts/train.py on bad input: exit status 2, a message naming the problem, nothing written to the run dir."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def snapshot(directory):
    return sorted((path, os.path.getsize(os.path.join(directory, path))) for path in os.listdir(directory))


def run_train(run_dir, *flags):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"), f"--config.run_dir={run_dir}", *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def malformed_jsonl(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n{not json\n")
    return str(path)


def short_model(tmp_path):
    from mathrl_jax.models import write_tiny_checkpoint

    directory = str(tmp_path / "short_model")
    write_tiny_checkpoint(directory, seed=0, num_hidden_layers=1, max_position_embeddings=32)
    return directory


CASES = {
    "unknown algorithm": (lambda t: ["--config.algorithm_name=ppo2"], "ppo2"),
    "missing dataset": (
        lambda t: ["--config.dataset_name=math500", f"--config.dataset_path={t}/none.jsonl"],
        "none.jsonl",
    ),
    "malformed jsonl": (
        lambda t: ["--config.dataset_name=math500", f"--config.dataset_path={malformed_jsonl(t)}"],
        "line 2",
    ),
    "missing model": (lambda t: [f"--config.model_name_or_path={t}/no_model"], "no_model"),
    "bad mesh": (lambda t: ["--config.mesh.dp=3", "--config.mesh.fsdp=1"], "mesh"),
    "unknown key": (lambda t: ["--config.learning_rate=1e-5"], "learning_rate"),
    "wrong type": (lambda t: ["--config.lr=fast"], "fast"),
    "no KV cache": (lambda t: ["--config.sampler=vllm", "--config.vllm.kv_cache_gib=0"], "vllm.kv_cache_gib=0"),
    "bad engine dtype": (lambda t: ["--config.sampler=vllm", "--config.vllm.dtype=int8"], "'int8'"),
    "bad tis_cap": (lambda t: ["--config.tis_cap=0"], "tis_cap=0"),
    "vllm's sampled-from log-probs as async_ppo's behaviour": (
        lambda t: ["--config.sampler=vllm", "--config.algorithm_name=async_ppo", "--config.temperature=0.7"],
        "temperature=0.7",
    ),
    "vllm with rows over the checkpoint's positions": (
        lambda t: [
            "--config.sampler=vllm",
            f"--config.model_name_or_path={short_model(t)}",
            "--config.max_new_tokens=40",
        ],
        "max_position_embeddings=32",
    ),
    "tis_cap on the decoupled loss": (
        lambda t: ["--config.tis_cap=2", "--config.algorithm_name=async_ppo"],
        "behaviour weight already corrects",
    ),
    "tis_cap with the sampler's old log-probs": (
        lambda t: ["--config.tis_cap=2", "--config.old_logprobs=sampler"],
        "old_logprobs='sampler'",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_with_a_message_and_writes_nothing(case, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("an existing run directory")
    before = snapshot(run_dir)
    flags, expected = CASES[case]
    done = run_train(run_dir, *flags(tmp_path))
    assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
    message = done.stderr.strip().splitlines()
    assert message and message[-1].startswith("train.py: error:"), done.stderr[-2000:]
    assert expected in message[-1]
    assert "Traceback" not in done.stderr
    assert snapshot(run_dir) == before
