"""OpenR TPPO: token-level PPO with the action-decomposed Bellman backup of POAD.

As `openr_appo.py` (same model, PRM, data and seed command) with the
credit assignment of POAD: token-level values, gamma applied only at the end
of each reasoning step, lambda within it.

    python scripts/train.py --config mathrl_jax/configs/openr_tppo.py \
        --config.model_name_or_path=/models/Qwen2.5-Math-1.5B-Instruct \
        --config.prm_model_name_or_path=/models/math-shepherd-mistral-7b-prm \
        --config.dataset_path=/data/openr_math_500.jsonl
"""

from mathrl_jax.configs import openr_appo


def get_config():
    config = openr_appo.get_config()
    config.algorithm_name = "tppo"
    config.run_dir = "runs/openr_tppo"
    return config
