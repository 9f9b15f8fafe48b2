"""Reward functions of your own, in TRL's convention: one float per completion; the problem's fields arrive as
keyword lists (`question`, `answer`, `solution` and `ground_truth` (the gold final answer, all three),
`worked_solution`, `level`, `subject`, `uid`), with TRL's `completion_ids` (each completion's token ids) and
`trainer_state` (`global_step`, `epoch`, `max_steps`). The README's example trains with them:

    python scripts/train.py --config.reward_source=verifier+functions \
        --config.reward.functions=examples/my_rewards.py:boxed_once,examples/my_rewards.py:brevity \
        --config.reward.weights=0.2,0.1
"""


def boxed_once(prompts, completions, **columns):
    """1 for a completion with exactly one \\boxed{...} answer."""
    return [1.0 if c.count("\\boxed{") == 1 else 0.0 for c in completions]


def brevity(prompts, completions, answer, **columns):
    """Up to 1 for a completion no longer than ten times its gold answer."""
    return [min(1.0, 10 * max(len(a), 1) / max(len(c), 1)) for c, a in zip(completions, answer)]


def token_budget(completions, completion_ids, trainer_state, **columns):
    """-1 per 100 tokens of a completion, phased in over the run (0 at the first step, in full at the last): TRL's
    `completion_ids` and `trainer_state` (a schedule over `global_step / max_steps`)."""
    progress = trainer_state.global_step / max(trainer_state.max_steps - 1, 1)
    return [-progress * len(ids) / 100 for ids in completion_ids]
