"""The training loop end to end on a one-layer tiny checkpoint: every algorithm learns a simple
reward, exact resume, the asynchronous loop's staleness bound, and the sync / async equivalence."""

import functools
import os
import shutil

import jax
import numpy as np
import pytest

from mathrl_jax.configs import default
from mathrl_jax.models import write_tiny_checkpoint
from mathrl_jax.train import batch, build, collect, loop, problems, rollout, validation, warmstart

DIGITS = set("0123456789")


def first_char_reward(texts, golds):
    """The fraction of digits in the completion: dense (10% for a random policy) and learnable in a few steps."""
    scores = np.array([sum(ch in DIGITS for ch in t) / max(len(t), 1) for t in texts], np.float32)
    return scores, {"reward/accuracy": float(np.mean(scores > 0.5))}


@functools.lru_cache(maxsize=None)
def tiny_dir(root):
    directory = os.path.join(root, "tiny1")
    if not os.path.isdir(directory):
        write_tiny_checkpoint(directory, seed=0, num_hidden_layers=1)
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_dir(str(tmp_path_factory.mktemp("model")))


def small_config(model_dir, run_dir, **overrides):
    config = default.get_config()
    config.model_name_or_path = model_dir
    config.run_dir = str(run_dir)
    config.warmstart.steps = 0
    config.arithmetic.num_train = 64
    config.arithmetic.num_eval = 8
    config.num_eval_problems = 8
    config.n_rollout_threads = 8
    config.group_size = 4
    config.max_new_tokens = 4
    config.num_iterations = 6
    config.eval_interval = 0
    config.save_interval = 0
    config.progress = False
    config.lr = 1e-2
    config.critic_lr = 3e-3
    config.reward.num_workers = 1
    for key, value in overrides.items():
        target = config
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return config


def run_and_record(config, reward_fn=first_char_reward):
    history = []
    summary = loop.train(config, reward_fn=reward_fn, on_metrics=lambda i, m: history.append((i, m)))
    return summary, history


ALGORITHM_SETTINGS = {
    "grpo": {},
    "drgrpo": {"loss_agg_mode": "seq-mean-token-sum-norm"},
    # The digit reward is rarely above the 0.5 success threshold: keep groups with no success, drop all-success ones.
    "dapo": {
        "clip_high": 0.28,
        "dapo.success_rate_lb": -0.1,
        "dapo.overlong_buffer_len": 2,
        "dapo.overlong_penalty_factor": 0.05,
    },
    "ppo": {"lam": 1.0},
    "appo": {"step_separator": "+"},
    "tppo": {"step_separator": "+"},
    "reinforce_rebn": {},
    "async_ppo": {"max_head_offpolicyness": 1},
    "rloo": {},
    "reinforce_pp": {},
}
FAST = ("grpo", "rloo")


@pytest.mark.parametrize(
    "algorithm",
    [a if a in FAST else pytest.param(a, marks=pytest.mark.slow) for a in ALGORITHM_SETTINGS],
)
def test_each_algorithm_improves_a_simple_reward(algorithm, model_dir, tmp_path):
    config = small_config(model_dir, tmp_path / algorithm, algorithm_name=algorithm, **ALGORITHM_SETTINGS[algorithm])
    summary, history = run_and_record(config)
    rewards = [m["rollout/rewards"] for _, m in history]
    assert all(np.isfinite(m["train/policy_loss"]) for _, m in history)
    # The first iterations' mean reward vs the last ones': the policy learns to start with TARGET.
    assert np.mean(rewards[-2:]) > np.mean(rewards[:2]) + 0.1, rewards
    if algorithm in ("ppo", "appo", "tppo"):
        assert all(np.isfinite(m["train/value_loss"]) for _, m in history)


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_resume_is_bit_identical_to_an_uninterrupted_run(model_dir, tmp_path):
    straight, straight_history = run_and_record(small_config(model_dir, tmp_path / "a", num_iterations=4))
    first, _ = run_and_record(small_config(model_dir, tmp_path / "b", num_iterations=2))
    resumed, resumed_history = run_and_record(small_config(model_dir, tmp_path / "b", num_iterations=4))
    assert [i for i, _ in resumed_history] == [3, 4]
    for a, b in zip(leaves(straight["state"]), leaves(resumed["state"])):
        np.testing.assert_array_equal(a, b)
    for (i, a), (j, b) in zip(straight_history[2:], resumed_history):
        assert i == j
        for key in ("rollout/rewards", "train/policy_loss", "train/grad_norm", "rollout/response_length"):
            assert a[key] == b[key], (key, a[key], b[key])


