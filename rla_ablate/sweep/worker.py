"""What runs inside a Ray worker: one job, its MLflow logger, progress and stop requests through the monitor.

The driver never trains; a worker never decides about retries. A job attempt returns a
`rla_ablate.outcome.JobOutcome` (failures are values): status, tokens, metrics, error line, traceback, cause,
and the GPU memory the attempt had.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import ray

from rla_ablate.errors import UserError
from rla_ablate.outcome import JobOutcome, Status

# Fault injection for resilience tests and drills: "<job_id prefix or *>@<tokens>" makes that job raise once,
# at the first step at or past <tokens>; a marker file in its out_dir keeps the retry from raising again.
FAIL_ONCE_ENV = "RLA_SWEEP_FAIL_ONCE"
# What the injected failure is (a drill of each failure cause): other (default), config, compile, oom.
FAIL_KIND_ENV = "RLA_SWEEP_FAIL_KIND"
REPORT_EVERY_S = 1.0
# Seconds a job's end waits for the tracking server to take its last metrics and its status.
CLOSE_TIMEOUT_S = 30.0


class CompilationError(RuntimeError):
    """The injected stand-in for Triton's CompilationError (FAIL_KIND_ENV=compile): classified by its name, like
    the real one, so the drill needs no GPU and no triton."""


def fail_kind(job_id: str) -> str:
    """FAIL_KIND_ENV for this job: one kind for every job, or `<job id prefix or *>=<kind>,...` (first match)."""
    spec = os.environ.get(FAIL_KIND_ENV, "").strip().lower()
    if "=" not in spec:
        return spec
    for part in spec.split(","):
        who, _, kind = part.partition("=")
        if who.strip() == "*" or job_id.startswith(who.strip()):
            return kind.strip()
    return ""


def injected_failure(kind: str, tokens: int) -> BaseException:
    """The exception FAIL_ONCE_ENV raises for FAIL_KIND_ENV `kind`."""
    where = f"injected failure at {tokens} tokens ({FAIL_ONCE_ENV}" + (f", {FAIL_KIND_ENV}={kind})" if kind else ")")
    if kind == "config":
        return UserError(where)
    if kind == "compile":
        return CompilationError(where)
    if kind == "oom":
        return RuntimeError(f"CUDA out of memory: {where}")
    if kind in ("", "other"):
        return RuntimeError(where)
    raise UserError(f"unknown {FAIL_KIND_ENV} {kind!r}; one of other, config, compile, oom", key=FAIL_KIND_ENV)


@ray.remote(num_cpus=0)
class Monitor:
    """The driver's mailbox: workers report progress and eval values, the driver asks jobs to stop."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.started: set[str] = set()
        self.values: dict[str, list[tuple[int, float]]] = {}
        self.stop_all = False
        self.stop: set[str] = set()
        self.notes: list[tuple[str, str, bool]] = []  # (job id, text, keep in its status)

    def report(self, job_id: str, tokens: int | None, values: list[tuple[int, float]]) -> bool:
        self.started.add(job_id)
        if tokens is not None:
            self.tokens[job_id] = max(tokens, self.tokens.get(job_id, 0))
        if values:
            self.values.setdefault(job_id, []).extend(values)
        return self.stop_all or job_id in self.stop

    def note(self, job_id: str, text: str, keep: bool = True) -> None:
        """A line for the launch's output and, if `keep`, the job's status (a resume that skipped an unreadable
        checkpoint); a passing state (a wait at the GPU's tuning gate) is only said."""
        self.notes.append((job_id, text, keep))

    def snapshot(self) -> tuple[dict[str, int], set[str], dict[str, list[tuple[int, float]]],
                                list[tuple[str, str, bool]]]:
        values, self.values = self.values, {}
        notes, self.notes = self.notes, []
        return dict(self.tokens), set(self.started), values, notes

    def started_jobs(self) -> set[str]:
        return set(self.started)

    def request_stop(self, job_id: str | None = None) -> None:
        if job_id is None:
            self.stop_all = True
        else:
            self.stop.add(job_id)

    def clear(self, job_id: str) -> None:
        self.stop.discard(job_id)
        self.started.discard(job_id)


