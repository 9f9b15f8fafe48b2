"""The dashboard's figures (reporting/_dashboard.py) against independent computations on hand-made batches: the
rewards' spread and zero-std groups (TRL's definitions, in plain Python), completion lengths, memory against the
kernel's own counters, and the completion table in completions.jsonl, tensorboard's text summary, and resumes."""

import json
import math
import mmap
import resource
import statistics

import numpy as np
import pytest

from mathrl_jax.train import run_directory
from mathrl_jax.train.reporting import (
    MetricsLogger,
    completion_rows,
    device_memory_metrics,
    host_memory_metrics,
    length_metrics,
    markdown_table,
    memory_metrics,
    reward_metrics,
)
from tests.train.reporting.test_metrics import iter_events

REWARDS = [1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 0.0, 3.0, 7.0]
GROUPS = [0, 0, 1, 1, 2, 2, 3, 3, 4]  # group 4 has one response: no std of its own


def test_reward_spread_and_zero_std_groups():
    metrics = reward_metrics(np.array(REWARDS), np.array(GROUPS))
    assert metrics["rollout/rewards_std"] == pytest.approx(statistics.pstdev(REWARDS))
    assert metrics["rollout/rewards_min"] == 0.0 and metrics["rollout/rewards_max"] == 7.0
    groups = [[r for r, g in zip(REWARDS, GROUPS) if g == k] for k in range(4)]  # those of two or more
    assert metrics["rollout/rewards_group_std"] == pytest.approx(statistics.mean(statistics.stdev(g) for g in groups))
    assert metrics["rollout/frac_reward_zero_std"] == 2 / 4  # groups 1 and 2 earned equal rewards
    # Order does not matter; single responses give no group figure; nothing gives nothing.
    perm = np.random.default_rng(0).permutation(len(REWARDS))
    shuffled = reward_metrics(np.array(REWARDS)[perm], np.array(GROUPS)[perm])
    assert shuffled == pytest.approx(metrics)
    alone = reward_metrics(np.array([1.0, 2.0]), np.array([0, 1]))
    assert set(alone) == {"rollout/rewards_std", "rollout/rewards_min", "rollout/rewards_max"}
    assert reward_metrics(np.zeros(0), np.zeros(0, int)) == {}
    with pytest.raises(ValueError, match="one id per reward"):
        reward_metrics(np.zeros(3), np.zeros(2, int))


def test_completion_lengths_and_the_clipped_ratio():
    lengths = [4, 1, 7, 4, 2]
    reasons = ["length", "stop", "length", "length", "stop"]
    metrics = length_metrics(np.array(lengths), reasons)
    assert metrics == {
        "rollout/response_length": statistics.mean(lengths),
        "rollout/response_length_min": 1.0,
        "rollout/response_length_max": 7.0,
        "rollout/truncated_fraction": 3 / 5,
        "rollout/terminated_length": statistics.mean([1, 2]),
    }
    assert "rollout/terminated_length" not in length_metrics(np.array([3, 3]), ["length", "length"])


def test_host_memory_is_the_kernels_resident_set():
    metrics = host_memory_metrics()
    # getrusage's ru_maxrss (kB on Linux) is the same high-water mark as /proc/self/status's VmHWM.
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert metrics["perf/host_memory_peak_gb"] == pytest.approx(peak_kib / 2**20, rel=0.05)
    assert 0 < metrics["perf/host_memory_gb"] <= metrics["perf/host_memory_peak_gb"]
    # 64 MiB of fresh anonymous pages, each written: the resident set grows by about as much (mmap, not numpy's
    # malloc, which may reuse pages a long test session left resident: the CI run at d37dd10 saw no growth).
    ballast = mmap.mmap(-1, 64 * 2**20)
    ballast.write(b"\x01" * (64 * 2**20))
    grown = host_memory_metrics()["perf/host_memory_gb"] - metrics["perf/host_memory_gb"]
    ballast.close()
    assert grown == pytest.approx(64 / 1024, abs=16 / 1024)
    assert host_memory_metrics("/nonexistent/status") == {}