def test_async_with_zero_offpolicyness_reproduces_the_synchronous_loop(model_dir, tmp_path, monkeypatch):
    config = small_config(
        model_dir, tmp_path / "async", algorithm_name="async_ppo", max_head_offpolicyness=0, num_iterations=3
    )
    asynchronous, async_history = run_and_record(config)
    assert all(m["async/staleness"] == 0 for _, m in async_history)

    class Inline(collect.SyncRollouts):  # the same algorithm, rollouts made inline with the current weights
        pass

    monkeypatch.setitem(loop.ROLLOUT_SOURCES, "async", Inline)
    synchronous, _ = run_and_record(
        small_config(model_dir, tmp_path / "sync", algorithm_name="async_ppo", num_iterations=3)
    )
    for a, b in zip(leaves(asynchronous["state"]), leaves(synchronous["state"])):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("eta", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_async_never_trains_on_rollouts_older_than_allowed(eta, model_dir, tmp_path):
    config = small_config(
        model_dir, tmp_path / f"eta{eta}", algorithm_name="async_ppo", max_head_offpolicyness=eta, num_iterations=4
    )
    _, history = run_and_record(config)
    # Iteration i samples with the params after iteration max(0, i - 1 - eta), whatever the threads' timing.
    assert [m["async/staleness"] for _, m in history] == [min(i - 1, eta) for i, _ in history]
    assert [m["async/policy_version"] for _, m in history] == [max(0, i - 1 - eta) for i, _ in history]


class Interrupted(Exception):
    pass


def test_an_interrupted_async_run_resumes_bit_for_bit(model_dir, tmp_path):
    """The generator runs eta batches ahead; the checkpoint keeps them, so the resumed run trains on the very
    batches the uninterrupted one did (sampled with the params of iterations before the checkpoint)."""
    settings = dict(algorithm_name="async_ppo", max_head_offpolicyness=2, num_iterations=5, save_interval=2)
    straight, straight_history = run_and_record(small_config(model_dir, tmp_path / "a", **settings))

    def stop_at_3(iteration, metrics):
        if iteration == 3:  # after checkpoint 2; batches 3 and 4 were made before it, with params 0 and 1
            raise Interrupted

    with pytest.raises(Interrupted):
        loop.train(
            small_config(model_dir, tmp_path / "b", **settings), reward_fn=first_char_reward, on_metrics=stop_at_3
        )
    resumed, resumed_history = run_and_record(small_config(model_dir, tmp_path / "b", **settings))
    assert [i for i, _ in resumed_history] == [3, 4, 5]
    for a, b in zip(leaves(straight["state"]), leaves(resumed["state"])):
        np.testing.assert_array_equal(a, b)
    for (i, a), (j, b) in zip(straight_history[2:], resumed_history):
        for key in ("rollout/rewards", "train/policy_loss", "async/staleness", "async/policy_version"):
            assert a[key] == b[key], (i, key, a[key], b[key])


@pytest.mark.slow
def test_an_async_run_resumes_under_another_offpolicyness(model_dir, tmp_path):
    """Resumed with a smaller eta, the saved batches that would be too stale are dropped and drawn again; with a
    larger one, they are used and the generator goes on from the restored params. Neither waits forever."""
    settings = dict(algorithm_name="async_ppo", num_iterations=5, save_interval=2)

    def stop_at_3(iteration, metrics):
        if iteration == 3:
            raise Interrupted

    with pytest.raises(Interrupted):
        loop.train(
            small_config(model_dir, tmp_path / "run", max_head_offpolicyness=2, **settings),
            reward_fn=first_char_reward,
            on_metrics=stop_at_3,
        )
    for eta, expected in ((1, [0, 1, 1]), (3, [2, 2, 2])):
        shutil.copytree(tmp_path / "run", tmp_path / f"eta{eta}")
        _, history = run_and_record(
            small_config(model_dir, tmp_path / f"eta{eta}", max_head_offpolicyness=eta, **settings)
        )
        assert [i for i, _ in history] == [3, 4, 5]
        assert [m["async/staleness"] for _, m in history] == expected, eta


@pytest.mark.slow
def test_prm_step_rewards_drive_appo(model_dir, tmp_path):
    config = small_config(
        model_dir,
        tmp_path / "prm",
        algorithm_name="appo",
        reward_source="prm",
        prm_model_name_or_path=model_dir,
        step_separator="+",
        num_iterations=2,
    )
    config.prm.step_tag = "@"
    _, history = run_and_record(config, reward_fn=None)
    assert all(np.isfinite(m["train/value_loss"]) and np.isfinite(m["train/policy_loss"]) for _, m in history)


@pytest.mark.slow
def test_multi_turn_guess_number_with_rebn(model_dir, tmp_path):
    from mathrl_jax.configs import gem_guess_number

    config = gem_guess_number.get_config()
    config.update(
        model_name_or_path=model_dir,
        run_dir=str(tmp_path / "gem"),
        n_rollout_threads=4,
        episode_length=3,
        max_new_tokens=8,
        max_prompt_length=600,
        num_iterations=2,
        progress=False,
        save_interval=0,
        num_mini_batch=2,
    )
    config.reward.num_workers = 1
    _, history = run_and_record(config, reward_fn=None)
    assert [i for i, _ in history] == [1, 2]
    assert all(1 <= m["rollout/episode_turns"] <= 3 for _, m in history)


def test_shuffled_rewards_are_a_seeded_permutation_within_the_batch():
    scores = np.arange(64, dtype=np.float32)
    shuffled = batch.shuffled_rewards(scores, seed=0, iteration=3)
    np.testing.assert_array_equal(np.sort(shuffled), scores)  # the same rewards, so the same distribution
    assert np.mean(shuffled == scores) < 0.2  # ... on other responses
    np.testing.assert_array_equal(shuffled, batch.shuffled_rewards(scores, seed=0, iteration=3))
    assert not np.array_equal(shuffled, batch.shuffled_rewards(scores, seed=0, iteration=4))
    assert not np.array_equal(shuffled, batch.shuffled_rewards(scores, seed=1, iteration=3))


def test_evaluations_measure_sampled_accuracy_at_the_ends_and_write_samples(model_dir, tmp_path):
    import json

    config = small_config(
        model_dir, tmp_path / "eval", num_iterations=2, eval_interval=1, eval_n_samples=4, num_logged_samples=3
    )
    summary, history = run_and_record(config, reward_fn=None)
    assert [i for i, _ in summary["eval"]] == [0, 1, 2]
    for ends in (summary["eval_start"], summary["eval_end"]):
        assert {"eval/accuracy", "eval/pass@1", "eval/pass@4"} <= set(ends)
        assert 0.0 <= ends["eval/pass@1"] <= ends["eval/pass@4"] <= 1.0
    assert "eval/pass@1" not in history[0][1]  # the evaluation in between is greedy only
    files = sorted(os.listdir(tmp_path / "eval" / "samples"))
    assert files == ["iteration_000000.jsonl", "iteration_000001.jsonl", "iteration_000002.jsonl"]
    records = [json.loads(line) for line in open(tmp_path / "eval" / "samples" / files[-1])]
    assert len(records) == 3 * (1 + 4)  # each prompt: greedy and 4 samples
    assert {r["decoding"] for r in records} == {"greedy", "T=1"}
    for record in records:
        assert record["reward"] == (1.0 if record["correct"] else 0.0) and record["iteration"] == 2
        assert record["prompt"].endswith("=") and isinstance(record["completion"], str)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"warmstart.steps": 5, "warmstart.targets": "gold"}, "'gold'"),
        ({"warmstart.steps": 5, "warmstart.slip_rate": 1.5}, "1.5"),
        ({"num_logged_samples": -1}, "num_logged_samples=-1"),
        (
            {"shuffle_rewards": True, "env_name": "guess_number", "group_size": 1, "algorithm_name": "reinforce_rebn"},
            "'guess_number'",
        ),
        ({"old_logprobs": "cached"}, "'cached'"),
        ({"old_logprobs": "sampler", "temperature": 0.7}, "temperature=0.7"),
        ({"old_logprobs": "sampler", "algorithm_name": "async_ppo"}, "'async_ppo'"),
    ],
)
def test_bad_warmstart_and_control_settings_name_the_value(overrides, message, model_dir, tmp_path):
    config = small_config(model_dir, tmp_path / "bad", **overrides)
    with pytest.raises(validation.TrainingError, match=message):
        validation.validate_config(config)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"arithmetic.levels": (3,)}, r"levels=\(3,\)"),
        ({"dataset_name": "math500", "dataset_path": "x.jsonl"}, "'math500'"),
    ],
)
def test_the_teacher_needs_its_task(overrides, message, model_dir, tmp_path):
    config = small_config(model_dir, tmp_path / "bad", **{"warmstart.steps": 5, **overrides})
    with pytest.raises(validation.TrainingError, match=message):
        problems.check_warmstart_data(config)
    config.warmstart.targets = "answer"  # imitating the gold answers works on any data
    problems.check_warmstart_data(config)


