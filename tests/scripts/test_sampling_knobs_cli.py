"""scripts/train.py with vLLM's `min_p` and `repetition_penalty` (issue 48): the options reach the sampler, and a
bad value stops the run with one line naming it before anything is written."""

import json

import pytest

from tests.scripts.test_train_cli import SHORT_RUN, run_train, snapshot

ONE_ITERATION = [*SHORT_RUN, "--config.max_new_tokens=8", "--config.num_iterations=1", "--config.tis_cap=2"]
"""One short iteration with truncated importance sampling: the trainer recomputes the old log-probs and logs the
weights pi_trainer / pi_sampler, which are 1 where the sampler samples from the policy itself."""


def rollout_record(run_dir):
    """The iteration's metrics (its rollouts' among them)."""
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return next(r for r in records if "rollout/tis_weight_mean" in r)


def test_min_p_and_repetition_penalty_reach_the_sampler(tmp_path):
    """Without the knobs the sampler's log-probs are the trainer's (weights 1, the mismatch ~1e-7); with them the
    sampler reports those of the distribution it sampled from (penalized, min-p filtered), so the weights move
    off 1 and the mismatch metrics, which compare like with like only, are left out. Before the options were
    wired, the second run sampled from the policy as the first does."""
    plain = run_train(tmp_path / "plain", *ONE_ITERATION)
    assert plain.returncode == 0, plain.stderr[-3000:]
    record = rollout_record(tmp_path / "plain")
    assert abs(record["rollout/tis_weight_mean"] - 1.0) < 1e-5, record
    assert record["rollout/sampler_logprob_diff"] < 1e-4

    knobs = run_train(tmp_path / "knobs", *ONE_ITERATION, "--config.min_p=0.1", "--config.repetition_penalty=1.3")
    assert knobs.returncode == 0, knobs.stderr[-3000:]
    saved = json.load(open(tmp_path / "knobs" / "config.json"))
    assert (saved["min_p"], saved["repetition_penalty"]) == (0.1, 1.3)
    record = rollout_record(tmp_path / "knobs")
    # The tiny stand-in's logits are nearly flat, so the knobs move the weights by ~1e-3: 100 times the float noise.
    assert abs(record["rollout/tis_weight_mean"] - 1.0) > 1e-4, record
    assert "rollout/sampler_logprob_diff" not in record


VLLM_OLD_LOGPROBS = ["--config.sampler=vllm", "--config.old_logprobs=sampler"]


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--config.min_p=1.5"], "min_p"),
        (["--config.repetition_penalty=0"], "repetition_penalty"),
        # vLLM reports the penalized / min-p filtered log-probs, not the policy's the old log-probs must be.
        ([*VLLM_OLD_LOGPROBS, "--config.repetition_penalty=1.3"], "repetition_penalty=1.3"),
        ([*VLLM_OLD_LOGPROBS, "--config.min_p=0.1"], "min_p=0.1"),
    ],
)
def test_a_bad_value_exits_2_naming_it_and_writes_nothing(tmp_path, flags, named):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    before = snapshot(run_dir)
    done = run_train(run_dir, *flags)
    assert done.returncode == 2, done.stderr[-2000:]
    message = done.stderr.strip().splitlines()
    assert len(message) == 1 and message[0].startswith("train.py: error:"), done.stderr[-2000:]
    assert named in message[0] and flags[-1].split("=")[1] in message[0], message
    assert "Traceback" not in done.stderr
    assert snapshot(run_dir) == before
