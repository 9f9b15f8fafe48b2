"""Every recipe file in mathrl_jax/configs runs through scripts/train.py as the README writes it, on tiny local
stand-ins made here: a Qwen2 policy (and a Qwen3 one for the game), a PRM, and data in each recipe's layout.

Only the overrides that make a run short are added (iterations, batch and generation sizes), plus the local
paths. A recipe that names vLLM runs on the real engine (its CPU build here) with a KV cache sized for this
machine (`--config.vllm.kv_cache_gib`; the recipe's is a GPU's). One exception: the stand-in PRM's
character tokenizer has no `ки`, OpenR's step tag, so the OpenR recipes tag steps with `@`. The GRPO recipe
runs in the default test set; the others are `slow`.
"""

import importlib
import json
import os
import subprocess
import sys
import time

import pytest

from mathrl_jax.models import write_tiny_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "mathrl_jax", "configs")
SHORT = [
    "--config.num_iterations=2",
    "--config.n_rollout_threads=4",
    "--config.max_new_tokens=16",
    "--config.max_prompt_length=256",
    "--config.progress=False",
]

CPU_ENGINE = ["--config.vllm.kv_cache_gib=0.25"]  # the recipes' KV cache is a GPU's


def math_rows(n=24):
    return [
        {
            "problem": f"What is {a} plus {a + 1}?",
            "answer": str(2 * a + 1),
            "solution": f"{a}+{a + 1}={2 * a + 1}, so \\boxed{{{2 * a + 1}}}.",
            "subject": ("Prealgebra", "Algebra", "Counting & Probability")[a % 3],
            "level": 1 + a % 5,
            "unique_id": f"test/prealgebra/{a}.json",
        }
        for a in range(n)
    ]


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes")
    paths = {"policy": str(root / "policy"), "qwen3": str(root / "qwen3"), "data": {}}
    write_tiny_checkpoint(paths["policy"], seed=0, num_hidden_layers=1)
    write_tiny_checkpoint(
        paths["qwen3"], seed=1, num_hidden_layers=1, architecture="Qwen3ForCausalLM", qk_norm=True, attention_bias=False
    )
    rows = math_rows()
    math500 = root / "math500.jsonl"
    math500.write_text("".join(json.dumps(r) + "\n" for r in rows))
    openr = root / "openr_math_500.jsonl"  # OpenR's copy: problem + final_answer
    openr.write_text("".join(json.dumps({"problem": r["problem"], "final_answer": r["answer"]}) + "\n" for r in rows))
    boba = root / "boba.jsonl"
    boba.write_text(
        "".join(
            json.dumps({"prompt": r["problem"], "solutions": [r["solution"]], "query_id": str(i)}) + "\n"
            for i, r in enumerate(rows)
        )
    )
    import datasets

    verl = str(root / "dapo_math.parquet")
    datasets.Dataset.from_list(
        [
            {
                "data_source": "math_dapo",
                "prompt": [{"role": "user", "content": r["problem"]}],
                "ability": "MATH",
                "reward_model": {"ground_truth": r["answer"], "style": "rule"},
                "extra_info": {"index": str(i)},
            }
            for i, r in enumerate(rows)
        ]
    ).to_parquet(verl)
    paths["data"] = {"math500": str(math500), "openr": str(openr), "boba": str(boba), "verl": verl}
    return paths


def recipe_flags(name, stand_ins):
    policy = f"--config.model_name_or_path={stand_ins['policy']}"
    data = stand_ins["data"]
    # OpenR's seed command: its upper-case algorithm name and a MATH subject as dataset_name (MATH-500 layout with
    # subjects for APPO; OpenR's own subject-less copy for TPPO, used whole as OpenR does).
    openr = [
        policy,
        f"--config.prm_model_name_or_path={stand_ins['policy']}",
        "--config.dataset_name=prealgebra",
        "--config.prm.step_tag=@",
        "--config.num_env_steps=64",  # 2 iterations of 4 answers x 8 steps
    ]
    return {
        "grpo_qwen_math": [policy, f"--config.dataset_path={data['math500']}", *CPU_ENGINE],
        "dapo_qwen_math": [policy, f"--config.dataset_path={data['verl']}", *CPU_ENGINE],
        "areal_async": [policy, f"--config.dataset_path={data['boba']}", *CPU_ENGINE],
        "openr_appo": [*openr, "--config.algorithm_name=APPO", f"--config.dataset_path={data['math500']}"],
        "openr_tppo": [*openr, "--config.algorithm_name=TPPO", f"--config.dataset_path={data['openr']}"],
        "gem_guess_number": [f"--config.model_name_or_path={stand_ins['qwen3']}", "--config.n_rollout_threads=2"],
    }[name]


