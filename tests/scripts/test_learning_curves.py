"""scripts/learning_curves.py: a seed run and its control end to end (tiny config), and the table / plot of
hand-written metrics checked against values computed here."""

from __future__ import annotations

import filecmp
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "learning_curves.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# About 35 s for the seed run and 10 s for its control on 2 CPU cores: one or two RL iterations, few problems,
# short completions, no logged samples; the control reuses the seed's compilations (the script's JAX cache).
TINY = [
    "--config.warmstart.steps=5",
    "--config.warmstart.batch_size=8",
    "--config.num_iterations=2",
    "--config.eval_interval=1",
    "--config.n_rollout_threads=2",
    "--config.group_size=2",
    "--config.num_mini_batch=1",
    "--config.arithmetic.num_train=100",
    "--config.arithmetic.num_eval=8",
    "--config.num_eval_problems=8",
    "--config.eval_n_samples=2",
    "--config.num_logged_samples=0",
    "--config.max_new_tokens=8",
    "--config.save_interval=0",
    "--config.export_final=False",
]


def load_script():
    from benchmarks import learning_curves

    return learning_curves


def run_script(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the script's own cache, under --out
    return subprocess.run(
        [sys.executable, SCRIPT, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def merged_steps(run_dir):
    """{step: the merged metrics of its lines} straight from metrics.jsonl, later lines winning."""
    steps = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                steps.setdefault(record["step"], {}).update(record)
    return steps


def table_row(markdown, first_cell):
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in\n{markdown}")


def check_png(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000, len(data)


def test_a_seed_and_its_control_end_to_end(tmp_path):
    out = tmp_path / "curves"
    args = ["--seeds", "0", "--out", str(out), "--xla-flags", "--xla_force_host_platform_device_count=1"]
    args += ["--progress-every-s", "0.5", "--"]
    result = run_script(*args, *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    # Progress while a run trains (before: silent for minutes per run).
    assert "seed0: warm-start and compiling (" in result.stdout or "seed0: iteration " in result.stdout
    check_png(out / "curves.png")
    markdown = (out / "curves.md").read_text()
    assert markdown.split("\n\n")[0] in result.stdout  # the table is printed too
    assert "[1/2] seed0: " in result.stdout and "[2/2] control0: " in result.stdout  # the sweep's progress
    check_png(out / "mean_curves.png")
    # 3 evaluations (0, 1, 2): too few to fit a sigmoid, said in the per-run table
    assert table_row(markdown, "seed0")[7].startswith("too few points") and "Over seeds:" in markdown

    seed_dir, control_dir = out / "seed0", out / "control0"
    seed, control = merged_steps(seed_dir), merged_steps(control_dir)
    assert max(seed) == max(control) == 2
    statistics = json.loads((out / "statistics.json").read_text())  # the same statistics, as JSON
    assert statistics["rows"][0]["seeds"][0]["run"]["curve"] == [[s, seed[s]["eval/accuracy"]] for s in (0, 1, 2)]
    start, end = seed[0]["eval/accuracy"], seed[2]["eval/accuracy"]
    control_start, control_end = control[0]["eval/accuracy"], control[2]["eval/accuracy"]
    cells = table_row(markdown, "0")
    assert cells[1] == f"{seed[0]['warmstart/eval_accuracy_after']:.3f}"
    assert cells[2:7] == [
        f"{start:.3f}",
        f"{end:.3f}",
        f"{end - start:+.3f}",
        f"{control_end:.3f}",
        f"{control_end - control_start:+.3f}",
    ]
    assert cells[7] == f"{seed[0]['eval/pass@1']:.3f} -> {seed[2]['eval/pass@1']:.3f}"
    assert cells[8] == f"{seed[0]['eval/pass@2']:.3f} -> {seed[2]['eval/pass@2']:.3f}"  # eval_n_samples=2
    assert "pass@2 start -> end" in markdown and "T=1 acc" in markdown
    run_seconds, control_seconds = (float(s) for s in cells[9].split(" / "))
    assert run_seconds > 0 and control_seconds > 0

    # The control: the seed's starting models, the shuffled rewards, no warm-start of its own.
    for name in ("initial_model", "warmstart_model"):
        comparison = filecmp.dircmp(seed_dir / name, control_dir / name)
        assert comparison.left_list and not (comparison.diff_files or comparison.left_only or comparison.right_only)
    assert json.loads((control_dir / "config.json").read_text())["shuffle_rewards"] is True
    assert json.loads((seed_dir / "config.json").read_text())["shuffle_rewards"] is False
    assert all("warmstart/seconds" not in metrics for metrics in control.values())
    assert "warmstart/seconds" in seed[0]

    # The same command again reads the finished runs instead of training.
    again = run_script(*args, *TINY)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already finished by the same command") == 2
    assert (out / "curves.md").read_text() == markdown
    assert merged_steps(seed_dir) == seed


def test_a_failing_run_is_named_with_its_stderr(tmp_path):
    result = run_script("--seeds", "3", "--out", str(tmp_path), "--", "--config.lr=fast")
    assert result.returncode != 0
    assert "the seed3 run" in result.stderr and "fast" in result.stderr  # train.py's own message, in the tail
    assert not (tmp_path / "curves.md").exists()


def write_run(run_dir, records, **config):
    run_dir.mkdir(parents=True)
    config = {"num_iterations": 4, "num_env_steps": 0, "eval_n_samples": 4, "temperature": 1.0, **config}
    (run_dir / "config.json").write_text(json.dumps({"num_eval_problems": 50, **config}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def eval_record(step, accuracy, sampled=None, pass4=None):
    record = {"step": step, "time": 0.0, "eval/accuracy": accuracy}
    if sampled is not None:
        record.update({"eval/pass@1": sampled, "eval/pass@2": 0.9, "eval/pass@4": pass4})
    return record


def test_read_run_and_markdown_table_on_hand_written_metrics(tmp_path):
    module = load_script()
    warm = {"step": 0, "time": 0.0, "warmstart/eval_accuracy_before": 0.1, "warmstart/eval_accuracy_after": 0.4}
    warm["warmstart/seconds"] = 12.0
    train_line = {"step": 1, "time": 0.0, "rollout/accuracy": 0.3}
    curves = {  # seed: (greedy accuracies at steps 0, 2, 4; control's)
        0: ([0.40, 0.46, 0.52], [0.40, 0.38, 0.42]),
        1: ([0.30, 0.30, 0.29], [0.30, 0.31, 0.27]),
    }
    rows = []
    for seed, (accuracies, control_accuracies) in curves.items():
        records = [warm, eval_record(0, accuracies[0], 0.35, 0.6), train_line, eval_record(2, 0.0)]
        # A resumed run logs step 2 again: the later line is the one that counts.
        records += [eval_record(2, accuracies[1]), eval_record(4, accuracies[2], 0.45, 0.7)]
        write_run(tmp_path / f"seed{seed}", records)
        control = [eval_record(0, control_accuracies[0], 0.35, 0.6), eval_record(2, control_accuracies[1])]
        write_run(tmp_path / f"control{seed}", [*control, eval_record(4, control_accuracies[2], 0.3, 0.5)])
        rows.append(
            {
                "seed": seed,
                "run": dict(module.read_run(str(tmp_path / f"seed{seed}")), wall_seconds=100.0 + seed),
                "control": dict(module.read_run(str(tmp_path / f"control{seed}")), wall_seconds=50.4),
            }
        )

    run = rows[0]["run"]
    assert run["curve"] == [(0, 0.40), (2, 0.46), (4, 0.52)]
    assert run["rl_gain"] == pytest.approx(0.12) and run["finished"] and run["pass_k"] == 4
    assert (run["pass_at_k_start"], run["pass_at_k_end"]) == (0.6, 0.7)
    assert rows[0]["control"]["warmstart_after"] is None  # the control's warm-start is its seed's

    markdown = module.markdown_table(rows)
    assert "pass@4 start -> end" in markdown and "T=1 acc start -> end" in markdown
    assert table_row(markdown, "0") == [
        "0", "0.400", "0.400", "0.520", "+0.120", "0.420", "+0.020", "0.350 -> 0.450", "0.600 -> 0.700", "100 / 50"
    ]  # fmt: skip
    assert table_row(markdown, "1")[4:7] == ["-0.010", "0.270", "-0.030"]
    gains = [a[2] - a[0] for a, _ in curves.values()]
    control_gains = [c[2] - c[0] for _, c in curves.values()]
    summary = table_row(markdown, "mean (min..max)")
    assert summary[3] == f"{(0.52 + 0.29) / 2:.3f}"
    assert summary[4] == f"{sum(gains) / 2:+.3f} ({min(gains):+.3f}..{max(gains):+.3f})" == "+0.055 (-0.010..+0.120)"
    assert summary[6] == f"{sum(control_gains) / 2:+.3f} ({min(control_gains):+.3f}..{max(control_gains):+.3f})"

    unfinished = tmp_path / "unfinished"
    write_run(unfinished, [eval_record(0, 0.5, 0.4, 0.6), eval_record(2, 0.5)])
    assert not module.read_run(str(unfinished))["finished"]
    without_control = module.markdown_table([{"seed": 7, "run": module.read_run(str(unfinished)), "control": None}])
    assert table_row(without_control, "7")[5:] == ["-", "-", "0.400 -> -", "0.600 -> -", "- / -"]

    png = module.plot_curves(rows, str(tmp_path / "curves.png"))
    check_png(png)


def test_overrides_of_the_per_run_keys_are_refused():
    module = load_script()
    with pytest.raises(SystemExit):
        module.parse_args(["--seeds", "0", "--", "--config.seed=3"])
    args, overrides = module.parse_args(["--seeds", "1", "2", "--no-control", "--", "--config.lr=1e-4"])
    assert args.seeds == [1, 2] and args.no_control and overrides == ["--config.lr=1e-4"]
    eigen = "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_xnnpack=false"
    args, overrides = module.parse_args(["--xla-flags", eigen, "--out", "x"])
    assert args.xla_flags == eigen and args.out == "x" and overrides == []


def configured(row, flags=(), config=None):
    """The config train.py would build for an algorithm row: its config file (else `config`), then each
    --config.key=value flag applied with the field's type (as ml_collections' command-line flags do)."""
    import ml_collections

    from mathrl_jax.configs import default

    script = load_script()
    path = row.config or config
    if path:
        spec = importlib.util.spec_from_file_location("row_config", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = module.get_config()
    else:
        config = default.get_config()
    for flag in (*script.row_flags(row, path, flags), *flags):
        key, value = flag.removeprefix("--config.").split("=", 1)
        *parents, name = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        current = node[name]
        field_type = node.get_type(name) if isinstance(node, ml_collections.ConfigDict) else type(current)
        if field_type is bool:
            parsed = value == "True"
        elif field_type in (int, float):
            parsed = field_type(value)
        else:
            parsed = value
        node[name] = parsed
    return config


def test_every_algorithm_has_a_row_and_every_rows_settings_are_valid(tmp_path):
    from mathrl_jax.train import algorithms
    from mathrl_jax.train.setup._validation import validate_config

    module = load_script()
    assert set(module.ALGORITHM_ROWS) == set(algorithms.NAMES)
    stress = set(module.STRESS_ROWS)
    assert [row.name for row in module.expand_algorithms(["all"])] == [
        row.name for row in module.ROWS if row.name not in stress
    ]
    assert [row.name for row in module.expand_algorithms(["stress"])] == list(module.STRESS_ROWS)
    named = [r for rows in module.ALGORITHM_ROWS.values() for r in rows] + list(module.VARIANT_ROWS)
    assert sorted(named + list(stress)) == sorted(module.ROW_BY_NAME)
    for row in module.ROWS:
        config = configured(row, [f"--config.run_dir={tmp_path / row.name}"])
        validate_config(config)  # raises (exit 2 in train.py) on a bad row
        wanted = "grpo" if row.name in stress - {"async_ppo_staleness8"} else row.name.split("_staleness")[0]
        assert config.algorithm_name == wanted.removesuffix("_lora"), row
    stale = [configured(module.ROW_BY_NAME[name]) for name in ("async_ppo_staleness8", "stale8_naive", "stale8_tis")]
    assert [c.max_head_offpolicyness for c in stale] == [8, 8, 8]
    noisy = [configured(module.ROW_BY_NAME[name]) for name in ("noise07_naive", "noise07_tis")]
    assert [c.sampler_logprob_noise for c in noisy] == [0.07, 0.07]
    assert [c.old_logprobs for c in stale[1:] + noisy] == ["sampler", "auto", "sampler", "auto"]
    assert [c.tis_cap for c in stale[1:] + noisy] == [None, 2.0, None, 2.0]
    async_rows = module.expand_algorithms(["async_ppo"])
    stalenesses = [configured(row).max_head_offpolicyness for row in async_rows]
    assert stalenesses == [1, 2]
    assert configured(module.ROW_BY_NAME["appo"]).prm_model_name_or_path == "arithmetic_steps"
    assert configured(module.ROW_BY_NAME["reinforce_rebn"]).env_name == "guess_number"
    assert configured(module.ROW_BY_NAME["grpo_lora"]).lora.rank > 0
    shared = configured(module.ROW_BY_NAME["appo_lora"])
    assert shared.lora.rank > 0 and shared.lora.share_critic_base and shared.algorithm_name == "appo"
    assert [r.name for r in module.expand_algorithms(["ppo", "grpo", "ppo"])] == ["grpo", "ppo"]  # table order, once
    with pytest.raises(ValueError, match="'?chess'?"):
        module.expand_algorithms(["chess"])
    with pytest.raises(SystemExit):
        module.parse_args(["--algorithms", "chess"])
    with pytest.raises(SystemExit):  # the game's row trains on its own config
        module.parse_args(["--algorithms", "grpo", "reinforce_rebn", "--config", "x.py"])


def test_a_sweep_on_another_task_gives_step_rewards_that_tasks_process_verifier(tmp_path):
    module = load_script()
    configs = os.path.join(module.ROOT, "mathrl_jax", "configs")
    args, _ = module.parse_args(["--algorithms", "grpo", "tppo", "--config", os.path.join(configs, "countdown.py")])
    assert args.algorithms == ["grpo", "tppo"]
    tppo, appo, grpo = (module.ROW_BY_NAME[name] for name in ("tppo", "appo", "grpo"))
    countdown = os.path.join(configs, "countdown.py")
    for row in (tppo, appo):
        config = configured(row, [f"--config.run_dir={tmp_path}"], config=countdown)
        assert (config.dataset_name, config.prm_model_name_or_path) == ("countdown", "countdown_steps")
        chain = configured(row, config=os.path.join(configs, "column_chain.py"))
        assert chain.prm_model_name_or_path == "arithmetic_steps"
    assert module.row_flags(grpo, countdown, []) == list(grpo.flags)
    assert module.task_name(grpo, countdown) == "countdown" and module.task_name(grpo) == "default"
    with pytest.raises(SystemExit):  # a task without a process verifier: refused, not rewarded by another's
        module.row_flags(tppo, countdown, ["--config.dataset_name=gsm8k"])


def test_sweeps_sharing_an_output_directory_keep_each_others_ledger_entries(tmp_path):
    module = load_script()
    path = str(tmp_path / "runs.json")
    first, second = module.load_ledger(path), module.load_ledger(path)  # two sweeps, each read the empty ledger
    first["grpo/seed0"] = {"command": ["a"], "xla_flags": None, "seconds": 1.0}
    module.save_ledger(path, first, "grpo/seed0")
    second["grpo/seed3"] = {"command": ["b"], "xla_flags": None, "seconds": 2.0}
    module.save_ledger(path, second, "grpo/seed3")
    assert module.load_ledger(path) == {**first, **second}


def test_the_algorithms_table_and_plot_on_hand_written_metrics(tmp_path):
    module = load_script()
    rows = {name: module.ROW_BY_NAME[name] for name in ("ppo", "reinforce_rebn")}
    # row: seed: (run accuracies at 0, 2, 4; control's); the game logs turns per game too
    curves = {
        "ppo": {0: ([0.6, 0.8, 0.95], [0.6, 0.58, 0.62]), 1: ([0.5, 0.7, 0.75], [0.5, 0.55, 0.49])},
        "reinforce_rebn": {0: ([0.3, 0.5, 0.9], [0.3, 0.3, 0.25]), 1: ([0.25, 0.35, 0.45], [0.25, 0.3, 0.3])},
    }
    results = []
    for name, seeds in curves.items():
        seed_rows = []
        for seed, (run, control) in seeds.items():
            summaries = {}
            for kind, accuracies in (("seed", run), ("control", control)):
                records = []
                for step, accuracy in zip((0, 2, 4), accuracies):
                    record = eval_record(step, accuracy)
                    if name == "reinforce_rebn":
                        record["eval/episode_turns"] = 4.5 - step / 4 - seed / 10
                    records.append(record)
                if kind == "seed":
                    warm = {"warmstart/eval_accuracy_after": 0.3, "warmstart/seconds": 30.0}
                    records.insert(0, {"step": 0, "time": 0.0, **warm})
                run_dir = tmp_path / name / f"{kind}{seed}"
                write_run(run_dir, records)
                summaries[kind] = dict(module.read_run(str(run_dir)), wall_seconds=100.0 + 2 * seed)
            seed_rows.append({"seed": seed, "run": summaries["seed"], "control": summaries["control"]})
        results.append((rows[name], seed_rows))

    markdown = module.algorithms_table(results, 0.15)
    for name, seeds in curves.items():
        gains = [run[2] - run[0] for run, _ in seeds.values()]
        control_gains = [control[2] - control[0] for _, control in seeds.values()]
        gaps = [g - c for g, c in zip(gains, control_gains)]
        cells = table_row(markdown, name)
        assert cells[2] == "0, 1"
        assert cells[4] == f"{sum(gains) / 2:+.3f} ({min(gains):+.3f}..{max(gains):+.3f})"
        assert cells[5] == f"{sum(control_gains) / 2:+.3f} ({min(control_gains):+.3f}..{max(control_gains):+.3f})"
        assert cells[6] == f"{sum(gaps) / 2:+.3f}"
        assert cells[7] == ("yes" if sum(gaps) / 2 >= 0.15 else "no")
        assert cells[9] == "71 / 101"  # the RL phase: the seed runs' 100, 102 s less their 30 s warm-start
    assert table_row(markdown, "ppo")[7] == "yes" and table_row(markdown, "ppo")[8] == "-"
    assert table_row(markdown, "reinforce_rebn")[8] == "4.45 -> 3.45"  # turns per held-out game, mean of seeds
    assert "configs/guess_number_tiny.py" in table_row(markdown, "reinforce_rebn")[1]
    check_png(module.plot_algorithms(results, str(tmp_path / "algorithms.png")))


@pytest.mark.slow
def test_the_algorithms_share_each_seeds_warmstart_end_to_end(tmp_path):
    out = tmp_path / "algorithms"
    args = ["--algorithms", "grpo", "rloo", "--seeds", "0", "--no-control", "--out", str(out), "--"]
    result = run_script(*args, *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    check_png(out / "algorithms.png")
    check_png(out / "mean_curves_default.png")  # the task's figure: each row's mean curve
    markdown = (out / "algorithms.md").read_text()
    assert table_row(markdown, "grpo/seed0")[1] == "3" and table_row(markdown, "rloo/seed0")[1] == "3"  # per run
    assert [row["name"] for row in json.loads((out / "statistics.json").read_text())["rows"]] == ["grpo", "rloo"]
    grpo, rloo = out / "grpo" / "seed0", out / "rloo" / "seed0"
    for name in ("initial_model", "warmstart_model"):
        comparison = filecmp.dircmp(grpo / name, rloo / name)
        assert comparison.left_list and not (comparison.diff_files or comparison.left_only or comparison.right_only)
    assert "warmstart/seconds" in merged_steps(grpo)[0] and "warmstart/seconds" not in merged_steps(rloo)[0]
    assert json.loads((rloo / "config.json").read_text())["algorithm_name"] == "rloo"
    for name, run_dir in (("grpo", grpo), ("rloo", rloo)):
        steps = merged_steps(run_dir)
        gain = steps[2]["eval/accuracy"] - steps[0]["eval/accuracy"]
        assert table_row(markdown, name)[4] == f"{gain:+.3f} ({gain:+.3f}..{gain:+.3f})"


def sigmoid_records(steps, r0, a, c_mid, b, entropy=None, length=None):
    """Eval records of ScaleRL's curve at `steps` (rounded to 3 decimals, as 1000 problems would give), and a
    training line per step after 0 with entropy and sampled length; the last eval with pass@k and greedy length."""
    records = []
    for step in steps:
        accuracy = r0 if step == 0 else r0 + (a - r0) / (1 + (c_mid / step) ** b)
        if step:
            records.append(
                {"step": step, "time": 0.0, "rollout/rewards": 0.5, "train/entropy": entropy + step / 1000,
                 "rollout/response_length": length + step}
            )  # fmt: skip
        records.append(eval_record(step, round(accuracy, 3)))
    records[-1].update({"eval/pass@1": 0.8, "eval/pass@4": 0.9, "eval/response_length": 17.5})
    records[-1].update({"eval_hard/accuracy": 0.1, "eval_hard/pass@4": 0.2})  # a harder split, at the last eval
    records[0].update({"eval/pass@1": 0.3, "eval/pass@4": 0.5, "eval_hard/accuracy": 0.0})  # step 0's eval
    return records


def test_fits_pass_at_k_entropy_length_and_the_summary_over_seeds(tmp_path):
    module = load_script()
    steps = list(range(0, 21, 2))
    truths = {0: (0.30, 0.80, 6.0, 1.5), 1: (0.32, 0.85, 5.0, 2.0), 2: (0.28, 0.78, 7.0, 1.2)}
    rows = []
    for seed, truth in truths.items():
        records = sigmoid_records(steps, *truth, entropy=0.4 + seed / 10, length=20.0)
        write_run(tmp_path / f"seed{seed}", records, num_iterations=20)
        flat = [eval_record(step, 0.3 + 0.002 * (step % 4)) for step in steps]  # a control that does not learn
        write_run(tmp_path / f"control{seed}", flat, num_iterations=20)
        rows.append(
            {
                "seed": seed,
                "run": module.read_run(str(tmp_path / f"seed{seed}")),
                "control": module.read_run(str(tmp_path / f"control{seed}")),
            }
        )
    run = rows[1]["run"]
    assert run["fit"].ok and run["fit"].asymptote == pytest.approx(0.85, abs=0.01)
    assert run["fit"].midpoint == pytest.approx(5.0, rel=0.05) and run["fit"].exponent == pytest.approx(2.0, rel=0.1)
    assert run["entropy_end"] == pytest.approx(0.5 + 20 / 1000) and run["response_length_end"] == 40.0
    assert run["eval_response_length_end"] == 17.5 and (run["pass_at_k_start"], run["pass_at_k_end"]) == (0.5, 0.9)
    assert (run["hard_start"], run["hard_end"], run["hard_pass_at_k_end"]) == (0.0, 0.1, 0.2)
    assert rows[0]["control"]["hard_end"] is None  # a run without the harder split
    assert not rows[0]["control"]["fit"].ok and rows[0]["control"]["fit"].reason.startswith("flat")

    text = module.statistics_text([("grpo", rows)], prefix=True)
    cells = table_row(text, "grpo/seed1")
    fit = run["fit"]
    assert cells[1:8] == [
        "11", f"{fit.start:.3f}", f"{fit.asymptote:.3f}", f"{fit.exponent:.2f}", f"{fit.midpoint:.1f}",
        f"{fit.rmse:.3f}", "ok",
    ]  # fmt: skip
    assert cells[8:] == ["0.300 -> 0.800", "0.500 -> 0.900", "0.520", "40.0 / 17.5"]
    assert table_row(text, "grpo/control0")[2:8] == ["-"] * 5 + [rows[0]["control"]["fit"].reason]

    summary = table_row(text, "grpo")
    ends = [r["run"]["rl_end"] for r in rows]
    gains = [r["run"]["rl_gain"] for r in rows]
    gaps = [r["run"]["rl_gain"] - r["control"]["rl_gain"] for r in rows]
    asymptotes = [r["run"]["fit"].asymptote for r in rows]
    assert summary[1] == "3" and summary[5] == "3/3"
    for cell, values, digits in ((summary[2], ends, ".3f"), (summary[3], gains, "+.3f"), (summary[4], gaps, "+.3f")):
        parts = cell.replace("[", "").replace("]", "").replace(",", "").replace(";", "").split(" ")
        mean, low, high, t_low, t_high = (float(parts[i]) for i in (0, 1, 2, 4, 5))
        assert f"{mean:{digits}}" == f"{np.mean(values):{digits}}"
        assert min(values) - 1e-3 <= low <= mean <= high <= max(values) + 1e-3  # a mean's interval: inside the range
        t_half = 4.303 * np.std(values, ddof=1) / np.sqrt(3)  # t_{0.975} at 2 degrees of freedom (a printed table)
        assert t_low == pytest.approx(np.mean(values) - t_half, abs=2e-3)
        assert t_high == pytest.approx(np.mean(values) + t_half, abs=2e-3)
    assert summary[6].startswith(f"{np.mean(asymptotes):.3f} [")
    one = table_row(module.summary_table([("one", rows[:1])]), "one")
    assert one[2] == f"{ends[0]:.3f}" and one[4] == f"{gaps[0]:+.3f}"  # one seed: the value, no interval

    check_png(module.plot_mean_curves([("grpo", [r["run"] for r in rows])], str(tmp_path / "mean.png"), "default"))
    written = json.loads(open(module.write_statistics(str(tmp_path / "statistics.json"), [("grpo", rows)])).read())
    row = written["rows"][0]
    assert row["name"] == "grpo" and row["statistics"]["final accuracy"]["values"] == ends
    assert row["seeds"][1]["run"]["fit"]["asymptote"] == pytest.approx(fit.asymptote)
    assert row["seeds"][0]["control"]["fit"]["ok"] is False


def test_eval_interval_and_the_progress_line(capsys):
    module = load_script()
    args, overrides = module.parse_args(["--eval-interval", "2", "--", "--config.lr=1e-4"])
    assert overrides == ["--config.eval_interval=2", "--config.lr=1e-4"]
    for argv in (["--eval-interval", "0"], ["--eval-interval", "2", "--", "--config.eval_interval=5"]):
        with pytest.raises(SystemExit):
            module.parse_args(argv)
    plan = module.Plan(3)
    plan.begin("seed0")
    plan.finish(None)  # reused
    plan.begin("control0")
    plan.finish(120.0)
    plan.begin("seed1")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[1/3] seed0: 0.0 min so far") and lines[1].startswith("[2/3] control0:")
    assert lines[2].endswith("about 2 min left")  # one run left at the 120 s a trained run took