def test_a_reused_warmstart_must_match_the_settings(model_dir, tmp_path):
    import json

    config = small_config(model_dir, tmp_path / "run", **{"warmstart.steps": 5})
    directory = tmp_path / "warm"
    directory.mkdir()
    warmstart.check_reused_warmstart(config, str(directory))  # no record (an older run): reused as it is
    record = {"seed": config.seed, **config.warmstart.to_dict()}
    (directory / warmstart.WARMSTART_RECORD).write_text(json.dumps(record))
    warmstart.check_reused_warmstart(config, str(directory))
    config.warmstart.slip_rate = 0.5
    with pytest.raises(validation.TrainingError, match="slip_rate: 0.7 -> 0.5"):
        warmstart.check_reused_warmstart(config, str(directory))


def test_a_control_never_resumes_the_real_run(model_dir, tmp_path):
    run_and_record(small_config(model_dir, tmp_path / "run", num_iterations=1))
    with pytest.raises(validation.TrainingError, match="shuffle_rewards: False -> True"):
        build.build_run(small_config(model_dir, tmp_path / "run", num_iterations=2, shuffle_rewards=True))


@pytest.mark.parametrize("micro_batch_size", [0, 2], ids=["one micro-batch", "several micro-batches"])
def test_remat_trains_as_without_it(micro_batch_size, model_dir, tmp_path):
    """Several micro-batches (padded rows, 4 a minibatch): the accumulation traces the metric shapes once more, where
    the remat'd model crashed with flax's TraceContextError."""
    settings = dict(num_iterations=2, micro_batch_size=micro_batch_size, packing=False)
    _, plain = run_and_record(small_config(model_dir, tmp_path / "plain", **settings))
    _, remat = run_and_record(small_config(model_dir, tmp_path / "remat", remat=True, **settings))
    for (i, a), (j, b) in zip(plain, remat):
        assert i == j
        for key in ("rollout/rewards", "rollout/response_length", "train/policy_loss", "train/grad_norm"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_scanned_layers_train_as_unrolled_ones(algorithm, model_dir, tmp_path):
    """`scan_layers` through the trainer's passes (packed micro-batches, remat, the reference KL; the critic's trunk
    for PPO): the same run, to float rounding."""
    settings = dict(num_iterations=2, micro_batch_size=2, remat=True, kl_coef=0.01, algorithm_name=algorithm)
    settings.update(ALGORITHM_SETTINGS.get(algorithm, {}))
    _, unrolled = run_and_record(small_config(model_dir, tmp_path / "unrolled", **settings))
    _, scanned = run_and_record(small_config(model_dir, tmp_path / "scanned", scan_layers=True, **settings))
    keys = ["rollout/rewards", "train/policy_loss", "train/grad_norm"] + (
        ["train/value_loss"] if algorithm == "ppo" else []
    )
    for (i, a), (j, b) in zip(unrolled, scanned):
        assert i == j
        for key in keys:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-7, err_msg=key)


