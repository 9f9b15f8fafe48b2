"""The supervised warm-start before RL (same command): examples, the reuse check, the atomic model write."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Dict, List, Tuple

from flax import nnx

import mathrl_jax.train.warmstart._sft as sft
from mathrl_jax import files
from mathrl_jax.data import teacher
from mathrl_jax.data.countdown import teacher as countdown_teacher
from mathrl_jax.errors import fail
from mathrl_jax.models import hf
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.sampling import JaxSampler
from mathrl_jax.sharding import distributed
from mathrl_jax.train import run_directory
from mathrl_jax.train.reporting import Progress
from mathrl_jax.train.rollouts import PromptSettings, encode_prompts


@dataclasses.dataclass(frozen=True)
class WarmStartSettings:
    """The supervised warm-start's section of the run's settings (made by the build): `steps` optimizer steps
    (0: none) of `batch_size` examples at `lr` after `warmup_steps`, on the teacher's worked solutions
    (`targets="teacher"`: the arithmetic teacher, each carry dropped with probability `slip_rate`, or with
    `teacher="countdown"` the countdown teacher, `data/countdown/teacher.py`, its last operator slipping with that
    probability) or the bare boxed answers ("answer"); the model at `param_dtype` / `dtype`, its prompts as the
    RL's."""

    steps: int
    prompts: PromptSettings
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 0
    targets: str = "teacher"
    slip_rate: float = 0.0
    seed: int = 0
    question_format: str = "{expr}="
    param_dtype: str = "float32"
    dtype: str = "float32"
    progress: bool = True
    # In the record: a multi-turn run's game (env, options, prompts, games), the column chain's arithmetic.digits,
    # countdown's dataset_name and instance settings
    task: Tuple[Tuple[str, Any], ...] = ()
    teacher: str = "arithmetic"  # whose worked solutions: "arithmetic" (data/teacher.py) or "countdown"

    def __post_init__(self):
        if self.targets not in ("teacher", "answer"):
            raise ValueError(f"unknown warmstart.targets {self.targets!r}; expected 'teacher' or 'answer'")
        if self.teacher not in ("arithmetic", "countdown"):
            raise ValueError(f"unknown teacher {self.teacher!r}; expected 'arithmetic' or 'countdown'")
        if self.steps < 0 or self.batch_size < 1 or not self.lr > 0 or not 0.0 <= self.slip_rate <= 1.0:
            raise ValueError(
                f"warmstart.steps={self.steps}, batch_size={self.batch_size}, lr={self.lr}, slip_rate="
                f"{self.slip_rate}: out of range"
            )

    def record(self) -> Dict[str, Any]:
        """What made a warm-started model, saved beside it (`WARMSTART_RECORD`) and checked when a run reuses it."""
        names = ("steps", "batch_size", "lr", "warmup_steps", "targets", "slip_rate")
        record = {"seed": int(self.seed), **{name: getattr(self, name) for name in names}}
        return {**record, "task": dict(self.task)} if self.task else record


def warmstart_examples(settings: WarmStartSettings, codec: TextCodec, problems) -> List[sft.Example]:
    """(prompt ids, target ids) of the warm-start: the teacher's worked solutions (`data/teacher.py`, or
    `data/countdown/teacher.py`), or the bare boxed answers. Prompts are the RL prompts (the same template),
    targets end with EOS."""
    prompt_ids = encode_prompts(settings.prompts, codec, problems)
    if settings.targets == "answer":
        targets = [sft.BOXED_COMPLETION.format(answer=p.answer) for p in problems]
    elif settings.teacher == "countdown":
        targets = countdown_teacher.teacher_solutions(
            [p.question for p in problems], slip_rate=settings.slip_rate, seed=settings.seed
        )
    else:
        targets = teacher.teacher_solutions(
            [p.question for p in problems],
            slip_rate=settings.slip_rate,
            seed=settings.seed,
            question_format=settings.question_format,
        )
    return [(prompt, codec.encode(text) + [codec.eos_token_id]) for prompt, text in zip(prompt_ids, targets)]


WARMSTART_RECORD = "mathrl_jax_warmstart.json"
WARMSTART_METRICS = "mathrl_jax_warmstart_metrics.json"  # the warm-start's before / after accuracies
"""Written beside the warm-started model: the settings that made it, checked when a run reuses it."""


