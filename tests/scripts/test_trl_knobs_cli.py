"""TRL's knobs and reward-function convention through `scripts/train.py` (issue 48, frictions 8 and 9): GSPO and
TRL's `loss_type` names, `mask_truncated_completions`, `lora.dropout`, reward functions that take TRL's
`completion_ids` / `trainer_state` and open-r1's `solution`, and reward functions given in Python beside the
default verifier. Each was refused, ignored or wrong before its fix."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.scripts.test_train_cli import ROOT, SHORT_RUN, run_train

REWARDS = r'''
import json, os

LOG = os.environ["TRL_KNOBS_LOG"]


def trl_style(prompts, completions, completion_ids, trainer_state, **kwargs):
    """TRL calls every reward function with these; the reward spreads the samples (a non-zero advantage)."""
    with open(LOG + ".trl", "a") as f:
        f.write(json.dumps(dict(
            completions=completions,
            completion_ids=completion_ids,
            state=[trainer_state.global_step, trainer_state.epoch, trainer_state.max_steps],
        )) + "\n")
    return [float(sum(ids) % 5) for ids in completion_ids]


def accuracy_reward(completions, solution, **kwargs):
    """open-r1's accuracy_reward: the gold `solution` parsed with math-verify, the completion verified against it."""
    from math_verify import parse, verify

    rewards, parsed = [], []
    for content, sol in zip(completions, solution):
        gold = parse(sol, extraction_mode="first_match")
        parsed.append([str(g) for g in gold])
        rewards.append(float(verify(gold, parse(content))) if gold else None)
    with open(LOG + ".accuracy", "a") as f:
        f.write(json.dumps(dict(
            solution=solution, parsed=parsed, question=kwargs["question"], answer=kwargs["answer"],
            ground_truth=kwargs["ground_truth"], worked_solution=kwargs["worked_solution"],
        )) + "\n")
    return rewards