def test_adafactor_trains_the_policy_and_the_critic_on_a_sharded_mesh(model_dir, tmp_path):
    """The optimizer users pick for memory, through the trainer: its factored moments (vectors under each kernel's
    path) are placed on the mesh (they failed the kernels' two-axis rules), and a PPO run learns with it."""
    settings = dict(num_iterations=2, algorithm_name="ppo", optimizer="adafactor", lr=1e-3)
    settings.update({"mesh.dp": 4, "mesh.fsdp": 2, **ALGORITHM_SETTINGS["ppo"]})
    _, history = run_and_record(small_config(model_dir, tmp_path / "run", **settings))
    assert len(history) >= 2
    for _, metrics in history:
        assert np.isfinite(metrics["train/policy_loss"]) and np.isfinite(metrics["train/value_loss"])
        assert metrics["train/skipped_updates"] == 0


@pytest.mark.parametrize("case", ["step tag of two tokens", "mistral prm"])
def test_a_prm_that_cannot_serve_stops_the_run_before_anything_is_written(case, model_dir, tmp_path):
    import json
    import shutil

    prm_dir = tmp_path / "prm"
    shutil.copytree(model_dir, prm_dir)
    overrides = {"algorithm_name": "appo", "reward_source": "prm", "prm_model_name_or_path": str(prm_dir)}
    if case == "mistral prm":
        config_file = prm_dir / "config.json"
        hf_config = json.loads(config_file.read_text())
        hf_config.update(model_type="mistral", architectures=["MistralForCausalLM"])
        config_file.write_text(json.dumps(hf_config))
        overrides["prm.step_tag"], expected = "@", "prm_model_name_or_path"
    else:
        overrides["prm.step_tag"], expected = "@@", "prm.step_tag='@@'"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("a user's file")
    with pytest.raises(validation.TrainingError, match=expected):
        build.build_run(small_config(model_dir, run_dir, **overrides))
    assert sorted(os.listdir(run_dir)) == ["notes.txt"]