def test_device_memory_from_the_backends_stats():
    gib = 2**30
    stats = [None, {"bytes_in_use": 3 * gib, "peak_bytes_in_use": 5 * gib}, {"bytes_in_use": gib}]
    assert device_memory_metrics(stats) == {"perf/device_memory_gb": 3.0, "perf/device_memory_peak_gb": 5.0}
    assert device_memory_metrics([None, None]) == {}  # the CPU backend reports none
    import jax

    reported = [d.memory_stats() for d in jax.local_devices()]
    assert ("perf/device_memory_gb" in memory_metrics()) == any(s and "bytes_in_use" in s for s in reported)


def test_markdown_table_escapes_its_cells():
    rows = completion_rows(3, ["1|2=", "p"], ["a\nb", "c"], np.array([1.5, 0]), np.array([0.25, -1]), [2, 1],
                           ["stop", "length"], count=5)  # fmt: skip
    assert [r["truncated"] for r in rows] == [False, True] and rows[0]["step"] == 3
    lines = markdown_table(rows).split("\n")
    assert len(lines) == 2 + len(rows)
    # Split on the unescaped bars: each line has one cell per column.
    cells = [[c.strip() for c in line.replace("\\|", "\0").split("|")[1:-1]] for line in lines]
    assert all(len(c) == 7 for c in cells) and cells[2][1] == "1\0" + "2=" and cells[2][2] == "a<br>b"


def test_completion_tables_go_to_the_jsonl_and_tensorboard_and_a_resume_drops_later_ones(tmp_path):
    def rows(step):
        return completion_rows(step, [f"p{step}"], [f"c{step}"], np.ones(1), np.zeros(1), [1], ["stop"], 1)

    with MetricsLogger(str(tmp_path)) as logger:
        for step in (1, 2, 3):
            logger.log_completions(step, rows(step))
    path = tmp_path / run_directory.COMPLETIONS
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows(1) + rows(2) + rows(3)
    texts = [
        (value.tag, event.step)
        for event in iter_events(str(tmp_path))
        for value in event.summary.value
        if value.metadata.plugin_data.plugin_name == "text"
    ]
    assert [step for _, step in texts] == [1, 2, 3] and all(tag.startswith("completions") for tag, _ in texts)
    with MetricsLogger(str(tmp_path), tensorboard=False, resumed_from=1) as logger:  # steps 2, 3 are logged again
        logger.log_completions(2, rows(2))
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    assert math.isclose(json.loads(path.read_text().splitlines()[-1])["reward"], 1.0)


def test_a_completion_table_with_nan_advantages_and_lone_surrogates_is_written_as_strict_json(tmp_path):
    """Issue 60, point 6: a NaN or +-inf reward or advantage, and a lone surrogate in a text (a tokenizer's decode of
    a cut character), stopped the run (`json.dumps(allow_nan=False)` raised ValueError; tensorboard's UTF-8 text
    summary raised UnicodeEncodeError). Now the row is written: non-finite numbers as null, surrogates as U+FFFD,
    and the file parses with a strict parser (no NaN / Infinity constants, valid UTF-8, no surrogate escapes)."""
    rows = completion_rows(
        4,
        ["p\ud800q", "plain"],
        ["a\udfffb\ud83d", "c"],
        np.array([np.nan, np.inf]),
        np.array([-np.inf, np.nan]),
        [2, 1],
        ["stop", "length"],
        count=2,
    )
    with MetricsLogger(str(tmp_path)) as logger:  # tensorboard too: its text summary is UTF-8
        logger.log_completions(4, rows)

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    raw = (tmp_path / run_directory.COMPLETIONS).read_bytes()
    text = raw.decode("utf-8", errors="strict")
    assert "\\ud8" not in text.lower() and "\\udf" not in text.lower()  # no surrogate escape either
    read = [json.loads(line, parse_constant=refuse) for line in text.splitlines()]
    assert [(r["reward"], r["advantage"]) for r in read] == [(None, None), (None, None)]
    assert read[0]["prompt"] == "p\ufffdq" and read[0]["completion"] == "a\ufffdb\ufffd"
    assert read[1]["prompt"] == "plain"
    assert [r["step"] for r in read] == [4, 4] and [r["truncated"] for r in read] == [False, True]
    summaries = [value.tag for event in iter_events(str(tmp_path)) for value in event.summary.value]
    assert len([tag for tag in summaries if tag.startswith("completions")]) == 1
