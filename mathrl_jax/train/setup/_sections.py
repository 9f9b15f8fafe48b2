"""The config turned into the run's settings, once, by the build: one frozen section per component, each checking
itself where it is defined (`RolloutSettings`, `BatchSettings`, `UpdateConfig`, `EvalSettings`, `RunSettings`,
`GameSettings`).

Below the build nothing reads the config: each component gets its section. The algorithm's record
(`algorithms.ALGORITHMS`) decides here what its name means (the estimator, the policy loss, the batch's extras);
no module below compares an algorithm's or a loss's name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

from mathrl_jax import losses
from mathrl_jax.evaluation import EvalSettings
from mathrl_jax.sampling.base import SamplingParams
from mathrl_jax.train import algorithms
from mathrl_jax.train import update as update_lib
from mathrl_jax.train.batch import BatchSettings, DapoSettings
from mathrl_jax.train.rollouts import TEACHER_GAMES, GameSettings, RolloutSettings, prompt_settings
from mathrl_jax.train.setup._run import RunSettings
from mathrl_jax.train.setup._validation import num_iterations
from mathrl_jax.train.warmstart import WarmStartSettings


def algorithm_of(config) -> algorithms.Algorithm:
    return algorithms.algorithm(config.algorithm_name)


def update_config(config, micro_batch_size: Optional[int] = None) -> update_lib.UpdateConfig:
    """The update's static settings for a run's config; `micro_batch_size`: the rows `_micro_batches` chose
    (None: `config.micro_batch_size`, 0 meaning the whole minibatch)."""
    algorithm = algorithm_of(config)
    policy_loss = algorithm.policy_loss
    if update_lib.policy_loss_use(policy_loss).per_action and not config.appo_action_ratio:
        policy_loss = "ppo"  # APPO with token-level ratios and the step's advantage on each token
    whitening = algorithm.openr_whitening if config.advantage_whitening == "openr" else None
    mode = losses.canonical_loss_agg_mode(config.loss_agg_mode)  # TRL's loss_type names too (dr_grpo, bnpo, ...)
    cfg = update_lib.UpdateConfig(
        ppo_epoch=config.ppo_epoch,
        num_mini_batch=config.num_mini_batch,
        micro_batch_size=micro_batch_size or config.micro_batch_size or None,
        policy_loss=policy_loss,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        clip_c=config.clip_c,
        behaviour_weight_cap=config.behaviour_weight_cap,
        loss_agg_mode=mode,
        norm_constant=float(config.max_new_tokens) if mode == "seq-mean-token-sum-norm" else None,  # TRL's L_max
        entropy_coef=config.entropy_coef,
        kl_coef=config.kl_coef,
        kl_kind=config.kl_kind,
        target_kl=config.target_kl,
        temperature=config.temperature,
        value_clip=config.value_clip,
        value_loss_type=config.value_loss_type,
        huber_delta=config.huber_delta,
        minibatch_whitening=whitening,
        lora_dropout=float(config.lora.dropout) if config.lora.rank else 0.0,  # PEFT's lora_dropout, the update's
    )
    # `skip_zero_advantage` where it changes no gradient (the config's comment).
    skip = config.skip_zero_advantage and update_lib.zero_advantage_rows_are_inert(cfg, has_critic=algorithm.critic)
    return dataclasses.replace(cfg, skip_zero_advantage=bool(skip))


def lora_settings(config) -> Dict[str, Any]:
    """The model's LoRA fields (`QwenConfig.lora_*`): none at rank 0 (every weight trains)."""
    if not config.lora.rank:
        return {}
    return dict(lora_rank=config.lora.rank, lora_alpha=config.lora.alpha, lora_targets=config.lora.targets)


def optimizer_settings_of(config) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The `state.make_optimizer` arguments of the policy and of the critic: `config.optimizer` over the params, in
    their dtype (`param_dtype`, the master precision), with the run's schedule counted in optimizer steps."""
    policy = dict(
        learning_rate=config.lr,
        name=config.optimizer,
        schedule=config.lr_schedule,
        warmup_steps=config.warmup_steps,
        total_steps=max(1, num_iterations(config) * config.ppo_epoch * config.num_mini_batch),
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        eps=config.adam_eps,
    )
    critic = dict(
        learning_rate=config.critic_lr, name=config.optimizer, max_grad_norm=config.max_grad_norm, eps=config.adam_eps
    )
    return policy, critic


