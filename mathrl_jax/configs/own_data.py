"""Your own data: GRPO on a data file of yours, with an instruct model and its chat template (TRL's GRPO quickstart).

    python scripts/train.py --config=mathrl_jax/configs/own_data.py --config.dataset_path=my_data/train.jsonl

The file may be in any layout `dataset_name="auto"` detects (docs/rewards_data_envs.md#data): TRL's (`prompt`, a
string or chat messages, with `solution`, `answer` or `ground_truth`), verl's, MATH-500's, MATH's, GSM8K's; or
name your fields (`--config.data.fields=question:problem,answer:gold`). A tenth of it (at most num_eval_problems)
is held out for evaluation, and the run says so (`--config.eval_holdout=0` trains on all of it,
`--config.eval_dataset_path` names another file). The model is Qwen2.5-0.5B-Instruct, a Hub id: downloaded when the
environment allows it (HF_HUB_OFFLINE unset), else read from the local cache; `--config.model_name_or_path` names
another (a local directory too). TRL's names work: `--config.num_generations=8 --config.beta=0.04
--config.max_completion_length=512` (docs/trl_verl_names.md). On a laptop CPU, sample with the JAX sampler (the
default here); on a GPU, `--config.sampler=vllm` (docs/vllm.md).
"""

from mathrl_jax.configs import default


def get_config():
    config = default.get_config()
    config.algorithm_name = "grpo"
    config.run_dir = "runs/own_data"
    config.model_name_or_path = "Qwen/Qwen2.5-0.5B-Instruct"
    config.dataset_name = "auto"
    # The tokenizer's own chat template, Qwen's "\boxed{}" instruction after the question (or after the last user
    # message of chat-message data: the verifier reads the boxed answer); "chat_plain" adds no instruction.
    config.prompt_template = "chat"
    config.max_prompt_length = 512
    config.max_new_tokens = 512
    config.param_dtype = "float32"
    config.dtype = "bfloat16"
    config.remat = True
    config.n_rollout_threads = 16
    config.group_size = 8
    config.num_iterations = 200
    config.num_mini_batch = 2
    config.micro_batch_size = 8
    config.lr = 1e-6
    config.warmup_steps = 0
    config.kl_coef = 0.0  # TRL's default beta
    config.loss_agg_mode = "token-mean"  # TRL's default loss_type, "dapo"
    config.warmstart.steps = 0
    config.eval_interval = 20
    config.eval_n_samples = 0
    config.save_interval = 20
    config.num_eval_problems = 100
    return config
