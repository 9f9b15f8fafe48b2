"""What TensorBoard itself shows of a run's event files (its own `EventAccumulator`, installed with the dev and
plot extras): every logged scalar at its step, and after a resume, the resumed run's values for the steps it
logged again, none of the interrupted run's."""

import pytest

from mathrl_jax.train.reporting._metrics import MetricsLogger

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator", reason="tensorboard: pip install -e '.[dev]'"
)


def scalars(logdir, tag):
    view = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.SCALARS: 0})
    view.Reload()
    return [(event.step, event.value) for event in view.Scalars(tag)]


def test_tensorboard_shows_the_resumed_runs_values_and_none_of_the_steps_it_replaced(tmp_path):
    with MetricsLogger(str(tmp_path), jsonl=False) as logger:
        for step in range(1, 7):  # the interrupted run got to step 6; its checkpoint was step 3
            logger.log(step, {"rollout/rewards": float(step)})
    assert scalars(tmp_path, "rollout/rewards") == [(s, float(s)) for s in range(1, 7)]
    with MetricsLogger(str(tmp_path), jsonl=False, resumed_from=3) as logger:
        for step in (4, 5):
            logger.log(step, {"rollout/rewards": 10.0 * step})
    assert scalars(tmp_path, "rollout/rewards") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]
