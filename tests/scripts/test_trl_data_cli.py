"""A TRL user's own data through scripts/train.py (issue 48, frictions 1 and 10b): TRL's `prompt` + `solution`
layout and chat-message prompts found by `--config.dataset_name=auto`, a field mapping from the command line
(`--config.data.fields`), and the held-out split said aloud (`--config.eval_holdout`), on the tiny stand-in."""

import glob
import json
import os

import pytest

from tests.scripts.test_train_cli import SHORT_RUN, run_train, snapshot

RUN = [
    *[flag for flag in SHORT_RUN if not flag.startswith(("--config.arithmetic", "--config.eval_interval"))],
    "--config.max_new_tokens=4",
    "--config.num_iterations=1",
    "--config.progress=False",
    "--config.dataset_name=auto",
]
"""One iteration of the tiny stand-in on a data file (the eval interval is each test's own)."""


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def sums(count, start=1):
    return [(a, b) for a in range(start, start + 10) for b in range(1, 10)][:count]


def sample_prompts(run_dir):
    """The held-out prompts of the run's logged samples (decoded from the ids the policy was given)."""
    prompts = set()
    for path in glob.glob(os.path.join(run_dir, "samples", "*.jsonl")):
        with open(path) as f:
            prompts |= {json.loads(line)["prompt"] for line in f}
    return prompts


def test_a_trl_prompt_solution_file_trains_and_its_held_out_problems_are_said(tmp_path):
    """Before: `cannot detect the layout from the fields ['prompt', 'solution']`; and 4 of the 50 problems were
    held out without a word."""
    rows = [{"prompt": f"{a}+{b}=", "solution": f"{a} plus {b} is {a + b}.\n#### {a + b}"} for a, b in sums(50)]
    path = write_jsonl(tmp_path / "trl_prompt_solution.jsonl", rows)
    done = run_train(tmp_path / "run", f"--config.dataset_path={path}", "--config.eval_interval=1", *RUN)
    assert done.returncode == 0, done.stderr[-3000:]
    line = (
        f"held out 4 of 50 problems of {path} for evaluation (seed 0); --config.eval_holdout=0 trains on all of "
        "them, --config.eval_dataset_path names another file"
    )
    assert done.stderr.count(line) == 1, done.stderr[-3000:]
    held_out = sample_prompts(tmp_path / "run")
    assert len(held_out) == 4 and held_out <= {row["prompt"] for row in rows}
    assert "RL phase gain: " in done.stdout and "(greedy, 4 held-out problems)" in done.stdout