class SweepLogger:
    """Wraps the MLflow logger (which drops steps a resumed run already holds): reports progress and eval values
    to the driver's monitor and relays its stop requests."""

    def __init__(self, inner: Any, monitor: Any, job_id: str, out_dir: Path, *, watch: str | None = None):
        self.inner, self.monitor, self.job_id, self.out_dir = inner, monitor, job_id, out_dir
        self.watch = watch
        self.tokens: int | None = None
        self._values: list[tuple[int, float]] = []
        self._stop = False
        self._last_report = 0.0
        self._pending: tuple[Any, list[tuple[int, float]]] | None = None  # (the reply's future, the values sent)
        self._closed = False
        self._fail_at = self._parse_fail_once()

    def _parse_fail_once(self) -> int | None:
        spec = os.environ.get(FAIL_ONCE_ENV)
        if not spec or "@" not in spec:
            return None
        who, at = spec.rsplit("@", 1)
        if who != "*" and not self.job_id.startswith(who):
            return None
        if (self.out_dir / ".failed-once").exists():
            return None
        return int(at)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.inner is not None:
            self.inner.log(metrics, step)
        self.tokens = step if self.tokens is None else max(self.tokens, step)
        if self.watch and self.watch in metrics:
            self._values.append((int(step), float(metrics[self.watch])))
            self._report(force=True)

    def tokens_trained(self, tokens: int) -> None:
        """The tokens after each step (the training loop calls it): the next report carries them, so the launch's
        rate and ETA move between metric logs (every `log_every_tokens`) too."""
        self.tokens = tokens if self.tokens is None else max(self.tokens, tokens)

    def event(self, name: str, step: int, detail: dict) -> None:
        skipped = (detail or {}).get("skipped_checkpoints") if name == "resumed" else None
        if skipped and self.monitor is not None:
            self.monitor.note.remote(self.job_id, f"unreadable checkpoint skipped ({'; '.join(skipped)}); resumed "
                                                  f"from the older one at {int(step)} tokens")
        if name == "info" and "tuning_gate" in (detail or {}) and self.monitor is not None:
            self.monitor.note.remote(self.job_id, "waits for its GPU's tuning gate (packed jobs autotune one at a "
                                                  "time)", False)
        if name == "start":
            self.tokens = int(step)
            self._report(force=True)
        if self.inner is not None:
            self.inner.event(name, step, detail)

    def close(self, status: str, reason: str | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._report(force=True, wait=True)
        if self.inner is not None:
            self.inner.close(status, reason)

    def announce(self) -> None:
        """Tell the driver the job has started (before run_job builds the model and opens the data)."""
        self._report(force=True)

    def should_stop(self) -> bool:
        if self._fail_at is not None and self.tokens is not None and self.tokens >= self._fail_at:
            self._fail_at = None
            (self.out_dir / ".failed-once").write_text(str(self.tokens))
            raise injected_failure(fail_kind(self.job_id), self.tokens)
        self._report()
        return self._stop

    def _report(self, force: bool = False, wait: bool = False) -> None:
        """Send the driver the tokens and the watched values since the last report; its reply (stop or not) is read
        once it has come, at any later call. Training never waits for it, not even by asking Ray whether it is
        there (`ray.get`, and `ray.wait` on a reply still on its way, count as blocked: Ray lends the task's CPUs
        to another job, and three jobs of `cpus: 1` ran on two CPUs); the reply's future is a plain Python one.
        `wait` (the job's last report) waits for both replies."""
        if self.monitor is None:
            return
        self._collect(False)  # a stop that has arrived is seen at once, whatever the rate limit
        now = time.monotonic()
        if not force and now - self._last_report < REPORT_EVERY_S:
            return
        if wait:
            self._collect(True)
        if self._pending is not None:
            return  # the reply is still in flight; what this report would carry waits for the next one
        self._last_report = now
        values, self._values = self._values, []
        try:
            self._pending = (self.monitor.report.remote(self.job_id, self.tokens, values).future(), values)
        except Exception:
            self._values = values + self._values
            return
        if wait:
            self._collect(True)

    def _collect(self, wait: bool) -> None:
        """Read the reply to the report in flight if it has come (or within 30 s when `wait`)."""
        if self._pending is None:
            return
        future, sent = self._pending
        if not wait and not future.done():
            return
        try:
            self._stop = bool(future.result(timeout=30))
        except Exception:
            # The driver is gone or slow; keep training, the checkpoint makes stopping later cheap.
            self._values = sent + self._values
        self._pending = None


def gpu_memory_gib(allocator_cap: float | None = None) -> float | None:
    """GPU memory this task may use: the device's total times its allocator cap, else times the task's GPU
    fraction; None without CUDA (or when the job never touched it: this must not create a CUDA context)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        fraction = float(ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0))
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    except Exception:
        return None
    if allocator_cap is not None:
        return total * allocator_cap / 2**30
    # A task that holds no GPU (a multi-worker job's coordinator) has no share of this device to report.
    return total * min(fraction, 1.0) / 2**30 if fraction > 0 else None


def execute(job: Any, out_dir: str, job_id: str, tracking_uri: str | None, run_id: str | None,
            monitor: Any, cpus: float, watch: str | None = None, allocator_cap: float | None = None) -> JobOutcome:
    """Run one job to its end (or a stop request) and return its outcome; never raises.

    `allocator_cap`: the fraction of the GPU this job's allocator may hold (its share when jobs are packed). The
    project's warnings (`errors.Notice`: damaged lines of the job's metrics.jsonl) go to the launch's output and the
    job's status through the monitor: the worker's own stderr reaches no one."""
    import warnings

    from rla_ablate.errors import Notice

    with warnings.catch_warnings():
        warnings.simplefilter("always", Notice)
        # the job reports a skipped checkpoint itself (its `resumed` event), as `rla-sweep train` does
        warnings.filterwarnings("ignore", message="skipped unreadable checkpoints")
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, Notice) and monitor is not None:
                try:
                    monitor.note.remote(job_id, f"warning: {message}")
                    return
                except Exception:
                    pass
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        return _execute(job, out_dir, job_id, tracking_uri, run_id, monitor, cpus, watch, allocator_cap)


def _execute(job: Any, out_dir: str, job_id: str, tracking_uri: str | None, run_id: str | None,
             monitor: Any, cpus: float, watch: str | None, allocator_cap: float | None) -> JobOutcome:
    entered = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    logger = None
    try:
        import torch

        torch.set_num_threads(max(1, int(cpus)))
        if allocator_cap is not None and torch.cuda.is_available():
            # Ray's fractional GPUs do not limit memory: past its share this job fails alone, its neighbours live
            torch.cuda.set_per_process_memory_fraction(allocator_cap)
        from rla_ablate.train import run_job

        inner = None
        if tracking_uri and run_id:
            from rla_ablate.tracking import MLflowLogger

            # A resumed job's logger first hands the run what an earlier attempt wrote but never sent (it was killed
            # with metrics buffered), retrying until the server answers; it then skips the steps the run holds.
            # A job waits at most CLOSE_TIMEOUT_S for an unreachable server at its end: the launch backfills the
            # run from metrics.jsonl once the server answers again.
            inner = MLflowLogger(tracking_uri, run_id, close_timeout_s=CLOSE_TIMEOUT_S, backfill=out / "metrics.jsonl")
        logger = SweepLogger(inner, monitor, job_id, out, watch=watch)
        logger.announce()
        started = time.time()
        outcome = run_job(job, out, logger, should_stop=logger.should_stop, shares_gpu=allocator_cap is not None)
        ended = time.time()
        outcome.metrics = {k: float(v) for k, v in (outcome.metrics or {}).items()}
        outcome.gpu_memory_gib = gpu_memory_gib(allocator_cap)
        logger.close(outcome.status, outcome.traceback or outcome.error)
        if inner is not None:
            _sync(tracking_uri, run_id, out)
        # Wall-clock marks (epoch seconds) for the scheduling-overhead benchmark.
        outcome.timing = {"entered": entered, "run_job_start": started, "run_job_end": ended,
                          "returned": time.time(), "triton_cache": os.environ.get("TRITON_CACHE_DIR")}
        return outcome
    except BaseException as exc:
        # UserError (a configuration run_job rejects before it starts) is classified `config`: never retried.
        tokens = (logger.tokens or 0) if logger is not None else 0
        if isinstance(exc, KeyboardInterrupt):
            outcome = JobOutcome(Status.CANCELLED, tokens_done=tokens, error="interrupted")
        else:
            outcome = JobOutcome.from_exception(exc, tokens_done=tokens, out_dir=out)
            outcome.gpu_memory_gib = gpu_memory_gib(allocator_cap)
        if logger is not None:
            try:
                logger.close(outcome.status, outcome.error)
            except Exception:
                pass
        if tracking_uri and run_id:
            _sync(tracking_uri, run_id, out)
        return outcome


def _sync(tracking_uri: str, run_id: str, out: Path) -> None:
    """Upload what the run lacks of the job's metrics.jsonl (the ground truth); the driver syncs again at the end
    of the launch, so a tracking server that does not answer here loses nothing."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return
    try:
        from rla_ablate.tracking.sync import sync_from_jsonl

        sync_from_jsonl(tracking_uri, run_id, path, timeout=10.0)
    except Exception:
        pass


run_remote = ray.remote(max_retries=0)(execute)
# A GPU job runs in a fresh worker process that exits with it (Ray's own default for GPU tasks; `max_calls` cannot be
# set per call): a reused process keeps the previous job's CUDA context, loaded kernels and cached allocator blocks,
# so packed jobs grow past their estimates and their neighbours run out of memory.
run_remote_gpu = ray.remote(max_retries=0, max_calls=1)(execute)


def remote_for(num_gpus: float) -> Any:
    """The remote function a job's task runs: one fresh process per job where it holds a GPU."""
    return run_remote_gpu if num_gpus > 0 else run_remote
