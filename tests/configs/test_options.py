"""One definition per option (`options.py`, the table in `configs/default.py`): an option added to the
table alone is in the config, in `--help`, in the range check and in the resume rule; the table is consistent."""

import json
import math

import pytest

from mathrl_jax import options
from mathrl_jax.configs import default
from mathrl_jax.errors import TrainingError
from mathrl_jax.options import MAY_CHANGE, NEVER, Option
from mathrl_jax.train.setup._help import flat_items, format_help
from mathrl_jax.train.setup._resume import check_resumed_config, resume_may_change, resume_never_changes
from mathrl_jax.train.setup._validation import validate_settings, validate_values


def saved_run(tmp_path, config):
    """A run directory holding `config` as the trainer saves it and one checkpoint step."""
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict(), default=str))
    return str(tmp_path)


def test_an_option_added_to_the_table_alone_reaches_help_the_range_check_and_the_resume_rule(monkeypatch, tmp_path):
    knob = Option("test_knob", 3, "a knob the test adds", low=1, high=8, resume=MAY_CHANGE, group="run")
    fixed = Option("test_fixed", 0.5, "another, fixed on resume", low=0.0, low_open=True, group="update")
    mode = Option("test_mode", "a", "a choice", choices=("a", "b"), case_free=True, group="update")
    monkeypatch.setattr(default, "OPTIONS", default.OPTIONS + (knob, fixed, mode))
    config = default.get_config()
    assert (config.test_knob, config.test_fixed) == (3, 0.5)

    help_text = format_help(config, "mathrl_jax/configs/default.py")
    run_group = help_text[help_text.index("\nrun:\n") : help_text.index("\nmodel:\n")]
    assert "  --config.test_knob=3\n      a knob the test adds\n" in run_group

    validate_values(config)
    for key, value, bounds in (
        ("test_knob", 9, r"\[1, 8\]"),
        ("test_knob", 0, r"\[1, 8\]"),
        ("test_fixed", 0.0, r"\(0.0, inf\]"),
    ):
        bad = default.get_config()
        bad[key] = value
        with pytest.raises(TrainingError, match=rf"^{key}={value} is out of range: must be in {bounds}$"):
            validate_values(bad)

    chosen = default.get_config()
    chosen.test_mode = "B"
    validate_settings(chosen)  # any case, lower-cased
    assert chosen.test_mode == "b"
    chosen.test_mode = "c"
    with pytest.raises(TrainingError, match="^unknown test_mode 'c'; expected one of 'a', 'b'$"):
        validate_settings(chosen)

    assert "test_knob" in resume_may_change() and "test_fixed" not in resume_may_change()
    run_dir = saved_run(tmp_path, config)
    resumed = default.get_config()
    resumed.test_knob = 5
    check_resumed_config(resumed, run_dir)  # may change: no refusal
    resumed.test_fixed = 0.25
    with pytest.raises(TrainingError, match=r"test_fixed: 0.5 -> 0.25"):
        check_resumed_config(resumed, run_dir)


def test_a_never_option_is_refused_even_when_named_in_resume_allow_changes(monkeypatch, tmp_path):
    monkeypatch.setattr(default, "OPTIONS", default.OPTIONS + (Option("test_tree", 1, resume=NEVER),))
    assert "test_tree" in resume_never_changes()
    config = default.get_config()
    run_dir = saved_run(tmp_path, config)
    config.test_tree, config.resume_allow_changes = 2, "test_tree"
    with pytest.raises(TrainingError, match="decide what the checkpoint holds"):
        check_resumed_config(config, run_dir)


def test_every_option_is_in_the_table_once_with_its_default_in_its_bounds():
    table = options.options_of(default.OPTIONS)
    keys = [o.key for o in table]
    assert len(keys) == len(set(keys))
    assert sorted(keys) == sorted(key for key, _ in flat_items(default.get_config()))
    for option in table:
        assert option.group, option.key
        assert options.range_error(option, option.default) is None, option.key
        assert options.choice_error(option, option.default) is None, option.key
    meanings = options.meanings(default.OPTIONS)
    assert all(group for group, _ in meanings.values())


@pytest.mark.parametrize(
    "option, value, refused",
    [
        (Option("x", 1, low=0), 0, False),
        (Option("x", 1, low=0, low_open=True), 0, True),
        (Option("x", 1.0, low=0.0, low_open=True), 1e-300, False),
        (Option("x", 1, low=0, high=1), 1, False),
        (Option("x", 1, low=0, high=1), 2, True),
        (Option("x", 1, high=1), -math.inf, False),
        (Option("x", 1, low=0), True, True),  # a bool is not a count
        (Option("x", 1, low=0), "1", True),
        (Option("x", 1, low=0), None, False),  # unset
        (Option("x", 1), -5, False),  # no bounds
    ],
)
def test_range_error_against_the_bounds_written_out(option, value, refused):
    assert (options.range_error(option, value) is not None) == refused


def test_choices_named_by_module_are_the_librarys_own_tuple():
    from mathrl_jax.losses import aggregate

    option = Option("x", "token-mean", choices="mathrl_jax.losses.aggregate:LOSS_AGG_MODES")
    assert options.choices_of(option) == tuple(aggregate.LOSS_AGG_MODES)
    assert options.choice_error(option, "token-mean") is None
    assert "unknown x 'tokens'" in options.choice_error(option, "tokens")
    by_key = {o.key: o for o in options.options_of(default.OPTIONS)}
    for key in ("algorithm_name", "sampler", "loss_agg_mode", "kl_kind", "attention", "remat_policy", "vllm.transfer"):
        assert options.choices_of(by_key[key]), key  # each resolves


def test_a_table_entry_that_contradicts_itself_is_refused_where_it_is_written():
    with pytest.raises(ValueError, match="resume"):
        Option("x", 1, resume="sometimes")
    with pytest.raises(ValueError, match="value_type"):
        Option("x", None)
    with pytest.raises(ValueError, match="low=2 > high=1"):
        Option("x", 1, low=2, high=1)
    with pytest.raises(ValueError, match="module:NAME"):
        Option("x", "a", choices="a,b")
