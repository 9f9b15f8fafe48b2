"""GRPO on MATH with Qwen2.5-Math, vLLM sampling and the boxed-answer verifier (verl's recipe).

    python scripts/train.py --config mathrl_jax/configs/grpo_qwen_math.py \
        --config.model_name_or_path=/models/Qwen2.5-Math-1.5B \
        --config.dataset_path=/data/math_train.jsonl

Rewards 1 / 0 by default; RLinf's +5 / -5 with `--config.reward.correct=5
--config.reward.incorrect=-5 --config.reward.no_answer=-5`. KL to the reference
in the loss (k3, 0.001), token-mean aggregation, 8 samples per prompt.
"""

from mathrl_jax.configs import default


def get_config():
    config = default.get_config()
    config.algorithm_name = "grpo"
    config.run_dir = "runs/grpo_qwen_math"
    config.sampler = "vllm"
    config.vllm.kv_cache_gib = 20.0  # GPU memory beside the trainer's on one 80 GB GPU (1.5B, bf16)
    config.dataset_name = "auto"
    config.dataset_path = "math_train.jsonl"
    config.prompt_template = "chat"
    config.max_prompt_length = 1024
    config.max_new_tokens = 3072
    config.param_dtype = "float32"  # master weights and AdamW moments: a 1e-6 step is below bf16's resolution
    config.dtype = "bfloat16"  # compute
    config.remat = True
    config.n_rollout_threads = 128
    config.group_size = 8
    config.num_iterations = 500
    config.ppo_epoch = 1
    config.num_mini_batch = 4
    config.micro_batch_size = 8
    config.lr = 1e-6
    config.warmup_steps = 10
    config.kl_coef = 0.001
    config.kl_kind = "k3"
    config.entropy_coef = 0.0
    config.loss_agg_mode = "token-mean"
    config.warmstart.steps = 0
    config.eval_interval = 25
    config.eval_n_samples = 0  # greedy only; e.g. 8 for pass@8 at the start and end (8x the generation)
    config.save_interval = 25
    config.num_eval_problems = 500
    return config
