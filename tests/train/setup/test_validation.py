"""Config validation and input checks: bad settings and bad input are refused with a `TrainingError` that names the
offending value (or, for an out-of-memory, the options that size the batch) before the run directory is written to;
names are normalised whatever their case, and a reused or resumed warm-start must agree with its own record."""

import os

import pytest

from mathrl_jax.configs import default
from mathrl_jax.errors import TrainingError
from mathrl_jax.train import loop
from mathrl_jax.train.rollouts import _problems as problems
from mathrl_jax.train.setup import _build as build
from mathrl_jax.train.setup import _inputs as inputs
from mathrl_jax.train.setup import _sections as sections
from mathrl_jax.train.setup import _validation as validation
from mathrl_jax.train.warmstart import _warmstart as warmstart
from tests.train.loop_fixtures import model_dir, run_and_record, small_config  # noqa: F401  (the fixture)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"warmstart.steps": 5, "warmstart.targets": "gold"}, "'gold'"),
        ({"warmstart.steps": 5, "warmstart.slip_rate": 1.5}, "1.5"),
        ({"num_logged_samples": -1}, "num_logged_samples=-1"),
        (
            {
                "warmstart.steps": 5,
                "warmstart.targets": "answer",
                "env_name": "guess_number",
                "group_size": 1,
                "algorithm_name": "reinforce_rebn",
            },
            "'answer' with env_name='guess_number'",
        ),
        (
            {
                "env_name": "guess_number",
                "group_size": 1,
                "algorithm_name": "reinforce_rebn",
                "warmstart.steps": 0,
                "eval_interval": 2,
                "num_eval_problems": 0,
            },
            "num_eval_problems held-out games: got 0",
        ),
        (
            {
                "env_name": "guess_number",
                "group_size": 1,
                "algorithm_name": "reinforce_rebn",
                "guess_number.max_turns": 0,
            },
            "max_turns must be a positive int, got 0",
        ),
        ({"old_logprobs": "cached"}, "'cached'"),
        ({"old_logprobs": "sampler", "temperature": 0.7}, "temperature=0.7"),
        ({"old_logprobs": "sampler", "algorithm_name": "async_ppo"}, "'async_ppo'"),
    ],
)
def test_bad_warmstart_and_control_settings_name_the_value(overrides, message, model_dir, tmp_path):  # noqa: F811
    config = small_config(model_dir, tmp_path / "bad", **overrides)
    with pytest.raises(TrainingError, match=message):
        validation.validate_config(config)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"arithmetic.levels": (3,)}, r"levels=\(3,\)"),
        ({"dataset_name": "math500", "dataset_path": "x.jsonl"}, "'math500'"),
    ],
)
def test_the_teacher_needs_its_task(overrides, message, model_dir, tmp_path):  # noqa: F811
    config = small_config(model_dir, tmp_path / "bad", **{"warmstart.steps": 5, **overrides})
    with pytest.raises(TrainingError, match=message):
        problems.check_warmstart_data(config)
    config.warmstart.targets = "answer"  # imitating the gold answers works on any data
    problems.check_warmstart_data(config)


def test_a_reused_warmstart_must_match_the_settings(model_dir, tmp_path):  # noqa: F811
    import json

    config = small_config(model_dir, tmp_path / "run", **{"warmstart.steps": 5})
    directory = tmp_path / "warm"
    directory.mkdir()
    warmstart.check_reused_warmstart(
        sections.warmstart_settings(config), str(directory)
    )  # no record (an older run): reused as it is
    record = {"seed": config.seed, **config.warmstart.to_dict()}
    (directory / warmstart.WARMSTART_RECORD).write_text(json.dumps(record))
    warmstart.check_reused_warmstart(sections.warmstart_settings(config), str(directory))
    config.warmstart.slip_rate = 0.5
    with pytest.raises(TrainingError, match="slip_rate: 0.7 -> 0.5"):
        warmstart.check_reused_warmstart(sections.warmstart_settings(config), str(directory))


def test_a_control_never_resumes_the_real_run(model_dir, tmp_path):  # noqa: F811
    run_and_record(small_config(model_dir, tmp_path / "run", num_iterations=1))
    with pytest.raises(TrainingError, match="shuffle_rewards: False -> True"):
        build.build_run(small_config(model_dir, tmp_path / "run", num_iterations=2, shuffle_rewards=True))


