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


SHORT_RUN = [
    "--config.warmstart.steps=0",
    "--config.n_rollout_threads=4",
    "--config.group_size=2",
    "--config.num_mini_batch=1",
    "--config.eval_interval=0",
    "--config.arithmetic.num_train=16",
    "--config.arithmetic.num_eval=4",
    "--config.num_eval_problems=4",
]
"""A run that trains in seconds: no warm-start, one small minibatch, no evaluation (with max_new_tokens and
num_iterations of each test's own)."""


def jsonl_with(tmp_path, name, second_line: bytes):
    path = tmp_path / name
    path.write_bytes(json.dumps({"problem": "1+1?", "answer": "2"}).encode() + b"\n" + second_line + b"\n")
    return str(path)


NOT_UTF8 = b'{"problem": "\xff", "answer": "3"}'
NAN_ANSWER = b'{"problem": "x", "answer": NaN}'


def model_without_tokenizer(tmp_path):
    import shutil

    full, bare = str(tmp_path / "full_model"), tmp_path / "bare_model"
    from mathrl_jax.models import write_tiny_checkpoint

    write_tiny_checkpoint(full, seed=0, num_hidden_layers=1)
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(full, name), bare / name)
    return str(bare)


def small_vocabulary_model(tmp_path):
    from mathrl_jax.models import write_tiny_checkpoint

    directory = str(tmp_path / "small_vocabulary")
    write_tiny_checkpoint(directory, seed=0, num_hidden_layers=1, vocab_size=20)  # the tokenizer's ids reach ~100
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
    "unknown key": (lambda t: ["--config.no_such_option=1"], "--config has no key 'no_such_option'"),
    "a TRL name misspelt": (lambda t: ["--config.learning_rat=1e-5"], "did you mean lr (TRL's learning_rate)"),
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
    # Values that passed or ended in a traceback before (issue 31).
    "lr nan": (lambda t: ["--config.lr=nan"], "lr=nan"),
    "critic_lr inf": (lambda t: ["--config.critic_lr=inf"], "critic_lr=inf"),
    "negative clip_low": (lambda t: ["--config.clip_low=-0.5"], "clip_low=-0.5"),
    "negative kl_coef": (lambda t: ["--config.kl_coef=-1"], "kl_coef=-1"),
    "negative top_k": (lambda t: ["--config.top_k=-5"], "top_k=-5"),
    "no checkpoints kept": (lambda t: ["--config.max_to_keep=0"], "max_to_keep=0"),
    "empty warm-start batch": (lambda t: ["--config.warmstart.batch_size=0"], "warmstart.batch_size=0"),
    "no grader workers": (lambda t: ["--config.reward.num_workers=0"], "reward.num_workers=0"),
    "negative LoRA rank": (lambda t: ["--config.lora.rank=-2"], "lora.rank=-2"),
    "unknown vLLM LoRA sync": (lambda t: ["--config.vllm.lora_sync=both"], "unknown vllm.lora_sync 'both'"),
    "unknown JAX sampler LoRA sync": (
        lambda t: ["--config.jax_sampler.lora_sync=no"],
        "unknown jax_sampler.lora_sync 'no'",
    ),
    "no vLLM workers": (
        lambda t: ["--config.sampler=vllm", "--config.vllm.tensor_parallel_size=0"],
        "vllm.tensor_parallel_size=0",
    ),
    "a server address without its scheme": (
        lambda t: ["--config.sampler=vllm", "--config.vllm.server_url=localhost:8000"],
        "vllm.server_url='localhost:8000'",
    ),
    "a server with the in-process engine's tensor parallelism": (
        lambda t: [
            "--config.sampler=vllm",
            "--config.vllm.server_url=http://127.0.0.1:1",
            "--config.vllm.tensor_parallel_size=2",
        ],
        "a server's tensor parallelism is its own",
    ),
    "no server there": (  # port 1: nothing listens; refused before anything is written
        lambda t: ["--config.sampler=vllm", "--config.vllm.server_url=http://127.0.0.1:1"],
        "the vLLM server at http://127.0.0.1:1 did not answer",
    ),
    "unknown weight transfer": (
        lambda t: ["--config.sampler=vllm", "--config.vllm.transfer=pigeon"],
        "unknown vllm.transfer 'pigeon'",
    ),
    "no time for a server": (lambda t: ["--config.sampler=vllm", "--config.vllm.timeout_s=0"], "vllm.timeout_s=0"),
    "empty transfer chunks": (
        lambda t: ["--config.sampler=vllm", "--config.vllm.transfer_chunk_gib=0"],
        "vllm.transfer_chunk_gib=0",
    ),
    "shared critic base without LoRA": (
        lambda t: ["--config.algorithm_name=ppo", "--config.lora.share_critic_base=True"],
        "no frozen base (rank 0)",
    ),
    "shared critic base without a critic": (
        lambda t: ["--config.lora.rank=4", "--config.lora.share_critic_base=True"],
        "'grpo' with lora.rank=4 has no critic",
    ),
    "LoRA alpha 0": (lambda t: ["--config.lora.rank=4", "--config.lora.alpha=0"], "lora.alpha=0"),
    "unknown LoRA target": (
        lambda t: ["--config.lora.rank=4", "--config.lora.targets=q_proj,qkv_proj"],
        "unknown: qkv_proj",
    ),
    "no grading time": (lambda t: ["--config.reward.timeout_s=0"], "reward.timeout_s=0"),
    "no time for reward functions": (
        lambda t: ["--config.reward.function_timeout_s=0"],
        "reward.function_timeout_s=0",
    ),
    "no arithmetic problems": (lambda t: ["--config.arithmetic.num_train=0"], "arithmetic.num_train=0"),
    "unknown arithmetic level": (lambda t: ["--config.arithmetic.levels=(9,)"], "arithmetic.levels=(9,)"),
    "negative eval count": (lambda t: ["--config.num_eval_problems=-1"], "num_eval_problems=-1"),
    "unknown KL estimator": (lambda t: ["--config.kl_kind=k4", "--config.kl_coef=0.1"], "'k4'"),
    "a data file without its layout": (
        lambda t: [f"--config.dataset_path={t}/problems.jsonl"],
        "dataset_name='arithmetic'",
    ),
    "a reward function that does not load": (
        lambda t: ["--config.reward_source=functions", "--config.reward.functions=no_such_module:score"],
        "cannot load 'no_such_module'",
    ),
    "reward functions without the source that uses them": (
        lambda t: ["--config.reward.functions=my_rewards:score"],
        "reward.functions='my_rewards:score'",
    ),
    "mistyped key": (lambda t: ["--config.num_iteration=3"], "did you mean num_iterations"),
    "jax sampler with rows over the checkpoint's positions": (
        lambda t: [f"--config.model_name_or_path={short_model(t)}", "--config.max_new_tokens=40"],
        "max_position_embeddings=32",
    ),
    "a model without its tokenizer": (
        lambda t: [f"--config.model_name_or_path={model_without_tokenizer(t)}"],
        "encodes text to no tokens",
    ),
    "a tokenizer over the model's vocabulary": (
        lambda t: [f"--config.model_name_or_path={small_vocabulary_model(t)}"],
        "vocab_size=20",
    ),
    "non-UTF-8 data": (
        lambda t: ["--config.dataset_name=math500", "--config.dataset_path=" + jsonl_with(t, "b.jsonl", NOT_UTF8)],
        "line 2: not UTF-8",
    ),
    "a NaN answer": (
        lambda t: ["--config.dataset_name=math500", "--config.dataset_path=" + jsonl_with(t, "n.jsonl", NAN_ANSWER)],
        "line 2: NaN is not a JSON number",
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
    assert "\\n" not in message[-1] and "\\'" not in message[-1]  # one readable line, not an escaped repr
    assert "Traceback" not in done.stderr
    assert snapshot(run_dir) == before


def test_a_config_file_that_does_not_exist_is_one_line(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    flags = [f"--config={tmp_path}/nosuch.py", f"--config.run_dir={tmp_path}/run"]
    script = os.path.join(ROOT, "scripts", "train.py")
    done = subprocess.run([sys.executable, script, *flags], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("train.py: error: cannot load the config")
    assert "nosuch.py" in done.stderr and not (tmp_path / "run").exists()


def test_a_run_dir_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "run"
    path.write_text("not a directory")
    done = run_train(path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "exists and is not a directory" in done.stderr and path.read_text() == "not a directory"


def finished_looking_run(tmp_path, **saved):
    """A run dir as a run leaves it after its first checkpoint: config.json (the default config with `saved`)
    and a step directory."""
    from mathrl_jax.configs import default

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "1").mkdir(parents=True)
    config = default.get_config()
    config.run_dir = str(run_dir)
    config.update(saved)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2, default=str))
    return run_dir


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--config.lr=1e-4"], "lr: 3e-05 -> 0.0001"),
        (["--config.model_name_or_path={other_model}"], "model_name_or_path: '' -> '{other_model}'"),
        (["--config.seed=1"], "seed: 0 -> 1"),
        (["--config.shuffle_rewards=True"], "shuffle_rewards: False -> True"),
    ],
)
def test_resuming_with_settings_that_change_what_is_trained_is_refused(tmp_path, flags, named):
    """Before: only seed, algorithm and shuffle_rewards were compared; another lr or model resumed silently and
    config.json was rewritten to name them."""
    run_dir = finished_looking_run(tmp_path)
    from mathrl_jax.models import write_tiny_checkpoint

    other_model = str(tmp_path / "other_model")
    write_tiny_checkpoint(other_model, seed=1)  # a real checkpoint of the same architecture
    flags, named = [f.format(other_model=other_model) for f in flags], named.format(other_model=other_model)
    before = snapshot(run_dir)
    done = run_train(run_dir, *flags)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert named in done.stderr and "resume_allow_changes" in done.stderr
    assert snapshot(run_dir) == before


