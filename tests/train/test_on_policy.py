"""The update's first pass over a fresh batch is on policy: the old log-probs are the current policy's.

With one minibatch and one epoch, every token the update trains on was sampled and scored by the policy that
the update starts from, so the importance ratio pi / pi_old is 1 on every token: its logged mean and maximum
are 1, the k3 KL estimate between the two is 0 and no token is clipped. Old log-probs left from an earlier
policy version (a stale cache, the reference model's, the parameters before the previous update) break it
from the second iteration on, while the run may still learn; tests/test_planted_bugs.py plants that bug.
"""

import numpy as np
import pytest

from tests.train.loop_fixtures import model_dir, run_and_record, small_config  # noqa: F401

# Float32 recomputation of the same forward pass at other batch shapes: rounding, far below a policy step's KL.
ROUNDING = 1e-5


# The old log-probs the sampler reported (its weights synced at every iteration) and those the trainer recomputes.
@pytest.mark.parametrize("algorithm_name, old_logprobs", [("grpo", "sampler"), ("grpo", "trainer"), ("ppo", "trainer")])
def test_one_minibatch_one_epoch_trains_on_policy_every_iteration(
    model_dir,  # noqa: F811
    tmp_path,
    algorithm_name,
    old_logprobs,
):
    config = small_config(
        model_dir,
        tmp_path / algorithm_name,
        algorithm_name=algorithm_name,
        old_logprobs=old_logprobs,
        num_iterations=4,
        num_mini_batch=1,
        ppo_epoch=1,
        lr=3e-3,
    )
    _, history = run_and_record(config)
    assert len(history) == config.num_iterations
    for iteration, metrics in history:
        assert abs(metrics["train/importance_weight"] - 1.0) < ROUNDING, (iteration, metrics)
        assert abs(metrics["train/importance_weight_max"] - 1.0) < ROUNDING, (iteration, metrics)
        assert metrics["train/approx_kl"] < ROUNDING, (iteration, metrics)
        assert metrics["train/clip_fraction"] == 0.0, (iteration, metrics)
    # The runs trained: what they logged changes across iterations (a run that never updated would pass above).
    entropies = np.array([m["train/entropy"] for _, m in history])
    assert np.ptp(entropies) > 10 * ROUNDING, entropies