def old_logprobs_from_sampler(
    old_logprobs: str,
    *,
    sampler: str,
    tis_cap,
    temperature: float,
    decoupled: bool,
    multi_turn: bool,
    rounded_merge: bool = False,
    stale: bool = False,
    logprob_noise: float = 0.0,
) -> bool:
    """Whether PPO's old log-probs are the sampler's (`config.old_logprobs`), not recomputed by the trainer.

    "auto" takes them from the JAX sampler, which decodes with the trainer's params and reports the untempered
    policy's log-prob of each sampled token (`Rollouts.policy_logprobs`): at temperature 1 the trainer's
    recomputation gives the same numbers up to float rounding (`rollout/sampler_logprob_diff`, ~1e-7 in float32),
    and skipping it saves a forward pass over the batch. The decoupled loss (async_ppo) needs both, multi-turn
    rows hold the environment's tokens, and another engine (vLLM) computes them with its own kernels: those
    recompute. So does a LoRA policy the JAX sampler merges into kernels of a compute dtype below float32
    (`rounded_merge`): the merged kernel is rounded as a whole, where the trainer adds the adapters' term to the
    base's, so their log-probs differ by more than the rounding of one computation. Rollouts sampled versions
    behind the learner (`stale`: `max_head_offpolicyness` > 0) hold the behaviour policy's log-probs, and
    `sampler_logprob_noise` perturbs them on purpose: those recompute too, unless "sampler" asks for them (naive
    PPO, clipped around the behaviour policy).
    """
    if old_logprobs != "auto":
        return old_logprobs == "sampler"
    return (
        sampler == "jax"
        and tis_cap is None  # TIS compares the trainer's log-probs with the sampler's
        and temperature == 1.0
        and not decoupled
        and not multi_turn
        and not rounded_merge
        and not stale
        and logprob_noise == 0.0
    )


def runs_ahead(config) -> bool:
    """Whether the rollouts come from the generator thread of `rollouts.AsyncRollouts` (sampled up to
    `max_head_offpolicyness` versions behind the learner): async_ppo always; any other single-turn algorithm at
    `max_head_offpolicyness` > 0, the stress knob that shows what staleness does to a loss without the decoupled
    correction."""
    return algorithm_of(config).decoupled or config.max_head_offpolicyness > 0


def uses_sampler_logprobs(config) -> bool:
    """`old_logprobs_from_sampler` for the config's `old_logprobs`."""
    algorithm = algorithm_of(config)
    return old_logprobs_from_sampler(
        config.old_logprobs,
        sampler=config.sampler,
        tis_cap=config.tis_cap,
        temperature=config.temperature,
        decoupled=algorithm.decoupled,
        multi_turn=bool(config.env_name),
        rounded_merge=bool(config.lora.rank) and config.jax_sampler.lora_sync == "merged" and config.dtype != "float32",
        stale=config.max_head_offpolicyness > 0,
        logprob_noise=config.sampler_logprob_noise,
    )


def batch_settings(config, update: update_lib.UpdateConfig) -> BatchSettings:
    algorithm = algorithm_of(config)
    dapo = None
    if algorithm.dynamic_sampling:
        reward = config.reward
        dapo = DapoSettings(
            max_new_tokens=config.max_new_tokens,
            success_rate_lb=config.dapo.success_rate_lb,
            success_rate_ub=config.dapo.success_rate_ub,
            overlong_buffer_len=config.dapo.overlong_buffer_len,
            overlong_penalty_factor=config.dapo.overlong_penalty_factor,
            correct_score=reward.correct if reward.correct > reward.incorrect else None,
        )
    return BatchSettings(
        algorithm=algorithm,
        max_length=config.max_prompt_length + config.max_new_tokens,
        gamma=config.gamma,
        lam=config.lam,
        whiten=config.advantage_whitening == "batch",
        kl_reward_coef=config.kl_reward_coef,
        old_logprobs_from_sampler=uses_sampler_logprobs(config),
        step_separator=config.step_separator,
        pack_length=int(config.pack_length) if config.packing else None,
        update=update,
        tis_cap=config.tis_cap,
        # The sampler's log-probs are not the tempered policy's where it filters (top-p, top-k, min-p) or penalizes.
        sampler_filters=(
            config.top_p < 1.0 or config.top_k > 0 or config.min_p > 0.0 or config.repetition_penalty != 1.0
        ),
        dapo=dapo,
        mask_truncated_completions=bool(config.mask_truncated_completions),
    )


