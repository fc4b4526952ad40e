"""One training job: `JobConfig` in, `JobResult` out, `metrics.jsonl` and checkpoints in its folder.

    from rla_ablate.train import JobConfig, run_job
    result = run_job(job, "runs/x", logger)      # resumes from runs/x/checkpoints when it can

See docs/ARCHITECTURE.md ("train") for the interfaces the sweep and tracking build on.
"""

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

__all__ = [
    "CompositeLogger",
    "JSONLLogger",
    "JobConfig",
    "JobResult",
    "MetricLogger",
    "NullLogger",
    "ProgressLogger",
    "TrainConfig",
    "metric_series",
    "read_jsonl",
    "run_job",
]
