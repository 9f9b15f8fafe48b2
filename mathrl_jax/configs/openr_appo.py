"""OpenR APPO: action-level PPO with a critic on MATH-500, rewards from a process reward model.

The seed command of OpenR's `train_math.py`, here:

    python scripts/train.py --config mathrl_jax/configs/openr_appo.py \
        --config.model_name_or_path=/models/Qwen2.5-Math-1.5B-Instruct \
        --config.prm_model_name_or_path=/models/Qwen2.5-Math-PRM \
        --config.dataset_path=/data/openr_math_500.jsonl

An action is one reasoning step (ending at `step_separator`); GAE runs over
actions (gamma 0.99, lambda 0.95); the critic is a value head on the policy's
trunk; OpenR's approx-KL early stop (0.02) and its batch sizes.
"""

from mathrl_jax.configs import default


def get_config():
    config = default.get_config()
    config.algorithm_name = "appo"
    config.run_dir = "runs/openr_appo"
    config.dataset_name = "auto"  # math500 / OpenR's two-field layout, detected from the fields
    config.dataset_path = "openr_math_500.jsonl"
    config.prompt_template = "chat"
    config.max_prompt_length = 512
    config.max_new_tokens = 512
    config.param_dtype = "bfloat16"
    config.dtype = "bfloat16"
    config.remat = True
    config.reward_source = "prm"
    config.step_separator = "\n\n"
    config.n_rollout_threads = 4
    config.group_size = 1
    config.episode_length = 8  # at most this many steps per answer (OpenR)
    config.num_env_steps = 4000
    config.num_mini_batch = 4
    config.ppo_epoch = 1
    config.lr = 1e-6
    config.critic_lr = 5e-6
    config.gamma = 0.99
    config.lam = 0.95
    config.target_kl = 0.02
    config.max_grad_norm = 0.5
    config.warmstart.steps = 0
    config.eval_interval = 20
    config.eval_n_samples = 0  # greedy only; e.g. 8 for pass@8 at the start and end (8x the generation)
    config.save_interval = 20
    config.log_interval = 1
    return config
