"""`rla-sweep launch`: schedule a sweep's unfinished jobs on Ray, track them in MLflow, never run a job twice.

Scheduling is Ray core: one task per job attempt with the sweep's `num_cpus`/`num_gpus` (fractional GPUs
share a device), at most `--max-concurrent` in flight, Ray deciding where and when each runs. The driver
only submits, waits (`ray.wait`) and decides about retries by the failure's cause (rla_ablate.outcome): a
failed attempt reruns from the job's last checkpoint (run_job resumes given the same out_dir) up to
`resources.retries` times; a config or compile failure never reruns (it would fail the same way); an attempt
out of GPU memory reruns with twice its share of a GPU, or alone on one past half a GPU, when it shared one
(`_Runner._retry_with_more_memory`); a
diverged job is a result and never reruns.

Embedded default: a local Ray instance and the local MLflow server of `rla_ablate.tracking` (the single
writer; jobs log over HTTP), both stopped at exit, Ctrl-C included; their pids are recorded in the sweep
folder so that the next launch stops what a SIGKILLed one left behind.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import signal
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from rla_ablate import environment
from rla_ablate.errors import UserError, exception_line
from rla_ablate.fileio import shell_arg
from rla_ablate.outcome import ENDED, TERMINAL, Cause, JobOutcome, Status
from rla_ablate.ray_local import init_local_ray
from rla_ablate.sweep.expand import ResolvedJob, Sweep, load_sweep, refuse_cuda_jobs
from rla_ablate.sweep.sources import GridSource, JobSource, count_statuses
from rla_ablate.sweep.summary import FailedJob, LaunchSummary
from rla_ablate.sweep.state import SweepDir, read_json
from rla_ablate.sweep.status import starts_from

DEFAULT_ROOT = "rla-runs"
# Seconds jobs get to write a checkpoint and return after Ctrl-C or `rla-sweep cancel`.
STOP_GRACE_S = 60.0
# A second Ctrl-C kills the running attempts and waits this long for their workers to end before closing their runs.
ABANDON_WAIT_S = 10.0
# Seconds the launch waits for its restarted tracking server before a run update is given up (and noted).
TRACKING_WAIT_S = 120.0


@dataclass
class LaunchOptions:
    """How `launch` runs a sweep (the CLI flags)."""

    root: Path = Path(DEFAULT_ROOT)
    """Folder holding every sweep's state, checkpoints and databases."""
    address: str | None = None
    """Ray cluster address (`ray start --head` prints it); None starts a local Ray instance."""
    tracking_uri: str | None = None
    """MLflow tracking server; None starts the embedded one (SQLite under the sweep folder)."""
    max_concurrent: int | None = None
    """Jobs in flight at once; None lets Ray's resources be the only limit."""
    interactive: bool | None = None
    """Redraw a live table (True) or print one line per change (False); None: when stdout is a terminal."""
    new_version: bool = False
    """Make the file the sweep's next version even where it looks like another study under the same name."""


def source_for(sweep: Sweep, sdir: SweepDir) -> JobSource:
    """The source of a sweep's jobs: its `search:` study, else its expansion."""
    if sweep.config.search is not None:
        from rla_ablate.sweep.search import OptunaSource

        return OptunaSource(sweep, sdir)
    return GridSource(sweep, sdir)


def resource_shortfall(sweep: Sweep, cluster: dict[str, float], placements: dict[str, Any],
                       where: str = "the Ray cluster") -> UserError | None:
    """What a job asks for that `cluster` (`where`) does not have (GPUs, CPUs), as the error a launch stops with."""
    res = sweep.config.resources
    line = sweep.source.line(("resources",))
    gpus_needed = max((p.gpus for p in placements.values()), default=0.0)
    have_gpus, have_cpus = cluster.get("GPU", 0.0), cluster.get("CPU", 0.0)
    if gpus_needed > have_gpus:
        return UserError(f"each job asks for {gpus_needed:g} GPU(s) but {where} has {have_gpus:g}; "
                         "set resources.gpus: 0 to train on CPU", file=sweep.source.file, line=line,
                         key="resources.gpus")
    if res.cpus > have_cpus:
        return UserError(f"each job asks for {res.cpus:g} CPUs but {where} has {have_cpus:g}",
                         file=sweep.source.file, line=line, key="resources.cpus")
    return None


# Why jobs that need CUDA cannot run where Ray has no GPU, and what runs instead.
NO_GPU = "but the Ray cluster has no GPU; allowed here: train.device auto or cpu and train.cuda_graphs false"


def local_shortfall(sweep: Sweep) -> UserError | None:
    """What stops a launch without --address (a local Ray instance) on this machine, or None: too few CPUs or GPUs
    (`resource_shortfall`), or jobs that need CUDA where there is no GPU."""
    from rla_ablate.sweep.packing import gpu_memory_bytes, place

    local = _local_resources()
    short = resource_shortfall(sweep, local, place(sweep, gpu_memory_bytes() if local["GPU"] > 0 else None),
                               "this machine")
    if short is None and not local["GPU"]:
        try:
            refuse_cuda_jobs(sweep.jobs, sweep.source, NO_GPU)
        except UserError as exc:
            return exc
    return short


def local_gpus() -> int:
    """How many GPUs a launch without --address finds on this machine."""
    return int(_local_resources()["GPU"])


def _check_resources(sweep: Sweep, cluster: dict[str, float], placements: dict[str, Any], sdir: SweepDir) -> None:
    short = resource_shortfall(sweep, cluster, placements)
    if short is not None:
        raise short
    have_gpus = cluster.get("GPU", 0.0)
    # the cuda jobs this launch would run (a resumed sweep's finished ones need no GPU); their status is read only
    # where a cuda job meets a cluster without GPUs
    if not have_gpus:
        # Each of them would start, open its run and fail at its first line (CUDA is not available).
        refuse_cuda_jobs(
            [j for j in sweep.jobs if j.job.train.needs_cuda and sdir.status(j.job_id).status is not Status.FINISHED],
            sweep.source, NO_GPU)


def on_gpus(placements: dict[str, Any] | None) -> bool:
    """Whether any job of the launch holds a GPU share."""
    return bool(placements) and any(p.gpus > 0 for p in placements.values())


def _glue_change(sdir: SweepDir, gpus: bool) -> str | None:
    """On GPUs, record the glue mode this launch's jobs run (RLA_GLUE), with a note when an earlier launch of the
    sweep on GPUs ran another: its finished runs and this launch's would differ in rounding (each run's tag `glue`
    says which). On the CPU both modes run the plain-torch glue: nothing to record."""
    if not gpus:
        return None
    mode, before = environment.glue_mode(), sdir.meta().get("glue_mode")
    sdir.write_meta(glue_mode=mode)
    if before is None or before == mode:
        return None
    return (f"an earlier launch of this sweep ran with {environment.GLUE_ENV}={before}, this one with {mode}: "
            f"set {environment.GLUE_ENV}={before} to keep its runs alike (each run's MLflow tag `glue` says which)")


def _local_resources() -> dict[str, float]:
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count()
    except Exception:
        pass
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(gpus)}


