"""What a run reports: `MetricsLogger` (metrics.jsonl, tensorboard, wandb; completions.jsonl), the dashboard's
figures (reward spread, lengths, memory, completion tables), the metric names and their meaning,
`Progress` (the progress bar and its lines), `read_jsonl_metrics` for tools that read a run back.

Behind the door: `_metrics` (the logger and its sinks), `_dashboard` (the rewards' spread, lengths, memory and the
completion table, from an iteration's batch), `_names` (every metric's name and meaning), `_wandb`
(the wandb sink), `_progress` (the progress display), `_watch` (a run that trains nothing stops, naming why).
"""

from mathrl_jax.train.reporting._dashboard import (
    completion_rows,
    completion_table,
    device_memory_metrics,
    host_memory_metrics,
    length_metrics,
    markdown_table,
    measured_update_metrics,
    memory_metrics,
    reward_metrics,
)
from mathrl_jax.train.reporting._metrics import (
    REPORT_TO,
    RESERVED_KEYS,
    MetricsLogger,
    read_jsonl_metrics,
    report_sinks,
    scalar_metrics,
)
from mathrl_jax.train.reporting._names import METRIC_NAMES, documented_name
from mathrl_jax.train.reporting._progress import Progress
from mathrl_jax.train.reporting._watch import NOTHING_TRAINED_PATIENCE, NothingTrainedError, TrainingWatch

__all__ = [
    "METRIC_NAMES",
    "MetricsLogger",
    "NOTHING_TRAINED_PATIENCE",
    "NothingTrainedError",
    "Progress",
    "REPORT_TO",
    "RESERVED_KEYS",
    "TrainingWatch",
    "completion_rows",
    "completion_table",
    "device_memory_metrics",
    "host_memory_metrics",
    "length_metrics",
    "markdown_table",
    "measured_update_metrics",
    "memory_metrics",
    "reward_metrics",
    "documented_name",
    "read_jsonl_metrics",
    "report_sinks",
    "scalar_metrics",
]
