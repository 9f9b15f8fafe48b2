"""OpenR TPPO: token-level PPO with the action-decomposed Bellman backup of POAD.

As `openr_appo.py` (same model, PRM, data and seed command) with the
credit assignment of POAD: token-level values, gamma applied only at the end
of each reasoning step, lambda within it; token-level ratios; advantages
standardised over each minibatch's non-zero entries; the critic on every token.

    python scripts/train.py --config mathrl_jax/configs/openr_tppo.py \
        --config.algorithm_name=TPPO --config.dataset_name=prealgebra \
        --config.model_name_or_path=/models/Qwen2.5-Math-1.5B-Instruct \
        --config.prm_model_name_or_path=/models/Qwen2.5-Math-7B-PRM \
        --config.dataset_path=/data/math_500.jsonl
"""

from mathrl_jax.configs import openr_appo


def get_config():
    config = openr_appo.get_config()
    config.algorithm_name = "tppo"
    config.run_dir = "runs/openr_tppo"
    return config