class _Services:
    """Ray and MLflow for one launch; stopped in reverse order whatever happens."""

    def __init__(self, sdir: SweepDir, opts: LaunchOptions):
        self.sdir, self.opts = sdir, opts
        self.server = None
        self.tracking_uri: str | None = opts.tracking_uri
        self.backend_uri: str | None = opts.tracking_uri
        self.ray_started = False

    def spawn_tracking(self) -> None:
        """Start the embedded server's process without waiting for it: its start-up (seconds of imports and
        store migrations) runs while Ray starts."""
        if self.tracking_uri is None and self.server is None:
            from rla_ablate.tracking import TrackingServer

            self.server = TrackingServer(self.sdir.mlflow_dir).start(wait=False)

    def start_tracking(self) -> None:
        if self.tracking_uri is None:
            self.spawn_tracking()
            assert self.server is not None
            # Supervised: a server that dies or hangs mid-sweep is started again on the same store and port.
            self.server.wait_until_up().supervise()
            self.tracking_uri, self.backend_uri = self.server.uri, self.server.backend_uri
        self.sdir.record_children()

    def tracking_notices(self) -> list[str]:
        """Lines about the embedded server since the last call (a restart after it died)."""
        return self.server.notices() if self.server is not None else []

    def wait_tracking(self, timeout: float = TRACKING_WAIT_S) -> bool:
        """Whether the embedded server answers within `timeout` (True at once for a --tracking-uri server)."""
        return self.server.wait_healthy(timeout) if self.server is not None else True

    def start_ray(self) -> dict[str, float]:
        import ray

        self.sdir.triton_cache.mkdir(parents=True, exist_ok=True)
        seed_triton_cache(self.sdir.triton_cache)
        env = {"TRITON_CACHE_DIR": str(self.sdir.triton_cache),
               # packed jobs live under allocator caps: growable segments keep freed blocks from fragmenting into
               # reserved-but-unusable memory (up to ~2 GiB per 100M job measured without)
               "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")}
        # Local workers inherit the driver's environment; remote nodes get it through the runtime env.
        os.environ.update(env)
        passthrough = {k: v for k, v in os.environ.items() if k.startswith("RLA_SWEEP_") or k in environment.FORWARDED}
        kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                                      configure_logging=True)
        if self.opts.address:
            _check_reachable(self.opts.address)
            kwargs["runtime_env"] = {"env_vars": {**env, **passthrough}}
            try:
                ray.init(address=self.opts.address, **kwargs)
            except (ConnectionError, RuntimeError) as exc:
                cause = exc.__cause__ or exc
                raise UserError(f"cannot join the Ray cluster at {self.opts.address}: "
                                f"{str(cause).strip().splitlines()[-1][:600]}", key="--address") from None
        else:
            init_local_ray(num_cpus=os.cpu_count() or 1, **kwargs)
        self.ray_started = True
        self.sdir.record_children()
        return ray.cluster_resources()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop_soon()  # it exits while Ray shuts down
        if self.ray_started:
            import ray

            try:
                ray.shutdown()
            except Exception:
                pass
            self.ray_started = False
        if self.server is not None:
            self.server.stop()
            self.server = None


# Autotune results of FLA's and our kernels for the committed presets' shapes, measured on an H200 (the Triton
# version and the GPU are part of each entry's key: elsewhere they are ignored and tuning runs as usual).
TUNING_SEEDS = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu-tuning" / "triton-cache"


def _delete_run(tracking_uri: str, run_id: str) -> bool:
    """Delete (soft: restorable) the run; False when this tracking store has no such run (another store's)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri).delete_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True


def seed_triton_cache(cache: Path) -> int:
    """Copy the shipped autotune results into a Triton cache (a sweep's; the benchmarks' on a GPU), keeping what is
    there: a fresh node's first step then compiles the winning configurations only, instead of timing every
    candidate for minutes (FLA's keys name the head sizes and dtypes, not the token count). Returns the files
    copied."""
    copied = 0
    if not TUNING_SEEDS.is_dir():
        return copied
    for src in TUNING_SEEDS.rglob("*"):
        dst = cache / src.relative_to(TUNING_SEEDS)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        elif not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            copied += 1
    return copied


def seed_this_process() -> str | None:
    """`seed_triton_cache` into the Triton cache this process compiles into (the benchmarks on a GPU): a line saying
    what it added, or None when the cache had every shipped file."""
    cache = triton_cache_dir()
    if copied := seed_triton_cache(cache):
        return f"autotune results: {copied} shipped files added to the Triton cache at {cache}"
    return None


def triton_cache_dir() -> Path:
    """The Triton cache this process compiles into: $TRITON_CACHE_DIR, else Triton's default (~/.triton/cache)."""
    import os

    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"])
    import triton

    knobs = getattr(triton, "knobs", None)
    return Path(knobs.cache.dir) if knobs is not None else Path.home() / ".triton" / "cache"


def _check_reachable(address: str) -> None:
    """Fail in seconds, not after Ray's minute of retries, when a host:port address does not answer."""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise UserError(f"no Ray cluster answers at {address} ({exc.strerror or exc}); `ray start --head` on the "
                        "head node prints the address to use", key="--address") from None


def launch(path: str | Path, opts: LaunchOptions, *, console: Any = None,
           on_event: Callable[[str, dict], None] | None = None) -> LaunchSummary:
    """Run every unfinished job of the sweep file at `path`; returns the summary (raises UserError on bad input)."""
    sweep = load_sweep(path)
    return launch_sweep(sweep, opts, console=console, on_event=on_event)


def launch_sweep(sweep: Sweep, opts: LaunchOptions, *, console: Any = None,
                 on_event: Callable[[str, dict], None] | None = None) -> LaunchSummary:
    from rla_ablate.sweep.progress import Progress

    sdir = SweepDir(opts.root, sweep.name)
    if opts.max_concurrent is not None and opts.max_concurrent < 1:
        raise UserError(f"must be at least 1; got {opts.max_concurrent}", key="--max-concurrent")
    check_store(sdir, opts.tracking_uri)
    source = source_for(sweep, sdir)
    # The data dry run: every data config and eval set a job will read opens and yields a batch, before anything
    # is created.
    from rla_ablate.sweep.datacheck import check_data

    check_data(sweep, source.data_jobs())
    check_evals(sweep)
    from rla_ablate.sweep.packing import gpu_memory_bytes, place

    placements = None
    gpu_bytes = None
    if opts.address is None:
        local = _local_resources()
        gpu_bytes = gpu_memory_bytes() if local["GPU"] > 0 else None
        placements = place(sweep, gpu_bytes)
        _check_resources(sweep, local, placements, sdir)
    # A sweep this launch creates is removed again if the launch fails before any job ran (a dead --address, a
    # tracking server that does not start): no sweep.yaml, jobs.json or pending jobs of a sweep that never ran.
    fresh = not sdir.path.exists()
    runner = None
    sdir.acquire()
    previous_term = None
    services = _Services(sdir, opts)
    progress = Progress(sweep.name, console=console, interactive=opts.interactive)
    try:
        left_out = _check_version(sweep, sdir, opts)
        source.check()
        sdir.path.mkdir(parents=True, exist_ok=True)
        Path(sdir.path / "sweep.yaml").write_text(Path(sweep.source.file).read_text(encoding="utf-8"), encoding="utf-8")
        if (sdir.path / "sweep.yaml").resolve() != Path(sweep.source.file).resolve():  # not `resume`
            # where the file's relative paths point: data paths from the folder it was launched in, evals'
            # include_path from its own folder (`resume` runs the copy above from there)
            sdir.write_meta(sweep_file=str(Path(sweep.source.file).resolve()), cwd=os.getcwd())
        if left_out:
            progress.note(left_out)
        lost = lost_store(sweep, sdir, opts)
        source.prepare()
        summary = LaunchSummary(sweep=sweep.name)
        if source.nothing_to_do(summary):
            if lost:  # nothing to train, but runs to make again: the sweep's own server for as long as that takes
                from rla_ablate.tracking import TrackingServer, ensure_parent_run

                with TrackingServer(sdir.mlflow_dir) as server:
                    sdir.write_meta(tracking_uri=server.uri, backend_uri=server.backend_uri, embedded_tracking=True)
                    parent = ensure_parent_run(server.uri, sweep.name, tags=parent_tags(sweep))
                    sdir.write_meta(parent_run_id=parent)
                    restore_runs(sweep, sdir, server.uri, lost, progress)
                    _close_parent(server.uri, parent, summary)
            summary.evals_error = score_evals(sweep, sdir, None, progress)
            progress.nothing_to_do(summary, restored=bool(lost))
            return summary
        from rla_ablate.sweep.plan import unset_budget_note

        unset = unset_budget_note(sweep, on_cpu=opts.address is None and gpu_bytes is None)
        if unset:
            progress.note(f"note: {unset}")
        t0 = time.monotonic()
        progress.note(f"starting {'Ray (joining ' + opts.address + ')' if opts.address else 'a local Ray instance'} "
                      f"and {'the MLflow server' if opts.tracking_uri is None else 'the MLflow client'}: "
                      "usually 5-20 s")
        # SIGTERM stops a launch like Ctrl-C from here on; ray.init installs a handler of its own, which exits
        # (SystemExit 15): during start-up that is an interrupt too, and ours goes in again once Ray is up
        previous_term = _term_as_interrupt()
        services.spawn_tracking()
        try:
            cluster = services.start_ray()
        except SystemExit as exc:
            if exc.code == signal.SIGTERM:
                raise KeyboardInterrupt from None
            raise
        _term_as_interrupt()
        progress.note(f"Ray: {'joined ' + opts.address if opts.address else 'local instance'}, "
                      f"{cluster.get('CPU', 0):g} CPUs, {cluster.get('GPU', 0):g} GPUs ({time.monotonic() - t0:.1f} s)")
        if opts.address is not None:
            from rla_ablate.sweep.packing import probe_cluster_gpu_memory

            import ray

            gpu_bytes = probe_cluster_gpu_memory(ray) if cluster.get("GPU", 0) > 0 else None
            placements = place(sweep, gpu_bytes)
            _check_resources(sweep, cluster, placements, sdir)
        _note_placements(progress, placements)
        order_longest_first(sweep, sdir, source, placements, progress)
        glue_note = _glue_change(sdir, on_gpus(placements))
        if glue_note:
            progress.note(glue_note)
        t0 = time.monotonic()
        services.start_tracking()
        progress.note(f"MLflow: {services.tracking_uri} ({time.monotonic() - t0:.1f} s)")
        sdir.write_meta(tracking_uri=services.tracking_uri, backend_uri=services.backend_uri,
                        embedded_tracking=opts.tracking_uri is None)
        from rla_ablate.tracking import ensure_parent_run

        parent = ensure_parent_run(services.tracking_uri, sweep.name, tags=parent_tags(sweep))
        sdir.write_meta(parent_run_id=parent)
        if lost:
            restore_runs(sweep, sdir, services.tracking_uri, lost, progress)
        runner = _Runner(sweep, sdir, services, opts, progress, on_event)
        runner.placements, runner.gpu_bytes = placements, gpu_bytes
        runner.window = opts.max_concurrent or default_window(sweep, cluster, placements, source.ahead)
        runner.run(source)
        runner.summary.skipped = summary.skipped
        summary = runner.summary
        evals_error = None if runner.stopping else score_evals(sweep, sdir, services.tracking_uri, progress)
        # Ctrl-C, SIGTERM and `rla-sweep cancel` alike: the launch was stopped (exit 130).
        summary.interrupted = bool(runner.stop_reason)
        summary.evals_error = evals_error
        summary.evals_pending = runner.stopping and sweep.config.evals is not None
        summary.output_closed = progress.closed
        summary.counts = count_statuses(sdir, (j.job_id for j in source.jobs))
        if sweep.config.search is not None:
            summary.study_counts = count_statuses(sdir, (r["job_id"] for r in sdir.job_list()))
        # Every run is completed from its job's metrics.jsonl: wait for a server that is being restarted.
        runner.tracking_notes()
        services.wait_tracking()
        runner.end_runs()
        runner.tracking_notes()
        _close_parent(services.tracking_uri, parent, summary)
        progress.final(summary, sdir)
        return summary
    except BaseException:
        if fresh and (runner is None or not runner.tries):
            services.stop()
            sdir.release()
            shutil.rmtree(sdir.path, ignore_errors=True)
        raise
    finally:
        progress.stop()
        services.stop()
        sdir.release()
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)


