"""The offline game: multi-turn REINFORCE with ReBN on GEM's GuessTheNumber (1..20 in 5 turns), tiny model, CPU.

    python scripts/train.py --config mathrl_jax/configs/guess_number_tiny.py

The multi-turn counterpart of the offline default. A warm-start imitates a teacher that plays binary search,
writing the candidates left before each guess ("11-20 \\boxed{15}"), but guesses the smallest candidate instead
of the midpoint 70% of the time (`envs/guess_number_teacher.py`): it wins about 45% of its games within the 5
turns, binary search all of them. RL (`reinforce_rebn`, gamma 1) has to find the midpoint. Held-out
evaluation: greedy games on seeds the training never draws; `eval/accuracy` is the success rate,
`eval/episode_turns` the turns per game. `--config.shuffle_rewards=True` is the control (each turn's reward
given to another turn of the batch). The policy sees the conversation's latest 128 tokens: its last action (the
candidates it had) and the hint after it, all it needs.
"""

from mathrl_jax.configs import default


def get_config():
    config = default.get_config()
    config.algorithm_name = "reinforce_rebn"
    config.run_dir = "runs/guess_number_tiny"
    config.env_name = "guess_number"
    config.guess_number.max_turns = 5
    config.episode_length = 5
    config.n_rollout_threads = 64  # games per iteration
    config.group_size = 1
    # Not GEM's 0.9: with gamma < 1 a won game's returns grow with the turn index, so ReBN's batch normalisation
    # gives early turns negative and late turns positive advantages however they played. Here that pushes the
    # teacher's majority (the slip) down at early turns, which happens to be right: with gamma 0.9 turns paired
    # with another game's advantages still raised greedy success from 0.29 to 0.46 by iteration 20. With gamma 1
    # every turn of a game gets its game's outcome; the same broken pairing gains +0.025 in 40 iterations, the
    # run itself +0.325 (tests/train/test_learning.py, docs/main_job.md).
    config.gamma = 1.0
    config.prompt_template = "plain"
    config.max_prompt_length = 128
    config.max_new_tokens = 24
    config.pack_length = 256
    config.num_iterations = 40
    # Measured on one warm-start (greedy success 0.28), gamma 0.9: lr 5e-5 with 64 games reaches 0.605 at iteration
    # 40, its control 0.16; 1e-4 with 32 games 0.55, but its control collapses (format errors end the games); 3e-4
    # collapses itself; 3e-5 had not moved by iteration 10. Gamma 1, lr 5e-5, 64 games: 0.605, control 0.0.
    config.lr = 5e-5
    config.num_eval_problems = 200  # held-out games
    config.eval_n_samples = 0
    config.num_logged_samples = 0
    config.warmstart.steps = 600
    config.warmstart.slip_rate = 0.7
    return config