'''


def records(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def trained(run_dir):
    return [r for r in records(run_dir) if "rollout/truncated_fraction" in r]


def run_with_rewards(tmp_path, name, *flags):
    module = tmp_path / "trl_rewards.py"
    module.write_text(REWARDS)
    os.environ["TRL_KNOBS_LOG"] = str(tmp_path / name)
    try:
        done = run_train(
            tmp_path / name,
            *SHORT_RUN,
            "--config.reward_source=functions",
            f"--config.reward.functions={module}:trl_style,{module}:accuracy_reward",
            "--config.skip_zero_advantage=False",
            *flags,
        )
    finally:
        del os.environ["TRL_KNOBS_LOG"]
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / name


@pytest.fixture(scope="module")
def truncation_runs(tmp_path_factory):
    """The same 3-iteration run with and without `mask_truncated_completions`, at a budget of 2 new tokens (nearly
    every completion of the untrained model is cut there)."""
    tmp_path = tmp_path_factory.mktemp("truncation")
    short = ["--config.max_new_tokens=2", "--config.num_iterations=3"]
    masked = run_with_rewards(tmp_path, "masked", *short, "--config.mask_truncated_completions=True")
    kept = run_with_rewards(tmp_path, "kept", *short)
    return masked, kept


def test_mask_truncated_completions_takes_cut_completions_out_of_the_loss(truncation_runs):
    """TRL's mask_truncated_completions (friction 8; the option was read by nothing): an iteration whose every
    completion was cut at max_new_tokens trains nothing with it (no minibatch trains a token) and trains without
    it; one with an ended completion still trains. The cut completions still count in the rewards' statistics:
    the first iteration, sampled before any update, logs the same rewards in both runs."""
    masked, kept = (trained(run) for run in truncation_runs)
    assert len(masked) == len(kept) == 3
    assert masked[0]["rollout/rewards"] == kept[0]["rollout/rewards"]
    assert masked[0]["rollout/truncated_fraction"] == kept[0]["rollout/truncated_fraction"]
    all_cut = [r for r in masked if r["rollout/truncated_fraction"] == 1.0]
    assert all_cut, [r["rollout/truncated_fraction"] for r in masked]  # the budget cuts every completion at least once
    for r in masked:
        expected = 0 if r["rollout/truncated_fraction"] == 1.0 else 1
        assert (r["train/minibatches_trained"] > 0) == bool(expected), r
        assert ("train/policy_loss" in r) == bool(expected), r
    assert all(r["train/minibatches_trained"] > 0 and np.isfinite(r["train/policy_loss"]) for r in kept)


def test_trl_style_reward_functions_get_completion_ids_and_trainer_state(truncation_runs):
    """Friction 9: a function declaring TRL's `completion_ids` and `trainer_state` was called without them
    (TypeError after the first generation). Now the ids are each completion's tokens (they decode, with the
    checkpoint's own tokenizer, to the completion text), and the state's global_step counts the updates done
    before the batch (0, 1, 2), max_steps the run's iterations, epoch the passes over the 16 training problems
    (4 per iteration)."""
    _, kept = truncation_runs
    calls = [json.loads(line) for line in open(str(kept) + ".trl")]
    assert len(calls) == 3
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(kept, "final_model"))
    for step, call in enumerate(calls):
        assert call["state"] == [step, step * 4 / 16, 3]
        assert len(call["completion_ids"]) == len(call["completions"]) == 8
        for ids, text in zip(call["completion_ids"], call["completions"]):
            assert 1 <= len(ids) <= 2 and all(isinstance(t, int) for t in ids)
            assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_an_open_r1_accuracy_reward_gets_the_gold_answer_as_solution(truncation_runs):
    """open-r1's `accuracy_reward(completions, solution)` parses `solution` with math-verify: it is the gold final
    answer (as are `answer` and `ground_truth`; the worked solution is `worked_solution`), here the value of each
    arithmetic question's expression, computed from the question's text."""
    _, kept = truncation_runs
    calls = [json.loads(line) for line in open(str(kept) + ".accuracy")]
    assert len(calls) == 3
    for call in calls:
        assert call["solution"] == call["answer"] == call["ground_truth"]
        for question, solution, parsed in zip(call["question"], call["solution"], call["parsed"]):
            expression = re.fullmatch(r"([\d+\-*]+)=", question).group(1)  # the offline default: "57-83="
            assert solution == str(eval(expression)), (question, solution)  # digits and + - * only
            assert parsed and float(parsed[0]) == float(solution), (solution, parsed)


LORA_RUN = [
    *SHORT_RUN,
    "--config.max_new_tokens=4",
    "--config.num_iterations=2",
    "--config.lora.rank=4",
    "--config.lora.targets=all-linear",
    "--config.lr=1e-2",
    "--config.algorithm_name=gspo",
    "--config.loss_type=dr_grpo",  # TRL's name and value
    "--config.epsilon=3e-4",  # TRL's names of clip_low / clip_high
    "--config.epsilon_high=4e-4",
]


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory):
    """GSPO with TRL's dr_grpo aggregation on LoRA adapters, without and with PEFT's lora_dropout."""
    tmp_path = tmp_path_factory.mktemp("lora")
    runs = {}
    for rate in ("0.0", "0.5"):
        run_dir = run_with_rewards(tmp_path, rate, *LORA_RUN, f"--config.lora.dropout={rate}")
        config = json.load(open(run_dir / "config.json"))
        assert config["algorithm_name"] == "gspo" and config["lora"]["dropout"] == float(rate), config
        # TRL's loss_type dr_grpo is saved as the mode it means; epsilon / epsilon_high reached the clip range.
        assert config["loss_agg_mode"] == "seq-mean-token-sum-norm", config["loss_agg_mode"]
        assert (config["clip_low"], config["clip_high"]) == (3e-4, 4e-4)
        runs[rate] = trained(run_dir)
    return runs


def test_gspo_and_trls_loss_type_names_train(lora_runs):
    """`algorithm_name=gspo` and `loss_agg_mode=dr_grpo` (TRL's loss_type) were refused as unknown names (friction
    8): the run trains (every update a finite loss, a minibatch that trained)."""
    for r in lora_runs["0.0"]:
        assert np.isfinite(r["train/policy_loss"]) and r["train/minibatches_trained"] > 0, r


def test_lora_dropout_changes_the_update_and_not_the_sampling(lora_runs):
    """PEFT's lora_dropout (friction 8; the option was read by nothing): with p = 0.5 the first update, made from
    the same rollouts (sampling has no dropout: same rewards, same lengths), takes another gradient than p = 0
    (fresh adapters have B = 0, so the loss itself is the same; B's gradient is A dropout(x) times the output's)."""
    plain, dropped = lora_runs["0.0"], lora_runs["0.5"]
    assert len(plain) == len(dropped) == 2
    for key in ("rollout/rewards", "rollout/response_length"):
        assert plain[0][key] == dropped[0][key], key
    assert plain[0]["train/policy_loss"] == dropped[0]["train/policy_loss"]
    assert abs(plain[0]["train/grad_norm"] - dropped[0]["train/grad_norm"]) > 1e-6 * plain[0]["train/grad_norm"]
    assert np.isfinite(dropped[0]["train/policy_loss"]) and np.isfinite(dropped[1]["train/policy_loss"])


def test_lora_dropout_without_adapters_is_refused(tmp_path):
    done = run_train(tmp_path / "run", *SHORT_RUN, "--config.lora.dropout=0.1")
    assert done.returncode == 2 and not (tmp_path / "run").exists(), done.stderr[-2000:]
    assert "lora.dropout=0.1" in done.stderr.strip().splitlines()[-1]


USER_SCRIPT = """
import json, sys
from mathrl_jax.configs import default
from mathrl_jax.train import loop


def longer(prompts, completions, completion_ids, trainer_state, **kwargs):
    return [len(ids) / 10 for ids in completion_ids]


config = default.get_config()
config.run_dir = sys.argv[1]
for flag in sys.argv[2:]:
    key, value = flag.removeprefix("--config.").split("=")
    target = config
    *parents, leaf = key.split(".")
    for parent in parents:
        target = target[parent]
    target[leaf] = type(target[leaf])(value)
history = []
loop.train(config, reward_functions=[longer], on_metrics=lambda i, m: history.append(m))
print(json.dumps(history))
"""


def test_python_reward_functions_beside_the_default_verifier_add_to_it_and_say_so(tmp_path):
    """A user's script passing `reward_functions=` with reward_source left at "verifier" (friction 9): the functions
    silently replaced the verifier. Now they add to it (the verifier still grades: accuracy is logged, and the
    reward is the accuracy plus the function's mean) and one line says so."""
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    flags = [*SHORT_RUN, "--config.max_new_tokens=4", "--config.num_iterations=1"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run"), *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    notes = [line for line in done.stderr.splitlines() if "reward_source='verifier+functions'" in line]
    assert len(notes) == 1, done.stderr[-3000:]
    (metrics,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert metrics["rollout/accuracy"] is not None
    assert metrics["rollout/rewards"] == pytest.approx(
        metrics["rollout/function/longer"] + metrics["rollout/accuracy"], abs=1e-6
    )