RECIPES = sorted(f[:-3] for f in os.listdir(CONFIGS) if f.endswith(".py") and f not in ("__init__.py", "default.py"))


def test_every_recipe_file_is_covered():
    assert set(RECIPES) == {
        "grpo_qwen_math",
        "dapo_qwen_math",
        "areal_async",
        "openr_appo",
        "openr_tppo",
        "gem_guess_number",
    }


@pytest.mark.parametrize(
    "name", [r if r == "grpo_qwen_math" else pytest.param(r, marks=pytest.mark.slow) for r in RECIPES]
)
def test_recipe_runs_to_the_end(name, stand_ins, tmp_path):
    run_dir = tmp_path / name
    command = [
        sys.executable,
        os.path.join(ROOT, "scripts", "train.py"),
        f"--config={os.path.join(CONFIGS, name + '.py')}",
        f"--config.run_dir={run_dir}",
        *SHORT,
        *recipe_flags(name, stand_ins),
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    steps = sorted({r["step"] for r in records if "train/policy_loss" in r})
    assert steps == [1, 2], steps
    assert all(r["train/policy_loss"] is not None for r in records if "train/policy_loss" in r)
    assert os.path.isdir(run_dir / "checkpoints") and os.path.isdir(run_dir / "final_model")
    saved = json.load(open(run_dir / "config.json"))  # the recipe's own settings, not the default's
    recipe = importlib.import_module(f"mathrl_jax.configs.{name}").get_config()
    for key in ("algorithm_name", "prompt_template", "lr", "loss_agg_mode", "remat", "sampler"):
        assert saved[key] == recipe[key], key
    if recipe["sampler"] == "vllm":  # the engine sampled, and was synced from the trainer every iteration
        synced = [r for r in records if "perf/sync_time" in r]
        assert len(synced) == 2 and all(r["perf/sync_time"] > 0 for r in synced)
        assert all(r["rollout/sampler_logprob_diff"] < 0.1 for r in records if "rollout/sampler_logprob_diff" in r)


def _last_record_of_each_step(run_dir):
    records = {}
    for line in open(run_dir / "metrics.jsonl"):
        record = json.loads(line)
        if "train/policy_loss" in record:
            records[record["step"]] = record  # a resumed run logs again the steps after its checkpoint
    return records


@pytest.mark.slow
def test_a_killed_areal_async_run_resumes_byte_identical(stand_ins, tmp_path):
    """SIGKILL once the first checkpoint is complete, while the generator has batches in flight; the same command
    again resumes, and the final model is byte for byte the uninterrupted run's."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")

    def command(run_dir):
        return [
            sys.executable,
            os.path.join(ROOT, "scripts", "train.py"),
            f"--config={os.path.join(CONFIGS, 'areal_async.py')}",
            f"--config.run_dir={run_dir}",
            *SHORT,
            *recipe_flags("areal_async", stand_ins),
            "--config.num_iterations=8",
            "--config.save_interval=2",
            "--config.eval_interval=0",
            # The random stand-in never earns a reward (zero advantages); an entropy bonus gives every batch a
            # gradient of its own, and a larger lr makes it move bf16 weights (1e-6 leaves them as they are).
            "--config.entropy_coef=0.01",
            "--config.lr=1e-3",
        ]

    straight = tmp_path / "straight"
    done = subprocess.run(command(straight), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    process = subprocess.Popen(command(killed), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    checkpoints = killed / "checkpoints"
    while not (checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())):
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        time.sleep(0.05)
    process.kill()
    process.wait()
    assert not (killed / "final_model").exists()  # it did not get to the end
    done = subprocess.run(command(killed), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    final = (straight / "final_model" / "model.safetensors").read_bytes()
    assert final != open(os.path.join(stand_ins["policy"], "model.safetensors"), "rb").read()  # it trained
    assert (killed / "final_model" / "model.safetensors").read_bytes() == final
    a, b = _last_record_of_each_step(straight), _last_record_of_each_step(killed)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in a:
        for key in ("train/policy_loss", "rollout/rewards", "async/staleness", "async/policy_version"):
            assert a[step][key] == b[step][key], (step, key)
