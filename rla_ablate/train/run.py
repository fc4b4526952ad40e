"""`run_job`, the one entry point of a training job: one process, or Ray Train workers when it asks for several."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from rla_ablate.train.distributed import run_data_parallel
from rla_ablate.train.job import JobConfig, JobResult
from rla_ablate.train.loggers import MetricLogger
from rla_ablate.train.loop import train_worker
from rla_ablate.train.parallel import WorkerContext


def run_job(job: JobConfig, out_dir: str | Path, logger: MetricLogger | None = None,
            should_stop: Callable[[], bool] | None = None, shares_gpu: bool = False) -> JobResult:
    """Train `job` in `out_dir`, resuming from its newest checkpoint when there is one.

    `out_dir/metrics.jsonl` is always written; `logger` (MLflow, a progress bar, ...) receives the same
    metrics and events. `should_stop()` is polled before every step: when it returns True the job saves a
    checkpoint and returns with status "cancelled". Errors become a JobResult with status "failed" (error line,
    traceback and cause: rla_ablate.outcome); a configuration that cannot run at all raises UserError before
    training starts. `shares_gpu`: the job is packed on a GPU with others (a sweep's fractional share), so its
    first steps and first evaluation wait their turn at the GPU's tuning gate (rla_ablate.train.local_memory).
    """
    if job.train.num_workers > 1:
        return run_data_parallel(job, out_dir, logger, should_stop)
    return train_worker(job, out_dir, logger, should_stop, WorkerContext(), shares_gpu=shares_gpu)
