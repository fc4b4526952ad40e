"""Data-parallel training through Ray Train's TorchTrainer: DDP by default, FSDP2 for the large shapes.

This module starts the workers and talks to them; how a worker spreads its model over the others (DDP or FSDP2)
is rla_ablate.train.parallel.

Every worker runs the same loop as a single process (`train_worker`) on disjoint data; rank 0 writes
metrics.jsonl and the checkpoints, which must therefore live on storage the driver can read. The driver
does no training: it forwards the records rank 0 appends to metrics.jsonl to the caller's logger, and turns
the caller's `should_stop()` into a file the workers poll, so loggers never have to cross process borders.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Callable

import torch

from rla_ablate.fileio import atomic_write_text
from rla_ablate.ray_local import init_local_ray
from rla_ablate.train.checkpoint import list_checkpoints
from rla_ablate.outcome import Cause, Status
from rla_ablate.train.job import JobConfig, JobResult
from rla_ablate.train.loggers import CompositeLogger, MetricLogger
from rla_ablate.train.loop import check_job, train_worker
from rla_ablate.train.parallel import WorkerContext

STOP_FILE = "STOP"
RESULT_FILE = "result.json"
POLL_S = 0.5


def _worker_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch

    job = config["job"]
    out_dir = Path(config["out_dir"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    stop_file = out_dir / STOP_FILE
    ctx = WorkerContext(rank=rank, world_size=world, device=device)
    result = train_worker(job, out_dir, None, lambda: rank == 0 and stop_file.exists(), ctx)
    if rank == 0:
        atomic_write_text(out_dir / RESULT_FILE, json.dumps(result.to_dict()))


class _Forwarder(threading.Thread):
    """Follows metrics.jsonl and hands each new record to the logger; polls `should_stop` into the stop file."""

    def __init__(self, path: Path, logger: MetricLogger | None, should_stop: Callable[[], bool] | None,
                 stop_file: Path):
        super().__init__(daemon=True)
        self.path, self.logger, self.should_stop, self.stop_file = path, logger, should_stop, stop_file
        self.done = threading.Event()
        self.stop_exc: BaseException | None = None
        self.inode, self.offset = None, 0
        # Lines the caller already has (an earlier attempt's records) are never sent again.
        self.seen: set[bytes] = set()
        if path.exists():
            data = path.read_bytes()
            self.inode, self.offset = path.stat().st_ino, len(data)
            self.seen.update(data.splitlines())

    def pump(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return
        if stat.st_ino != self.inode:
            # Rank 0 rewrote the file (a resume drops the records past its checkpoint): read it again and
            # skip what was already sent.
            self.inode, self.offset = stat.st_ino, 0
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        # Only whole lines: rank 0 may be in the middle of writing the last one.
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            if line in self.seen:
                continue
            self.seen.add(line)
            record = json.loads(line)
            if self.logger is None:
                continue
            if record["type"] == "metrics":
                self.logger.log(record["values"], record["step"])
            elif record["type"] == "event":
                self.logger.event(record["name"], record["step"], record["detail"])

    def run(self) -> None:
        while not self.done.wait(POLL_S):
            self.pump()
            try:
                stop = self.should_stop is not None and self.should_stop()
            except Exception as exc:
                # As in a single process, an exception from should_stop fails the job; it stops at a checkpoint.
                self.stop_exc = exc
                stop = True
            if stop:
                self.stop_file.touch()


def run_data_parallel(job: JobConfig, out_dir: str | Path, logger: MetricLogger | None,
                      should_stop: Callable[[], bool] | None) -> JobResult:
    """Train `job` on `job.train.num_workers` Ray Train workers (GPUs when the Ray cluster has them, else CPU + gloo)."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    check_job(job)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    # As in a single process, a logger that raises never stops the job (nor the forwarding thread).
    logger = CompositeLogger(logger) if logger is not None else None
    metrics_path = out_dir / "metrics.jsonl"
    stop_file, result_file = out_dir / STOP_FILE, out_dir / RESULT_FILE
    stop_file.unlink(missing_ok=True)
    result_file.unlink(missing_ok=True)

    started_ray = False
    if not ray.is_initialized():
        init_local_ray(include_dashboard=False, configure_logging=False)
        started_ray = True
    # "auto" asks the cluster, not this process: a sweep task that holds no GPU still trains its workers on GPUs.
    use_gpu = job.train.device == "cuda" or (job.train.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
    forwarder = _Forwarder(metrics_path, logger, should_stop, stop_file)
    forwarder.start()
    error: BaseException | None = None
    try:
        trainer = TorchTrainer(
            _worker_loop,
            train_loop_config={"job": job, "out_dir": str(out_dir)},
            scaling_config=ScalingConfig(num_workers=job.train.num_workers, use_gpu=use_gpu),
            torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
            run_config=RunConfig(name="train", storage_path=str(out_dir / "ray"),
                                 failure_config=FailureConfig(max_failures=0)),
        )
        trainer.fit()
    except Exception as exc:
        error = exc
    finally:
        forwarder.done.set()
        forwarder.join()
        forwarder.pump()
        stop_file.unlink(missing_ok=True)
        if started_ray:
            ray.shutdown()
    if result_file.exists():
        result = JobResult.from_dict(json.loads(result_file.read_text()))
        result.out_dir = out_dir
    else:
        done = list_checkpoints(out_dir)
        tokens = done[-1][0] if done else 0
        if error is not None:
            result = JobResult.from_exception(error, tokens_done=tokens, out_dir=out_dir)
        else:
            result = JobResult(status=Status.FAILED, tokens_done=tokens, error="the workers ended without a result",
                               cause=Cause.OTHER, out_dir=out_dir)
    if forwarder.stop_exc is not None and result.status == Status.CANCELLED:
        failed = JobResult.from_exception(forwarder.stop_exc, tokens_done=result.tokens_done, metrics=result.metrics,
                                          out_dir=out_dir)
        failed.error = f"should_stop raised {failed.error}"
        result = failed
    if logger is not None:
        # As for one process, the logs keep a failure's whole traceback.
        logger.close(result.status, result.traceback or result.error)
    return result

