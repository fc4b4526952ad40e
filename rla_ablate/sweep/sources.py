"""Where a launch's jobs come from: the `JobSource` protocol that the launch's runner loop drives.

The runner (`rla_ablate.sweep.launch`) owns Ray, MLflow, retries and stops; a source owns which jobs run and when.
The loop asks the source for jobs while there is room, relays the intermediate values of the metric the source
watches, and tells it how each job ended. Two sources exist: `GridSource` hands out the expanded, unfinished jobs
of a fixed sweep (grid, zip, ablations, controls, seeds); `rla_ablate.sweep.search.OptunaSource` asks an Optuna
study for one trial at a time. `rla_ablate.sweep.launch.source_for(sweep, sdir)` is the one place that picks a
sweep's source: a new source is a class implementing `JobSource` and its line there; the runner loop stays as it is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from rla_ablate.outcome import TERMINAL, JobOutcome, Status
from rla_ablate.sweep.expand import ResolvedJob, Sweep
from rla_ablate.sweep.status import starts_from
from rla_ablate.sweep.state import SweepDir

if TYPE_CHECKING:
    from rla_ablate.sweep.summary import LaunchSummary


class JobSource(Protocol):
    """The jobs of one launch, handed to the runner as it has room for them."""

    watch: str | None
    """The metric whose intermediate values (step = tokens seen) the workers report to `observe`; None: none."""
    ahead: int
    """Tasks kept in flight per job that runs at once, without --max-concurrent: 2 keeps the next job queued in Ray,
    1 runs only what fits (a search then samples each trial knowing every finished one)."""
    jobs: list[ResolvedJob]
    """The jobs of this launch so far, in order: what the summary counts and the end of the launch syncs to MLflow."""

    def data_jobs(self) -> list[ResolvedJob]:
        """Jobs whose data and eval sets this launch may read (the launch dry-runs each distinct one first)."""

    def check(self) -> None:
        """Before the launch writes anything in the sweep folder: raise a UserError for what it cannot continue
        (a refused launch leaves the folder, its saved file included, as it was)."""

    def prepare(self) -> None:
        """Before anything starts: record in the sweep folder the jobs known up front."""

    def nothing_to_do(self, summary: LaunchSummary) -> bool:
        """True when no job is left to run; the summary then counts the sweep's jobs. Fills `summary.skipped`."""

    def start(self, runner: Any) -> None:
        """Before the first job: `runner` (the launch's `_Runner`) for its progress display and summary."""

    def next_jobs(self, capacity: int) -> Iterator[ResolvedJob]:
        """Up to `capacity` jobs to submit now; each is submitted before the next is made. None: nothing now."""

    def observe(self, job: ResolvedJob, values: list[tuple[int, float]], ended: bool = False) -> str | None:
        """New (step, value) pairs of `watch` from a job (`ended`: its attempt has returned); returns why a running
        job should stop, or None."""

    def done(self, job: ResolvedJob, outcome: JobOutcome) -> None:
        """A job ended (its last attempt of this launch; retries are the runner's)."""

    def drain(self) -> list[ResolvedJob]:
        """The launch is stopping: the jobs that would still have been handed out (they are cancelled unstarted)."""

    def finish(self) -> None:
        """After the last job: a closing note."""


def count_statuses(sdir: SweepDir, job_ids: Iterable[str]) -> dict[str, int]:
    """How many of the jobs are in each status (a job listed twice counts twice)."""
    counts: dict[str, int] = {}
    for job_id in job_ids:
        s = sdir.status(job_id).status
        counts[s] = counts.get(s, 0) + 1
    return counts


def job_record(job: ResolvedJob) -> dict[str, Any]:
    """A job's entry in jobs.json: its description, token budget and estimated peak memory."""
    from rla_ablate.sweep.calibration import estimate_memory

    rec = job.describe()
    rec["tokens_target"] = job.tokens_target
    rec["mem_estimate_gib"] = round(estimate_memory(job.job).gib, 2)
    return rec


class GridSource:
    """A fixed sweep: every expanded job not yet finished or diverged, in expansion order (on GPUs, longest first:
    `order`)."""

    watch: str | None = None
    ahead = 2

    def __init__(self, sweep: Sweep, sdir: SweepDir):
        self.sweep, self.sdir = sweep, sdir
        self.jobs: list[ResolvedJob] = list(sweep.jobs)
        self.queue: deque[ResolvedJob] = deque()

    def unfinished(self) -> list[ResolvedJob]:
        return [j for j in self.jobs if self.sdir.status(j.job_id).status not in TERMINAL]

    def data_jobs(self) -> list[ResolvedJob]:
        """The unfinished jobs: what a relaunch skips is not read again."""
        return self.unfinished()

    def check(self) -> None:
        """Nothing beyond the launch's own version check (`launch._check_version`)."""

    def prepare(self) -> None:
        self.sdir.write_job_list([job_record(j) for j in self.jobs])
        for job in self.jobs:
            self.sdir.job_dir(job.job_id).mkdir(parents=True, exist_ok=True)
            if not (self.sdir.job_dir(job.job_id) / "job.json").exists():
                (self.sdir.job_dir(job.job_id) / "job.json").write_text(job.job.model_dump_json(indent=1))

    def nothing_to_do(self, summary: LaunchSummary) -> bool:
        self.queue = deque(self.unfinished())
        summary.skipped = len(self.jobs) - len(self.queue)
        if self.queue:
            return False
        summary.counts = count_statuses(self.sdir, (j.job_id for j in self.jobs))
        return True

    def start(self, runner: Any) -> None:
        for job in self.jobs:
            st = self.sdir.status(job.job_id)
            done = st.tokens_done if st.status in TERMINAL else starts_from(self.sdir, job.job_id, st)
            runner.progress.update(job, st.status if st.status in TERMINAL else Status.PENDING, done,
                                   job.tokens_target)

    def order(self, seconds: Callable[[ResolvedJob], float]) -> None:
        """Start the longest jobs first (`seconds`: a job's estimated time to run): packed jobs of unequal length
        then end together instead of leaving the longest alone at the end, and the widest shapes, which the
        shipped autotune seeds are least likely to cover, compile while the others train. Equal estimates keep
        the expansion order."""
        self.queue = deque(sorted(self.queue, key=lambda job: -seconds(job)))

    def next_jobs(self, capacity: int) -> Iterator[ResolvedJob]:
        while self.queue and capacity > 0:
            capacity -= 1
            yield self.queue.popleft()

    def observe(self, job: ResolvedJob, values: list[tuple[int, float]], ended: bool = False) -> str | None:
        return None

    def done(self, job: ResolvedJob, outcome: JobOutcome) -> None:
        pass

    def drain(self) -> list[ResolvedJob]:
        left = list(self.queue)
        self.queue.clear()
        return left

    def finish(self) -> None:
        pass
