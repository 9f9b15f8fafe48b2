"""The supervised warm-start before RL (same command): examples, the reuse check, the atomic model write."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List

from flax import nnx

from mathrl_jax import files
from mathrl_jax.data import teacher
from mathrl_jax.models import hf
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.sampling import JaxSampler
from mathrl_jax.sharding import distributed
from mathrl_jax.train import sft
from mathrl_jax.train.evaluation import EvalSettings, held_out_accuracy
from mathrl_jax.train.problems import encode_prompts, prompt_settings
from mathrl_jax.train.progress import Progress
from mathrl_jax.train.validation import fail


def warmstart_examples(config, codec: TextCodec, problems) -> List[sft.Example]:
    """(prompt ids, target ids) of the warm-start: the teacher's worked solutions (`data/teacher.py`), or the bare
    boxed answers. Prompts are the RL prompts (the same template), targets end with EOS."""
    prompt_ids = encode_prompts(prompt_settings(config), codec, problems)
    if config.warmstart.targets == "answer":
        targets = [sft.BOXED_COMPLETION.format(answer=p.answer) for p in problems]
    else:
        targets = teacher.teacher_solutions(
            [p.question for p in problems],
            slip_rate=config.warmstart.slip_rate,
            seed=config.seed,
            question_format=config.arithmetic.question_format,
        )
    return [(prompt, codec.encode(text) + [codec.eos_token_id]) for prompt, text in zip(prompt_ids, targets)]


WARMSTART_RECORD = "mathrl_jax_warmstart.json"
WARMSTART_METRICS = "mathrl_jax_warmstart_metrics.json"  # the warm-start's before / after accuracies
"""Written beside the warm-started model: the settings that made it, checked when a run reuses it."""


def warmstart_settings(config) -> Dict[str, Any]:
    return {"seed": int(config.seed), **config.warmstart.to_dict()}


def check_reused_warmstart(config, directory: str) -> None:
    path = os.path.join(directory, WARMSTART_RECORD)
    if not os.path.isfile(path):  # made before the record existed: nothing to compare
        return
    with open(path) as f:
        saved = json.load(f)
    wanted = json.loads(json.dumps(warmstart_settings(config)))  # tuples as lists, as saved
    changed = {k: (saved.get(k), v) for k, v in wanted.items() if saved.get(k) != v}
    if changed:
        differences = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        fail(
            f"{directory} was warm-started with other settings ({differences}); a run reuses its warm-start: "
            "use a new --config.run_dir, or remove that directory to redo it"
        )


def warm_start(
    config,
    evaluation: EvalSettings,
    run_dir,
    model_dir,
    codec,
    train_problems,
    sampler_args,
    grader,
    eval_prompts,
    eval_golds,
):
    """Supervised warm-start into run_dir/warmstart_model (once; a resumed run reuses it)."""
    directory = os.path.join(run_dir, "warmstart_model")
    if config.warmstart.steps <= 0:
        return model_dir, {}
    if os.path.isdir(directory):
        check_reused_warmstart(config, directory)
        return directory, unlogged_warmstart_metrics(run_dir, directory)
    model = hf.load_model(model_dir, param_dtype=config.param_dtype, dtype=config.dtype)
    before = held_out_accuracy(evaluation, JaxSampler(model, **sampler_args), codec, grader, eval_prompts, eval_golds)
    examples = warmstart_examples(config, codec, train_problems)
    start = time.time()
    bar = Progress(config.warmstart.steps, keys=("loss",), disable=not config.progress, desc="warm-start")
    with bar:
        new_state = sft.supervised_warmstart(
            model,
            examples,
            steps=config.warmstart.steps,
            batch_size=config.warmstart.batch_size,
            learning_rate=config.warmstart.lr,
            warmup_steps=config.warmstart.warmup_steps,
            seed=config.seed,
            pad_id=codec.pad_token_id,
            log_every=max(1, config.warmstart.steps // 100),
            log_fn=bar.update if config.progress else None,
        )
    seconds = time.time() - start
    warm = nnx.merge(nnx.graphdef(model), new_state)
    after = held_out_accuracy(evaluation, JaxSampler(warm, **sampler_args), codec, grader, eval_prompts, eval_golds)

    metrics = {
        "warmstart/eval_accuracy_before": before["eval/accuracy"],
        "warmstart/eval_accuracy_after": after["eval/accuracy"],
        "warmstart/seconds": seconds,
        "warmstart/steps": float(config.warmstart.steps),
    }

    def write(d):
        hf.export_checkpoint(new_state, model.config, d, tokenizer_dir=model_dir)
        with open(os.path.join(d, WARMSTART_RECORD), "w") as f:
            json.dump(warmstart_settings(config), f, indent=2)
        with open(os.path.join(d, WARMSTART_METRICS), "w") as f:  # kept with the model: see unlogged_...
            json.dump({"run_dir": os.path.realpath(run_dir), "metrics": metrics}, f, indent=2)

    # Every process has checked `directory` above before process 0 writes it (the barrier in on_main_process).
    distributed.on_main_process("warmstart_model", lambda: files.write_directory(directory, write))
    return directory, metrics


def unlogged_warmstart_metrics(run_dir: str, directory: str) -> dict:
    """The warm-start's record, saved beside its model, when `metrics.jsonl` does not hold it yet: a run killed
    between writing `warmstart_model` and logging the record logs it when resumed; otherwise nothing. Only the
    run that trained the warm-start logs it: a copy of another run's `warmstart_model` (a control's) does not."""
    path = os.path.join(directory, WARMSTART_METRICS)
    log = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        saved = json.load(f)
    if saved.get("run_dir") != os.path.realpath(run_dir):
        return {}
    if os.path.isfile(log):
        with open(log, encoding="utf-8", errors="replace") as f:
            if any('"warmstart/eval_accuracy_after"' in line for line in f):
                return {}
    return saved["metrics"]