def check_reused_warmstart(settings: WarmStartSettings, directory: str) -> None:
    path = os.path.join(directory, WARMSTART_RECORD)
    if not os.path.isfile(path):  # made before the record existed: nothing to compare
        return
    with open(path) as f:
        saved = json.load(f)
    wanted = json.loads(json.dumps(settings.record()))  # tuples as lists, as saved
    # Over both records' keys: a game's warm-start (with a "task") is not an arithmetic run's, nor the reverse.
    changed = {k: (saved.get(k), wanted.get(k)) for k in {**saved, **wanted} if saved.get(k) != wanted.get(k)}
    if changed:
        differences = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        fail(
            f"{directory} was warm-started with other settings ({differences}); a run reuses its warm-start: "
            "use a new --config.run_dir, or remove that directory to redo it"
        )


def warm_start(
    settings: WarmStartSettings,
    run_dir,
    model_dir,
    sampler_args,
    examples: Callable[[], List[sft.Example]],
    accuracy: Callable[[JaxSampler], float],
):
    """Supervised warm-start into run_dir/warmstart_model (once; a resumed run reuses it): `examples()` (the
    task's teacher: `warmstart_examples`, or a game's `game_warmstart_examples`), with the held-out
    `accuracy(sampler)` before and after (the greedy accuracy, or a game's success rate)."""
    directory = run_directory.path(run_dir, run_directory.WARMSTART_MODEL)
    if settings.steps <= 0:
        return model_dir, {}
    if os.path.isdir(directory):
        check_reused_warmstart(settings, directory)
        return directory, unlogged_warmstart_metrics(run_dir, directory)
    model = hf.load_model(model_dir, param_dtype=settings.param_dtype, dtype=settings.dtype)
    before = accuracy(JaxSampler(model, **sampler_args))
    start = time.time()
    bar = Progress(settings.steps, keys=("loss",), disable=not settings.progress, desc="warm-start")
    with bar:
        new_state = sft.supervised_warmstart(
            model,
            examples(),
            steps=settings.steps,
            batch_size=settings.batch_size,
            learning_rate=settings.lr,
            warmup_steps=settings.warmup_steps,
            seed=settings.seed,
            pad_id=sampler_args["pad_token_id"],
            log_every=max(1, settings.steps // 100),
            log_fn=bar.update if settings.progress else None,
        )
    seconds = time.time() - start
    warm = nnx.merge(nnx.graphdef(model), new_state)
    after = accuracy(JaxSampler(warm, **sampler_args))

    metrics = {"warmstart/seconds": seconds, "warmstart/steps": float(settings.steps)}
    if before == before and after == after:  # NaN: no held-out problem (eval_holdout=0), nothing measured
        metrics.update({"warmstart/eval_accuracy_before": before, "warmstart/eval_accuracy_after": after})

    def write(d):
        hf.export_checkpoint(new_state, model.config, d, tokenizer_dir=model_dir)
        with open(os.path.join(d, WARMSTART_RECORD), "w") as f:
            json.dump(settings.record(), f, indent=2)
        with open(os.path.join(d, WARMSTART_METRICS), "w") as f:  # kept with the model: see unlogged_...
            json.dump({"run_dir": os.path.realpath(run_dir), "metrics": metrics}, f, indent=2)

    # Every process has checked `directory` above before process 0 writes it (the barrier in on_main_process).
    distributed.on_main_process(run_directory.WARMSTART_MODEL, lambda: files.write_directory(directory, write))
    return directory, metrics


def unlogged_warmstart_metrics(run_dir: str, directory: str) -> dict:
    """The warm-start's record, saved beside its model, when `metrics.jsonl` does not hold it yet: a run killed
    between writing `warmstart_model` and logging the record logs it when resumed; otherwise nothing. Only the
    run that trained the warm-start logs it: a copy of another run's `warmstart_model` (a control's) does not."""
    path = os.path.join(directory, WARMSTART_METRICS)
    log = run_directory.path(run_dir, run_directory.METRICS)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        saved = json.load(f)
    if saved.get("run_dir") != os.path.realpath(run_dir):
        return {}
    if os.path.isfile(log):
        with open(log, encoding="utf-8", errors="replace") as f:
            if any('"warmstart/steps"' in line for line in f):
                return {}
    return saved["metrics"]
