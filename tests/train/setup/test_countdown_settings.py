"""dataset_name="countdown" in the trainer: its settings checked where settings are checked (naming the value), its
data and harder split, its warm-start teacher and record, its grader and process verifier chosen by the build."""

import json

import pytest

from mathrl_jax.configs import countdown as countdown_recipe
from mathrl_jax.data.countdown import check_derivation, parse_instance
from mathrl_jax.errors import TrainingError
from mathrl_jax.train.rollouts import _problems as problems
from mathrl_jax.train.setup import _build as build
from mathrl_jax.train.setup import _inputs as inputs
from mathrl_jax.train.setup import _resume as resume
from mathrl_jax.train.setup import _sections as sections
from mathrl_jax.train.setup import _validation as validation
from mathrl_jax.train.warmstart import _warmstart as warmstart
from tests.train.loop_fixtures import model_dir, small_config  # noqa: F401  (the fixture)


def countdown_config(model_dir, run_dir, **overrides):  # noqa: F811
    return small_config(
        model_dir,
        run_dir,
        **{"dataset_name": "countdown", "countdown.num_train": 64, "countdown.num_eval": 8, **overrides},
    )


def test_the_recipe_is_valid_and_fits_the_teacher():
    config = countdown_recipe.get_config()
    validation.validate_settings(config)
    assert config.dataset_name == "countdown" and config.countdown.eval_count == config.countdown.count + 1
    assert config.max_new_tokens == 40  # the teacher's longest solution at 4 numbers, with EOS


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"countdown.count": 2}, "countdown.count=2: expected 3 to 6 numbers"),
        ({"countdown.count": 7}, "countdown.count=7"),
        ({"countdown.min_number": 0}, "countdown.min_number=0"),
        ({"countdown.max_number": 100}, "max_number=100"),
        ({"countdown.max_target": 0}, "countdown.max_target=0"),
        ({"countdown.num_train": 0}, "countdown.num_train=0 is out of range"),
        ({"countdown.eval_count": 2}, r"countdown.eval_count=2: expected 0 \(none\) or a whole number from 3 to 6"),
        ({"countdown.eval_count": 4, "dataset_name": "arithmetic"}, "it needs dataset_name='countdown'"),
        ({"countdown.eval_count": 4, "num_eval_problems": 0}, "num_eval_problems problems: got 0"),
        ({"dataset_path": "x.jsonl"}, "dataset_name='countdown' \\(a built-in task"),
        (
            {"model_name_or_path": "", "warmstart.steps": 5, "countdown.eval_count": 4, "max_new_tokens": 28},
            "max_new_tokens=28 is under the 40 tokens .* at countdown.eval_count=4: raise max_new_tokens to 40",
        ),
    ],
)
def test_bad_countdown_settings_name_the_value(overrides, message, model_dir, tmp_path):  # noqa: F811
    config = countdown_config(model_dir, tmp_path / "bad", **overrides)
    with pytest.raises(TrainingError, match=message):
        validation.validate_settings(config)


def test_the_process_verifier_belongs_to_its_task(model_dir, tmp_path):  # noqa: F811
    config = countdown_config(model_dir, tmp_path / "prm", algorithm_name="tppo", reward_source="prm+verifier")
    config.prm_model_name_or_path = "countdown_steps"
    with pytest.raises(TrainingError, match="step_separator=','"):
        validation.validate_settings(config)
    config.step_separator = ","
    validation.validate_settings(config)
    assert type(inputs.load_prm(config)).__name__ == "CountdownStepVerifier"
    config.dataset_name = "arithmetic"
    with pytest.raises(TrainingError, match="countdown_steps.*needs dataset_name='countdown'"):
        validation.validate_settings(config)


def test_the_build_grades_countdown_by_the_derivation(model_dir, tmp_path):  # noqa: F811
    grader = build._grader(countdown_config(model_dir, tmp_path / "a"))
    assert type(grader).__name__ == "CountdownGrader"
    results = grader.grade_batch(["\\boxed{26}", "7*3=21,21+5=26,\\boxed{26}"], ["3,7,5->26"] * 2)
    assert [r.status for r in results] == ["incorrect", "correct"]
    math_grader = build._grader(small_config(model_dir, tmp_path / "b"))
    try:
        assert type(math_grader).__name__ == "MathGrader"
    finally:
        math_grader.close()


def test_data_and_the_harder_split(model_dir, tmp_path):  # noqa: F811
    config = countdown_config(model_dir, tmp_path / "run", num_eval_problems=30, **{"countdown.num_eval": 40})
    train, held_out = problems.load_data(config)
    assert len(train) == 64 and len(held_out) == 30
    assert not {p.question for p in held_out} & {p.question for p in train}
    assert all(len(parse_instance(p.question).numbers) == 3 for p in train + held_out)
    assert all(check_derivation(parse_instance(p.answer), p.solution).correct for p in train + held_out)
    assert problems.load_hard_eval(config, train, held_out) == []
    config.countdown.eval_count = 5
    hard = problems.load_hard_eval(config, train, held_out)
    assert len(hard) == 30 == len({p.question for p in hard})
    assert all(len(parse_instance(p.question).numbers) == 5 for p in hard)
    assert hard == problems.load_hard_eval(config, train, held_out)
    assert "countdown.eval_count" in resume.resume_may_change()  # evaluation only: a resumed run may change it


def test_the_warmstart_imitates_the_countdown_teacher_and_records_the_task(model_dir, tmp_path):  # noqa: F811
    config = countdown_config(model_dir, tmp_path / "run", **{"warmstart.steps": 5, "warmstart.slip_rate": 0.0})
    problems.check_warmstart_data(config)  # the teacher writes countdown's solutions
    settings = sections.warmstart_settings(config)
    assert settings.teacher == "countdown"
    record = settings.record()
    assert record["task"] == {
        "dataset_name": "countdown",
        "countdown.count": 3,
        "countdown.min_number": 1,
        "countdown.max_number": 9,
        "countdown.max_target": 99,
        "countdown.num_train": 64,
    }

    from mathrl_jax.models.codec import TextCodec

    codec = TextCodec(model_dir)
    train, _ = problems.load_data(config)
    examples = warmstart.warmstart_examples(settings, codec, train[:4])
    for (prompt, target), problem in zip(examples, train):
        assert codec.decode(prompt) == problem.question
        assert target[-1] == codec.eos_token_id
        text = codec.decode(target[:-1])
        assert text.endswith("}") and "\\boxed{" in text and text.split(",")[0][0] == problem.question[0]

    directory = tmp_path / "warm"
    directory.mkdir()
    (directory / warmstart.WARMSTART_RECORD).write_text(json.dumps(record))
    config.countdown.count = 4
    with pytest.raises(TrainingError, match="task"):
        warmstart.check_reused_warmstart(sections.warmstart_settings(config), str(directory))

    config.warmstart.targets = "answer"  # countdown's gold answer is the instance, nothing to imitate
    with pytest.raises(TrainingError, match="targets='answer' with dataset_name='countdown'"):
        problems.check_warmstart_data(config)