@pytest.mark.parametrize("case", ["step tag of two tokens", "mistral prm"])
def test_a_prm_that_cannot_serve_stops_the_run_before_anything_is_written(case, model_dir, tmp_path):  # noqa: F811
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
    with pytest.raises(TrainingError, match=expected):
        build.build_run(small_config(model_dir, run_dir, **overrides))
    assert sorted(os.listdir(run_dir)) == ["notes.txt"]


@pytest.mark.parametrize("own_model", [True, False])
def test_a_too_long_prompt_leaves_the_run_directory_as_it_was(own_model, model_dir, tmp_path):  # noqa: F811
    config = small_config(model_dir, tmp_path / "run", max_prompt_length=3)  # "12+34=" is 6 tokens
    if not own_model:  # the tiny offline model, written into the run directory first
        config.model_name_or_path = ""
    with pytest.raises(TrainingError, match="max_prompt_length=3"):
        build.build_run(config)
    assert not os.path.exists(tmp_path / "run")


def test_out_of_memory_names_the_options_that_size_the_batch(model_dir, tmp_path):  # noqa: F811
    config = small_config(model_dir, tmp_path / "oom", micro_batch_size=4)
    run, batch = sections.run_settings(config), sections.batch_settings(config, sections.update_config(config))
    with pytest.raises(TrainingError, match=r"micro_batch_size \(now 4.*max_new_tokens \(4\)"):
        with loop.out_of_memory_hint(run, batch, 32):
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 39939927136 bytes.")
    with pytest.raises(ValueError, match="unrelated"):  # any other error passes through unchanged
        with loop.out_of_memory_hint(run, batch, 32):
            raise ValueError("unrelated")


def test_a_warmstart_record_lost_to_a_kill_is_logged_when_resumed(tmp_path):
    """Before: a kill between writing `warmstart_model` and logging its record lost the record for good."""
    import json

    run_dir, directory = tmp_path / "run", tmp_path / "run" / "warmstart_model"
    directory.mkdir(parents=True)
    record = {  # as _warmstart writes it (its accuracies absent where nothing was held out)
        "warmstart/seconds": 3.0,
        "warmstart/steps": 5.0,
        "warmstart/eval_accuracy_before": 0.1,
        "warmstart/eval_accuracy_after": 0.7,
    }
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


def test_trls_loss_type_names_are_one_spelling_of_a_mode():
    """`--config.loss_type=dr_grpo` (TRL's name, through its alias) is saved as the mode it means, so that a resume
    naming the mode either way compares equal."""
    config = default.get_config()
    config.loss_agg_mode = "dr_grpo"
    validation.validate_settings(config)
    assert config.loss_agg_mode == "seq-mean-token-sum-norm"


@pytest.mark.parametrize("algorithm_name", ["gspo", "appo"])
def test_a_dual_clip_is_refused_where_the_loss_has_none(algorithm_name):
    """GSPO's sequence ratio and APPO's action ratio have no dual clip: clip_c was ignored without a word."""
    config = default.get_config()
    config.algorithm_name, config.clip_c = algorithm_name, 3.0
    with pytest.raises(TrainingError, match=rf"clip_c=3.0 .* is not part of {algorithm_name}'s loss"):
        validation.validate_settings(config)


