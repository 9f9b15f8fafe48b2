"""One process of `test_grading_is_shared_out_and_gathered_in_order`: `python multiprocess_grader_worker.py OUT_DIR`,
joined to the others by the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID environment."""

import json
import os
import sys

from mathrl_jax.sharding import distributed

distributed.initialize()

import jax  # noqa: E402

from mathrl_jax.rewards.math_grader import MathGrader, RewardValues  # noqa: E402
from mathrl_jax.rewards.serial_grader import SerialGrader  # noqa: E402

RESPONSES = ["\\boxed{4}", "\\boxed{5}", "no answer", "\\boxed{\\frac{1}{2}}", "\\boxed{7}", "x", "\\boxed{0.5}"]
GOLDS = ["4", "4", "4", "0.5", "7", "7", "1/2"]

values = RewardValues(1.0, -1.0, -2.0, 0.0)
grader = MathGrader(values, num_workers=1)
graded = []
plain = grader.grade_batch
grader.grade_batch = lambda responses, golds: graded.append(len(responses)) or plain(responses, golds)
rewards, _ = SerialGrader(grader).rewards(RESPONSES, GOLDS)
verdicts = SerialGrader(grader).grade_batch(RESPONSES, GOLDS)
expected = plain(RESPONSES, GOLDS)  # this process alone, the whole batch
with open(os.path.join(sys.argv[1], f"grader{jax.process_index()}.json"), "w") as f:
    json.dump(
        {
            "graded": graded[0],
            "verdicts": [v.status for v in verdicts],
            "expected": [v.status for v in expected],
            "rewards": rewards.tolist(),
            "expected_rewards": grader.rewards(RESPONSES, GOLDS)[0].tolist(),
        },
        f,
    )
grader.close()
distributed.barrier("done")