@pytest.mark.parametrize("own_model", [True, False])
def test_a_too_long_prompt_leaves_the_run_directory_as_it_was(own_model, model_dir, tmp_path):
    config = small_config(model_dir, tmp_path / "run", max_prompt_length=3)  # "12+34=" is 6 tokens
    if not own_model:  # the tiny offline model, written into the run directory first
        config.model_name_or_path = ""
    with pytest.raises(validation.TrainingError, match="max_prompt_length=3"):
        build.build_run(config)
    assert not os.path.exists(tmp_path / "run")


def test_out_of_memory_names_the_options_that_size_the_batch(model_dir, tmp_path):
    config = small_config(model_dir, tmp_path / "oom", micro_batch_size=4)
    with pytest.raises(validation.TrainingError, match=r"micro_batch_size \(now 4.*max_new_tokens \(4\)"):
        with loop.out_of_memory_hint(config, 32):
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 39939927136 bytes.")
    with pytest.raises(ValueError, match="unrelated"):  # any other error passes through unchanged
        with loop.out_of_memory_hint(config, 32):
            raise ValueError("unrelated")


@pytest.mark.parametrize("temperature, expected", [(1.0, True), (0.7, False)])
def test_old_logprobs_auto_takes_the_samplers_only_where_they_are_the_trainers(
    temperature, expected, model_dir, tmp_path
):
    config = small_config(model_dir, tmp_path / "run", temperature=temperature)
    assert batch.old_logprobs_from_sampler(config) is expected
    for overrides in ({"algorithm_name": "async_ppo"}, {"sampler": "vllm"}, {"old_logprobs": "trainer"}):
        assert not batch.old_logprobs_from_sampler(small_config(model_dir, tmp_path / "run", **overrides))
    assert batch.old_logprobs_from_sampler(small_config(model_dir, tmp_path / "run", old_logprobs="sampler"))


def test_the_samplers_old_logprobs_are_the_trainers_recomputed_ones(model_dir, tmp_path):
    """The forward pass `old_logprobs="auto"` skips gives what the sampler reported: the same update follows."""
    config = small_config(model_dir, tmp_path / "run", num_iterations=1, old_logprobs="trainer")
    run = build.build_run(config)
    try:
        rollouts, _, scores, _ = collect.collect(run, 1)
        recomputed, metrics = batch.prepare_batch(run, rollouts, scores)
        run.config.old_logprobs = "sampler"
        reported, _ = batch.prepare_batch(run, rollouts, scores)
    finally:
        run.grader.close()
        run.checkpointer.close()
        run.logger.close()
    mask = np.asarray(recomputed["response_mask"]) > 0
    old, new = np.asarray(recomputed["old_logprobs"]), np.asarray(reported["old_logprobs"])
    assert mask.sum() > 0 and np.all(old[mask] < 0)  # real log-probs where the completions are
    np.testing.assert_allclose(new, old, atol=1e-5)
    assert np.all(new[~mask] == 0) and metrics["rollout/sampler_logprob_diff"] < 1e-5
    for key in recomputed:
        if key not in ("old_logprobs", batch.update_lib.PACKED):
            np.testing.assert_allclose(np.asarray(reported[key]), np.asarray(recomputed[key]), atol=1e-5, err_msg=key)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({}, True),
        ({"algorithm_name": "async_ppo"}, True),
        ({"algorithm_name": "reinforce_rebn"}, True),
        ({"skip_zero_advantage": False}, False),
        ({"kl_coef": 0.01}, False),
        ({"entropy_coef": 0.01}, False),
        ({"algorithm_name": "ppo"}, False),  # the critic trains on every row
        ({"algorithm_name": "tppo", "advantage_whitening": "openr"}, False),
    ],
)
def test_zero_advantage_rows_are_left_out_only_where_they_train_nothing(overrides, expected, model_dir, tmp_path):
    assert build.update_config(small_config(model_dir, tmp_path / "run", **overrides)).skip_zero_advantage is expected