def rollout_settings(config) -> RolloutSettings:
    return RolloutSettings(
        prompts_per_iteration=config.n_rollout_threads,
        sampling=SamplingParams(
            n=config.group_size,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            min_p=config.min_p,
            repetition_penalty=config.repetition_penalty,
            max_new_tokens=config.max_new_tokens,
        ),
        seed=config.seed,
        prompts=prompt_settings(config),
        grade=config.reward_source != "functions",
        step_separator=config.step_separator,
        episode_length=config.episode_length,
        logprob_noise=config.sampler_logprob_noise,
    )


def warmstart_settings(config) -> WarmStartSettings:
    w = config.warmstart
    game = game_settings(config)
    task = ()
    if game is not None:  # what the teacher's games and their prompts depend on
        task = (
            ("env_name", game.env_name),
            ("env", dict(game.env_kwargs)),
            ("games", TEACHER_GAMES),
            ("prompt_template", config.prompt_template),
            ("max_prompt_length", config.max_prompt_length),
        )
    elif config.dataset_name == "arithmetic" and config.arithmetic.digits != 2:  # the column chain's length
        task = (("arithmetic.digits", config.arithmetic.digits),)
    elif config.dataset_name == "countdown":  # what its instances, so its teacher's solutions, depend on
        c = config.countdown
        task = (("dataset_name", "countdown"),) + tuple(
            (f"countdown.{key}", c[key]) for key in ("count", "min_number", "max_number", "max_target", "num_train")
        )
    return WarmStartSettings(
        task=task,
        teacher="countdown" if config.dataset_name == "countdown" and game is None else "arithmetic",
        steps=w.steps,
        prompts=prompt_settings(config),
        batch_size=w.batch_size,
        lr=w.lr,
        warmup_steps=w.warmup_steps,
        targets=w.targets,
        slip_rate=w.slip_rate,
        seed=config.seed,
        question_format=config.arithmetic.question_format,
        param_dtype=config.param_dtype,
        dtype=config.dtype,
        progress=bool(config.progress),
    )


def game_settings(config) -> Optional[GameSettings]:
    """The multi-turn section (None for single-turn runs): the env's own options are `config.<env_name>`."""
    if not config.env_name:
        return None
    options = config.get(config.env_name)
    return GameSettings(
        env_name=config.env_name,
        gamma=config.gamma,
        env_kwargs=tuple(sorted(options.to_dict().items())) if options is not None else (),
        shuffle_rewards=bool(config.shuffle_rewards),
        eval_games=config.num_eval_problems,
    )


def eval_settings(config) -> EvalSettings:
    return EvalSettings(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
        n_samples=config.eval_n_samples,
        num_logged_samples=config.num_logged_samples,
    )


def run_settings(config) -> RunSettings:
    return RunSettings(
        run_dir=config.run_dir,
        total_iterations=num_iterations(config),
        seed=config.seed,
        eval_interval=config.eval_interval,
        log_interval=config.log_interval,
        progress=bool(config.progress),
        export_final=bool(config.export_final),
        max_staleness=config.max_head_offpolicyness,
        step_rewards_only=config.reward_source == "prm",
        shuffle_rewards=bool(config.shuffle_rewards),
        max_new_tokens=config.max_new_tokens,
        prompts_per_iteration=config.n_rollout_threads,
        log_completions_every=config.log_completions_every if config.log_completions else 0,
        num_completions_to_print=config.num_completions_to_print,
    )
