"""Option values as the command line and config files give them (issue 60, point 5): a whole-number option takes
no float and no count past its bound; one value written two ways, or in the space form, or in a flag file, is one
value to the TRL / verl alias check."""

import pytest

from mathrl_jax import options
from mathrl_jax import trl_verl_names as names
from mathrl_jax.configs import default
from mathrl_jax.options import Option

TABLE = {o.key: o for o in options.options_of(default.OPTIONS)}


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("n_rollout_threads", 1e12, "n_rollout_threads=1000000000000.0: must be a whole number"),
        ("seed", 1e23, "seed=1e+23: must be a whole number"),
        ("n_rollout_threads", 10**12, "n_rollout_threads=1000000000000 is out of range: must be in [1, 1048576]"),
        ("seed", 10**23, "seed=100000000000000000000000 is out of range: must be in [0, 4294967295]"),
        ("seed", -1, "seed=-1 is out of range: must be in [0, 4294967295]"),
        ("reward.num_workers", 10**6, "reward.num_workers=1000000 is out of range: must be in [1, 1024]"),
        ("num_iterations", 2**31, f"num_iterations={2**31} is out of range: must be in [0, {options.MAX_WHOLE}]"),
        ("arithmetic.digits", -(2**40), f"arithmetic.digits={-(2**40)} is out of range: must be in [{-(2**31)}, "),
    ],
)
def test_a_whole_number_option_refuses_floats_and_counts_past_its_bound(key, value, message):
    assert options.range_error(TABLE[key], value).startswith(message)


@pytest.mark.parametrize("key, value", [("seed", 2**32 - 1), ("seed", 0), ("n_rollout_threads", 2**20), ("lr", 1e9)])
def test_the_bounds_themselves_are_taken(key, value):
    assert options.range_error(TABLE[key], value) is None


def test_a_float_option_has_no_whole_number_bound():
    assert options.range_error(Option("x", 1.0), 1e300) is None
    assert options.range_error(Option("x", None, value_type=int), 2**31) is not None


@pytest.mark.parametrize(
    "argv",
    [
        ["t", "--config.learning_rate=1e-5", "--config.lr=0.00001"],
        ["t", "--config.beta=0.1", "--config.kl_coef=1e-1"],
        ["t", "--config.num_generations", "4", "--config.group_size=4"],
        ["t", "--config.resume", "--config.learning_rate=3e-5", "--config.lr", "0.00003"],
    ],
)
def test_one_value_written_two_ways_under_two_names_is_taken(argv):
    resolved, _ = names.resolve_names(argv)
    assert not any("learning_rate" in a or "beta" in a or "num_generations" in a for a in resolved)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["t", "--config.learning_rate", "1e-5", "--config.lr=0.001"], "--config.learning_rate 1e-5 and --config.lr"),
        (["t", "--config.lr", "0.001", "--config.learning_rate=1e-5"], "--config.lr 0.001 and --config.learning_rate"),
        # Found in review: literals of other types are other values (True is not 1, 1 is not 1.0).
        (["t", "--config.beta=True", "--config.kl_coef=1"], "--config.beta=True and --config.kl_coef"),
        (["t", "--config.beta=1", "--config.kl_coef=1.0"], "--config.beta=1 and --config.kl_coef"),
    ],
)
def test_the_space_form_is_seen_by_the_conflict_check(argv, message):
    with pytest.raises(names.RefusedName, match=message):
        names.resolve_names(argv)


def test_a_boolean_option_takes_no_next_word(tmp_path):
    """`--config.remat` alone is True: the next word is a flag of its own, not its value."""
    resolved, notes = names.resolve_names(["t", "--config.gradient_checkpointing", "--config.remat=False"])
    assert resolved == ["t", "--config.remat", "--config.remat=False"] and len(notes) == 1


def test_a_flag_files_names_are_rewritten_and_checked(tmp_path):
    flagfile = tmp_path / "flags.txt"
    flagfile.write_text("--config.learning_rate=0.5\n")
    resolved, notes = names.resolve_names(["t", f"--flagfile={flagfile}", "--config.seed=3"])
    assert resolved == ["t", "--config.lr=0.5", "--config.seed=3"] and notes
    with pytest.raises(names.RefusedName, match="given twice, as --config.learning_rate=0.5 and --config.lr=1"):
        names.resolve_names(["t", "--flagfile", str(flagfile), "--config.lr=1"])
    with pytest.raises(names.RefusedName, match="cannot be read"):
        names.resolve_names(["t", f"--flagfile={tmp_path}/none.txt"])
