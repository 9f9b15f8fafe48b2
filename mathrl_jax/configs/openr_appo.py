"""OpenR APPO: action-level PPO with a critic on MATH-500, rewards from a process reward model.

OpenR's seed command (`train_math.py --algorithm_name APPO --dataset_name prealgebra
--num_mini_batch 4 --ppo_epoch 1`), here:

    python scripts/train.py --config mathrl_jax/configs/openr_appo.py \
        --config.algorithm_name=APPO --config.dataset_name=prealgebra \
        --config.model_name_or_path=/models/Qwen2.5-Math-1.5B-Instruct \
        --config.prm_model_name_or_path=/models/Qwen2.5-Math-7B-PRM \
        --config.dataset_path=/data/math_500.jsonl

An action is one reasoning step (the tokens up to the one whose text completes
`step_separator`); GAE runs over actions; one importance ratio per action; the
critic is trained on each action's first token; advantages standardised over each
minibatch's actions; a minibatch whose approx-KL exceeds 0.02 skips its policy step
(the critic steps regardless); OpenR's one-sided Huber value loss (delta 10).
Every setting is OpenR's effective one (`train_math.py` overrides `config.py`'s
defaults: lr 1e-6, critic lr 5e-5, 4 threads x 8 steps, 50000 env steps); where
the project differs, docs/training.md's OpenR section says so.
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
    config.param_dtype = "float32"  # master weights and AdamW moments: a 1e-6 step is below bf16's resolution
    config.dtype = "bfloat16"  # compute
    config.remat = True
    config.reward_source = "prm"
    config.step_separator = "\n\n"
    config.n_rollout_threads = 4
    config.group_size = 1
    config.episode_length = 8  # OpenR: 8 steps per episode; counts env steps for num_env_steps (answers may have more)
    config.num_env_steps = 50000  # OpenR train_math.py: 50000 env steps of 4 threads x 8 steps
    config.num_mini_batch = 4
    config.ppo_epoch = 1
    config.lr = 1e-6
    config.lora.rank = 8  # OpenR's policy: LoRA r 8, alpha 16 on q_proj and v_proj (qwen_lora_agent.py), base frozen
    config.lora.alpha = 16.0
    config.lora.targets = "q_proj,v_proj"
    # OpenR's critic (mat/models/critic.py): the policy's base with its adapters disabled, under a trained MLP head
    config.lora.share_critic_base = True
    config.critic_lr = 5e-5
    config.warmup_steps = 0  # OpenR: constant learning rates
    config.adam_eps = 1e-5  # OpenR: opti_eps
    config.gamma = 0.95
    config.lam = 0.95
    config.entropy_coef = 0.01
    config.value_loss_type = "huber_one_sided"  # OpenR's util.huber_loss
    config.huber_delta = 10.0
    config.value_clip = 0.2  # OpenR: the value loss is clipped with clip_param
    config.appo_action_ratio = True
    config.advantage_whitening = "openr"
    config.target_kl = 0.02
    config.max_grad_norm = 0.5
    config.warmstart.steps = 0
    config.eval_interval = 20
    config.eval_n_samples = 0  # greedy only; e.g. 8 for pass@8 at the start and end (8x the generation)
    config.save_interval = 20
    config.log_interval = 1
    return config
