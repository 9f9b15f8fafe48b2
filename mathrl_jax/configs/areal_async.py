"""AReaL-style asynchronous PPO: generation runs ahead, at most 4 versions stale, decoupled loss.

    python scripts/train.py --config mathrl_jax/configs/areal_async.py \
        --config.model_name_or_path=/models/DeepSeek-R1-Distill-Qwen-1.5B \
        --config.dataset_path=/data/areal_boba_106k.jsonl

Group advantages (GRPO-style, 16 samples), decoupled PPO loss with the
proximal policy recomputed by the learner, `max_head_offpolicyness=4`.
"""

from mathrl_jax.configs import grpo_qwen_math


def get_config():
    config = grpo_qwen_math.get_config()
    config.algorithm_name = "async_ppo"
    config.run_dir = "runs/areal_async"
    config.dataset_name = "areal_boba"
    config.dataset_path = "areal_boba_106k.jsonl"
    config.prompt_template = "plain"  # AReaL-boba prompts carry their own template
    config.group_size = 16
    config.n_rollout_threads = 32
    config.max_head_offpolicyness = 4
    config.behaviour_weight_cap = 5.0
    config.kl_coef = 0.0
    config.max_new_tokens = 8192
    config.max_prompt_length = 1024
    config.reward.correct = 5.0
    config.reward.incorrect = -5.0
    config.reward.no_answer = -5.0
    return config
