"""The column chain: d-digit a+b / a-b solved column by column, the horizon d a knob; tiny model, CPU, minutes.

    python scripts/train.py --config mathrl_jax/configs/column_chain.py

The offline default's task grown longer (docs/testbed.md). Two operands of `arithmetic.digits` digits each
("4821+3795="); the warm-start imitates the teacher's worked solutions, one step per column, units first, each
naming its carry or borrow ("1+5=6,2+9+0=11,8+7+1=16,4+3+1=8,\\boxed{8616}", `data/teacher.py`), where the teacher
drops each carry it needs independently with probability `warmstart.slip_rate`: on four digits it is right only on
the problems that carry nowhere or where it slipped nowhere. RL is rewarded by the verifier on the boxed answer
alone, which grows sparse with the horizon, while the rule-based process verifier (`arithmetic_steps`, for APPO /
TPPO: `--config.prm_model_name_or_path=arithmetic_steps --config.step_separator=, --config.reward_source=
prm+verifier`) scores every column. Besides the held-out set of the training length (`eval/*`), a second held-out
set has `arithmetic.eval_digits` digits (`eval_hard/*`: length generalisation). `--config.arithmetic.digits=2
--config.arithmetic.eval_digits=4` is the offline default's task at this config's scale. `--config.shuffle_rewards=
True` is the control.
"""

from mathrl_jax.configs import default
from mathrl_jax.data import teacher


def get_config():
    config = default.get_config()
    config.run_dir = "runs/column_chain"
    config.arithmetic.digits = 4  # the horizon: columns per solution
    config.arithmetic.eval_digits = 6  # the harder held-out split: two digits longer than trained
    # Room for the longest worked solution at either length, with EOS (one token per character): 81 at 6 digits.
    config.max_new_tokens = teacher.longest_solution(max(config.arithmetic.digits, config.arithmetic.eval_digits)) + 1
    # Calibrated (docs/testbed.md#the-column-chain): 600 steps teach the column facts well but not perfectly, and
    # with each needed carry dropped 80% of the time the warm-started policy solves about 16% of the held-out
    # problems at temperature 1 (15% greedy, the problems that carry nowhere); GRPO lifts greedy accuracy to about
    # 0.75 by iteration 6 and holds there, short of 0.95.
    config.warmstart.steps = 600
    config.warmstart.slip_rate = 0.8
    config.num_iterations = 30
    config.eval_interval = 3  # a curve of 11 points: where the methods differ in speed
    config.save_interval = 30
    return config
