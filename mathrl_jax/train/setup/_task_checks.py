"""The built-in tasks' own settings (part of the config checks, `_validation`): the column chain's lengths, countdown's
numbers, the held-out pool a generated task draws, and the game's options."""

from __future__ import annotations

from mathrl_jax.envs import MULTI_TURN_ENVS
from mathrl_jax.errors import fail


def check_column_chain(c, levels: tuple) -> None:
    """`arithmetic.digits` and `arithmetic.eval_digits` (the column chain, `data/arithmetic.py`): whole numbers in
    range, on level 2 alone, and, with the tiny model warm-started on the teacher (one token per character), a
    `max_new_tokens` that holds the longest worked solution at those lengths."""
    from mathrl_jax.data import arithmetic, teacher

    a = c.arithmetic
    low, high = arithmetic.MIN_DIGITS, arithmetic.MAX_DIGITS
    for key, value, off in (("digits", a.digits, None), ("eval_digits", a.eval_digits, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not (low <= value <= high or value == off):
            allowed = f"{low} to {high}" if off is None else f"0 (none) or {low} to {high}"
            fail(f"arithmetic.{key}={value!r}: expected a whole number, {allowed}")
    if a.digits != 2 and levels != (2,):
        fail(
            f"arithmetic.digits={a.digits} sets the operands of level 2 (a+b, a-b): use --config.arithmetic.levels=2, "
            f"got arithmetic.levels={c.arithmetic.levels!r}"
        )
    if a.eval_digits:
        if c.dataset_name != "arithmetic" or c.env_name or levels != (2,):
            fail(
                f"arithmetic.eval_digits={a.eval_digits} draws a held-out set of level 2 of the arithmetic task: it "
                f"needs dataset_name='arithmetic', arithmetic.levels=2 and no env_name (got {c.dataset_name!r}, "
                f"{levels}, {c.env_name!r})"
            )
        if not c.num_eval_problems:
            fail(f"arithmetic.eval_digits={a.eval_digits} evaluates num_eval_problems problems: got 0")
    # Only where the policy writes the teacher's solutions (the tiny model warm-started on them; its tokenizer
    # takes a token per character), and only longer ones: two digits fit every budget the tests and recipes use.
    lengths = [(key, a[key]) for key in ("digits", "eval_digits") if a[key] > 2]
    teacher_warmstart = c.warmstart.steps > 0 and c.warmstart.targets == "teacher"
    if c.dataset_name == "arithmetic" and not c.env_name and not c.model_name_or_path and teacher_warmstart:
        for key, digits in lengths:
            needed = teacher.longest_solution(digits) + 1  # + EOS
            if c.max_new_tokens < needed:
                fail(
                    f"max_new_tokens={c.max_new_tokens} is under the {needed} tokens (with EOS) of the longest worked "
                    f"solution at arithmetic.{key}={digits}: raise max_new_tokens to {needed}"
                )


def check_held_out_pool(c) -> None:
    """A generated task draws its held-out set once (`arithmetic.num_eval`, `countdown.num_eval`, which also keeps
    those problems out of training); `num_eval_problems` evaluates that many of them, so more than the pool holds
    would be cut to the pool without a word."""
    pools = {"arithmetic": "arithmetic.num_eval", "countdown": "countdown.num_eval"}
    if c.env_name or c.dataset_name not in pools:
        return
    pool = pools[c.dataset_name]
    size = c[c.dataset_name].num_eval
    if c.num_eval_problems > size:
        fail(
            f"num_eval_problems={c.num_eval_problems} is more than the {size} held-out problems {pool} draws: "
            f"raise --config.{pool} to {c.num_eval_problems}, or lower num_eval_problems"
        )


def check_countdown(c) -> None:
    """`config.countdown` (`data/countdown/`): the instance settings in range, `eval_count` 0 or a count, and, with
    the tiny model warm-started on the teacher (one token per character), a `max_new_tokens` that holds the
    teacher's longest solution at either count."""
    from mathrl_jax.data.countdown import problems, rules, teacher

    s = c.countdown
    try:
        problems.check_settings(s.count, s.min_number, s.max_number, s.max_target)
    except ValueError as error:
        fail(f"countdown.{error}")
    low, high = rules.MIN_NUMBERS, rules.MAX_NUMBERS
    if (
        isinstance(s.eval_count, bool)
        or not isinstance(s.eval_count, int)
        or not (s.eval_count == 0 or low <= s.eval_count <= high)
    ):
        fail(f"countdown.eval_count={s.eval_count!r}: expected 0 (none) or a whole number from {low} to {high}")
    if s.eval_count and c.dataset_name != "countdown":
        fail(
            f"countdown.eval_count={s.eval_count} draws a held-out set of countdown: it needs dataset_name='countdown'"
        )
    if s.eval_count and not c.num_eval_problems:
        fail(f"countdown.eval_count={s.eval_count} evaluates num_eval_problems problems: got 0")
    if c.dataset_name == "countdown" and c.env_name:
        fail(f"dataset_name='countdown' is a single-turn task; env_name={c.env_name!r} plays a game instead")
    teacher_warmstart = c.warmstart.steps > 0 and c.warmstart.targets == "teacher"
    if c.dataset_name == "countdown" and not c.model_name_or_path and teacher_warmstart:
        for key in ("count", "eval_count"):
            if s[key]:
                needed = teacher.longest_solution(s[key], s.max_number) + 1  # + EOS
                if c.max_new_tokens < needed:
                    fail(
                        f"max_new_tokens={c.max_new_tokens} is under the {needed} tokens (with EOS) of the countdown "
                        f"teacher's longest solution at countdown.{key}={s[key]}: raise max_new_tokens to {needed}"
                    )


def check_env(c) -> None:
    """A multi-turn run's environment exists and its options (`config.<env_name>`) make one."""
    if c.env_name not in MULTI_TURN_ENVS:
        fail(f"unknown env_name {c.env_name!r}; expected '' (single-turn) or one of {', '.join(MULTI_TURN_ENVS)}")
    if c.eval_interval and c.num_eval_problems < 1:
        fail(f"eval_interval={c.eval_interval} plays num_eval_problems held-out games: got {c.num_eval_problems}")
    options = c.get(c.env_name)
    try:
        MULTI_TURN_ENVS[c.env_name](**(options.to_dict() if options is not None else {}))
    except (TypeError, ValueError) as error:
        fail(f"{c.env_name}: {error} (--config.{c.env_name}.*)")