def test_an_iterations_update_plan_leaves_out_the_groups_that_earned_one_reward(model_dir, tmp_path):
    config = small_config(model_dir, tmp_path / "run", num_iterations=1)
    run = build.build_run(config)
    try:
        rollouts, _, scores, _ = collect.collect(run, 1)
        scores = np.where(rollouts.prompt_indices % 2 == 0, 1.0, scores).astype(np.float32)  # even groups all right
        scores[rollouts.prompt_indices == 1] = [1.0, 0.0, 0.0, 0.0]  # one group that learns
        prepared, _ = batch.prepare_batch(run, rollouts, scores)
    finally:
        run.grader.close()
        run.checkpointer.close()
        run.logger.close()
    trained = set(np.asarray(prepared[batch.update_lib.PACKED]["rows"]).ravel().tolist()) - {len(rollouts)}
    advantages = np.asarray(prepared["advantages"])
    assert trained == set(np.flatnonzero((advantages != 0).any(axis=1)).tolist())
    assert trained >= set(np.flatnonzero(rollouts.prompt_indices == 1).tolist())
    assert not trained & set(np.flatnonzero(rollouts.prompt_indices % 2 == 0).tolist())


def test_a_finished_run_without_its_final_model_exports_it_when_rerun(model_dir, tmp_path):
    """Before: a run killed after its last checkpoint but before `final_model` was rerun with exit 0 and no
    export. The re-export is the same model, byte for byte."""
    config = small_config(model_dir, tmp_path / "run", num_iterations=1)
    run_and_record(config)
    assert not (tmp_path / "run" / ".lock").exists()  # released when the run ended: free for the next one
    weights = tmp_path / "run" / "final_model" / "model.safetensors"
    exported = weights.read_bytes()
    shutil.rmtree(tmp_path / "run" / "final_model")
    _, history = run_and_record(small_config(model_dir, tmp_path / "run", num_iterations=1))
    assert history == [] and weights.read_bytes() == exported


def test_a_warmstart_record_lost_to_a_kill_is_logged_when_resumed(tmp_path):
    """Before: a kill between writing `warmstart_model` and logging its record lost the record for good."""
    import json

    run_dir, directory = tmp_path / "run", tmp_path / "run" / "warmstart_model"
    directory.mkdir(parents=True)
    record = {"warmstart/eval_accuracy_before": 0.1, "warmstart/eval_accuracy_after": 0.7}
    saved = {"run_dir": os.path.realpath(run_dir), "metrics": record}
    (directory / warmstart.WARMSTART_METRICS).write_text(json.dumps(saved))
    copied_to = tmp_path / "control"  # another run's copy of the warm-start (a control's): not its record
    assert warmstart.unlogged_warmstart_metrics(str(copied_to), str(directory)) == {}
    assert warmstart.unlogged_warmstart_metrics(str(run_dir), str(directory)) == record  # no metrics.jsonl yet
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "rollout/rewards": 0.5}) + "\n")
    assert warmstart.unlogged_warmstart_metrics(str(run_dir), str(directory)) == record
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 0, **record}) + "\n")
    assert warmstart.unlogged_warmstart_metrics(str(run_dir), str(directory)) == {}  # logged once, not twice


def test_names_are_taken_in_any_case():
    """Before: `--config.algorithm_name=GRPO` was accepted and `--config.sampler=JAX` refused."""
    config = default.get_config()
    config.algorithm_name, config.sampler, config.kl_kind = "GRPO", "JAX", "K3"
    validation.validate_settings(config)
    assert (config.algorithm_name, config.sampler, config.kl_kind) == ("grpo", "jax", "k3")
    config.algorithm_name = "Dr_GRPO"  # TRL's spelling of Dr. GRPO
    validation.validate_settings(config)
    assert config.algorithm_name == "drgrpo"