def test_resume_allow_changes_names_real_keys(tmp_path):
    run_dir = finished_looking_run(tmp_path)
    done = run_train(run_dir, "--config.lr=1e-4", "--config.resume_allow_changes=lr,learning_rte")
    assert done.returncode == 2 and "['learning_rte'] are not config keys" in done.stderr, done.stderr[-2000:]
    before = snapshot(run_dir)
    done = run_train(run_dir, "--config.resume_allow_changes=lora.share_critic_base")
    assert done.returncode == 2 and "['lora.share_critic_base'] decide what the checkpoint holds" in done.stderr
    assert snapshot(run_dir) == before


def test_a_second_run_on_a_locked_run_dir_is_refused(tmp_path):
    """Before: no lock; the first run died on the second's temporary checkpoint directory."""
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from mathrl_jax.train.setup._run_lock import acquire_run_dir; "
            f"acquire_run_dir({str(run_dir)!r}); print('held', flush=True); time.sleep(120)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        done = run_train(run_dir)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert f"is in use by another run (process {holder.pid} holds" in done.stderr
    finally:
        holder.kill()
        holder.wait()


def test_a_run_whose_every_checkpoint_is_damaged_stops_with_a_message(tmp_path):
    """A checkpoint that fails verification is not trained on; with no intact step left, train.py says so (exit 2)
    rather than a traceback, and the damaged steps are left on disk for the user."""
    from tests.train.checkpoint.test_checkpoint_integrity import flip_a_byte

    run_dir = tmp_path / "run"
    short = [*SHORT_RUN, "--config.max_new_tokens=4", "--config.save_interval=1", "--config.num_iterations=2"]
    short.append("--config.progress=False")
    done = run_train(run_dir, *short)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = sorted(int(name) for name in os.listdir(run_dir / "checkpoints") if name.isdigit())
    assert steps == [1, 2]
    for step in steps:
        flip_a_byte(str(run_dir / "checkpoints"), step)
    longer = [flag for flag in short if "num_iterations" not in flag] + ["--config.num_iterations=3"]
    done = run_train(run_dir, *longer)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "no intact checkpoint in" in done.stderr.strip().splitlines()[-1]
    assert sorted(int(n) for n in os.listdir(run_dir / "checkpoints") if n.isdigit()) == steps


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_option_with_its_value_and_meaning(flag, tmp_path):
    """Before: `Unknown command line flag 'help'`. Each option appears once, under its section, with the value of
    the config given (a recipe's own) and the meaning written beside it in configs/default.py."""
    import importlib

    from mathrl_jax.configs import default
    from mathrl_jax.train.setup._validation import flat_items

    recipe = "mathrl_jax/configs/grpo_qwen_math.py"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    script = os.path.join(ROOT, "scripts", "train.py")
    for config_flags, config in (([], default.get_config()), ([f"--config={recipe}"], None)):
        if config is None:
            config = importlib.import_module("mathrl_jax.configs.grpo_qwen_math").get_config()
        done = subprocess.run(
            [sys.executable, script, *config_flags, flag], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        for key, value in flat_items(config):
            assert done.stdout.count(f"  --config.{key}={value!r}\n") == 1, key
    assert "--config.lr=1e-06" in done.stdout  # the recipe's value, not the default's
    assert '"" = the tiny offline model (written to run_dir)' in " ".join(done.stdout.split())
    assert "\nmodel:\n" in done.stdout and "\nupdate:\n" in done.stdout


def test_the_readmes_reward_functions_command_trains(tmp_path):
    """The README's `--config.reward.functions=examples/my_rewards.py:...` command (shortened: no warm-start, two
    small iterations): it runs, and logs each function's mean beside the verifier's accuracy, nothing NaN."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = readme[readme.index("python scripts/train.py --config.reward_source=verifier+functions") :]
    flags = [f for f in block[: block.index("```")].replace("\\\n", " ").split()[2:]]
    assert flags[0] == "--config.reward_source=verifier+functions", flags
    assert "--config.run_dir=runs/my_rewards" in flags  # its own, not command 1's runs/default: here, the test's
    flags = [f for f in flags if not f.startswith("--config.run_dir=")]
    short = [*SHORT_RUN, "--config.max_new_tokens=8", "--config.num_iterations=2"]
    done = run_train(tmp_path / "run", *flags, *short)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    trained = [r for r in records if "train/update_step" in r]  # each iteration, whether a token trained or not
    assert len(trained) == 2 and all(r["rollout/accuracy"] is not None for r in trained)
    assert all(0.0 <= r["rollout/function/boxed_once"] <= 1.0 and 0.0 < r["rollout/function/brevity"] for r in trained)
    assert not [(r["step"], k) for r in records for k, v in r.items() if v is None]


MISBEHAVING_REWARDS = """
def huge(prompts, completions, **columns):
    return [1e39] * len(completions)  # finite in float64, inf in float32


def as_dict(prompts, completions, **columns):
    return {i: 1.0 for i in range(len(completions))}


def hangs(prompts, completions, **columns):
    while True:
        pass
"""


@pytest.mark.parametrize(
    "function, flags, named",
    [
        ("huge", [], "returned [1e+39, 1e+39, 1e+39, 1e+39, 1e+39, 1e+39, ...], whose entry 0 (1e+39) is non-finite"),
        ("as_dict", [], "returned a dict ({0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, ...})"),
        ("hangs", ["--config.reward.function_timeout_s=2"], "did not return within 2 s (reward.function_timeout_s)"),
    ],
)
def test_a_reward_function_with_a_bad_result_or_a_hang_stops_the_run_naming_it(tmp_path, function, flags, named):
    """A result that is not one float32-finite number per completion, or a call past reward.function_timeout_s:
    exit 2 at the first iteration, one line naming the function and the value, no final model exported (issue 45:
    1e39 skipped every update and exported the initial model, a dict trained on its keys, a hang never ended)."""
    module = tmp_path / "misbehaving.py"
    module.write_text(MISBEHAVING_REWARDS)
    spec = f"{module}:{function}"
    short = [*SHORT_RUN, "--config.max_new_tokens=4", "--config.num_iterations=2"]
    done = run_train(
        tmp_path / "run", "--config.reward_source=functions", f"--config.reward.functions={spec}", *short, *flags
    )
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-3000:])
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith(f"train.py: error: iteration 1: reward function {spec!r} "), done.stderr[-3000:]
    assert named in message, message
    assert "Traceback" not in done.stderr and not (tmp_path / "run" / "final_model").exists()


def fill_hub_cache(cache, repo_id, revision="0123456789abcdef0123456789abcdef01234567"):
    """A local Hugging Face Hub cache holding `repo_id` as `hf download` leaves it: snapshots/<revision>/ and
    refs/main naming that revision (the tiny model stands in for the repository's files)."""
    from mathrl_jax.models import write_tiny_checkpoint

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    write_tiny_checkpoint(str(repo / "snapshots" / revision), seed=0, num_hidden_layers=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return repo / "snapshots" / revision


def fill_hub_dataset_cache(cache, repo_id, splits, revision="89abcdef0123456789abcdef0123456789abcdef"):
    """A dataset repository as `hf download --repo-type dataset` leaves it in the cache: one `<split>.jsonl` per
    split (MATH-500's layout) in snapshots/<revision>/, refs/main naming that revision."""
    snapshot = cache / f"datasets--{repo_id.replace('/', '--')}" / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for split, problems in splits.items():
        with open(snapshot / f"{split}.jsonl", "w") as f:
            for i, (question, answer) in enumerate(problems):
                f.write(json.dumps({"problem": question, "answer": answer, "unique_id": f"{split}{i}"}) + "\n")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(revision)
    return snapshot


def test_a_dataset_named_by_hub_id_is_found_in_the_local_cache_offline(tmp_path, monkeypatch):
    """`--config.dataset_path=org/name` reads that dataset repository's snapshot from the local Hub cache (offline),
    its train split for training and its test split for evaluation; one the cache lacks is refused, before anything
    is written, with the command that fetches it."""
    cache = tmp_path / "hub"
    sums = [(f"{a}+{b}=", str(a + b)) for a in range(1, 9) for b in range(1, 9)]
    snapshot = fill_hub_dataset_cache(cache, "tiny-org/tiny-sums", {"train": sums[:48], "test": sums[48:]})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    short = [*SHORT_RUN, "--config.max_new_tokens=4", "--config.num_iterations=1", "--config.dataset_name=math500"]
    both = ["--config.dataset_path=tiny-org/tiny-sums", "--config.eval_dataset_path=tiny-org/tiny-sums"]
    unsplit = run_train(tmp_path / "run0", *both, *short)
    assert unsplit.returncode == 2 and "--config.dataset_split" in unsplit.stderr, unsplit.stderr[-2000:]
    splits = ["--config.dataset_split=train", "--config.eval_dataset_split=test"]
    done = run_train(tmp_path / "run", *both, *splits, *short)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert os.path.samefile(saved["dataset_path"], snapshot) and os.path.samefile(saved["eval_dataset_path"], snapshot)
    missing = run_train(tmp_path / "run2", "--config.dataset_path=tiny-org/not-downloaded", *short)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr[-2000:]
    assert "hf download tiny-org/not-downloaded --repo-type dataset" in missing.stderr
    assert not (tmp_path / "run2").exists()


def test_a_model_named_by_hub_id_is_found_in_the_local_cache_offline(tmp_path, monkeypatch):
    """`--config.model_name_or_path=org/name` resolves through the local Hub cache (offline: HF_HUB_OFFLINE=1, and
    a run never downloads); an id the cache lacks is refused with how to fetch it."""
    cache = tmp_path / "hub"
    snapshot = fill_hub_cache(cache, "tiny-org/tiny-qwen")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    short = [*SHORT_RUN, "--config.max_new_tokens=4", "--config.num_iterations=1"]
    done = run_train(tmp_path / "run", "--config.model_name_or_path=tiny-org/tiny-qwen", *short)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert os.path.samefile(saved["model_name_or_path"], snapshot)
    missing = run_train(tmp_path / "run2", "--config.model_name_or_path=tiny-org/not-downloaded", *short)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr[-2000:]
    assert "nor in the local Hugging Face cache" in missing.stderr and "hf download tiny-org/not-downloaded" in (
        missing.stderr
    )
    assert not (tmp_path / "run2").exists()
