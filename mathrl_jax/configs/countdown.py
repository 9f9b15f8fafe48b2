"""Countdown: reach a target from a few numbers with + - *, each used once; a search task, tiny model, CPU, minutes.

    python scripts/train.py --config mathrl_jax/configs/countdown.py

docs/testbed.md. The prompt is the instance, "3,7,5->26:"; the answer a derivation, one operation per step, then
the boxed target: "7*3=21,21+5=26,\\boxed{26}" (data/countdown/rules.py). The reward is the outcome verifier's
(rewards/countdown_grader.py): the steps must be right, use every given number exactly once (intermediate results
once too) and end at the target, so copying the target from the prompt earns nothing. The warm-start imitates a
teacher that only combines the numbers left to right, in the given order, with + and * (data/countdown/teacher.py):
its rule solves about a third of the 3-number instances and writes its nearest chain on the rest, and its last
operator slips (`warmstart.slip_rate`): wrong where the rule is right, sometimes right (by `-`) where it is not. So
the right behaviour is rare under the warm-start on part of the task and RL has to find it (pass@k); another order
or grouping the teacher never shows.
`countdown.count` is the difficulty knob (3 to 5 numbers); the harder held-out split has one number more
(`countdown.eval_count`, eval_hard/*). The rule-based process verifier scores every step (a step is good while the
rules hold and the target stays reachable), for APPO / TPPO: `--config.prm_model_name_or_path=countdown_steps
--config.step_separator=, --config.reward_source=prm+verifier`. `--config.shuffle_rewards=True` is the control.
"""

from mathrl_jax.configs import default
from mathrl_jax.data.countdown import teacher


def get_config():
    config = default.get_config()
    config.run_dir = "runs/countdown"
    config.dataset_name = "countdown"
    config.countdown.count = 3
    config.countdown.eval_count = 4
    # Room for the teacher's longest solution at either count, with EOS (one token per character): 40 at 4 numbers.
    c = config.countdown
    config.max_new_tokens = teacher.longest_solution(max(c.count, c.eval_count), c.max_number) + 1
    # The teacher's last operator slips 70% of the time: greedy decoding starts near 0.14, sampling at 0.13.
    config.warmstart.slip_rate = 0.7
    config.warmstart.steps = 1200
    # Twice the default's prompts and minibatches per iteration: the right chain depends on the instance, a slower
    # lesson than the default's carry, so RL needs more updates in its 30 iterations to move.
    config.n_rollout_threads = 64
    config.num_mini_batch = 8
    config.num_iterations = 30
    config.eval_interval = 3
    config.num_eval_problems = 500
    config.save_interval = 30
    return config
