"""The synchronous training loop: the public pieces composed as a user would.

One iteration:

    problems (data loader) ─► prompts ─► Sampler.generate (n per prompt)
      ─► rewards (math grader; DAPO shaping / filtering)
      ─► old / reference log-probs, critic values (jitted forwards)
      ─► advantages (train/rollout.py) ─► update (train/update.py)
      ─► Sampler.update_weights(params, version) ─► metrics, eval, checkpoint

`build_run(config)` checks the whole config and every input it names before it
writes anything; `train(config)` runs the loop. Both raise `TrainingError` for
bad input, with a message naming the bad value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import sys
import threading
import time
import zlib
from typing import Any, Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mathrl_jax import sharding
from mathrl_jax.data import arithmetic, prompts, sources, teacher
from mathrl_jax.models import hf, qwen, tiny, value_head
from mathrl_jax.rewards.math_grader import MathGrader, RewardValues
from mathrl_jax.sampling import JaxSampler, SamplingParams
from mathrl_jax.sampling.jax_sampler import bucket
from mathrl_jax.train import rollout as rollout_lib
from mathrl_jax.train import sft
from mathrl_jax.train import state as state_lib
from mathrl_jax.train import update as update_lib
from mathrl_jax.train.checkpoint import Checkpointer
from mathrl_jax.train.evaluation import completion_samples, evaluate
from mathrl_jax.train.metrics import MetricsLogger, Progress

RewardFn = Callable[[List[str], List[str]], Any]


class TrainingError(ValueError):
    """Bad input to a training run (config, data, model path, mesh); the message names it."""


# ----------------------------------------------------------------------------- config checks

LOSS_OF_ALGORITHM = {"async_ppo": "decoupled", "reinforce_rebn": "reinforce"}
DATASET_LAYOUTS = ("auto", "math500", "math", "gsm8k", "areal_boba", "verl")


def _fail(message: str):
    raise TrainingError(message)


def normalize_config(config) -> None:
    """Spellings other systems use, in place: OpenR's upper-case algorithm names (`APPO`)."""
    if isinstance(config.algorithm_name, str):
        config.algorithm_name = config.algorithm_name.lower()


def validate_config(config) -> None:
    """Every check that needs no file: names, ranges, divisibility."""
    c = config
    normalize_config(c)
    if c.algorithm_name not in rollout_lib.ALGORITHMS:
        _fail(f"unknown algorithm_name {c.algorithm_name!r}; expected one of {', '.join(rollout_lib.ALGORITHMS)}")
    if c.sampler not in ("jax", "vllm"):
        _fail(f"unknown sampler {c.sampler!r}; expected 'jax' or 'vllm'")
    if c.dataset_name != "arithmetic" and c.dataset_name not in DATASET_LAYOUTS + sources.MATH_SUBJECTS:
        _fail(
            f"unknown dataset_name {c.dataset_name!r}; expected 'arithmetic', a layout {DATASET_LAYOUTS} or a MATH "
            f"subject (OpenR's --dataset_name, which keeps that subject's problems) {sources.MATH_SUBJECTS}"
        )
    if c.advantage_whitening not in ("batch", "openr"):
        _fail(f"unknown advantage_whitening {c.advantage_whitening!r}; expected 'batch' or 'openr'")
    if c.value_loss_type not in update_lib.losses.value.VALUE_LOSS_TYPES:
        _fail(
            f"unknown value_loss_type {c.value_loss_type!r}; expected one of {update_lib.losses.value.VALUE_LOSS_TYPES}"
        )
    if c.dataset_name != "arithmetic" and not c.dataset_path:
        _fail(f"dataset_name={c.dataset_name!r} needs --config.dataset_path (a local file or directory)")
    if c.prompt_template not in prompts.TEMPLATE_NAMES:
        _fail(f"unknown prompt_template {c.prompt_template!r}; expected one of {prompts.TEMPLATE_NAMES}")
    positive = (
        "n_rollout_threads",
        "group_size",
        "episode_length",
        "max_new_tokens",
        "ppo_epoch",
        "num_mini_batch",
        "max_prompt_length",
        "log_interval",
    )
    for name in positive:
        if int(c[name]) < 1:
            _fail(f"{name}={c[name]} must be >= 1")
    for name in (
        "num_iterations",
        "num_env_steps",
        "eval_interval",
        "save_interval",
        "micro_batch_size",
        "max_head_offpolicyness",
        "eval_n_samples",
        "num_logged_samples",
    ):
        if int(c[name]) < 0:
            _fail(f"{name}={c[name]} must be >= 0")
    rows = c.n_rollout_threads * (c.episode_length if c.env_name else c.group_size)
    if rows % c.num_mini_batch:
        _fail(
            f"{rows} rows per iteration (n_rollout_threads x group_size, or x episode_length for envs) do not split "
            f"into num_mini_batch={c.num_mini_batch}"
        )
    mini = rows // c.num_mini_batch
    if c.micro_batch_size and c.micro_batch_size < mini and mini % c.micro_batch_size:
        _fail(f"a minibatch of {mini} rows does not split into micro_batch_size={c.micro_batch_size}")
    if c.lr <= 0 or c.critic_lr <= 0:
        _fail(f"lr={c.lr} and critic_lr={c.critic_lr} must be > 0")
    if not 0.0 < c.temperature or not 0.0 < c.top_p <= 1.0:
        _fail(f"temperature={c.temperature} must be > 0 and top_p={c.top_p} in (0, 1] for RL sampling")
    if c.env_name and c.group_size != 1:
        _fail(f"env_name={c.env_name!r}: one episode per environment, so group_size must be 1 (got {c.group_size})")
    if c.algorithm_name in rollout_lib.GROUP_ALGORITHMS and c.group_size < 2:
        _fail(f"{c.algorithm_name} compares samples of one prompt: group_size={c.group_size} must be >= 2")
    if c.env_name and c.algorithm_name != "reinforce_rebn":
        _fail(
            f"env_name={c.env_name!r} (multi-turn) trains with algorithm_name='reinforce_rebn', "
            f"not {c.algorithm_name!r}"
        )
    if c.reward_source not in ("verifier", "prm", "prm+verifier"):
        _fail(f"unknown reward_source {c.reward_source!r}; expected 'verifier', 'prm' or 'prm+verifier'")
    if "prm" in c.reward_source and not c.prm_model_name_or_path:
        _fail(f"reward_source={c.reward_source!r} needs --config.prm_model_name_or_path (a local PRM checkpoint)")
    if c.shuffle_rewards and (c.env_name or c.reward_source != "verifier"):
        _fail(
            "shuffle_rewards (the control run) shuffles the verifier's per-response rewards: it needs "
            f"reward_source='verifier' and no env_name, got {c.reward_source!r} and {c.env_name!r}"
        )
    if c.env_name not in ("", "guess_number"):
        _fail(f"unknown env_name {c.env_name!r}; expected '' (single-turn problems) or 'guess_number'")
    if c.loss_agg_mode not in update_lib.losses.LOSS_AGG_MODES:
        _fail(f"unknown loss_agg_mode {c.loss_agg_mode!r}; expected one of {update_lib.losses.LOSS_AGG_MODES}")
    if c.lr_schedule not in state_lib.SCHEDULES:
        _fail(f"unknown lr_schedule {c.lr_schedule!r}; expected one of {state_lib.SCHEDULES}")
    if c.warmstart.targets not in ("teacher", "answer"):
        _fail(f"unknown warmstart.targets {c.warmstart.targets!r}; expected 'teacher' or 'answer'")
    if not 0.0 <= c.warmstart.slip_rate <= 1.0:
        _fail(f"warmstart.slip_rate={c.warmstart.slip_rate} must be a probability in [0, 1]")
    try:
        sharding.resolve_mesh_shape(c.mesh.to_dict(), jax.device_count())
    except (sharding.MeshError, ValueError) as error:
        _fail(f"bad mesh {c.mesh.to_dict()}: {error}")