def parent_tags(sweep: Sweep) -> dict:
    """The tags of the sweep's parent run: its file and description."""
    return {"sweep_file": str(Path(sweep.source.file).resolve()), "description": sweep.config.description[:5000]}


def run_tags(job: ResolvedJob) -> dict:
    """The tags of a job's MLflow run: what a dashboard groups and labels it by."""
    tags = {"family": job.family, "ablations": list(job.ablations), "seed": job.seed, "name": job.name,
            **job.identity_tags()}
    if job.control_of:
        tags["control_of"] = job.control_of
    return tags


def lost_store(sweep: Sweep, sdir: SweepDir, opts: LaunchOptions) -> list[ResolvedJob]:
    """The jobs of the current expansion that have an MLflow run in a sweep whose embedded tracking store is gone
    (mlflow/mlflow.db moved or deleted): their runs are made again from their metrics.jsonl (`restore_runs`)."""
    if opts.tracking_uri is not None or not sdir.path.is_dir() or (sdir.mlflow_dir / "mlflow.db").exists():
        return []
    if not sdir.meta().get("embedded_tracking", True):
        return []
    return [j for j in sweep.jobs if sdir.status(j.job_id).mlflow_run_id]


def restore_runs(sweep: Sweep, sdir: SweepDir, uri: str, jobs: list[ResolvedJob], progress: Any) -> None:
    """The runs of a lost tracking store, made again: an ended job's from its metrics.jsonl (every metric step and
    its end status, its task scores; params and tags from its config), a job still to run starts a new run when
    it does."""
    from rla_ablate.evals.core import log_results_again
    from rla_ablate.terminal import count
    from rla_ablate.tracking import create_or_get_child_run
    from rla_ablate.tracking.runs import restore_events
    from rla_ablate.tracking.sync import sync_from_jsonl
    from rla_ablate.train.loggers import read_jsonl

    made = uploaded = later = 0
    for job in jobs:
        st = sdir.status(job.job_id)
        jsonl = sdir.job_dir(job.job_id) / "metrics.jsonl"
        if st.status not in ENDED or not jsonl.is_file():
            sdir.set_status(job.job_id, mlflow_run_id=None)
            later += 1
            continue
        run_id = create_or_get_child_run(uri, sweep.name, job.job_id, tags=run_tags(job),
                                         config=job.job.model_dump(mode="json"))
        records = read_jsonl(jsonl)  # once: its metrics and its events
        uploaded += (sync_from_jsonl(uri, run_id, jsonl, records=records)
                     + log_results_again(sdir.job_dir(job.job_id), uri, run_id))
        restore_events(uri, run_id, records)
        sdir.set_status(job.job_id, mlflow_run_id=run_id, tracking_uri=uri)
        made += 1
    current = {job.job_id for job in sweep.jobs}
    older = [d.name for d in sdir.jobs_dir.iterdir() if d.name not in current and sdir.status(d.name).mlflow_run_id] \
        if sdir.jobs_dir.is_dir() else []
    progress.note(f"the sweep's tracking store ({sdir.mlflow_dir / 'mlflow.db'}) was gone: {count(made, 'run')} of "
                  f"ended jobs made again from their metrics.jsonl ({uploaded:,} metric values)"
                  + (f"; {count(later, 'job')} still to run will start new runs" if later else "")
                  + (f"; the runs of {count(len(older), 'job')} of earlier versions of the sweep file are not made "
                     "again (their metrics stay in their folders' metrics.jsonl)" if older else ""))


