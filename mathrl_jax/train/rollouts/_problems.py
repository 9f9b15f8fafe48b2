"""The run's problems: loading and checking the data a config names, and their prompt ids."""

from __future__ import annotations

import dataclasses
import os
from typing import List

from mathrl_jax.data import arithmetic, prompts, sources
from mathrl_jax.data.countdown import problems as countdown
from mathrl_jax.errors import fail
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.sharding import distributed


def check_warmstart_data(config) -> None:
    """The teacher's worked solutions exist for a+b / a-b (level 2, at any `arithmetic.digits`) and for countdown;
    countdown has no bare answer to imitate (checked after the data loads, so that a missing or malformed data file
    is reported first)."""
    w = config.warmstart
    if w.steps <= 0:
        return
    if config.env_name:  # the game's teacher plays the game (multiturn.TEACHERS; validation checked targets)
        return
    if config.dataset_name == "countdown":
        if w.targets != "teacher":
            fail(
                f"warmstart.targets={w.targets!r} with dataset_name='countdown': its gold answer is the instance, not "
                "a completion to imitate; use --config.warmstart.targets=teacher or --config.warmstart.steps=0"
            )
        return
    if w.targets != "teacher":
        return
    if config.dataset_name != "arithmetic":
        fail(
            f"warmstart.targets='teacher' writes worked solutions of the arithmetic and countdown tasks only, not of "
            f"dataset_name={config.dataset_name!r}: use --config.warmstart.targets=answer (imitate the gold "
            "answers) or --config.warmstart.steps=0 (no warm-start)"
        )
    levels = tuple(config.arithmetic.levels)
    if levels != (2,):
        fail(
            f"warmstart.targets='teacher' solves a+b / a-b (arithmetic level 2, any arithmetic.digits) only, got "
            f"arithmetic.levels={levels}: use --config.arithmetic.levels=2 or --config.warmstart.targets=answer"
        )


def load_data(config):
    """(train problems, eval problems); raises TrainingError naming the file / field on bad data."""
    if config.dataset_name == "arithmetic":
        a = config.arithmetic
        train, held_out = arithmetic.arithmetic_train_eval(
            a.num_train,
            a.num_eval,
            seed=config.seed,
            levels=tuple(a.levels),
            question_format=a.question_format,
            digits=a.digits,
        )
        return train, held_out[: config.num_eval_problems]
    if config.dataset_name == "countdown":
        c = config.countdown
        train, held_out = countdown.countdown_train_eval(c.num_train, c.num_eval, seed=config.seed, **_instances(c))
        return train, held_out[: config.num_eval_problems]
    for name in ("dataset_path", "eval_dataset_path"):
        path = config[name]
        if path and not os.path.exists(path):
            fail(f"{name} {path!r} does not exist (all data is read from local paths)")
    subject = config.dataset_name if config.dataset_name in sources.MATH_SUBJECTS else None
    layout = data_layout(config)
    eval_path, eval_split = config.eval_dataset_path, config.eval_dataset_split
    try:
        problems = sources.load_problems(config.dataset_path, layout, split=config.dataset_split or None)
        if subject:
            problems = _keep_subject(problems, subject, config.dataset_path)
        if eval_path or eval_split:  # another file, or another split of the training dataset
            held_out = sources.load_problems(eval_path or config.dataset_path, layout, split=eval_split or None)
            if subject:
                held_out = _keep_subject(held_out, subject, eval_path or config.dataset_path)
            if not eval_path:
                distributed.note(
                    f"evaluating on the {eval_split!r} split of {config.dataset_path} ({len(held_out)} problems; "
                    f"num_eval_problems={config.num_eval_problems} of them)",
                )
        else:
            problems, held_out = hold_out(config, problems)
    except sources.DataError as error:
        named = f" (--config.data.fields={config.data.fields!r})" if config.data.fields and error.field else ""
        fail(str(error) + named)
    if not problems:
        fail(f"dataset {config.dataset_path!r} has no training problems left")
    _check_message_prompts(config, problems + held_out)
    return problems, held_out[: config.num_eval_problems]


def data_layout(config):
    """The layout of the run's data files: `data.fields`'s mapping (`sources.parse_fields`), else
    `dataset_name`'s (a MATH subject's file is read with "auto")."""
    if config.data.fields:
        try:
            return sources.parse_fields(config.data.fields)
        except ValueError as error:
            fail(str(error))
    return "auto" if config.dataset_name in sources.MATH_SUBJECTS else config.dataset_name


