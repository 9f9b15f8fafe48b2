"""DAPO on MATH with Qwen2.5-Math (Yu et al. 2025): clip-higher, token-mean, dynamic sampling, overlong shaping.

    python scripts/train.py --config mathrl_jax/configs/dapo_qwen_math.py \
        --config.model_name_or_path=/models/Qwen2.5-Math-7B \
        --config.dataset_path=/data/dapo_math_17k.parquet

clip (0.2, 0.28), no KL, token-mean loss, groups whose 16 samples are all right
or all wrong dropped, soft overlong punishment over the last 512 tokens.
"""

from mathrl_jax.configs import grpo_qwen_math


def get_config():
    config = grpo_qwen_math.get_config()
    config.algorithm_name = "dapo"
    config.run_dir = "runs/dapo_qwen_math"
    config.group_size = 16
    config.n_rollout_threads = 64
    config.clip_low = 0.2
    config.clip_high = 0.28
    config.kl_coef = 0.0
    config.loss_agg_mode = "token-mean"
    config.max_new_tokens = 4096
    config.dapo.success_rate_lb = 0.0
    config.dapo.success_rate_ub = 1.0
    config.dapo.overlong_buffer_len = 512
    config.dapo.overlong_penalty_factor = 1.0
    config.reward.correct = 1.0
    config.reward.incorrect = -1.0
    config.reward.no_answer = -1.0
    return config
