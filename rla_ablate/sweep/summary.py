"""What a launch reports when it ends: its counts by status and the jobs it left failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rla_ablate.outcome import Cause, Status


@dataclass
class FailedJob:
    """A job this launch left failed, as the summary names it."""

    name: str
    job_id: str
    error: str
    """The cause line: "Type: message" (or the out-of-memory report)."""
    cause: Cause | None = None
    log: Path | None = None
    """The job's error.log (every failed attempt's traceback), when one was written."""


@dataclass
class LaunchSummary:
    sweep: str
    counts: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    ran: int = 0
    resumed: int = 0
    """Attempts that went on from a checkpoint (a resume, or a retry after its first checkpoint)."""
    failed: list[FailedJob] = field(default_factory=list)
    pruned: int = 0
    """Search trials stopped by the pruner (status cancelled): a result, not a failure."""
    invalid: int = 0
    """Search trials whose parameters built no valid job: failed in the study, with no job to count."""
    interrupted: bool = False
    """Stopped by Ctrl-C, SIGTERM, `rla-sweep cancel` or a closed output."""
    output_closed: bool = False
    """The launch's output pipe was closed by its reader (`| head`, quitting `| less`): it stopped (exit 141)."""
    evals_error: str | None = None
    """Why the `evals:` stage stopped (a task whose data is missing): the training results stand, the launch fails."""
    evals_pending: bool = False
    """The sweep has an `evals:` stage, which a stopped launch does not run (a resume does)."""
    study_counts: dict[str, int] | None = None
    """A search: the counts by status of every job of its study, earlier launches' included (`counts` are this
    launch's trials)."""

    @property
    def ok(self) -> bool:
        # A diverged job is a result (it never reruns), like a finished one. An interrupted launch is not done even
        # when every job it counts is: a search's trials not yet asked for are in no count.
        unfinished = sum(n for k, n in self.counts.items() if k not in (Status.FINISHED, Status.DIVERGED))
        return unfinished == self.pruned and not self.interrupted and self.evals_error is None

    @property
    def resume_helps(self) -> bool:
        """False when every unfinished job failed deterministically (config, compile): a resume fails them again."""
        if self.ok:
            return False
        unfinished = sum(n for k, n in self.counts.items() if k not in (Status.FINISHED, Status.DIVERGED)) - self.pruned
        if not unfinished and (self.evals_error is not None or self.study_counts is None):
            # every job trained: the tasks need fixing, not the jobs resuming; or an interrupt came after the
            # last job of a grid ended (a search's study may still have trials to ask for)
            return False
        deterministic = [f for f in self.failed if f.cause is not None and f.cause.deterministic]
        return not (self.failed and len(deterministic) == len(self.failed) == unfinished)