def test_the_arithmetic_process_verifier_needs_its_task_and_step_split():
    """`prm_model_name_or_path='arithmetic_steps'` (no checkpoint: the built-in verifier) scores two-digit
    column steps split at ','; any other task or split is refused naming them."""
    config = default.get_config()
    config.algorithm_name, config.reward_source = "appo", "prm"
    config.prm_model_name_or_path = "arithmetic_steps"
    with pytest.raises(TrainingError, match="step_separator=','"):
        validation.validate_settings(config)
    config.step_separator = ","
    validation.validate_settings(config)
    assert type(inputs.load_prm(config)).__name__ == "ArithmeticStepVerifier"
    config.arithmetic.levels = (1, 2)
    with pytest.raises(TrainingError, match="levels"):
        validation.validate_settings(config)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"arithmetic.digits": 1}, "arithmetic.digits=1: expected a whole number, 2 to 10"),
        ({"arithmetic.digits": 11}, "arithmetic.digits=11"),
        ({"arithmetic.digits": True}, "arithmetic.digits=True"),
        ({"arithmetic.eval_digits": 1}, r"arithmetic.eval_digits=1: expected a whole number, 0 \(none\) or 2 to 10"),
        ({"arithmetic.eval_digits": -2}, "arithmetic.eval_digits=-2"),
        ({"arithmetic.digits": 4, "arithmetic.levels": (2, 3)}, r"arithmetic.levels=\(2, 3\)"),
        ({"arithmetic.eval_digits": 4, "arithmetic.levels": (3,)}, r"\(3,\)"),
        ({"arithmetic.eval_digits": 4, "dataset_name": "math500", "dataset_path": "x.jsonl"}, "'math500'"),
        ({"arithmetic.eval_digits": 4, "num_eval_problems": 0}, "num_eval_problems problems: got 0"),
        # The tiny model warm-started on the teacher: room for the longest worked solution (one token a character)
        (
            {"model_name_or_path": "", "warmstart.steps": 5, "arithmetic.digits": 4, "max_new_tokens": 40},
            "max_new_tokens=40 is under the 57 tokens .* at arithmetic.digits=4: raise max_new_tokens to 57",
        ),
        (
            {"model_name_or_path": "", "warmstart.steps": 5, "arithmetic.eval_digits": 6, "max_new_tokens": 57},
            "under the 81 tokens .* arithmetic.eval_digits=6",
        ),
    ],
)
def test_bad_column_chain_settings_name_the_value(overrides, message, model_dir, tmp_path):  # noqa: F811
    config = small_config(model_dir, tmp_path / "bad", **overrides)
    with pytest.raises(TrainingError, match=message):
        validation.validate_settings(config)


def test_column_chain_settings_that_are_fine(model_dir, tmp_path):  # noqa: F811
    # A budget too short for the teacher is the user's choice where the policy does not write its solutions
    for overrides in (
        {"arithmetic.digits": 4},  # own model
        {"model_name_or_path": "", "arithmetic.digits": 4},  # no warm-start
        {"model_name_or_path": "", "arithmetic.digits": 4, "warmstart.steps": 5, "warmstart.targets": "answer"},
        {"model_name_or_path": "", "arithmetic.digits": 4, "warmstart.steps": 5, "max_new_tokens": 57},
        {"arithmetic.eval_digits": 2},
    ):
        validation.validate_settings(small_config(model_dir, tmp_path / "fine", **overrides))
    # The process verifier scores the column chain too
    config = small_config(model_dir, tmp_path / "prm", **{"arithmetic.digits": 6, "arithmetic.eval_digits": 8})
    config.algorithm_name, config.reward_source = "appo", "prm+verifier"
    config.prm_model_name_or_path, config.step_separator = "arithmetic_steps", ","
    validation.validate_settings(config)


def test_the_column_chain_warmstart_records_its_length(model_dir, tmp_path):  # noqa: F811
    config = small_config(model_dir, tmp_path / "run", **{"warmstart.steps": 5})
    assert "task" not in sections.warmstart_settings(config).record()  # the default's record as before
    config.arithmetic.digits = 4
    record = sections.warmstart_settings(config).record()
    assert record["task"] == {"arithmetic.digits": 4}
    directory = tmp_path / "warm"
    directory.mkdir()
    import json

    (directory / warmstart.WARMSTART_RECORD).write_text(json.dumps(record))
    config.arithmetic.digits = 5
    with pytest.raises(TrainingError, match="task"):
        warmstart.check_reused_warmstart(sections.warmstart_settings(config), str(directory))


def test_the_harder_split_is_held_out_and_of_its_length(model_dir, tmp_path):  # noqa: F811
    config = small_config(model_dir, tmp_path / "run", **{"arithmetic.digits": 3, "num_eval_problems": 40})
    train, held_out = problems.load_data(config)
    assert problems.load_hard_eval(config, train, held_out) == []
    assert all(len(p.question) == len("123+456=") for p in train + held_out)
    config.arithmetic.eval_digits = 5
    hard = problems.load_hard_eval(config, train, held_out)
    assert len(hard) == 40 == len({p.question for p in hard})
    assert all(len(p.question) == len("12345+67890=") for p in hard)
    assert hard == problems.load_hard_eval(config, train, held_out)
    config.arithmetic.eval_digits = 3  # the training length: still none of the training or held-out questions
    same = problems.load_hard_eval(config, train, held_out)
    assert not {p.question for p in same} & {p.question for p in train + held_out}