def _check_version(sweep: Sweep, sdir: SweepDir, opts: LaunchOptions) -> str | None:
    """A file launched under an existing sweep's name becomes the sweep's next version: its jobs are the ones
    `status`, `results` and the dashboard show and `resume` runs. Refuses (unless --new-version) a file that looks
    like another study that happens to share the name: launched from another path and sharing none of the sweep's
    jobs (a search: any other path with other contents, as its trials continue one Optuna study). Returns a note
    on the jobs of the previous version that the new one leaves out (their folders and runs stay), or None."""
    saved = sdir.path / "sweep.yaml"
    here = Path(sweep.source.file).resolve()
    if not saved.is_file() or saved.resolve() == here:
        return None
    if here.read_text(encoding="utf-8") == saved.read_text(encoding="utf-8"):
        return None
    before, now = {rec["job_id"] for rec in sdir.job_list()}, {j.job_id for j in sweep.jobs}
    earlier = sdir.meta().get("sweep_file")
    search = sweep.config.search is not None
    shared = not search and bool(before & now)
    if earlier and earlier != str(here) and not shared and not opts.new_version:
        what = "its Optuna study" if search else f"none of its {len(before)} job(s) is in {sweep.source.file}"
        raise UserError(f"sweep '{sweep.name}' under {sdir.root} was launched from {earlier}, and "
                        f"{'this file would continue ' + what if search else what}: it looks like another study "
                        f"with the same name. Give this one its own `name:`, or pass --new-version to make "
                        f"{sweep.source.file} the next version of '{sweep.name}' (the earlier jobs stay in its folder "
                        "and come back if that file is launched again)",
                        file=sweep.source.file, line=sweep.source.line(("name",)), key="name")
    if search:
        return None
    gone = before - now
    if not gone:
        return None
    finished = sum(sdir.status(job_id).status == Status.FINISHED for job_id in gone)
    return (f"{len(gone)} job(s) of the previous version ({finished} finished) are not in this file: their folders "
            f"and MLflow runs stay, launching that file again brings them back, and `rla-sweep dashboard "
            f"{shell_arg(sweep.name)} --root {shell_arg(sdir.root)} --include-stale` shows them"
            + _bookkeeping_only(sweep, sdir, gone))


def _bookkeeping_only(sweep: Sweep, sdir: SweepDir, gone: set[str]) -> str:
    """The words for new jobs that are jobs of the previous version but for bookkeeping keys (checkpoint and log
    intervals, graphs: `BOOKKEEPING_FIELDS`): a job's id hashes its whole config, so they train again from the
    start; "" when there are none."""
    from rla_ablate.train import JobConfig
    from rla_ablate.train.job import BOOKKEEPING_FIELDS

    earlier: dict[str, dict] = {}
    for job_id in gone:
        data = sdir.job_config(job_id)
        try:
            earlier[JobConfig.model_validate(data).identity_json()] = data or {}
        except ValueError:
            continue
    same, keys = 0, set()
    for job in sweep.jobs:
        old = earlier.get(job.job.identity_json())
        if old is None or sdir.status(job.job_id).status in TERMINAL:  # ran already under this file's id
            continue
        same += 1
        new = job.job.model_dump(mode="json")["train"]
        keys |= {f"train.{k}" for k in BOOKKEEPING_FIELDS if old.get("train", {}).get(k) != new.get(k)}
    if not same:
        return ""
    return (f". Of those, {same} differ from a job of this file only in {', '.join(sorted(keys))}, which a job's id "
            "includes: this file's jobs are new and train from the first step (Ctrl-C now, set "
            f"{'that key' if len(keys) == 1 else 'those keys'} back and launch again to use the finished runs "
            "instead)")


def _eval_request(sweep: Sweep):
    """The sweep's `evals:` section as a request, its task folders resolved against the sweep file's folder (for
    `resume`, which reads the copy under --root, the folder of the file it copies: its sweep.json says which)."""
    cfg = sweep.config.evals
    here = Path(sweep.source.file).resolve()
    meta = (read_json(here.parent / "sweep.json", {}) or {}) if here.name == "sweep.yaml" else {}
    original = meta.get("sweep_file")
    base = Path(original).parent if original and Path(original) != here else here.parent
    return cfg.model_copy(update={"include_path": [base / p for p in cfg.include_path]})


def check_evals(sweep: Sweep) -> None:
    """A sweep's `evals:` tasks and task folders resolve (`plan`, and a launch before it writes anything): a name
    lm-eval does not know is an error at its line in the sweep file, not after every job has trained, and a refused
    launch leaves the sweep's folder as it was."""
    if sweep.config.evals is None:
        return
    from rla_ablate.evals.core import resolve_tasks

    try:
        resolve_tasks(_eval_request(sweep))
    except UserError as e:
        key = ("evals", "include_path") if e.key == "--include-path" else ("evals", "tasks")
        raise UserError(e.message.replace("--include-path folders", "evals.include_path folders"),
                        file=sweep.source.file, line=sweep.source.line(key), key=".".join(key)) from None
    from rla_ablate.evals.core import check_names_apart

    for job in sweep.jobs:
        names = [e.name for e in job.job.eval]
        clash = check_names_apart(names, sweep.config.evals)
        if clash is not None:
            at = ("base", "eval", names.index(clash), "name")
            raise UserError(f"the eval set '{clash}' and the evals task '{clash}' would both log eval/{clash}/* into "
                            "each job's run, one over the other; give the eval set another name",
                            file=sweep.source.file, line=sweep.source.line(at), key=".".join(map(str, at)))


def stored_tracking_uri(sdir: SweepDir, meta: dict | None = None) -> str | None:
    """The tracking server a sweep's earlier launch logged to (`--tracking-uri`), or None: its own store under
    --root, or no launch yet. `meta`: its sweep.json, when the caller has read it."""
    meta = sdir.meta() if meta is None else meta
    return meta.get("tracking_uri") if meta.get("tracking_uri") and not meta.get("embedded_tracking", True) else None


def _store_key(uri: str | None) -> str:
    """A tracking URI as the store it names: without a trailing '/', and this machine's server under one name
    (http://localhost:5000 and http://127.0.0.1:5000/ are one store)."""
    from urllib.parse import urlsplit

    text = (uri or "").rstrip("/")
    parts = urlsplit(text)
    if parts.scheme in ("http", "https") and parts.hostname in ("localhost", "127.0.0.1", "::1"):
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://127.0.0.1{port}{parts.path}"
    return text


def check_store(sdir: SweepDir, tracking_uri: str | None) -> None:
    """A sweep's runs stay in the store its first launch logged them to: a relaunch that logs elsewhere would leave
    its finished jobs' runs behind, and `results` and dashboards (which read one store) would show those jobs as
    not started and compare the rest with fewer seeds. A damaged embedded store is said before anything starts."""
    if tracking_uri is None:
        sdir.check_store_intact()
    meta = sdir.meta()
    if not meta.get("tracking_uri"):
        return
    before = stored_tracking_uri(sdir, meta)
    if _store_key(before) == _store_key(tracking_uri):
        return
    where = before or f"its own store under --root ({sdir.path / 'mlflow'})"
    asked = tracking_uri or "its own store under --root (no --tracking-uri)"
    again = f"--tracking-uri {before}" if before else "no --tracking-uri"
    raise UserError(f"sweep '{sdir.name}' logs its runs to {where}; this launch asks for {asked}, which does not hold "
                    "its finished jobs' runs (results and dashboards would show them as not started). Launch with "
                    f"{again}, or give the sweep another `name:` for a new sweep in the new store",
                    key="--tracking-uri")


