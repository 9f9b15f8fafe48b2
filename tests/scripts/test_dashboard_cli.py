"""Issue 48, friction 4: the metrics a TRL / verl user reads, replayed through scripts/train.py on the tiny offline
model. docs/training.md's dashboard command runs (on a small batch) with reward functions of the test's own,
which write down every prompt and completion they score: the new figures in metrics.jsonl are checked against
each other, against the schedule's formula and against the completion table, whose rows are checked against what
the reward functions saw. A run where nothing trains logs no update measurement (it logged entropy_loss 0.0,
grad_norm 0.0 as if measured)."""

import importlib.util
import json
import os
import re
import shlex
import statistics
from collections import defaultdict

import pytest

from tests.scripts.test_train_cli import ROOT, SHORT_RUN, run_train

WANDB = importlib.util.find_spec("wandb") is not None  # the trackers' table too, where wandb is installed
BATCH = 8  # n_rollout_threads 4 x group_size 2 (SHORT_RUN)
UPDATE_MEASUREMENTS = ("train/loss", "train/policy_loss", "train/entropy", "train/grad_norm", "train/approx_kl",
                       "train/importance_weight", "train/clip_fraction", "train/applied_fraction")  # fmt: skip

REWARDS = """
import json

def digits(prompts, completions, **columns):
    with open({log!r}, "a") as f:
        f.write(json.dumps([[p, c] for p, c in zip(prompts, completions)]) + "\\n")
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

def short(prompts, completions, **columns):
    return [1.0 / (1 + len(c)) for c in completions]
"""


def documented_command():
    """docs/training.md's dashboard command, as arguments after scripts/train.py (without its run_dir)."""
    text = open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8").read()
    found = re.search(r"<!-- dashboard:begin -->\n```bash\n(.*?)```\n<!-- dashboard:end -->", text, re.S)
    assert found, "docs/training.md has no dashboard block"
    words = shlex.split(found.group(1).replace("\\\n", " "))
    assert words[:2] == ["python", "scripts/train.py"], words
    return [w for w in words[2:] if not w.startswith("--config.run_dir=")]


