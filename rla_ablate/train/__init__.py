"""One training job: `JobConfig` in, `JobResult` out, `metrics.jsonl` and checkpoints in its folder.

    from rla_ablate.train import JobConfig, run_job
    result = run_job(job, "runs/x", logger)      # resumes from runs/x/checkpoints when it can

The names below are imported on first use (`rla_ablate.lazy`). See docs/ARCHITECTURE.md ("train") for the
interfaces the sweep and tracking build on.
"""

# ruff: noqa: F401
from typing import TYPE_CHECKING

from rla_ablate.lazy import exports

if TYPE_CHECKING:  # the names for type checkers (listed in __all__ through _WHERE)
    from rla_ablate.train.config import TrainConfig
    from rla_ablate.train.job import JobConfig, JobResult
    from rla_ablate.train.loggers import (
        CompositeLogger,
        JSONLLogger,
        MetricLogger,
        NullLogger,
        ProgressLogger,
        metric_series,
        read_jsonl,
    )
    from rla_ablate.train.run import run_job

_WHERE = {"TrainConfig": "config", "JobConfig": "job", "JobResult": "job", "CompositeLogger": "loggers",
          "JSONLLogger": "loggers", "MetricLogger": "loggers", "NullLogger": "loggers", "ProgressLogger": "loggers",
          "metric_series": "loggers", "read_jsonl": "loggers", "run_job": "run"}
__all__ = sorted(_WHERE)
__getattr__ = exports(__name__, _WHERE)