def score_evals(sweep: Sweep, sdir: SweepDir, tracking_uri: str | None, progress: Any) -> str | None:
    """The `evals:` stage after training: score every finished job not yet scored on the sweep's tasks, one after
    another in this process (rla_ablate.evals); None as tracking URI logs to the sweep's own store. Returns why the
    stage stopped (a task's data missing, a checkpoint that does not load), None when it ran: the launch then still
    closes its runs and fails, and the jobs scored so far keep their scores."""
    cfg = sweep.config.evals
    if cfg is None or not sdir.has_job_list():
        return None
    from rla_ablate.evals.core import score_sweep

    req = _eval_request(sweep)  # task folders in a sweep file are relative to it
    t0 = time.monotonic()
    try:
        results = score_sweep(sdir.root, sweep.name, req, tracking_uri=tracking_uri, silent=True)
    except UserError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - the trained jobs stand; the launch reports this and fails
        import traceback

        log = sdir.path / "evals-error.log"
        log.write_text(traceback.format_exc(), encoding="utf-8")
        return f"{exception_line(exc, 300)} (traceback: {log})"
    scored = sum(not r.skipped for r in results.values())
    progress.note(f"evals: {scored} job(s) scored on {', '.join(cfg.tasks)}, {len(results) - scored} already scored "
                  f"({time.monotonic() - t0:.1f} s)")
    return None


def default_window(sweep: Sweep, cluster: dict[str, float], placements: dict[str, Any] | None = None,
                   ahead: int = 2) -> int:
    """Tasks kept in flight without --max-concurrent: `ahead` times what the cluster runs at once. A fixed sweep's
    source asks for twice, so Ray always has the next job queued while runs are created just in time; a search
    keeps only what runs, so that each new trial is sampled knowing every finished one (`JobSource.ahead`)."""
    res = sweep.config.resources
    workers = max((j.job.train.num_workers for j in sweep.jobs), default=1)
    fit = cluster.get("CPU", 1.0) / (res.cpus * workers)
    shares = [p.gpus for p in (placements or {}).values() if p.gpus > 0]
    if shares:
        # packed by memory, jobs differ in their share: the mean share says how many run at once
        fit = min(fit, cluster.get("GPU", 0.0) / (sum(shares) / len(shares) * workers))
    return ahead * max(1, int(fit + 1e-9))


def _note_placements(progress: Any, placements: dict[str, Any] | None) -> None:
    if not placements:
        return
    shares = [p.gpus for p in placements.values()]
    if not any(shares):
        return
    est = [p.estimate_gib for p in placements.values()]
    packed = [g for g in shares if 0 < g < 1]
    per_gpu = f"{len(packed) / sum(packed):.1f} jobs per GPU on average" if packed else "whole GPUs"
    progress.note(f"GPU shares {min(shares):.2f}-{max(shares):.2f} ({per_gpu}); estimated peak memory "
                  f"{min(est):.1f}-{max(est):.1f} GiB per job")


def order_longest_first(sweep: Sweep, sdir: SweepDir, source: JobSource, placements: dict[str, Any] | None,
                        progress: Any) -> None:
    """On GPUs, a fixed sweep's jobs start longest first (`GridSource.order`): the tokens each has left over its
    estimated tokens/s alone on a GPU (`calibration.estimate_speed`, as `plan` shows it)."""
    order = getattr(source, "order", None)
    if order is None or not on_gpus(placements):
        return
    from rla_ablate.sweep.calibration import estimate_speed

    assumed = sweep.config.resources.assumed_tflops

    def seconds(job: ResolvedJob) -> float:
        left = max(job.tokens_target - sdir.status(job.job_id).tokens_done, 0)
        return left / estimate_speed(job.job, assumed).tokens_per_s

    order(seconds)
    progress.note("on the GPUs, jobs start longest first (tokens left over estimated tokens/s)")


