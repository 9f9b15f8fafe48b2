"""Reward functions of your own, in TRL's convention: one float per completion; the problem's fields arrive as
keyword lists (`question`, `answer`, `solution`, `level`, `subject`, `uid`). The README's example trains with them:

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