def test_a_resumed_run_says_where_it_resumes(model_dir, tmp_path, capsys):
    run_and_record(small_config(model_dir, tmp_path / "run", num_iterations=1))
    capsys.readouterr()
    run_and_record(small_config(model_dir, tmp_path / "run", num_iterations=3, progress=True))
    assert f"resuming {tmp_path / 'run'} from its checkpoint of iteration 1 (2 of 3 iterations to go)" in (
        capsys.readouterr().err
    )


REWARD_MODULE = '''
def digits(prompts, completions, **columns):
    """TRL's convention: one float per completion."""
    return [sum(ch in "0123456789" for ch in c) / max(len(c), 1) for c in completions]


def sees_the_rows(prompts, completions, answer, question, uid, **columns):
    assert len(prompts) == len(completions) == len(answer) == len(question) == len(uid)
    assert all(q in p for p, q in zip(prompts, question))  # each prompt is its problem's, formatted
    return [0.0] * len(completions)
'''


def test_reward_functions_named_in_the_config_train_the_policy(model_dir, tmp_path):
    """TRL's reward-function convention, named as verl names one (`file.py:function`), weighted: the policy learns
    the functions' reward, each function's mean is logged, and nothing is NaN (no verifier: no accuracy)."""
    import json

    module = tmp_path / "my_rewards.py"
    module.write_text(REWARD_MODULE)
    config = small_config(
        model_dir,
        tmp_path / "run",
        reward_source="functions",
        **{"reward.functions": f"{module}:digits,{module}:sees_the_rows", "reward.weights": "1.0,0.5"},
    )
    summary, history = run_and_record(config, reward_fn=None)
    rewards = [m["rollout/rewards"] for _, m in history]
    assert np.mean(rewards[-2:]) > np.mean(rewards[:2]) + 0.1, rewards
    for _, m in history:  # weight 1, and 0.5 x 0
        assert m["rollout/rewards"] == pytest.approx(m["rollout/function/digits"], abs=1e-6)
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert not [(r["step"], k) for r in records for k, v in r.items() if v is None]  # no NaN written
    assert not any("rollout/accuracy" in r for r in records if "train/policy_loss" in r)


def test_reward_functions_from_python_add_to_the_verifier(model_dir, tmp_path):
    namespace = {}
    exec(REWARD_MODULE, namespace)
    config = small_config(model_dir, tmp_path / "run", num_iterations=1, reward_source="verifier+functions")
    history = []
    summary = loop.train(config, reward_functions=[namespace["digits"]], on_metrics=lambda i, m: history.append(m))
    (metrics,) = history
    assert metrics["rollout/accuracy"] >= 0.0  # the verifier graded
    assert metrics["rollout/rewards"] == pytest.approx(
        metrics["rollout/function/digits"] + metrics["rollout/accuracy"], abs=1e-6
    )  # reward.correct = 1, incorrect = no_answer = 0
    assert summary["final_iteration"] == 1


def test_rloo_and_reinforce_pp_advantages_are_verls_formulas():
    """The two estimators the record adds, through the loop's dispatch, against the formulas written out here
    (verl `compute_rloo_outcome_advantage`, `compute_reinforce_plus_plus_baseline_outcome_advantage`)."""
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 2, 12).astype(np.float32) + rng.normal(0, 0.1, 12).astype(np.float32)
    group_ids = np.repeat(np.arange(3), 4)
    mask = (np.arange(6)[None, :] < rng.integers(1, 7, 12)[:, None]).astype(np.float32)
    batch = {"response_mask": mask}
    means = np.array([scores[group_ids == g].mean() for g in group_ids])
    rloo = rollout.compute_advantages("rloo", batch, scores, group_ids=group_ids, num_groups=3)["advantages"]
    expected = (scores - (means * 4 - scores) / 3)[:, None] * mask  # s_i minus the mean of the other three
    np.testing.assert_allclose(np.asarray(rloo), expected, atol=1e-5)
    pp = rollout.compute_advantages("reinforce_pp", batch, scores, group_ids=group_ids, num_groups=3)["advantages"]
    centred = (scores - means)[:, None] * mask
    token_mean = centred.sum() / mask.sum()
    token_var = (((centred - token_mean) * mask) ** 2).sum() / (mask.sum() - 1)  # unbiased, as verl's masked_whiten
    expected = (centred - token_mean) / np.sqrt(token_var + 1e-8) * mask
    np.testing.assert_allclose(np.asarray(pp) * mask, expected, atol=1e-4)
