"""Benchmark of the math grader on a batch like the offline default's.

256 completions of arithmetic level-2 problems ("57+38="), written as the warm-start
teacher writes them ("7+8=15,5+3+1=9,\\boxed{95}"), wrong where the teacher slips
(slip_rate 0.7), and every eighth cut off before its box (no answer). Graded with
`MathGrader.rewards` at the default config's reward settings (timeout 5 s, 2 workers);
prints the median and range of the batch's wall time over the repeats, per answer, and
the latency of one answer through a grading worker (`WorkerPool.run`, serially).

    python scripts/bench_grader.py              # 256 completions, 20 repeats
    python scripts/bench_grader.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from mathrl_jax.configs import default
from mathrl_jax.data.arithmetic import arithmetic_problems
from mathrl_jax.data.teacher import teacher_solutions
from mathrl_jax.rewards import MathGrader, RewardValues


def offline_batch(n: int) -> tuple[list[str], list[str]]:
    """(completions, golds): the teacher's solutions, some wrong, every eighth without its box."""
    problems = arithmetic_problems(n, seed=0, levels=(2,), question_format="{expr}=")
    texts = teacher_solutions([p.question for p in problems], slip_rate=0.7, seed=0)
    texts = [t[: t.index("\\boxed")] if i % 8 == 7 else t for i, t in enumerate(texts)]
    return texts, [p.answer for p in problems]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    reward = default.get_config().reward
    values = RewardValues(reward.correct, reward.incorrect, reward.no_answer, reward.format_reward)
    texts, golds = offline_batch(args.n)
    with MathGrader(values, timeout_s=reward.timeout_s, num_workers=reward.num_workers) as grader:
        rewards, metrics = grader.rewards(texts, golds)  # warm-up: waits for the workers to start
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            grader.rewards(texts, golds)
            times.append(time.perf_counter() - start)
        grader._pool.run(golds[0], golds[0], reward.timeout_s)  # a worker started
        single = []
        for gold in golds[:64]:
            start = time.perf_counter()
            grader._pool.run(gold, gold, reward.timeout_s)
            single.append(time.perf_counter() - start)
    median = statistics.median(times)
    accuracy, no_answer = metrics["reward/accuracy"], metrics["reward/no_answer_rate"]
    print(f"batch of {args.n}: accuracy {accuracy:.3f}, no answer {no_answer:.3f}")
    print(
        f"MathGrader.rewards: median {median * 1e3:.1f} ms (min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}) "
        f"over {args.repeats} repeats = {median / args.n * 1e6:.0f} us per completion"
    )
    print(f"one answer through a worker (WorkerPool.run, serial): median {statistics.median(single) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
