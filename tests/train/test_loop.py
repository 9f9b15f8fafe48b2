"""The training loop end to end on a one-layer tiny checkpoint: every algorithm learns a simple reward, a resumed run
(synchronous or asynchronous) is bit-identical to an uninterrupted one, the asynchronous loop keeps its staleness
bound, and evaluation, samples, export and metrics come out as documented."""

import os
import shutil

import jax
import numpy as np
import pytest

from mathrl_jax.train import loop
from mathrl_jax.train.rollouts import _collect as collect
from tests.train.loop_fixtures import (  # noqa: F401  (the fixture)
    first_char_reward,
    model_dir,
    run_and_record,
    small_config,
)

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
    "gspo": {"loss_agg_mode": "grpo"},  # TRL's GSPO: importance_sampling_level="sequence", loss_type="grpo"
}
FAST = ("grpo", "rloo")


@pytest.mark.parametrize(
    "algorithm",
    [a if a in FAST else pytest.param(a, marks=pytest.mark.slow) for a in ALGORITHM_SETTINGS],
)
def test_each_algorithm_improves_a_simple_reward(algorithm, model_dir, tmp_path):  # noqa: F811
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


def test_resume_is_bit_identical_to_an_uninterrupted_run(model_dir, tmp_path):  # noqa: F811
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


def test_async_with_zero_offpolicyness_reproduces_the_synchronous_loop(model_dir, tmp_path, monkeypatch):  # noqa: F811
    config = small_config(
        model_dir, tmp_path / "async", algorithm_name="async_ppo", max_head_offpolicyness=0, num_iterations=3
    )
    asynchronous, async_history = run_and_record(config)
    assert all(m["async/staleness"] == 0 for _, m in async_history)

    def inline(run):  # the same algorithm, rollouts made inline with the current weights
        return collect.SyncRollouts(run.rollouts)

    monkeypatch.setitem(loop.ROLLOUT_SOURCES, "async", inline)
    synchronous, _ = run_and_record(
        small_config(model_dir, tmp_path / "sync", algorithm_name="async_ppo", num_iterations=3)
    )
    for a, b in zip(leaves(asynchronous["state"]), leaves(synchronous["state"])):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("eta", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_async_never_trains_on_rollouts_older_than_allowed(eta, model_dir, tmp_path):  # noqa: F811
    config = small_config(
        model_dir, tmp_path / f"eta{eta}", algorithm_name="async_ppo", max_head_offpolicyness=eta, num_iterations=4
    )
    _, history = run_and_record(config)
    # Iteration i samples with the params after iteration max(0, i - 1 - eta), whatever the threads' timing.
    assert [m["async/staleness"] for _, m in history] == [min(i - 1, eta) for i, _ in history]
    assert [m["async/policy_version"] for _, m in history] == [max(0, i - 1 - eta) for i, _ in history]


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("algorithm", ["async_ppo", "grpo"])
def test_an_interrupted_async_run_resumes_bit_for_bit(algorithm, model_dir, tmp_path):  # noqa: F811
    """The generator runs eta batches ahead; the checkpoint keeps them, so the resumed run trains on the very
    batches the uninterrupted one did (sampled with the params of iterations before the checkpoint). The same for
    any algorithm the generator feeds (GRPO at max_head_offpolicyness > 0: the testbed's staleness knob)."""
    settings = dict(algorithm_name=algorithm, max_head_offpolicyness=2, num_iterations=5, save_interval=2)
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
    assert [m["async/staleness"] for _, m in resumed_history] == [2, 2, 2]  # the saved batches, 2 versions old
    for a, b in zip(leaves(straight["state"]), leaves(resumed["state"])):
        np.testing.assert_array_equal(a, b)
    for (i, a), (j, b) in zip(straight_history[2:], resumed_history):
        for key in ("rollout/rewards", "train/policy_loss", "async/staleness", "async/policy_version"):
            assert a[key] == b[key], (i, key, a[key], b[key])


@pytest.mark.slow
def test_an_async_run_resumes_under_another_offpolicyness(model_dir, tmp_path):  # noqa: F811
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
def test_prm_step_rewards_drive_appo(model_dir, tmp_path):  # noqa: F811
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
def test_multi_turn_guess_number_with_rebn(model_dir, tmp_path):  # noqa: F811
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


def test_evaluations_measure_sampled_accuracy_at_the_ends_and_write_samples(model_dir, tmp_path):  # noqa: F811
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
    "micro_batch_size, policy",
    [(0, "nothing_saveable"), (2, "nothing_saveable"), (2, "dots_with_no_batch_dims_saveable")],
    ids=["one micro-batch", "several micro-batches", "several micro-batches, projections kept"],
)
def test_remat_trains_as_without_it(micro_batch_size, policy, model_dir, tmp_path):  # noqa: F811
    """Several micro-batches (padded rows, 4 a minibatch): the accumulation traces the metric shapes once more, where
    the remat'd model crashed with flax's TraceContextError. `remat_policy` reaches the trainer's model."""
    from mathrl_jax.train.setup._trainer import build_trainer

    settings = dict(num_iterations=2, micro_batch_size=micro_batch_size, packing=False)
    _, plain = run_and_record(small_config(model_dir, tmp_path / "plain", **settings))
    config = small_config(model_dir, tmp_path / "remat", remat=True, remat_policy=policy, **settings)
    assert build_trainer(config, model_dir).model.config.remat_policy == policy
    _, remat = run_and_record(config)
    for (i, a), (j, b) in zip(plain, remat):
        assert i == j
        for key in ("rollout/rewards", "rollout/response_length", "train/policy_loss", "train/grad_norm"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_scanned_layers_train_as_unrolled_ones(algorithm, model_dir, tmp_path):  # noqa: F811
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


def test_adafactor_trains_the_policy_and_the_critic_on_a_sharded_mesh(model_dir, tmp_path):  # noqa: F811
    """The optimizer users pick for memory, through the trainer: its factored moments (vectors under each kernel's
    path) are placed on the mesh (they failed the kernels' two-axis rules), and a PPO run learns with it."""
    settings = dict(num_iterations=2, algorithm_name="ppo", optimizer="adafactor", lr=1e-3)
    settings.update({"mesh.dp": 4, "mesh.fsdp": 2, **ALGORITHM_SETTINGS["ppo"]})
    _, history = run_and_record(small_config(model_dir, tmp_path / "run", **settings))
    assert len(history) >= 2
    for _, metrics in history:
        assert np.isfinite(metrics["train/policy_loss"]) and np.isfinite(metrics["train/value_loss"])
        assert metrics["train/skipped_updates"] == 0


def test_a_finished_run_without_its_final_model_exports_it_when_rerun(model_dir, tmp_path):  # noqa: F811
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


def test_a_resumed_run_says_where_it_resumes(model_dir, tmp_path, capsys):  # noqa: F811
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


def test_reward_functions_named_in_the_config_train_the_policy(model_dir, tmp_path):  # noqa: F811
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


def test_reward_functions_from_python_add_to_the_verifier(model_dir, tmp_path):  # noqa: F811
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
