"""Functions run in `multiprocessing` workers by the grader tests (importable by a spawned child)."""

import multiprocessing
import time

MB = 1_000_000

# Responses that hang or exhaust math-verify (each ran > 20 s without a timeout when this was written),
# or that are merely huge. (response, gold).
ADVERSARIAL = [
    ("\\boxed{10^{10^{10}}}", "5"),  # sympy evaluates the power
    ("\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "1"),  # deeply nested braces
    ("\\boxed{" + "1+" * 300_000 + "1}", "5"),  # a 600 kB sum
    ("\\boxed{" + "x+" * (MB // 2) + "x}", "5"),  # 1 MB inside the box
    ("x" * MB + " so \\boxed{\\frac{1}{2}}", "0.5"),  # 1 MB of text, then a plain answer
    ("y" * MB, "5"),  # 1 MB of text, no answer
]


def grade_timed(cases, timeout_s):
    """[(status, seconds)] of `grade` on each case, after one untimed call that starts the workers."""
    from mathrl_jax.rewards.math_grader import grade

    assert grade("\\boxed{1.0}", "1", timeout_s=60.0).correct  # not a plain integer: it goes to a worker
    out = []
    for response, gold in cases:
        start = time.monotonic()
        result = grade(response, gold, timeout_s=timeout_s)
        out.append((result.status, time.monotonic() - start))
    return out, multiprocessing.current_process().daemon