def _term_as_interrupt() -> Any:
    """SIGTERM (a scheduler's or `kill`'s stop) stops the sweep like Ctrl-C: jobs checkpoint, services stop.

    Installed before ray.init and again after it, whose own handler would end the driver at once; returns the
    handler it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


def _close_parent(tracking_uri: str, parent: str, summary: LaunchSummary) -> None:
    _end_parent(tracking_uri, parent,
                "FINISHED" if summary.ok else ("KILLED" if summary.counts.get(Status.CANCELLED) else "FAILED"))


def _end_parent(tracking_uri: str, parent: str, status: str) -> None:
    """The sweep's parent run ended with MLflow's `status`; a tracking failure is left for the next launch."""
    from mlflow.tracking import MlflowClient

    try:
        # set_terminated prints "View run ... at <url>" to stdout; the summary names the store instead.
        with contextlib.redirect_stdout(io.StringIO()):
            MlflowClient(tracking_uri).set_terminated(parent, status=status)
    except Exception:
        pass


_T = TypeVar("_T")


class _TrackingDown(Exception):
    """The tracking server failed a request and did not answer again within TRACKING_WAIT_S."""


class _Runner:
    """Submits job attempts to Ray, collects outcomes, retries failures, relays stop requests."""

    def __init__(self, sweep: Sweep, sdir: SweepDir, services: _Services, opts: LaunchOptions, progress: Any,
                 on_event: Callable[[str, dict], None] | None):
        import ray

        from rla_ablate.sweep.worker import Monitor

        self.ray = ray
        self.sweep, self.sdir, self.services, self.opts = sweep, sdir, services, opts
        self.progress, self.on_event = progress, on_event or (lambda name, detail: None)
        self.monitor = Monitor.remote()
        self.summary = LaunchSummary(sweep=sweep.name)
        self.inflight: dict[Any, ResolvedJob] = {}
        # Attempts in this launch (status.json counts them over all launches); retries are per launch.
        self.tries: dict[str, int] = {}
        self.started_from: dict[str, int] = {}  # the checkpoint's tokens each attempt in flight went on from
        # Ray task options of each job's latest attempt: the out-of-memory retry decides from them.
        self.task_options: dict[str, dict[str, Any]] = {}
        # Options that replace the sweep's for a job's next attempts (a rerun with a larger share of a GPU, or a
        # whole one, after running out of memory); such a rerun fixes the resources, so it does not use up one of
        # `resources.retries` (`oom_reruns` counts them).
        self.more_memory: dict[str, dict[str, Any]] = {}
        self.oom_reruns: dict[str, int] = {}
        self.gpu_bytes: int | None = None
        self.stopping = False
        self.abandoned = False
        self.stop_reason = ""
        self._last_record = 0.0
        # Where the jobs come from (`run`); job_id -> name of every job it handed out, for the notes of workers.
        self.source: JobSource | None = None
        self.names: dict[str, str] = {}
        self.window = 1
        # job_id -> rla_ablate.sweep.packing.Placement (GPU share and allocator cap); None: from resources.gpus
        self.placements: dict[str, Any] | None = None

    @property
    def capacity(self) -> int:
        return self.window - len(self.inflight)

    def ensure_run(self, job: ResolvedJob) -> str:
        from rla_ablate.tracking import create_or_get_child_run

        st = self.sdir.status(job.job_id)
        if st.mlflow_run_id and self.starts_over(job, st):
            # An earlier attempt trained and left no checkpoint (the sweep folder came from another machine
            # without its checkpoints, or the attempt ended before its first one): this one starts from the first
            # step, and reusing the run would mix the two attempts' values step by step (a run keeps the first
            # value logged at a step). The old run is deleted (MLflow keeps it restorable) and a new one made.
            old = st.mlflow_run_id
            try:
                deleted = self.call_tracking(lambda: _delete_run(self.services.tracking_uri, old))
            except Exception as exc:
                raise UserError(f"cannot delete the MLflow run {old} of {job.name}, which restarts from its first "
                                f"step, at {self.services.tracking_uri}: {_first_line(str(exc))}") from None
            # What run_job would drop when it starts: the new run's logger must not backfill it first.
            from rla_ablate.train.loggers import truncate_jsonl

            truncate_jsonl(self.sdir.job_dir(job.job_id) / "metrics.jsonl", -1)
            self.sdir.set_status(job.job_id, mlflow_run_id=None, tokens_done=0)
            if deleted and job.job_id not in self.tries:  # a retry in this launch: its note said so already
                self.progress.note(f"{job.name}: no checkpoint of its earlier attempt, so it starts from its first "
                                   f"step in a new MLflow run (the earlier run {old[:12]} is deleted, restorable)")
        elif st.mlflow_run_id and st.tracking_uri == self.services.tracking_uri:
            return st.mlflow_run_id
        elif st.mlflow_run_id is None and not self.has_attempt(job):
            self.drop_orphaned_run(job)
        def create() -> str:
            return create_or_get_child_run(self.services.tracking_uri, self.sweep.name, job.job_id,
                                           tags=run_tags(job), config=job.job.model_dump(mode="json"))

        try:
            # The lookup by job_id finds the run again when the first try made it before the server went away.
            run_id = self.call_tracking(create)
        except _TrackingDown as exc:
            raise UserError(f"the MLflow server at {self.services.tracking_uri} does not answer; cannot create "
                            f"the run of {job.name}: {_first_line(str(exc))}") from None
        except Exception as exc:
            raise UserError(f"cannot create the MLflow run of {job.name} at {self.services.tracking_uri}: "
                            f"{_first_line(str(exc))}") from None
        self.sdir.set_status(job.job_id, mlflow_run_id=run_id, tracking_uri=self.services.tracking_uri)
        return run_id

    def logged(self, job: ResolvedJob) -> bool:
        """Whether the job's metrics.jsonl holds a metric of an earlier attempt."""
        from rla_ablate.train.loggers import read_jsonl

        return any(r.get("type") == "metrics" for r in read_jsonl(self.sdir.job_dir(job.job_id) / "metrics.jsonl"))

    def has_attempt(self, job: ResolvedJob) -> bool:
        """Whether the job's folder holds anything of an earlier attempt: a checkpoint or a logged metric."""
        from rla_ablate.train.checkpoint import list_checkpoints

        return bool(list_checkpoints(self.sdir.job_dir(job.job_id))) or self.logged(job)

    def drop_orphaned_run(self, job: ResolvedJob) -> None:
        """A job whose folder was deleted after an attempt logged to its run: that run is deleted (restorable) so
        the job trains in a new one, as a restart from the first step does (`ensure_run`)."""
        from rla_ablate.tracking.runs import logged_child_run

        uri = self.services.tracking_uri
        try:
            old = self.call_tracking(lambda: logged_child_run(uri, self.sweep.name, job.job_id))
            if old is not None and self.call_tracking(lambda: _delete_run(uri, old)):
                self.progress.note(f"{job.name}: its folder has nothing of the attempt that logged to MLflow run "
                                   f"{old[:12]} (deleted from the sweep folder?), so it starts from its first step in "
                                   "a new run (the earlier one is deleted, restorable)")
        except Exception as exc:
            raise UserError(f"cannot look up or delete the earlier MLflow run of {job.name} at {uri}: "
                            f"{_first_line(str(exc))}") from None

    def starts_over(self, job: ResolvedJob, st: Any) -> bool:
        """Whether the job's next attempt trains from its first step after an earlier attempt trained."""
        from rla_ablate.train.checkpoint import list_checkpoints

        if list_checkpoints(self.sdir.job_dir(job.job_id)):
            return False
        return st.tokens_done > 0 or self.logged(job)

    def end_run(self, job: ResolvedJob, status: Status, reason: str | None) -> None:
        """Backfill the job's run from its metrics.jsonl and close it if still SCHEDULED/RUNNING (a job cancelled
        before it started never opened it; a killed worker never closed it)."""
        from rla_ablate.tracking.runs import end_open_run
        from rla_ablate.tracking.sync import sync_from_jsonl

        metrics = self.sdir.job_dir(job.job_id) / "metrics.jsonl"

        def update(uri: str, run_id: str) -> None:
            if metrics.exists():
                sync_from_jsonl(uri, run_id, metrics)
            if status in ENDED:
                end_open_run(uri, run_id, str(status), reason)

        self._update_run(job, "update", update)

    def tag_run(self, job: ResolvedJob, tags: dict[str, str]) -> None:
        """Set tags on the job's MLflow run (a search's trial number, a pruned trial's cause)."""
        from mlflow.tracking import MlflowClient

        def update(uri: str, run_id: str) -> None:
            client = MlflowClient(uri)
            for key, value in tags.items():
                client.set_tag(run_id, key, value)

        self._update_run(job, "tag", update)

    def _update_run(self, job: ResolvedJob, verb: str, update: Callable[[str, str], None]) -> None:
        """update(tracking URI, run id) on the job's run in this launch's store (none: nothing to do), through
        `call_tracking`; a failure is a note: the sweep folder holds the truth, and a tracking hiccup must not stop
        the launch."""
        st = self.sdir.status(job.job_id)
        if not st.mlflow_run_id or st.tracking_uri != self.services.tracking_uri:
            return
        uri, run_id = self.services.tracking_uri, st.mlflow_run_id
        try:
            self.call_tracking(lambda: update(uri, run_id))
        except Exception as exc:
            self.progress.note(f"{job.name}: could not {verb} MLflow run {run_id}: {_first_line(str(exc))}")

    def call_tracking(self, call: Callable[[], _T]) -> _T:
        """`call()` (MLflow requests); when it fails, wait for the embedded server that may be restarting and call
        once more. Raises the second failure, or `_TrackingDown` (from the first) when no server comes back."""
        try:
            return call()
        except Exception as first:
            self.tracking_notes()
            if not self.services.wait_tracking():
                raise _TrackingDown(str(first)) from first
            return call()

    def tracking_notes(self) -> None:
        """Show the lines about the embedded tracking server since the last call (a restart)."""
        for line in self.services.tracking_notices():
            self.progress.note(line)

    def end_runs(self) -> None:
        """At the end of a launch, every job's run holds every metric of its metrics.jsonl, and an ended job's run
        has its final status, whatever died on the way (a worker, an earlier launch)."""
        for job in self.source.jobs if self.source else []:
            st = self.sdir.status(job.job_id)
            self.end_run(job, st.status, st.error)

    def submit(self, job: ResolvedJob) -> None:
        from rla_ablate.sweep.worker import remote_for

        res = self.sweep.config.resources
        self.on_event("queued", {"job_id": job.job_id})
        run_id = self.ensure_run(job)
        st = self.sdir.status(job.job_id)
        self.sdir.set_status(job.job_id, status=Status.PENDING, tokens_target=job.tokens_target,
                             attempts=st.attempts + 1, error=None, cause=None, traceback=None, notice=None)
        # Multi-worker jobs start their own Ray Train workers (one GPU each); the task itself only coordinates.
        multi = job.job.train.num_workers > 1
        placement = (self.placements or {}).get(job.job_id)
        gpus = placement.gpus if placement is not None else (0.0 if res.auto else float(res.gpus))
        options = {"num_cpus": 1 if multi else res.cpus, "num_gpus": 0 if multi else gpus,
                   "name": f"{self.sweep.name}:{job.name}", **self.more_memory.get(job.job_id, {})}
        self.task_options[job.job_id] = options
        cap = self._allocator_cap(placement, options) if not multi else None
        ref = remote_for(options["num_gpus"]).options(**options).remote(job.job, str(self.sdir.job_dir(job.job_id)),
                                                   job.job_id, self.services.tracking_uri, run_id, self.monitor,
                                                   res.cpus, self.source.watch if self.source else None, cap)
        self.inflight[ref] = job
        self.tries[job.job_id] = self.tries.get(job.job_id, 0) + 1
        # where it starts again (its checkpoint), not where a killed attempt last reported: the display and, until
        # its first report, its status
        kept = starts_from(self.sdir, job.job_id, st)
        self.started_from[job.job_id] = kept
        if kept != st.tokens_done:
            self.sdir.set_status(job.job_id, tokens_done=kept)
        self.progress.update(job, Status.PENDING, kept)
        self.on_event("submitted", {"job_id": job.job_id, "attempt": st.attempts + 1})

    def run(self, source: JobSource) -> None:
        """Run the source's jobs to the end: while there is room, a failed attempt's rerun first, then the source's
        next jobs; the source hears its metric's intermediate values and how each job ended."""
        self.source = source
        source.start(self)
        self.names = {j.job_id: j.name for j in source.jobs}
        reruns: deque[ResolvedJob] = deque()
        if self.sdir.take_cancel_request():  # asked for while Ray and MLflow were starting: no job starts
            self.stop("cancelled by `rla-sweep cancel`")
        while True:
            try:
                while reruns and self.capacity > 0 and not self.stopping:
                    self.submit(reruns.popleft())
                if not self.stopping and self.capacity > 0:
                    for job in source.next_jobs(self.capacity):
                        self.names[job.job_id] = job.name
                        self.submit(job)
                if self.stopping:
                    for job in [*reruns, *source.drain()]:
                        error = f"{self.stop_reason} before it started"
                        st = self.sdir.set_status(job.job_id, status=Status.CANCELLED, error=error)
                        self.progress.update(job, Status.CANCELLED)
                        source.done(job, JobOutcome(Status.CANCELLED, tokens_done=st.tokens_done, error=error))
                    reruns.clear()
                if not self.inflight:
                    break
                for job, _outcome, retry in self.step():
                    if retry:
                        reruns.appendleft(job)
            except KeyboardInterrupt:
                self.interrupted()
        source.finish()

    def step(self, timeout: float = 0.5) -> list[tuple[ResolvedJob, JobOutcome, bool]]:
        """Wait a little for outcomes, refresh progress, check for a cancel request; returns the attempts that ended:
        (job, outcome, whether the job runs again)."""
        done: list[tuple[ResolvedJob, JobOutcome, bool]] = []
        try:
            if self.inflight:
                # Return at the first completion (not after `timeout`), then take every other one already done.
                ready, rest = self.ray.wait(list(self.inflight), num_returns=1, timeout=timeout)
                if ready and rest:
                    more, _ = self.ray.wait(rest, num_returns=len(rest), timeout=0)
                    ready += more
            else:
                ready = []
                time.sleep(min(timeout, 0.1))
            # Reported values first: a job reports its last values before its task returns, so the pruner sees
            # every intermediate value before it hears the outcome. Then the ended attempts, then the running
            # jobs' progress: a job that took an ended one's place is listed after it.
            ending = [(ref, self.inflight.pop(ref)) for ref in ready]
            snapshot = self._observe([job for _, job in ending])
            for ref, job in ending:
                done.append((job, *self._collect(job, ref)))
            self._poll(snapshot)
            if not self.stopping and self.sdir.take_cancel_request():
                self.stop("cancelled by `rla-sweep cancel`")
            if not self.stopping and self.progress.closed:
                self.stop("the launch's output was closed")
        except KeyboardInterrupt:
            self.interrupted()
        return done

    def interrupted(self) -> None:
        """First Ctrl-C / SIGTERM: stop gracefully; the second one abandons the jobs (they resume next launch)."""
        if self.stopping:
            self.abandon()
            raise KeyboardInterrupt
        self.stop("interrupted")

    def abandon(self) -> None:
        """The running jobs are given up (a second Ctrl-C): their workers are killed, their MLflow runs closed now,
        as cancelled, with what their metrics.jsonl holds (else they would read RUNNING until the next launch), and
        the launch says how to resume them; their folders keep them pending. A third Ctrl-C cuts this short."""
        from rla_ablate.terminal import count

        jobs = [] if self.abandoned else list(self.inflight.values())
        self.abandoned = True  # once: the interrupt passes through the loop's handler too on its way out
        if not jobs:
            return
        reason = "abandoned by a second Ctrl-C; the next launch or `resume` continues it from its last checkpoint"
        # Their workers are ended first: one still logging while its metrics.jsonl is copied into the run could
        # send a step the copy sends too, and MLflow would keep both. Killed now, a job resumes from its last
        # checkpoint, as an abandoned job does anyway.
        refs = list(self.inflight)
        for ref in refs:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # an attempt that ended meanwhile
                pass
        try:
            self.ray.wait(refs, num_returns=len(refs), timeout=ABANDON_WAIT_S)
        except Exception:
            pass
        for job in jobs:
            self.end_run(job, Status.CANCELLED, reason)
        parent = self.sdir.meta().get("parent_run_id")
        if parent:  # the sweep's run too (the next launch opens it again)
            _end_parent(self.services.tracking_uri, parent, "KILLED")
        self.progress.note(f"abandoned {count(len(jobs), 'running job')} (their MLflow runs closed as cancelled); "
                           f"`rla-sweep resume {shell_arg(self.sweep.name)} --root {shell_arg(self.sdir.root)}` "
                           "continues them from their last checkpoints")

    def stop(self, why: str) -> None:
        self.stopping = True
        self.stop_reason = why
        again = "again " if why == "interrupted" else ""  # a cancel or SIGTERM came without a Ctrl-C here
        self.progress.note(f"stopping: {why}; jobs save a checkpoint and stop (Ctrl-C {again}to abandon them)")
        self.monitor.request_stop.remote(None)
        self._stop_deadline = time.monotonic() + STOP_GRACE_S
        # Tasks still waiting in Ray's queue never start; running ones checkpoint and return.
        started = self.ray.get(self.monitor.started_jobs.remote())
        for ref, job in self.inflight.items():
            if job.job_id not in started:
                self.ray.cancel(ref)

    def _observe(self, ending: list[ResolvedJob]) -> tuple:
        """The monitor's snapshot (tokens, started, values, notes), its notes shown and every job's reported values
        passed to the source, the attempts that just ended (`ending`) included."""
        self.tracking_notes()
        snapshot = self.ray.get(self.monitor.snapshot.remote())
        _, _, values, notes = snapshot
        for job_id, text, keep in notes:
            self.progress.note(f"{self.names.get(job_id, job_id[:8])}: {text}")
            if keep:
                self.sdir.set_status(job_id, notice=text)
        ended = {job.job_id for job in ending}
        for job in [*self.inflight.values(), *ending]:
            if values.get(job.job_id) and self.source is not None:
                why = self.source.observe(job, values[job.job_id], ended=job.job_id in ended)
                if why:
                    self.progress.note(f"{job.name}: {why}")
                    self.monitor.request_stop.remote(job.job_id)
        return snapshot

    def _poll(self, snapshot: tuple) -> None:
        """The running jobs' tokens into their status and the progress display (`_observe`'s snapshot)."""
        tokens, started = snapshot[0], snapshot[1]
        for job in self.inflight.values():
            if job.job_id in started:
                st = self.sdir.status(job.job_id)
                # Until its first report the job is where its last attempt left it (a resume's checkpoint).
                n = tokens.get(job.job_id, st.tokens_done)
                if st.status != Status.RUNNING or abs(st.tokens_done - n) > 0:
                    self.sdir.set_status(job.job_id, status=Status.RUNNING, tokens_done=n)
                self.progress.update(job, Status.RUNNING, n)
        self.progress.refresh()
        now = time.monotonic()
        if now - self._last_record > 5.0:
            self._last_record = now
            self.sdir.record_children()
        if self.stopping and self.inflight and now > getattr(self, "_stop_deadline", now + 1):
            for ref, job in list(self.inflight.items()):
                self.ray.cancel(ref, force=True)
                self.inflight.pop(ref)
                self.sdir.set_status(job.job_id, status=Status.CANCELLED, error=f"{self.stop_reason}; did not stop "
                                     f"within {STOP_GRACE_S:.0f} s, killed (resumes from its last checkpoint)")
                self.end_run(job, Status.CANCELLED, self.stop_reason)
                self.progress.update(job, Status.CANCELLED)

    def _collect(self, job: ResolvedJob, ref: Any) -> tuple[JobOutcome, bool]:
        """The attempt's outcome, recorded; True when the job runs again (a retry)."""
        tokens_before = self.sdir.status(job.job_id).tokens_done
        ran = True  # an attempt, unless Ray cancelled it in its queue
        try:
            outcome = self.ray.get(ref)
        except self.ray.exceptions.TaskCancelledError:
            ran = False
            outcome = JobOutcome(Status.CANCELLED, tokens_done=tokens_before,
                                 error=f"{self.stop_reason or 'stopped'} before it started")
        except Exception as exc:
            # The worker process died (OOM killer, segfault, node lost): nothing came back from it.
            outcome = JobOutcome.from_exception(exc, tokens_done=tokens_before, cause=Cause.WORKER_DIED)
            outcome.error = f"worker died: {outcome.error}"
        if not isinstance(outcome, JobOutcome):
            outcome = JobOutcome(Status.FAILED, tokens_done=tokens_before, cause=Cause.OTHER,
                                 error=f"the worker returned {type(outcome).__name__}, not a JobOutcome")
        if outcome.status not in ENDED:
            outcome.status = Status.FAILED
        if outcome.status == Status.FAILED and outcome.cause is None:
            outcome.cause = Cause.OTHER
        if self.stopping:
            outcome = stopped_outcome(outcome, self.stop_reason or "stopped")
        st = self.sdir.status(job.job_id)
        tokens = outcome.tokens_done
        self.summary.ran += ran
        self.summary.resumed += ran and self.started_from.pop(job.job_id, 0) > 0
        self.monitor.clear.remote(job.job_id)
        log = None
        if outcome.status == Status.FAILED:
            log = self.sdir.log_failure(job.job_id, st.attempts, outcome)
        retry = self._retry(job, outcome) if outcome.status == Status.FAILED and not self.stopping else None
        if retry is not None:
            self.sdir.set_status(job.job_id, status=Status.PENDING, tokens_done=tokens, error=outcome.error,
                                 cause=outcome.cause, traceback=outcome.traceback)
            restart = self._restart_point(job)
            if restart:
                where = f"from its last checkpoint ({restart:,} tokens)"
            elif (now := self.sdir.status(job.job_id)).mlflow_run_id and self.starts_over(job, now):
                # ensure_run replaces the run when the attempt starts; said here once, not again there
                where = ("from its first step in a new MLflow run (it left no checkpoint; the earlier run "
                         f"{now.mlflow_run_id[:12]} is deleted, restorable)")
            else:
                where = "from its first step (it left no checkpoint)"
            self.progress.note(f"{job.name}: attempt {self.tries[job.job_id]} failed ({outcome.cause}: "
                               f"{_first_line(outcome.error)}); {retry} {where}; log: {log}")
            self.progress.update(job, Status.PENDING, restart)
            self.on_event("retry", {"job_id": job.job_id, "attempt": st.attempts, "error": outcome.error,
                                    "cause": str(outcome.cause)})
            return outcome, True
        if outcome.status == Status.FAILED and outcome.cause == Cause.OOM:
            outcome.error = self._oom_report(job, outcome)
        if outcome.status == Status.CANCELLED and not outcome.error:
            outcome.error = self.stop_reason or "stopped"
        self.sdir.set_status(job.job_id, status=outcome.status, tokens_done=tokens, error=outcome.error,
                             cause=outcome.cause, traceback=outcome.traceback)
        self.progress.update(job, outcome.status, tokens)
        self.end_run(job, outcome.status, outcome.error)
        if outcome.status == Status.FAILED:
            self.summary.failed.append(FailedJob(job.name, job.job_id, _first_line(outcome.error), outcome.cause, log))
        self.on_event("done", {"job_id": job.job_id, "status": str(outcome.status), "timing": outcome.timing})
        if self.source is not None:
            self.source.done(job, outcome)
        return outcome, False

    def _retry(self, job: ResolvedJob, outcome: JobOutcome) -> str | None:
        """Whether a failed attempt reruns, by its cause: None when not, else how (for the note, which adds where
        from: `_restart_point`)."""
        cause = outcome.cause or Cause.OTHER
        if cause.deterministic:
            # A config or compile error fails the same way on every attempt.
            return None
        if cause == Cause.OOM:
            options = self._retry_with_more_memory(job, outcome)
            if options is None:
                return None
            self.more_memory[job.job_id] = options
            self.oom_reruns[job.job_id] = self.oom_reruns.get(job.job_id, 0) + 1
            given = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in options.items())
            return f"rerunning with more memory ({given})"
        used = self.tries.get(job.job_id, 1) - self.oom_reruns.get(job.job_id, 0)
        if used <= self.sweep.config.resources.retries:
            return "retrying"
        return None

    def _restart_point(self, job: ResolvedJob) -> int:
        """The tokens of the checkpoint the job's next attempt resumes from, 0 when it starts from its first step."""
        from rla_ablate.train.checkpoint import list_checkpoints

        found = list_checkpoints(self.sdir.job_dir(job.job_id))
        return found[-1][0] if found else 0

    def _retry_with_more_memory(self, job: ResolvedJob, outcome: JobOutcome) -> dict[str, Any] | None:
        """Ray task options that give a job out of GPU memory more of it, or None when this launch cannot.

        A job that shared a GPU (a fraction below 1) reruns with twice its share, still packed with others, while
        that is at most half a GPU, else alone on a whole GPU: an estimate a little under the peak costs one rerun
        beside the others, not a wait for an empty GPU. One that already had a whole GPU, or ran on CPU, cannot get
        more here and is reported instead (`_oom_report`)."""
        gpus = float(self.task_options.get(job.job_id, {}).get("num_gpus") or 0.0)
        if 0.0 < gpus < 1.0:
            twice = math.ceil(2 * gpus * 100 - 1e-9) / 100
            return {"num_gpus": twice if twice <= 0.5 and self.gpu_bytes is not None else 1.0}
        return None

    def _allocator_cap(self, placement: Any, options: dict[str, Any]) -> float | None:
        """The fraction of the device a placed job's allocator is capped at: that of the share it asks Ray for
        (`calibration.allocator_cap`, as `packing.place` computes it), so a rerun with a larger share gets the
        larger cap; None on a whole GPU (the device is the cap) or where the GPU's size is unknown."""
        gpus = float(options.get("num_gpus") or 0.0)
        if placement is None or self.gpu_bytes is None or not 0.0 < gpus < 1.0:
            return None
        from rla_ablate.sweep.calibration import allocator_cap

        return allocator_cap(gpus, self.gpu_bytes)

    def _oom_report(self, job: ResolvedJob, outcome: JobOutcome) -> str:
        """"out of memory: estimated X GiB, had Y GiB" plus the exception's line."""
        rec = next((r for r in self.sdir.job_list() if r.get("job_id") == job.job_id), {})
        estimate = rec.get("mem_estimate_gib")
        if estimate is None:
            est = "estimate unknown"
        else:
            gib = float(estimate)
            est = f"estimated {gib:.1f} GiB" if gib >= 1 else f"estimated {gib:.2g} GiB"
        had = f"{outcome.gpu_memory_gib:.1f} GiB" if outcome.gpu_memory_gib is not None else "unknown"
        return f"out of memory: {est}, had {had} ({_first_line(outcome.error)})"


def stopped_outcome(outcome: JobOutcome, reason: str) -> JobOutcome:
    """An attempt a stopping launch interrupted while it started: Ray's cancel raises KeyboardInterrupt in the task,
    and an import in progress can turn it into its own error (pydantic's SchemaError was seen). Such an attempt
    was cancelled, not failed: it resumes with the sweep and is not reported as a failure."""
    text = f"{outcome.error or ''}\n{outcome.traceback or ''}"
    if outcome.status == Status.FAILED and "KeyboardInterrupt" in text:
        return JobOutcome(Status.CANCELLED, tokens_done=outcome.tokens_done, metrics=outcome.metrics,
                          error=f"{reason} while it started")
    return outcome


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if text else ""