def records(run_dir, name):
    with open(os.path.join(run_dir, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_the_dashboard_command_logs_the_figures_trl_and_verl_users_read(tmp_path):
    log = tmp_path / "scored.jsonl"
    (tmp_path / "rewards.py").write_text(REWARDS.format(log=str(log)))
    functions = f"{tmp_path}/rewards.py:digits,{tmp_path}/rewards.py:short"
    flags = (
        documented_command()
        + SHORT_RUN
        + [
            "--config.max_new_tokens=4",
            "--config.num_completions_to_print=8",  # the whole batch: every row is checked
            "--config.reward_source=functions",
            f"--config.reward.functions={functions}",
            "--config.lr=1e-3",
            "--config.lr_schedule=linear",
            "--config.warmup_steps=4",
            "--config.progress=False",
            "--config.report_to=" + ("tensorboard,wandb" if WANDB else "tensorboard"),
        ]
    )
    run_dir = tmp_path / "run"
    done = run_train(run_dir, *flags)
    assert done.returncode == 0, done.stderr[-3000:]

    metrics = {r["step"]: r for r in records(run_dir, "metrics.jsonl")}
    table = defaultdict(list)
    for row in records(run_dir, "completions.jsonl"):
        table[row["step"]].append(row)
    scored = [json.loads(line) for line in log.read_text().splitlines()]  # one call per iteration
    assert sorted(metrics) == sorted(table) == [1, 2, 3] and len(scored) == 3
    for step, m in metrics.items():
        rows = table[step]
        # The table: every response of the batch, as the reward functions scored it, with their summed reward.
        assert [[r["prompt"], r["completion"]] for r in rows] == scored[step - 1] and len(rows) == BATCH
        for r in rows:
            c = r["completion"]
            assert r["reward"] == pytest.approx(sum(ch.isdigit() for ch in c) / max(len(c), 1) + 1 / (1 + len(c)))
            assert 1 <= r["length"] <= 4 and (r["length"] == 4 or not r["truncated"])  # cut at max_new_tokens
        rewards = [r["reward"] for r in rows]
        lengths = [r["length"] for r in rows]
        # The figures, recomputed from the table.
        assert m["rollout/rewards"] == pytest.approx(statistics.mean(rewards), rel=1e-5)
        assert m["rollout/rewards_std"] == pytest.approx(statistics.pstdev(rewards), rel=1e-4, abs=1e-6)
        assert m["rollout/rewards_min"] <= m["rollout/rewards"] <= m["rollout/rewards_max"]
        assert m["rollout/rewards_min"] == pytest.approx(min(rewards)) and m["rollout/rewards_max"] == pytest.approx(
            max(rewards)
        )
        groups = defaultdict(list)
        for i, r in enumerate(rows):
            groups[i // 2].append(r["reward"])  # group_size 2: a prompt's responses are adjacent
        assert all(len({rows[2 * g]["prompt"], rows[2 * g + 1]["prompt"]}) == 1 for g in groups)
        zero = [statistics.stdev(g) <= 1e-8 for g in groups.values()]
        assert 0 <= m["rollout/frac_reward_zero_std"] <= 1
        assert m["rollout/frac_reward_zero_std"] == pytest.approx(statistics.mean(zero))
        assert m["rollout/response_length_min"] <= m["rollout/response_length"] <= m["rollout/response_length_max"]
        assert (m["rollout/response_length_min"], m["rollout/response_length_max"]) == (min(lengths), max(lengths))
        assert m["rollout/truncated_fraction"] == statistics.mean(r["truncated"] for r in rows)
        if m["rollout/truncated_fraction"] < 1:
            kept = [r["length"] for r in rows if not r["truncated"]]
            assert m["rollout/terminated_length"] == pytest.approx(statistics.mean(kept))
        # GRPO's advantages, token-weighted over the response tokens (verl's critic/advantages/*).
        advantages = [r["advantage"] for r in rows]
        weighted = sum(a * n for a, n in zip(advantages, lengths)) / sum(lengths)
        assert m["rollout/advantages_mean"] == pytest.approx(weighted, abs=1e-5)
        assert m["rollout/advantages_min"] == pytest.approx(min(advantages), abs=1e-5)
        assert m["rollout/advantages_max"] == pytest.approx(max(advantages), abs=1e-5)
        assert m["rollout/advantages_std"] >= 0
        # Each reward function's mean and std (TRL's rewards/<name>/mean, /std).
        digit_scores = [sum(ch.isdigit() for ch in r["completion"]) / max(len(r["completion"]), 1) for r in rows]
        assert m["rollout/function/digits"] == pytest.approx(statistics.mean(digit_scores), abs=1e-6)
        assert m["rollout/function_std/digits"] == pytest.approx(statistics.pstdev(digit_scores), abs=1e-6)
        assert "rollout/function_std/short" in m
        # The learning rate of the iteration's one optimizer step: linear warm-up, lr x count / warmup_steps.
        assert m["train/lr"] == pytest.approx(1e-3 * (m["train/update_step"] - 1) / 4, rel=1e-6)
        assert m["perf/host_memory_gb"] > 0 and m["perf/host_memory_peak_gb"] >= m["perf/host_memory_gb"]
        assert "perf/device_memory_gb" not in m  # the CPU backend reports no device memory
        assert "train/entropy_loss" not in m
        if m["train/minibatches_trained"] > 0:
            assert all(name in m for name in UPDATE_MEASUREMENTS) and m["train/entropy"] > 0
        else:
            assert not any(name in m for name in UPDATE_MEASUREMENTS)
    assert any(m["train/minibatches_trained"] > 0 for m in metrics.values()), "nothing trained: the rewards are flat"
    # The trackers: a text summary (the Markdown table, a header, its rule and a line per row) per table.
    from tests.train.reporting.test_metrics import iter_events

    texts = {
        event.step: value.tensor.string_val[0].decode()
        for event in iter_events(str(run_dir))
        for value in event.summary.value
        if value.metadata.plugin_data.plugin_name == "text"
    }
    assert sorted(texts) == [1, 2, 3] and all(len(t.split("\n")) == 2 + BATCH for t in texts.values())
    assert all(table[step][0]["prompt"] in text for step, text in texts.items())
    if WANDB:  # a wandb.Table of the same rows at each step, in the offline run
        import glob

        from tests.train.reporting.test_wandb_logging import wandb_history

        (wandb_run,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
        history = wandb_history(wandb_run)
        paths = {step: v["completions/path"] for step, v in history.items() if "completions/path" in v}
        assert sorted(paths) == [1, 2, 3]
        for step, path in paths.items():
            (stored,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "files" / path))
            written = json.load(open(stored, encoding="utf-8"))
            columns = written["columns"]
            assert [dict(zip(columns, row)) for row in written["data"]] == table[step]


def test_an_iteration_that_trains_nothing_logs_no_update_measurement(tmp_path):
    """The tiny random model answers no arithmetic problem: every reward is 0, every group's std is 0, every
    advantage 0, and skip_zero_advantage (the default) trains no row. The update's figures are absent, not 0."""
    done = run_train(tmp_path / "run", *SHORT_RUN, "--config.max_new_tokens=4", "--config.num_iterations=2")
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = records(tmp_path / "run", "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["rollout/rewards_max"] == 0.0 and m["rollout/frac_reward_zero_std"] == 1.0
        assert m["rollout/advantages_min"] == m["rollout/advantages_max"] == 0.0
        assert m["train/minibatches_trained"] == 0 and m["train/trained_token_fraction"] == 0.0
        assert "train/lr" in m  # the schedule's rate is no measurement: always there
        present = [name for name in (*UPDATE_MEASUREMENTS, "train/entropy_loss") if name in m]
        assert not present, f"step {m['step']} logs update figures measured over nothing: {present}"