def test_chat_message_prompts_train_through_the_chat_template(tmp_path):
    """A dataset folder of TRL's conversational prompts (a system turn, then the user's), its train split trained
    on and its test split evaluated (`eval_dataset_split` alone: that split of the same dataset)."""
    folder = tmp_path / "chat_data"
    folder.mkdir()
    for split, start in (("train", 1), ("test", 11)):
        rows = [
            {
                "prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{a}+{b}="}],
                "answer": a + b,
            }
            for a, b in sums(12, start)
        ]
        write_jsonl(folder / f"{split}.jsonl", rows)
    flags = [f"--config.dataset_path={folder}", "--config.dataset_split=train", "--config.eval_dataset_split=test"]
    done = run_train(tmp_path / "run", *flags, "--config.max_prompt_length=40", "--config.eval_interval=1", *RUN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"evaluating on the 'test' split of {folder} (12 problems; num_eval_problems=4 of them)" in done.stderr
    assert "held out" not in done.stderr
    # The tiny model's ChatML template, written out by hand, as the samples decode it (control tokens skipped).
    expected = {f"system\nAdd.\nuser\n{a}+{b}=\nassistant\n" for a, b in sums(12, 11)}
    held_out = sample_prompts(tmp_path / "run")
    assert len(held_out) == 4 and held_out <= expected, held_out


def test_a_field_mapping_from_the_command_line_and_no_held_out_set(tmp_path):
    """`--config.data.fields` maps the file's own names; `eval_holdout=0` trains on every problem and evaluates
    nothing (no curve, no gain), even with an eval_interval."""
    rows = [{"problem": f"{a}+{b}=", "gold": str(a + b), "ref": f"p{i}"} for i, (a, b) in enumerate(sums(20))]
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    fields = "--config.data.fields=question:problem,answer:gold,uid:ref"
    flags = [f"--config.dataset_path={path}", fields, "--config.eval_holdout=0", "--config.eval_interval=1"]
    done = run_train(tmp_path / "run", *flags, *RUN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held out" not in done.stderr
    assert "RL eval curve" not in done.stdout and "RL phase gain" not in done.stdout, done.stdout
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        logged = [json.loads(line) for line in f]
    assert logged and not any(key.startswith("eval/") for record in logged for key in record)
    assert not os.path.isdir(tmp_path / "run" / "samples")


def refusal_cases(t):
    mine = write_jsonl(t / "mine.jsonl", [{"problem": f"{a}+{b}=", "gold": str(a + b)} for a, b in sums(10)])
    chat = write_jsonl(
        t / "chat.jsonl", [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": a + b} for a, b in sums(10)]
    )
    data = [f"--config.dataset_path={mine}", "--config.dataset_name=auto"]
    return {
        "malformed mapping": ([*data, "--config.data.fields=question=problem,answer:gold"], "'question=problem'"),
        "unknown role": ([*data, "--config.data.fields=question:problem,gold:gold"], "unknown role 'gold'"),
        "no answer role": ([*data, "--config.data.fields=question:problem"], "no answer field"),
        "a field the file lacks": (
            [*data, "--config.data.fields=question:problem,answer:final"],
            "field 'final': missing (the record's fields: gold, problem) (--config.data.fields=",
        ),
        "a mapping with another layout": (
            [f"--config.dataset_path={mine}", "--config.dataset_name=gsm8k", "--config.data.fields=question:problem"],
            "dataset_name='gsm8k' names another",
        ),
        "custom without a mapping": (
            [f"--config.dataset_path={mine}", "--config.dataset_name=custom"],
            "dataset_name='custom' needs --config.data.fields",
        ),
        "holding out the whole file": (
            [*data, "--config.data.fields=question:problem,answer:gold", "--config.eval_holdout=10"]
            + ["--config.num_eval_problems=10"],
            "eval_holdout=10 holds out 10 of the 10 problems",
        ),
        "holding out more than is evaluated": (
            [*data, "--config.data.fields=question:problem,answer:gold", "--config.eval_holdout=6"]
            + ["--config.num_eval_problems=4"],
            "eval_holdout=6 holds out more problems than num_eval_problems=4 evaluates",
        ),
        "holding out beside an evaluation file": (
            [*data, "--config.eval_holdout=3", f"--config.eval_dataset_path={mine}"],
            "eval_holdout=3 holds problems of the training file out",
        ),
        "holding out of a built-in task": (["--config.eval_holdout=0"], "dataset_name='arithmetic' draws"),
        "a text template over chat messages": (
            [f"--config.dataset_path={chat}", "--config.dataset_name=auto", "--config.prompt_template=r1_zero"],
            "prompt_template='r1_zero' cannot render the chat-message prompts",
        ),
    }


def _case_names():
    """The refusal cases' names (their files written to a throwaway directory)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as directory:
        return list(refusal_cases(Path(directory)))


@pytest.mark.parametrize("case", _case_names())
def test_a_bad_mapping_or_held_out_split_is_one_line_before_anything_is_written(case, tmp_path):
    flags, expected = refusal_cases(tmp_path)[case]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("an existing run directory")
    before = snapshot(run_dir)
    done = run_train(run_dir, *RUN[:-1], *flags)  # the case's flags last: they win
    assert done.returncode == 2, (done.stdout[-1000:], done.stderr[-2000:])
    message = done.stderr.strip().splitlines()
    assert message[-1].startswith("train.py: error:") and expected in message[-1], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert snapshot(run_dir) == before