def holdout_count(eval_holdout: int, num_eval_problems: int, total: int) -> int:
    """How many of `total` training problems `eval_holdout` holds out: -1 = min(num_eval_problems, a tenth of them
    (at least 1)), 0 = none, N = N."""
    if eval_holdout == -1:
        return min(num_eval_problems, total // 10 or 1)
    return eval_holdout


def hold_out(config, problems):
    """(training problems, held-out problems): `holdout_count` problems drawn with the run's seed
    (`sources.shuffled_order(len, seed, 0)`), said on stderr; none left to train on is refused."""
    total, path = len(problems), config.dataset_path
    count = holdout_count(config.eval_holdout, config.num_eval_problems, total)
    if count == 0:
        return problems, []
    if count >= total:
        fail(
            f"eval_holdout={config.eval_holdout} holds out {count} of the {total} problems of {path!r}, leaving none "
            "to train on: lower --config.eval_holdout (0 trains on all of them), or name an evaluation file with "
            "--config.eval_dataset_path"
        )
    order = sources.shuffled_order(total, config.seed, 0)
    distributed.note(
        f"held out {count} of {total} problems of {path} for evaluation (seed {config.seed}); "
        "--config.eval_holdout=0 trains on all of them, --config.eval_dataset_path names another file",
    )
    return [problems[i] for i in order[count:]], [problems[i] for i in order[:count]]


def _check_message_prompts(config, problems) -> None:
    """A chat-message prompt is rendered by a template that takes one (`prompts.MESSAGE_TEMPLATES`)."""
    if config.prompt_template in prompts.MESSAGE_TEMPLATES:
        return
    first = next((p for p in problems if p.messages is not None), None)
    if first is not None:
        fail(
            f"prompt_template={config.prompt_template!r} cannot render the chat-message prompts of "
            f"{config.dataset_path!r} (problem {first.uid!r}): use one of {sorted(prompts.MESSAGE_TEMPLATES)} "
            "('plain': the tokenizer's chat template over the messages as they are)"
        )


def _instances(section) -> dict:
    """The countdown instances' settings of `config.countdown`."""
    return dict(
        count=section.count,
        min_number=section.min_number,
        max_number=section.max_number,
        max_target=section.max_target,
    )


def load_hard_eval(config, train_problems, eval_problems):
    """The second held-out set (`arithmetic.eval_digits`, `countdown.eval_count`; [] at 0): `num_eval_problems`
    distinct problems, level 2 at that many digits or countdown instances of that many numbers, from a stream of
    their own (split "eval_digits<d>", "eval_count<k>"), none a training or evaluation question."""
    if config.dataset_name == "countdown" and config.countdown.eval_count:
        c = config.countdown
        return countdown.countdown_problems(
            config.num_eval_problems,
            seed=config.seed,
            **{**_instances(c), "count": c.eval_count},
            split=f"eval_count{c.eval_count}",
            unique=True,
            exclude={p.question for p in (*train_problems, *eval_problems)},
        )
    a = config.arithmetic
    if config.dataset_name != "arithmetic" or not a.eval_digits:
        return []
    return arithmetic.arithmetic_problems(
        config.num_eval_problems,
        seed=config.seed,
        levels=tuple(a.levels),
        question_format=a.question_format,
        split=f"eval_digits{a.eval_digits}",
        unique=True,
        exclude={p.question for p in (*train_problems, *eval_problems)},
        digits=a.eval_digits,
    )


def _keep_subject(problems, subject: str, path: str):
    """OpenR's `--dataset_name prealgebra`: the problems of that MATH subject. Data without subjects (OpenR's own
    two-field copy of MATH-500) is used whole, as OpenR does (its environment never reads the name), with a note."""
    if not any(p.subject for p in problems):
        distributed.note(
            f"note: {path!r} has no subject field, so dataset_name={subject!r} keeps every problem (as OpenR does)",
        )
        return problems
    kept = sources.filter_by_subject(problems, subject)
    if not kept:
        found = sorted({sources.subject_key(p.subject) for p in problems if p.subject})
        fail(f"dataset_name={subject!r}: no problem of that subject in {path!r}; its subjects are {found}")
    return kept


@dataclasses.dataclass(frozen=True)
class PromptSettings:
    """How a problem becomes a prompt: the template (`data.prompts.TEMPLATE_NAMES`) and the longest prompt."""

    template: str
    max_length: int

    def __post_init__(self):
        if self.template not in prompts.TEMPLATE_NAMES:
            raise ValueError(f"unknown prompt_template {self.template!r}; expected one of {prompts.TEMPLATE_NAMES}")
        if self.max_length < 1:
            raise ValueError(f"max_prompt_length={self.max_length} must be >= 1")


def prompt_settings(config) -> PromptSettings:
    return PromptSettings(config.prompt_template, int(config.max_prompt_length))


def prompt_text(template: str, codec: TextCodec, problem) -> str:
    """A problem's prompt (`prompts.problem_prompt`: its chat messages through the tokenizer's template, else its
    question under `template`)."""
    source = getattr(codec, "directory", "the model")
    return prompts.problem_prompt(problem, template, tokenizer=codec.tokenizer, source=source)


def encode_prompts(settings: PromptSettings, codec: TextCodec, problems) -> List[List[int]]:
    out = []
    for problem in problems:
        text = prompt_text(settings.template, codec, problem)
        ids = codec.encode(text)
        if len(ids) > settings.max_length:
            fail(
                f"problem {problem.uid!r} has a {len(ids)}-token prompt, over --config.max_prompt_length="
                f"{settings.max_length}: raise it, or drop the longer problems from the data file"
            )
        out.append(ids)
    return out


PROMPT_CHECK_BATCH = 512
"""Prompts tokenized together by `check_prompts` (a fast tokenizer encodes a batch in parallel)."""


def check_prompts(settings: PromptSettings, codec: TextCodec, train_problems, eval_problems) -> None:
    """Fails now, not at iteration 500, on a prompt over `max_prompt_length`: every evaluation and training prompt
    is tokenized (in batches of `PROMPT_CHECK_BATCH`), and the first too long is named with its row."""
    for what, problems in (("evaluation", eval_problems), ("training", train_problems)):
        for start in range(0, len(problems), PROMPT_CHECK_BATCH):
            batch = problems[start : start + PROMPT_CHECK_BATCH]
            texts = [prompt_text(settings.template, codec, problem) for problem in batch]
            lengths = [len(ids) for ids in codec.tokenizer(texts, add_special_tokens=False)["input_ids"]]
            for offset, length in enumerate(lengths):
                if length > settings.max_length:
                    fail(
                        f"problem {batch[offset].uid!r} ({what} problem {start + offset + 1} of {len(problems)}) "
                        f"has a {length}-token prompt, over --config.max_prompt_length={settings.max_length}: "
                        "raise it, or drop the longer problems from the data file"
                    )
