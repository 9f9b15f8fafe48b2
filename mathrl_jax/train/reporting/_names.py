"""The names of the metrics the training loop logs (`mathrl_jax.train.loop`), each with its meaning.

Named as in the reference systems (verl, OpenR, AReaL) where they have one; each meaning names the TRL / verl
metric it stands for where there is one (docs/training.md has the table). A name with a `{k}` stands for a family
(`eval/pass@{k}`: `eval/pass@1`, `eval/pass@8`, ...); `documented_name` maps a logged name to its entry.
`tests/train/reporting/test_metrics.py` runs each family of algorithms and checks that every name it logs is here.
"""

from __future__ import annotations

import re

METRIC_NAMES: dict[str, str] = {
    # rollout: the batch of sampled responses (real rows only: not a multi-turn batch's padding)
    "rollout/rewards": (
        "mean reward a response earned (verifier score plus PRM step scores; TRL `reward`, verl `critic/score/mean`)"
    ),
    "rollout/rewards_std": "population std of the rewards over the batch (TRL's `reward_std`: rewards_group_std)",
    "rollout/rewards_min": "smallest reward of the batch (verl `critic/score/min`)",
    "rollout/rewards_max": "largest reward of the batch (verl `critic/score/max`)",
    "rollout/rewards_group_std": (
        "mean over the groups (a prompt's responses) of the unbiased within-group reward std (TRL `reward_std`); "
        "absent without groups of two or more"
    ),
    "rollout/frac_reward_zero_std": (
        "fraction of the groups whose rewards have zero std, whose group-relative advantages are all 0 (TRL "
        "`frac_reward_zero_std`); absent without groups of two or more"
    ),
    "rollout/function/{name}": (
        "mean score of reward function {name} (reward.functions), before its weight (TRL `rewards/{name}/mean`)"
    ),
    "rollout/function_std/{name}": "std of reward function {name}'s scores (TRL `rewards/{name}/std`)",
    "rollout/advantages_mean": (
        "mean advantage over the response tokens that count, before tis_cap's weights (verl "
        "`critic/advantages/mean`); absent when no token counts (DAPO filtered every row)"
    ),
    "rollout/advantages_std": "std of the advantages over the response tokens that count (as advantages_mean)",
    "rollout/advantages_min": "smallest advantage of a response token (verl `critic/advantages/min`)",
    "rollout/advantages_max": "largest advantage of a response token (verl `critic/advantages/max`)",
    "rollout/accuracy": (
        "fraction of responses the verifier grades correct (multi-turn: of episodes won; absent where nothing "
        "grades: reward functions alone, or a custom reward_fn that does not report `reward/accuracy`)"
    ),
    "rollout/response_length": (
        "mean response length, in tokens (TRL `completions/mean_length`, verl `response_length/mean`)"
    ),
    "rollout/response_length_min": "shortest response (TRL `completions/min_length`, verl `response_length/min`)",
    "rollout/response_length_max": "longest response (TRL `completions/max_length`, verl `response_length/max`)",
    "rollout/terminated_length": (
        "mean length of the responses that ended by themselves, not cut at max_new_tokens (TRL "
        "`completions/mean_terminated_length`); absent when every one was cut"
    ),
    "rollout/truncated_fraction": (
        "fraction of responses cut at max_new_tokens without an end of sequence (TRL `completions/clipped_ratio`, "
        "verl `response_length/clip_ratio`)"
    ),
    "rollout/no_answer_rate": "fraction of responses with no final answer to grade (absent if the reward does not say)",
    "rollout/grader_timeouts": "responses whose grading ran past reward.timeout_s (graded incorrect)",
    "rollout/prm_reward": "mean sum of a response's PRM step scores (reward_source with 'prm')",
    "rollout/sampler_logprob_diff": (
        "mean |trainer - sampler| log-prob of the response tokens (sampler-trainer mismatch, and the policy's move "
        "since it sampled when rollouts are stale), when the trainer recomputes the old log-probs (old_logprobs) "
        "and the sampler filters no tokens (top_p 1, no top_k)"
    ),
    "rollout/sampler_ratio_outside": (
        "share of response tokens whose pi_trainer / pi_sampler is outside [0.5, 2] (as sampler_logprob_diff)"
    ),
    "rollout/sampler_kl_sampler_trainer": (
        "mean log pi_sampler - log pi_trainer over response tokens, a k1 estimate of KL(sampler || trainer)"
    ),
    "rollout/tis_weight_mean": "mean truncated importance weight min(pi_trainer / pi_sampler, tis_cap) (tis_cap)",
    "rollout/tis_truncated_fraction": "share of response tokens whose weight was cut to tis_cap (tis_cap)",
    "rollout/episode_return": "mean undiscounted return of an episode (multi-turn env_name)",
    "rollout/episode_turns": "mean turns per episode (multi-turn env_name)",
    "dapo/kept_fraction": "fraction of responses kept by DAPO's group filter (the others are masked out)",
    # async: how far the rollouts are behind the learner (every loop; 0 in the synchronous one)
    "async/staleness": "policy versions between the policy that sampled the batch and the one it updates (AReaL)",
    "async/policy_version": "version of the policy that sampled the batch (the oldest turn's, multi-turn)",
    # train: the update, averaged over the ppo_epoch x num_mini_batch minibatches that trained a token (weighted
    # by their tokens). The per-token means are over the rows that train: with skip_zero_advantage, those with a
    # non-zero advantage. An update that trained no token (train/minibatches_trained 0) measured nothing: its
    # loss, entropy, KL, ratio, clip and gradient figures are absent from the record, not 0.
    "train/minibatches_trained": (
        "minibatch steps of the update that trained a response token (0: every row had a zero advantage with "
        "skip_zero_advantage, or DAPO filtered every row; the update's measurements are then absent)"
    ),
    "train/lr": (
        "learning rate of the policy's optimizer steps: the schedule (lr_schedule, warmup_steps) at the optimizer's "
        "step count, averaged over the iteration's steps (TRL `learning_rate`, verl `actor/lr`)"
    ),
    "train/value_lr": "learning rate of the critic's optimizer steps (critic_lr; verl `critic/lr`)",
    "train/loss": "the policy objective differentiated: policy loss - entropy_coef x entropy + kl_coef x kl",
    "train/policy_loss": "policy-gradient loss (verl `actor/pg_loss`)",
    "train/entropy": (
        "mean token entropy of the policy, not multiplied by entropy_coef (TRL `entropy`, verl `actor/entropy`; "
        "OpenR's `entropy_loss`, logged under that name before; a mean over actions with APPO's action ratio)"
    ),
    "train/kl": (
        "KL(pi || pi_ref) to the reference policy, kl_kind estimator (with kl_coef > 0; TRL `kl`, verl `actor/kl_loss`)"
    ),
    "train/approx_kl": (
        "mean of (r - 1) - log r, r = pi / pi_old, over tokens (over actions for APPO): OpenR's KL skip, which "
        "compares it with target_kl"
    ),
    "train/ppo_kl": (
        "mean of log pi_old - log pi over tokens (verl `actor/ppo_kl`; pi_old is the proximal policy for "
        "async_ppo); not logged with APPO's action ratio"
    ),
    "train/clip_fraction": "fraction of tokens whose clipped term is the active one (verl `actor/pg_clipfrac`)",
    "train/clip_fraction_high": (
        "fraction of tokens with A > 0 and a ratio above 1 + clip_high (TRL `clip_ratio/high_mean`)"
    ),
    "train/clip_fraction_low": (
        "fraction of tokens with A < 0 and a ratio below 1 - clip_low (TRL `clip_ratio/low_mean`, verl "
        "`actor/pg_clipfrac_lower`)"
    ),
    "train/dual_clip_fraction": "fraction of tokens bounded by the dual clip (clip_c; 0 without it)",
    "train/importance_weight": "mean ratio pi / pi_old over response tokens",
    "train/importance_weight_max": "largest ratio pi / pi_old of a response token",
    "train/trained_token_fraction": (
        "fraction of the response tokens in rows the update trained on (below 1 with skip_zero_advantage: rows "
        "whose every advantage is 0 are left out of its passes)"
    ),
    "train/grad_norm": "global L2 norm of the policy gradient, before clipping (TRL `grad_norm`)",
    "train/applied_fraction": "fraction of minibatches whose policy step was taken (finite, approx-KL <= target_kl)",
    "train/kl_skipped_fraction": "fraction of minibatches whose approx-KL exceeded target_kl: no policy step (OpenR)",
    "train/skipped_updates": "minibatch steps skipped for a non-finite loss or gradient (policy or critic)",
    "train/update_step": (
        "updates of the policy so far (`TrainState.step`): one per iteration, each of ppo_epoch x num_mini_batch "
        "optimizer steps"
    ),
    "train/behaviour_weight_mean": "mean pi_prox / pi_behaviour of the tokens kept (async_ppo's decoupled loss)",
    "train/behaviour_kl": "mean log pi_prox - log pi_behaviour of the tokens kept (async_ppo)",
    "train/behaviour_capped_fraction": "fraction of tokens dropped by behaviour_weight_cap (async_ppo)",
    # train, critic (ppo, appo, tppo)
    "train/value_loss": "critic loss (verl `critic/vf_loss`)",
    "train/value_grad_norm": "global L2 norm of the critic gradient before clipping",
    "train/value_clip_fraction": "fraction of value entries whose clipped term is active (verl `critic/vf_clipfrac`)",
    "train/value_mean": "mean critic value over the entries it is trained on",
    "train/value_explained_variance": "1 - Var(returns - values) / Var(returns) of the critic",
    # eval: held-out problems, every eval_interval iterations and at the end
    "eval/accuracy": (
        "fraction of evaluation problems answered correctly by greedy decoding (multi-turn: of held-out games won)"
    ),
    "eval/episode_return": "mean undiscounted return of a greedy held-out game (multi-turn env_name)",
    "eval/episode_turns": "mean turns per greedy held-out game (multi-turn env_name)",
    "eval/response_length": "mean greedy evaluation response length, in tokens",
    "eval/pass@{k}": (
        "unbiased pass@k (Chen et al. 2021) from eval_n_samples samples at the RL temperature, for k in 1, 4, 8 "
        "and eval_n_samples (k <= eval_n_samples), at the first and last evaluation; pass@1 is the sampled accuracy"
    ),
    # eval_hard: the second held-out set (arithmetic.eval_digits: more or fewer digits than trained;
    # countdown.eval_count: more numbers), beside eval/
    "eval_hard/accuracy": (
        "greedy accuracy on the harder held-out split (arithmetic.eval_digits, countdown.eval_count), at each "
        "evaluation"
    ),
    "eval_hard/response_length": "mean greedy response length on the harder held-out split, in tokens",
    "eval_hard/pass@{k}": "eval/pass@{k} on the harder held-out split, at the first and last evaluation",
    # perf: throughput
    "perf/step_time": "seconds of the whole iteration (without the evaluation)",
    "perf/generate_time": "seconds the batch took to sample and grade (in the generator thread for async_ppo)",
    "perf/wait_time": "seconds the learner waited for its batch",
    "perf/grade_time": "seconds of perf/generate_time spent computing the rewards (verifier, or a custom reward_fn)",
    "perf/logprob_time": "seconds of the trainer's passes before the update: old (unless taken from the sampler, "
    "old_logprobs) / reference / proximal log-probs, critic values, advantages",
    "perf/update_time": "seconds of the jitted update (every minibatch's forward, backward and optimizer step)",
    "perf/sync_time": "seconds to hand the new weights to the sampler (Sampler.update_weights)",
    "perf/tokens_per_second": "response tokens of the batch per second of the iteration",
    "perf/device_memory_gb": (
        "GiB in use on the fullest local device after the iteration (`Device.memory_stats()` bytes_in_use; verl "
        "`perf/max_memory_allocated_gb`); absent where the backend does not report it (CPU)"
    ),
    "perf/device_memory_peak_gb": "peak GiB in use on the fullest local device so far (peak_bytes_in_use)",
    "perf/host_memory_gb": "GiB resident in this process's host memory (VmRSS; verl `perf/cpu_memory_used_gb`)",
    "perf/host_memory_peak_gb": "peak GiB resident in this process's host memory so far (VmHWM)",
    # warmstart: the supervised warm-start before RL (logged at step 0, once)
    "warmstart/eval_accuracy_before": "greedy eval accuracy before the warm-start",
    "warmstart/eval_accuracy_after": "greedy eval accuracy after the warm-start",
    "warmstart/seconds": "seconds of the warm-start's training",
    "warmstart/steps": "optimizer steps of the warm-start",
}


_PLACEHOLDERS = {"{k}": "[1-9][0-9]*", "{name}": "[A-Za-z_][A-Za-z0-9_]*"}
_NAME_FAMILIES = {
    name: re.compile(
        re.escape(name)
        .replace(re.escape("{k}"), _PLACEHOLDERS["{k}"])
        .replace(re.escape("{name}"), _PLACEHOLDERS["{name}"])
    )
    for name in METRIC_NAMES
    if any(p in name for p in _PLACEHOLDERS)
}


def documented_name(name: str) -> str | None:
    """The `METRIC_NAMES` entry that documents the logged metric `name`: itself, its family
    (`"eval/pass@4"` -> `"eval/pass@{k}"`), or None for a name the loop does not log."""
    if name in METRIC_NAMES and name not in _NAME_FAMILIES:
        return name
    return next((family for family, pattern in _NAME_FAMILIES.items() if pattern.fullmatch(name)), None)
