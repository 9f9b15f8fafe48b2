"""What a run reports: `MetricsLogger` (metrics.jsonl, tensorboard, wandb), the metric names and their meaning,
`Progress` (the progress bar and its lines), `read_jsonl_metrics` for tools that read a run back.

Behind the door: `_metrics` (the logger and its sinks), `_names` (every metric's name and meaning), `_wandb`
(the wandb sink), `_progress` (the progress display).
"""

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

__all__ = [
    "METRIC_NAMES",
    "MetricsLogger",
    "Progress",
    "REPORT_TO",
    "RESERVED_KEYS",
    "documented_name",
    "read_jsonl_metrics",
    "report_sinks",
    "scalar_metrics",
]
