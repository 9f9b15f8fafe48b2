"""GEM GuessTheNumber: multi-turn REINFORCE with return batch-normalisation (ReBN), gamma 0.9.

    python scripts/train.py --config mathrl_jax/configs/gem_guess_number.py \
        --config.model_name_or_path=/models/Qwen3-1.7B-Base

Each turn's response is one transition: per-turn discounted returns
(gamma 0.9), normalised over every turn of the batch, given to the turn's tokens.
"""

from mathrl_jax.configs import default


def get_config():
    config = default.get_config()
    config.algorithm_name = "reinforce_rebn"
    config.run_dir = "runs/gem_guess_number"
    config.env_name = "guess_number"
    config.dataset_name = "arithmetic"  # unused by the env; kept valid
    config.prompt_template = "chat"
    config.gamma = 0.9
    config.episode_length = 10
    config.n_rollout_threads = 64
    config.group_size = 1
    config.max_new_tokens = 256
    config.max_prompt_length = 2048
    config.num_iterations = 200
    config.lr = 1e-6
    config.loss_agg_mode = "token-mean"
    # 640 turns of up to 2048 + 256 tokens per iteration: the log-prob passes and the update go 16 turns at a
    # time (exact accumulation), or their [rows, tokens, vocabulary] logits alone exceed any device's memory.
    config.micro_batch_size = 16
    config.warmstart.steps = 0
    config.eval_interval = 0
    return config