def num_iterations(config) -> int:
    """`num_iterations`, or `num_env_steps` over the samples one iteration takes."""
    if config.num_env_steps:
        per_iteration = config.n_rollout_threads * config.group_size * config.episode_length
        return max(1, math.ceil(config.num_env_steps / per_iteration))
    return int(config.num_iterations)


# ----------------------------------------------------------------------------- text


class TextCodec:
    """Encode / decode with a local Hugging Face tokenizer, without adding special tokens."""

    def __init__(self, directory: str):
        import transformers

        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except Exception as error:  # transformers raises OSError / ValueError for a missing or broken tokenizer
            _fail(f"no usable tokenizer in {directory!r}: {error}")
        tok = self.tokenizer
        self.eos_token_id = tok.eos_token_id
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        if self.eos_token_id is None:
            _fail(f"the tokenizer in {directory!r} has no eos token")
        self._token_texts: Dict[int, str] = {}

    def encode(self, text: str) -> List[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The text of one token ("" for a special token), cached: a byte-level BPE piece of a multi-byte
        character decodes to U+FFFD, which is all step splitting needs."""
        token_id = int(token_id)
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=True)
        return text


class SerialGrader:
    """A `MathGrader` shared by the generator thread and evaluation: one batch at a time."""

    def __init__(self, grader: MathGrader):
        self.grader = grader
        self.lock = threading.Lock()

    def grade_batch(self, responses, golds):
        with self.lock:
            return self.grader.grade_batch(responses, golds)

    def rewards(self, responses, golds):
        with self.lock:
            return self.grader.rewards(responses, golds)

    def close(self):
        self.grader.close()


# ----------------------------------------------------------------------------- data


def check_warmstart_data(config) -> None:
    """The teacher's worked solutions exist for two-digit a+b / a-b only (checked after the data loads, so that
    a missing or malformed data file is reported first)."""
    w = config.warmstart
    if w.steps <= 0 or w.targets != "teacher":
        return
    if config.dataset_name != "arithmetic":
        _fail(
            f"warmstart.targets='teacher' writes worked solutions of the arithmetic task only, not of "
            f"dataset_name={config.dataset_name!r}: use --config.warmstart.targets=answer (imitate the gold "
            "answers) or --config.warmstart.steps=0 (no warm-start)"
        )
    levels = tuple(config.arithmetic.levels)
    if levels != (2,):
        _fail(
            f"warmstart.targets='teacher' solves two-digit a+b / a-b (arithmetic level 2) only, got "
            f"arithmetic.levels={levels}: use --config.arithmetic.levels=2 or --config.warmstart.targets=answer"
        )


def load_data(config):
    """(train problems, eval problems); raises TrainingError naming the file / field on bad data."""
    if config.dataset_name == "arithmetic":
        a = config.arithmetic
        train, held_out = arithmetic.arithmetic_train_eval(
            a.num_train, a.num_eval, seed=config.seed, levels=tuple(a.levels), question_format=a.question_format
        )
        return train, held_out[: config.num_eval_problems]
    for name in ("dataset_path", "eval_dataset_path"):
        path = config[name]
        if path and not os.path.exists(path):
            _fail(f"{name} {path!r} does not exist (all data is read from local paths)")
    subject = config.dataset_name if config.dataset_name in sources.MATH_SUBJECTS else None
    layout = "auto" if subject else config.dataset_name
    try:
        problems = sources.load_problems(config.dataset_path, layout)
        if subject:
            problems = _keep_subject(problems, subject, config.dataset_path)
        if config.eval_dataset_path:
            held_out = sources.load_problems(config.eval_dataset_path, layout)
            if subject:
                held_out = _keep_subject(held_out, subject, config.eval_dataset_path)
        else:
            order = sources.shuffled_order(len(problems), config.seed, 0)
            count = min(config.num_eval_problems, len(problems) // 10 or 1)
            held_out = [problems[i] for i in order[:count]]
            problems = [problems[i] for i in order[count:]]
    except sources.DataError as error:
        _fail(str(error))
    if not problems:
        _fail(f"dataset {config.dataset_path!r} has no training problems left")
    return problems, held_out[: config.num_eval_problems]


def _keep_subject(problems, subject: str, path: str):
    """OpenR's `--dataset_name prealgebra`: the problems of that MATH subject. Data without subjects (OpenR's own
    two-field copy of MATH-500) is used whole, as OpenR does (its environment never reads the name), with a note."""
    if not any(p.subject for p in problems):
        print(
            f"note: {path!r} has no subject field, so dataset_name={subject!r} keeps every problem (as OpenR does)",
            file=sys.stderr,
        )
        return problems
    kept = sources.filter_by_subject(problems, subject)
    if not kept:
        found = sorted({sources.subject_key(p.subject) for p in problems if p.subject})
        _fail(f"dataset_name={subject!r}: no problem of that subject in {path!r}; its subjects are {found}")
    return kept


# ----------------------------------------------------------------------------- the run


@dataclasses.dataclass
class Run:
    config: Any
    run_dir: str
    codec: TextCodec
    graphdef: Any
    state: state_lib.TrainState
    ref_params: Any
    critic_graphdef: Any
    sampler: Any
    grader: MathGrader
    loader: sources.ProblemLoader
    eval_prompts: List[List[int]]
    eval_golds: List[str]
    update: Callable
    logprobs: Callable
    values: Optional[Callable]
    checkpointer: Checkpointer
    logger: MetricsLogger
    mesh: Any
    total_iterations: int
    start_iteration: int
    warmstart_metrics: Dict[str, float]
    reward_fn: Optional[RewardFn] = None  # (texts, golds) -> (scores [N], metrics); default: the math grader
    data_state: Optional[Dict[str, int]] = None  # loader position after the last consumed batch
    prm: Any = None  # rewards.prm.ProcessRewardModel with reward_source "prm" / "prm+verifier"
    model_dir: str = ""  # the checkpoint the policy started from (tokenizer files for the export)
    pending_rollouts: List[Dict[str, Any]] = dataclasses.field(default_factory=list)  # resumed async batches


def _prompt_ids(config, codec: TextCodec, problems) -> List[List[int]]:
    out = []
    for problem in problems:
        text = prompts.format_prompt(problem.question, config.prompt_template, tokenizer=codec.tokenizer)
        ids = codec.encode(text)
        if len(ids) > config.max_prompt_length:
            _fail(
                f"problem {problem.uid!r} has a {len(ids)}-token prompt, over --config.max_prompt_length="
                f"{config.max_prompt_length}: raise it, or drop the longer problems from the data file"
            )
        out.append(ids)
    return out


def _check_prompts(config, codec: TextCodec, train_problems, eval_problems) -> None:
    """Fails now, not at iteration 500, on a prompt over `max_prompt_length` (the first 1000 training ones)."""
    _prompt_ids(config, codec, eval_problems)
    _prompt_ids(config, codec, train_problems[:1000])


def _write_atomically(directory: str, write: Callable[[str], None]) -> None:
    """Writes a directory through a temporary sibling and renames, so a crash never leaves half of it.

    An existing directory (a resumed run's earlier export) is moved aside first and removed only after
    the new one is in place.
    """
    tmp, old = directory + ".tmp", directory + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    if os.path.isdir(directory):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)


def _model_dir(config, run_dir: str) -> str:
    if config.model_name_or_path:
        return config.model_name_or_path
    directory = os.path.join(run_dir, "initial_model")
    if not os.path.isdir(directory):
        _write_atomically(directory, lambda d: tiny.write_tiny_checkpoint(d, seed=config.seed))
    return directory


def _check_model_path(config) -> None:
    path = config.model_name_or_path
    if path:
        if not os.path.isdir(path):
            _fail(f"model_name_or_path {path!r} is not a local directory (no downloads: give a local checkpoint)")
        try:
            qwen.QwenConfig.from_pretrained(path)
        except (qwen.ConfigError, OSError, ValueError) as error:
            _fail(f"model_name_or_path {path!r}: {error}")


def _greedy_accuracy(config, sampler, codec, grader, eval_prompts, eval_golds, n_samples=0) -> Dict[str, float]:
    return evaluate(
        sampler,
        eval_prompts,
        eval_golds,
        grader,
        codec.decode,
        max_new_tokens=config.max_new_tokens,
        n_samples=n_samples,
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
    )


def warmstart_examples(config, codec: TextCodec, problems) -> List[sft.Example]:
    """(prompt ids, target ids) of the warm-start: the teacher's worked solutions (`data/teacher.py`), or the bare
    boxed answers. Prompts are the RL prompts (the same template), targets end with EOS."""
    prompt_ids = _prompt_ids(config, codec, problems)
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
"""Written beside the warm-started model: the settings that made it, checked when a run reuses it."""


def _warmstart_settings(config) -> Dict[str, Any]:
    return {"seed": int(config.seed), **config.warmstart.to_dict()}


def _check_reused_warmstart(config, directory: str) -> None:
    path = os.path.join(directory, WARMSTART_RECORD)
    if not os.path.isfile(path):  # made before the record existed: nothing to compare
        return
    with open(path) as f:
        saved = json.load(f)
    wanted = json.loads(json.dumps(_warmstart_settings(config)))  # tuples as lists, as saved
    changed = {k: (saved.get(k), v) for k, v in wanted.items() if saved.get(k) != v}
    if changed:
        differences = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        _fail(
            f"{directory} was warm-started with other settings ({differences}); a run reuses its warm-start: "
            "use a new --config.run_dir, or remove that directory to redo it"
        )


def _warmstart(config, run_dir, model_dir, codec, train_problems, sampler_args, grader, eval_prompts, eval_golds):
    """Supervised warm-start into run_dir/warmstart_model (once; a resumed run reuses it)."""
    directory = os.path.join(run_dir, "warmstart_model")
    if config.warmstart.steps <= 0:
        return model_dir, {}
    if os.path.isdir(directory):
        _check_reused_warmstart(config, directory)
        return directory, {}
    model = hf.load_model(model_dir, param_dtype=config.param_dtype, dtype=config.dtype)
    before = _greedy_accuracy(config, JaxSampler(model, **sampler_args), codec, grader, eval_prompts, eval_golds)
    examples = warmstart_examples(config, codec, train_problems)
    start = time.time()
    new_state = sft.supervised_warmstart(
        model,
        examples,
        steps=config.warmstart.steps,
        batch_size=config.warmstart.batch_size,
        learning_rate=config.warmstart.lr,
        warmup_steps=config.warmstart.warmup_steps,
        seed=config.seed,
        pad_id=codec.pad_token_id,
        log_fn=None,
    )
    seconds = time.time() - start
    warm = nnx.merge(nnx.graphdef(model), new_state)
    after = _greedy_accuracy(config, JaxSampler(warm, **sampler_args), codec, grader, eval_prompts, eval_golds)

    def write(d):
        hf.export_checkpoint(new_state, model.config, d, tokenizer_dir=model_dir)
        with open(os.path.join(d, WARMSTART_RECORD), "w") as f:
            json.dump(_warmstart_settings(config), f, indent=2)

    _write_atomically(directory, write)
    metrics = {
        "warmstart/eval_accuracy_before": before["eval/accuracy"],
        "warmstart/eval_accuracy_after": after["eval/accuracy"],
        "warmstart/seconds": seconds,
        "warmstart/steps": float(config.warmstart.steps),
    }
    return directory, metrics


def load_prm(config):
    """The process reward model of `prm_model_name_or_path`, loaded before the run directory is written, so a
    PRM that cannot serve (architecture, tokenizer, a step tag or label that is not one token) stops the run
    with the option to change and leaves the run directory as it was."""
    from mathrl_jax.rewards.prm import PRMConfig, ProcessRewardModel

    path = config.prm_model_name_or_path
    prm_config = PRMConfig(
        step_tag=config.prm.step_tag,
        candidate_tokens=tuple(config.prm.candidate_tokens),
        step_separator=config.step_separator,
        reward_mode="steps",
    )
    try:
        return ProcessRewardModel.from_pretrained(path, prm_config)
    except (qwen.ConfigError, hf.CheckpointError) as error:
        _fail(
            f"--config.prm_model_name_or_path={path!r} cannot be loaded as a PRM: {error} (the PRM must be a "
            "Qwen2 / Qwen2.5 / Qwen3-architecture checkpoint)"
        )
    except (OSError, ValueError) as error:
        _fail(
            f"the PRM at --config.prm_model_name_or_path={path!r} cannot score with --config.prm.step_tag="
            f"{config.prm.step_tag!r} and --config.prm.candidate_tokens={tuple(config.prm.candidate_tokens)}: "
            f"{error}"
        )


def update_config(config) -> update_lib.UpdateConfig:
    """The update's static settings for a run's config."""
    alg = config.algorithm_name
    policy_loss = LOSS_OF_ALGORITHM.get(alg, "ppo")
    if alg == "appo" and config.appo_action_ratio:
        policy_loss = "action_ppo"
    whitening = None
    if config.advantage_whitening == "openr" and alg in ("appo", "tppo"):
        whitening = "actions" if alg == "appo" else "nonzero"
    return update_lib.UpdateConfig(
        ppo_epochs=config.ppo_epoch,
        num_mini_batches=config.num_mini_batch,
        micro_batch_size=config.micro_batch_size or None,
        policy_loss=policy_loss,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        clip_c=config.clip_c,
        behaviour_weight_cap=config.behaviour_weight_cap,
        loss_agg_mode=config.loss_agg_mode,
        norm_constant=float(config.max_new_tokens) if config.loss_agg_mode == "seq-mean-token-sum-norm" else None,
        entropy_coef=config.entropy_coef,
        kl_coef=config.kl_coef,
        kl_kind=config.kl_kind,
        target_kl=config.target_kl,
        temperature=config.temperature,
        value_clip=config.value_clip,
        value_loss_type=config.value_loss_type,
        huber_delta=config.huber_delta,
        minibatch_whitening=whitening,
    )


def build_run(config) -> Run:
    """Checks everything, then builds the models, sampler, data, optimizers and restores a checkpoint if any."""
    validate_config(config)
    train_problems, eval_problems = load_data(config)
    check_warmstart_data(config)
    _check_model_path(config)
    if config.prm_model_name_or_path and not os.path.isdir(config.prm_model_name_or_path):
        _fail(f"prm_model_name_or_path {config.prm_model_name_or_path!r} is not a local directory")
    if config.sampler == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            _fail("sampler='vllm' needs vllm (pip install -e '.[vllm]' on a GPU machine); use sampler='jax'")
    if config.model_name_or_path:  # a missing tokenizer or a too-long prompt fails before anything is written
        _check_prompts(config, TextCodec(config.model_name_or_path), train_problems, eval_problems)
    prm = load_prm(config) if "prm" in config.reward_source else None
    # From here on the run directory is written.
    run_dir = config.run_dir
    existed = os.path.isdir(run_dir)
    initial = os.path.join(run_dir, "initial_model")
    had_initial = os.path.isdir(initial)
    os.makedirs(run_dir, exist_ok=True)
    model_dir = _model_dir(config, run_dir)
    codec = TextCodec(model_dir)
    try:  # the tiny offline model's tokenizer exists only once written: undo that if the prompts do not fit
        _check_prompts(config, codec, train_problems, eval_problems)
    except TrainingError:
        if not existed:
            shutil.rmtree(run_dir, ignore_errors=True)
        elif not had_initial:
            shutil.rmtree(initial, ignore_errors=True)
        raise
    eval_prompts = _prompt_ids(config, codec, eval_problems)
    eval_golds = [p.answer for p in eval_problems]
    grader = SerialGrader(
        MathGrader(
            RewardValues(
                config.reward.correct, config.reward.incorrect, config.reward.no_answer, config.reward.format_reward
            ),
            timeout_s=config.reward.timeout_s,
            num_workers=config.reward.num_workers,
        )
    )
    sampler_args = dict(eos_token_ids=[codec.eos_token_id], pad_token_id=codec.pad_token_id, tokenizer=codec)
    start_dir, warm_metrics = _warmstart(
        config, run_dir, model_dir, codec, train_problems, sampler_args, grader, eval_prompts, eval_golds
    )

    mesh = sharding.make_mesh(config.mesh.to_dict())
    model = hf.load_model(start_dir, param_dtype=config.param_dtype, dtype=config.dtype, remat=config.remat)
    rules = sharding.qwen_rules(model.config.num_key_value_heads, mesh.shape["tp"])
    graphdef, params = nnx.split(model)
    params = sharding.shard_tree(params, mesh, rules)
    total = num_iterations(config)
    alg = config.algorithm_name
    needs_critic = alg in rollout_lib.CRITIC_ALGORITHMS
    optimizer = state_lib.make_optimizer(
        config.lr,
        schedule=config.lr_schedule,
        warmup_steps=config.warmup_steps,
        total_steps=max(1, total * config.ppo_epoch * config.num_mini_batch),
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        eps=config.adam_eps,
    )
    critic_graphdef = critic_params = critic_optimizer = None
    if needs_critic:
        critic = value_head.load_critic(start_dir, seed=config.seed, param_dtype=config.param_dtype, dtype=config.dtype)
        critic_graphdef, critic_params = nnx.split(critic)
        critic_params = sharding.shard_tree(critic_params, mesh, rules)
        critic_optimizer = state_lib.make_optimizer(
            config.critic_lr, max_grad_norm=config.max_grad_norm, eps=config.adam_eps
        )
    state = state_lib.create_train_state(
        params, optimizer, seed=config.seed, critic_params=critic_params, critic_optimizer=critic_optimizer
    )
    state = place_state(state, mesh, rules)
    needs_ref = config.kl_coef > 0 or config.kl_reward_coef > 0
    ref_params = jax.tree.map(jnp.copy, params) if needs_ref else None
    update_cfg = update_config(config)
    # The asynchronous generator samples with the params the learner is updating: donating them to the update
    # would free buffers another thread is reading.
    update = update_lib.make_update_fn(
        graphdef,
        optimizer,
        update_cfg,
        critic_graphdef=critic_graphdef,
        critic_optimizer=critic_optimizer,
        donate=alg != "async_ppo",
    )
    loader = sources.ProblemLoader(train_problems, seed=config.seed)
    checkpointer = Checkpointer(
        os.path.join(run_dir, "checkpoints"), save_interval=config.save_interval, max_to_keep=config.max_to_keep
    )
    start_iteration = 0
    pending: List[Dict[str, Any]] = []
    if config.resume and checkpointer.latest_step() is not None:
        _check_resumed_config(config, run_dir)
        state, metadata = checkpointer.restore(state)
        loader.restore(metadata["data"])
        start_iteration = int(metadata["iteration"])
        pending = metadata.get(PENDING_KEY) or []
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(config.to_dict(), f, indent=2, default=str)
    sampler = _make_sampler(config, start_dir, model, codec, sampler_args)
    sampler.update_weights(state.params, int(state.policy_version))
    return Run(
        config=config,
        run_dir=run_dir,
        codec=codec,
        graphdef=graphdef,
        state=state,
        ref_params=ref_params,
        critic_graphdef=critic_graphdef,
        sampler=sampler,
        grader=grader,
        loader=loader,
        eval_prompts=eval_prompts,
        eval_golds=eval_golds,
        update=update,
        logprobs=update_lib.compute_logprobs_fn(graphdef, config.temperature, config.micro_batch_size or None),
        values=update_lib.compute_values_fn(critic_graphdef, config.micro_batch_size or None) if needs_critic else None,
        checkpointer=checkpointer,
        logger=MetricsLogger(run_dir),
        mesh=mesh,
        total_iterations=total,
        start_iteration=start_iteration,
        warmstart_metrics=warm_metrics,
        prm=prm,
        model_dir=start_dir,
        pending_rollouts=pending,
    )


PENDING_KEY = "pending_rollouts"
"""Checkpoint metadata: the batches an asynchronous generator had made ahead of the learner (`async_loop`)."""

RUN_IDENTITY = ("seed", "algorithm_name", "shuffle_rewards")
"""Config keys a resumed run must share with the run it continues (e.g. a control must not resume the real run)."""


def _check_resumed_config(config, run_dir: str) -> None:
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        return
    with open(path) as f:
        saved = json.load(f)
    changed = [f"{k}: {saved[k]!r} -> {config[k]!r}" for k in RUN_IDENTITY if k in saved and saved[k] != config[k]]
    if changed:
        _fail(
            f"run_dir {run_dir!r} holds a run with other settings ({', '.join(changed)}), which this run would "
            "resume: use another --config.run_dir, or --config.resume=False to start over"
        )


def place_state(state: state_lib.TrainState, mesh, rules) -> state_lib.TrainState:
    """Every leaf on the mesh: params and optimizer states by the partition rules, scalars replicated.

    Done before a restore too, so restored leaves land on the same shardings (the checkpoint takes the
    target's) and the jitted update sees one device set.
    """
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def put(tree):
        return None if tree is None else jax.device_put(tree, sharding.tree_shardings(tree, mesh, rules))

    return state.replace(
        params=put(state.params),
        opt_state=put(state.opt_state),
        critic_params=put(state.critic_params),
        critic_opt_state=put(state.critic_opt_state),
        **{
            k: jax.device_put(getattr(state, k), replicated)
            for k in ("step", "rng", "policy_version", "skipped_updates")
        },
    )


def _make_sampler(config, model_dir, model, codec, sampler_args):
    if config.sampler == "vllm":
        from mathrl_jax.sampling.vllm_sampler import VllmSampler

        return VllmSampler(model_dir, config=model.config, dtype=config.dtype, seed=config.seed)
    sampler_mesh = sharding.follow_mesh(config.sampler_mesh.to_dict(), config.mesh.to_dict())
    mesh = sharding.make_mesh(sampler_mesh) if jax.device_count() > 1 else None
    return JaxSampler(model, mesh=mesh, **sampler_args)


def iteration_seed(config, iteration: int) -> int:
    """The sampling seed of an iteration: a function of (seed, iteration), so a resumed run samples the same."""
    return zlib.crc32(f"{config.seed}:{iteration}".encode()) & 0x7FFFFFFF


def collect(run: Run, iteration: int):
    """Samples and grades one iteration's rollouts; returns (rollouts, problems, scores, reward metrics)."""
    c = run.config
    problems = run.loader.next_batch(c.n_rollout_threads)
    prompt_ids = _prompt_ids(c, run.codec, problems)
    params = SamplingParams(
        n=c.group_size,
        temperature=c.temperature,
        top_p=c.top_p,
        top_k=c.top_k,
        max_new_tokens=c.max_new_tokens,
        seed=iteration_seed(c, iteration),
    )
    rollouts = run.sampler.generate(prompt_ids, params)
    golds = [p.answer for p in problems for _ in range(c.group_size)]
    texts = rollouts.texts or [run.codec.decode(ids) for ids in rollouts.completion_ids]
    reward_fn = run.reward_fn or run.grader.rewards
    scores, reward_metrics = reward_fn(texts, golds)
    return rollouts, problems, np.asarray(scores, np.float32), reward_metrics


def prm_action_rewards(run: Run, rollouts, problems) -> Optional[np.ndarray]:
    """`[N, A]` PRM scores of each completion's reasoning steps (OpenR), or None without a PRM.

    Steps are the completion split at `step_separator`, as the PRM sees them; the
    trainer's actions are the same split in token space (`action_index_from_separators`).
    """
    if run.prm is None:
        return None
    c = run.config
    questions = [p.question for p in problems for _ in range(c.group_size)]
    steps = []
    for ids, index in zip(rollouts.completion_ids, action_indices(run, rollouts)):
        texts = [""] * (int(index.max()) + 1 if len(index) else 1)
        for token, action in zip(ids, index):
            texts[action] += run.codec.token_text(token)
        steps.append([text.replace(c.step_separator, " ").strip() for text in texts])
    scores = run.prm.step_scores(questions, steps)
    out = np.zeros((len(steps), max(len(row) for row in steps)), np.float32)
    for row, row_scores in enumerate(scores):
        row_scores = np.nan_to_num(np.asarray(row_scores, np.float32))
        out[row, : len(row_scores)] = row_scores
    return out


def action_indices(run: Run, rollouts) -> List[np.ndarray]:
    """Per completion, `[len]` int32: the reasoning step (action) of each token, split at `step_separator` in
    the tokens' text (`rollout.action_index_from_text`): the actions APPO / TPPO train on and the steps the
    PRM scores. Without a separator each completion is one action."""
    separator = run.config.step_separator
    if not separator:
        return [np.zeros(len(ids), np.int32) for ids in rollouts.completion_ids]
    return [
        rollout_lib.action_index_from_text([run.codec.token_text(t) for t in ids], separator)
        for ids in rollouts.completion_ids
    ]


def batch_columns(config, rollouts) -> int:
    """Columns of the trainer's batch: the longest prompt + completion, rounded up to a power of two (a
    handful of shapes to compile), at most `max_prompt_length + max_new_tokens`. A multi-turn run's rows
    are far shorter than that budget, and every pass costs (and its attention holds) columns squared."""
    needed = max(len(p) for p in rollouts.prompt_ids) + max([len(x) for x in rollouts.completion_ids] + [1])
    return min(bucket(needed, 16), config.max_prompt_length + config.max_new_tokens)


def prepare_batch(
    run: Run, rollouts, scores: np.ndarray, *, params=None, action_rewards=None, row_advantages=None, row_mask=None
) -> Dict[str, Any]:
    """The update's batch: padded arrays, recomputed old / reference log-probs, values, advantages."""
    c = run.config
    params = run.state.params if params is None else params
    correct = scores >= c.reward.correct if c.reward.correct > c.reward.incorrect else scores > 0
    lengths = rollouts.completion_lengths
    row_mask = np.ones(len(rollouts), np.float32) if row_mask is None else np.asarray(row_mask, np.float32)
    metrics: Dict[str, float] = {}
    if c.algorithm_name == "dapo":
        scores = scores + rollout_lib.overlong_penalty(
            lengths,
            max_new_tokens=c.max_new_tokens,
            buffer_len=c.dapo.overlong_buffer_len,
            penalty_factor=c.dapo.overlong_penalty_factor,
        )
        keep = rollout_lib.dapo_group_filter(
            correct.astype(np.float32),
            rollouts.prompt_indices,
            success_rate_lb=c.dapo.success_rate_lb,
            success_rate_ub=c.dapo.success_rate_ub,
        )
        row_mask = keep.astype(np.float32)
        metrics["dapo/kept_fraction"] = float(keep.mean())
    arrays = rollouts.to_batch(run.codec.pad_token_id, max_length=batch_columns(c, rollouts))
    arrays.pop("prompt_length")
    sampler_logprobs = arrays.pop("sampler_logprobs")
    batch = {k: jnp.asarray(v) for k, v in arrays.items() if k != "old_logprobs"}
    with _mesh(run):
        old = run.logprobs(params, batch["input_ids"], batch["attention_mask"]) * batch["response_mask"]
        ref = None
        if run.ref_params is not None:
            ref = run.logprobs(run.ref_params, batch["input_ids"], batch["attention_mask"]) * batch["response_mask"]
        values = None
        if run.values is not None:
            values = run.values(run.state.critic_params, batch["input_ids"], batch["attention_mask"])
    if c.algorithm_name == "async_ppo":  # decoupled: behaviour = the sampler's, proximal = the learner's now
        batch["old_logprobs"] = jnp.asarray(arrays["old_logprobs"])
        batch["proximal_logprobs"] = old
    else:
        batch["old_logprobs"] = old
    if ref is not None:
        batch["ref_logprobs"] = ref
    if row_advantages is not None:  # the source made them (multi-turn ReBN)
        response_mask = batch["response_mask"] * jnp.asarray(row_mask)[:, None]
        batch.update(
            response_mask=response_mask,
            advantages=update_lib.losses.broadcast_to_tokens(jnp.asarray(row_advantages), response_mask),
        )
        return batch, metrics
    action_index = None
    if c.algorithm_name in ("appo", "tppo"):
        rows = action_indices(run, rollouts)
        prompt_length = max(len(p) for p in rollouts.prompt_ids)
        action_index = np.zeros(batch["input_ids"].shape, np.int32)
        for row, index in enumerate(rows):
            action_index[row, prompt_length : prompt_length + len(index)] = index
        action_index = jnp.asarray(action_index)
        if action_rewards is not None:
            action_rewards = jnp.asarray(action_rewards)
    advantages = rollout_lib.compute_advantages(
        c.algorithm_name,
        batch,
        jnp.asarray(scores),
        group_ids=jnp.asarray(rollouts.prompt_indices),
        num_groups=int(rollouts.prompt_indices.max()) + 1,
        row_mask=jnp.asarray(row_mask),
        values=values,
        ref_logprobs=ref,
        kl_reward_coef=c.kl_reward_coef,
        gamma=c.gamma,
        lam=c.lam,
        action_index=action_index,
        action_rewards=action_rewards,
        whiten=c.advantage_whitening == "batch",
    )
    batch.update(advantages)
    plain_sampling = c.temperature == 1.0 and c.top_p == 1.0 and c.top_k <= 0
    mask = np.asarray(batch["response_mask"]) > 0
    if plain_sampling and mask.any():  # sampler vs trainer log-probs of the same tokens: a health check
        metrics["rollout/sampler_logprob_diff"] = float(np.abs(np.asarray(old) - sampler_logprobs)[mask].mean())
    return batch, metrics


@contextlib.contextmanager
def _mesh(run: Run):
    if run.mesh is not None and run.mesh.size > 1:
        with jax.set_mesh(run.mesh):
            yield
    else:
        yield


RENAMES = {
    "policy_loss": "train/policy_loss",
    "entropy": "train/entropy_loss",
    "kl": "train/kl",
    "approx_kl_k3": "train/approx_kl",
    "clip_fraction": "train/clip_fraction",
    "ratio_mean": "train/importance_weight",
    "ratio_max": "train/importance_weight_max",
    "grad_norm": "train/grad_norm",
    "value_loss": "train/value_loss",
    "value_grad_norm": "train/value_grad_norm",
    "kl_skipped": "train/kl_skipped_fraction",
    "skipped_updates": "train/skipped_updates",
    "loss": "train/loss",
}


@dataclasses.dataclass
class Collected:
    """One iteration's graded rollouts, and the data position after drawing their prompts."""

    rollouts: Any
    scores: np.ndarray
    reward_metrics: Dict[str, float]
    data_state: Dict[str, int]
    generate_seconds: float
    action_rewards: Optional[np.ndarray] = None  # [N, A] PRM step scores (reward_source with "prm")
    row_advantages: Optional[np.ndarray] = None  # [N] per-row advantages made by the source (multi-turn ReBN)
    row_mask: Optional[np.ndarray] = None  # [N] 1 on rows that count


class SyncRollouts:
    """Rollouts made when asked, with the current weights: the synchronous loop.

    A rollout source (this, `multiturn.EnvRollouts`, `async_loop.AsyncRollouts`)
    makes each iteration's graded batch (`get`), hears of every update (`updated`),
    names the batches it made ahead of the learner for a checkpoint (`pending`) and
    lends the sampler, holding the current weights, to the evaluation (`current_weights`).
    """

    def __init__(self, run: "Run"):
        self.run = run

    def get(self, iteration: int) -> Collected:
        start = time.perf_counter()
        rollouts, problems, scores, reward_metrics = collect(self.run, iteration)
        action_rewards = prm_action_rewards(self.run, rollouts, problems)
        return Collected(
            rollouts, scores, reward_metrics, self.run.loader.state(), time.perf_counter() - start, action_rewards
        )

    def updated(self, iteration: int, params: Any, version: int) -> None:
        self.run.sampler.update_weights(params, version)

    def pending(self, iteration: int) -> List[Dict[str, Any]]:
        return []

    def current_weights(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


def shuffled_rewards(scores: np.ndarray, seed: int, iteration: int) -> np.ndarray:
    """The control run's rewards: the batch's own `[N]` scores in a random order (a function of seed and
    iteration, so a resumed control shuffles as an uninterrupted one).

    Same reward distribution, no information about which response earned which:
    whatever a policy learns from these, it does not learn from the verifier.
    """
    order = np.random.default_rng([seed, iteration, 0x5EED]).permutation(len(scores))
    return np.asarray(scores)[order]


@contextlib.contextmanager
def out_of_memory_hint(config, rows: int):
    """Turns a device out-of-memory error of the trainer's passes into a `TrainingError` naming the options that
    size them (the raw XLA message names only a byte count)."""
    try:
        yield
    except Exception as error:  # jax raises its runtime errors under several class names across versions
        text = str(error)
        if "RESOURCE_EXHAUSTED" not in text and "Out of memory" not in text:
            raise
        micro = config.micro_batch_size or f"0 (the whole minibatch, {rows // config.num_mini_batch} rows)"
        raise TrainingError(
            f"out of device memory in the trainer's passes over {rows} rows of up to "
            f"{config.max_prompt_length + config.max_new_tokens} tokens: lower --config.micro_batch_size (now "
            f"{micro}; rows per forward and backward), --config.max_new_tokens ({config.max_new_tokens}) or "
            f"--config.n_rollout_threads ({config.n_rollout_threads}), or set --config.remat=True. "
            f"XLA said: {text.splitlines()[0][:300]}"
        ) from error


def train_iteration(run: Run, iteration: int, source=None) -> Dict[str, float]:
    """One iteration (see the module docstring); updates `run.state` and tells `source` (default: the synchronous
    loop's, which gives the sampler the new weights)."""
    start = time.perf_counter()
    source = source or SyncRollouts(run)
    got = source.get(iteration)
    rollouts, scores, reward_metrics = got.rollouts, got.scores, got.reward_metrics
    run.data_state = got.data_state
    waited = time.perf_counter() - start
    staleness = int(run.state.policy_version) - rollouts.policy_version
    if staleness > run.config.max_head_offpolicyness:
        raise RuntimeError(
            f"iteration {iteration}: rollouts of version {rollouts.policy_version} are {staleness} versions old, over "
            f"max_head_offpolicyness={run.config.max_head_offpolicyness}"
        )
    if "verifier" not in run.config.reward_source:
        scores = np.zeros_like(scores)  # step rewards only
    if run.config.shuffle_rewards:
        scores = shuffled_rewards(scores, run.config.seed, iteration)
    with out_of_memory_hint(run.config, len(rollouts)):
        batch, batch_metrics = prepare_batch(
            run,
            rollouts,
            scores,
            action_rewards=got.action_rewards,
            row_advantages=got.row_advantages,
            row_mask=got.row_mask,
        )
        with _mesh(run):
            run.state, update_metrics = run.update(run.state, batch)
        update_metrics = jax.device_get(update_metrics)
    source.updated(iteration, run.state.params, int(run.state.policy_version))
    done = time.perf_counter()
    lengths = rollouts.completion_lengths
    tokens = int(lengths.sum())
    real = np.ones(len(rollouts), bool)
    if got.row_mask is not None and (got.row_mask > 0).any():  # padded rows (multi-turn) are not responses
        real = got.row_mask > 0
    # What a response earned: the verifier's score plus, with a PRM, its step scores (the undiscounted return).
    earned = scores if got.action_rewards is None else scores + got.action_rewards.sum(axis=1)
    metrics = {
        "rollout/rewards": float(np.mean(earned[real])),
        "rollout/accuracy": reward_metrics.get("reward/accuracy", float("nan")),
        "rollout/response_length": float(lengths[real].mean()),
        "rollout/truncated_fraction": float(np.mean(np.asarray(rollouts.finish_reasons)[real] == "length")),
        "rollout/no_answer_rate": reward_metrics.get("reward/no_answer_rate", float("nan")),
        "rollout/grader_timeouts": reward_metrics.get("reward/timeout_count", 0.0),
        "perf/step_time": done - start,
        "perf/generate_time": got.generate_seconds,
        "perf/wait_time": waited,
        "perf/tokens_per_second": tokens / max(done - start, 1e-9),
        "async/staleness": float(staleness),
        "async/policy_version": float(rollouts.policy_version),
        "train/lr_step": float(run.state.step),
        **(
            {"rollout/prm_reward": float(got.action_rewards.sum(axis=1).mean())}
            if got.action_rewards is not None
            else {}
        ),
        **batch_metrics,
        **{k: v for k, v in reward_metrics.items() if k.startswith("rollout/")},
    }
    for key, value in update_metrics.items():
        metrics[RENAMES.get(key, f"train/{key}")] = float(value)
    return metrics


def save(run: Run, iteration: int, *, force: bool = False, pending: Optional[List[Dict[str, Any]]] = None) -> bool:
    """Checkpoints the state after `iteration`, with the data position and the batches a generator `pending`
    had made ahead (`SyncRollouts.pending`)."""
    metadata = {"data": run.data_state or run.loader.state(), "iteration": iteration, PENDING_KEY: pending or []}
    return run.checkpointer.save(iteration, run.state, metadata, force=force)


def run_eval(run: Run, iteration: int, *, sampled: bool = False) -> Dict[str, float]:
    """Greedy held-out accuracy; with `sampled`, also pass@k from `eval_n_samples` samples at the RL
    temperature (pass@1 is the sampled accuracy). Writes `run_dir/samples/` (`write_samples`)."""
    c = run.config
    n_samples = c.eval_n_samples if sampled else 0
    metrics = _greedy_accuracy(c, run.sampler, run.codec, run.grader, run.eval_prompts, run.eval_golds, n_samples)
    write_samples(run, iteration)
    return metrics


def write_samples(run: Run, iteration: int) -> Optional[str]:
    """Writes `run_dir/samples/iteration_<k>.jsonl` (process 0): the first `num_logged_samples` held-out prompts,
    each with its greedy completion and 4 samples at the RL temperature, graded by the verifier
    (`completion_samples`; a run trained on PRM or custom rewards still logs the verifier's)."""
    c = run.config
    count = min(c.num_logged_samples, len(run.eval_prompts))
    if count == 0 or jax.process_index() != 0:
        return None
    records = completion_samples(
        run.sampler,
        run.eval_prompts[:count],
        run.eval_golds[:count],
        run.grader,
        run.codec.decode,
        max_new_tokens=c.max_new_tokens,
        n_samples=4,
        temperature=c.temperature,
        top_p=c.top_p,
        seed=zlib.crc32(f"samples:{c.seed}:{iteration}".encode()) & 0x7FFFFFFF,  # not the training rollouts' seed
        values=run.grader.grader.values,
    )
    directory = os.path.join(run.run_dir, "samples")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"iteration_{iteration:06d}.jsonl")
    with open(path + ".tmp", "w") as f:
        for record in records:
            f.write(json.dumps(dict(record, iteration=iteration)) + "\n")
    os.replace(path + ".tmp", path)
    return path


def train(
    config,
    *,
    on_metrics: Optional[Callable[[int, Dict[str, float]], None]] = None,
    reward_fn: Optional[RewardFn] = None,
) -> Dict[str, Any]:
    """Runs (or resumes) a training run; returns a summary with the eval curve and the final state.

    `reward_fn(texts, golds) -> (scores, metrics)` replaces the math grader's
    rewards (e.g. a custom verifier); `on_metrics(iteration, metrics)` sees every
    iteration's metrics.
    """
    run = build_run(config)
    run.reward_fn = reward_fn
    c = config
    source = SyncRollouts(run)
    if c.env_name:
        from mathrl_jax.train.multiturn import EnvRollouts

        source = EnvRollouts(run)
    elif c.algorithm_name == "async_ppo":
        from mathrl_jax.train.async_loop import AsyncRollouts

        source = AsyncRollouts(run)
    summary: Dict[str, Any] = {
        "warmstart": run.warmstart_metrics,
        "eval": [],
        "num_eval_problems": len(run.eval_prompts),
    }
    progress = Progress(
        run.total_iterations,
        initial_step=run.start_iteration,
        keys=("rollout/accuracy", "eval/accuracy", "rollout/rewards", "train/policy_loss"),
        disable=not c.progress,
    )
    try:
        if run.warmstart_metrics:
            run.logger.log(0, run.warmstart_metrics)
            progress.write(
                "warm-start: greedy eval accuracy {:.3f} -> {:.3f} in {:.0f} s".format(
                    run.warmstart_metrics["warmstart/eval_accuracy_before"],
                    run.warmstart_metrics["warmstart/eval_accuracy_after"],
                    run.warmstart_metrics["warmstart/seconds"],
                )
            )
        if run.start_iteration == 0 and c.eval_interval:
            with source.current_weights():
                metrics = run_eval(run, 0, sampled=True)
            run.logger.log(0, metrics)
            summary["eval"].append((0, metrics["eval/accuracy"]))
            summary["eval_start"] = metrics
            progress.update(0, metrics)
        for iteration in range(run.start_iteration + 1, run.total_iterations + 1):
            metrics = train_iteration(run, iteration, source)
            last = iteration == run.total_iterations
            if c.eval_interval and (iteration % c.eval_interval == 0 or last):
                with source.current_weights():
                    metrics.update(run_eval(run, iteration, sampled=last))
                summary["eval"].append((iteration, metrics["eval/accuracy"]))
                if last:
                    summary["eval_end"] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
            if iteration % c.log_interval == 0 or "eval/accuracy" in metrics:
                run.logger.log(iteration, metrics)
            progress.update(iteration, metrics)
            if on_metrics is not None:
                on_metrics(iteration, metrics)
            if run.checkpointer.should_save(iteration) or last:
                save(run, iteration, force=last, pending=source.pending(iteration))
        summary["state"] = run.state
        summary["final_iteration"] = run.total_iterations
        if c.export_final and run.total_iterations > run.start_iteration:
            final = os.path.join(run.run_dir, "final_model")
            model_config = nnx.merge(run.graphdef, run.state.params).config
            _write_atomically(
                final, lambda d: hf.export_checkpoint(run.state.params, model_config, d, tokenizer_dir=run.model_dir)
            )
    finally:
        source.close()
        progress.close()
        run.checkpointer.close()
        run.logger.close()
        run.grader.close()
    return summary
