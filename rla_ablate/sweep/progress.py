"""Live view of a launch: a rich table of jobs (status, tokens, tok/s, ETA) on a terminal; otherwise one line per
change plus, every PROGRESS_EVERY_S, one progress line with each running job's rate and ETA and the sweep's."""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from rich.markup import escape

from rla_ablate.fileio import shell_arg
from rla_ablate.outcome import ACTIVE, TERMINAL, Status
from rla_ablate.terminal import count

if TYPE_CHECKING:
    from rich.live import Live

STYLE = {Status.PENDING: "dim", Status.RUNNING: "cyan", Status.FINISHED: "green", Status.FAILED: "red",
         Status.DIVERGED: "magenta", Status.CANCELLED: "yellow"}
# Beyond this many jobs the live table shows the running and recently changed ones, plus counts.
MAX_ROWS = 24
# Seconds between progress lines when stdout is not a terminal (a log file gets a rate and ETA this often).
PROGRESS_EVERY_S = 30.0
# Time constant of the tokens/s smoothing: the last half minute or so weighs most.
RATE_TAU_S = 30.0
# Running jobs named in one progress line; the others are counted, so that the line stays one line.
LINE_JOBS = 8
# The order of counts in a progress line.
COUNT_ORDER = (Status.RUNNING, Status.FINISHED, Status.PENDING, Status.FAILED, Status.DIVERGED, Status.CANCELLED)


def fmt_tokens(n: int | None) -> str:
    if not n:
        return "0"
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)


def fmt_rate(rate: float | None) -> str:
    """Tokens per second as fmt_tokens writes counts ("140k"); "-" while unknown."""
    return "-" if rate is None else fmt_tokens(int(round(rate)))


def fmt_duration(seconds: float | None) -> str:
    """36s, 4m10s, 2h05m, 3d04h; "-" when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


class RateMeter:
    """Tokens/s of one job attempt from its token reports over time.

    An exponential moving average (time constant `tau_s`) of the rate between successive increases, so that
    evaluation pauses count but one slow interval does not swing the estimate. The interval up to the first
    increase is not measured: it holds the attempt's start (a resume's jump to its checkpoint, the model build,
    the first compile), not training. Tokens going back (a retry resumed from an earlier checkpoint) restart it.
    """

    def __init__(self, tau_s: float = RATE_TAU_S):
        self.tau_s = tau_s
        self.rate: float | None = None
        self._last: tuple[float, int] | None = None
        self._measuring = False

    def add(self, now: float, tokens: int) -> None:
        if self._last is None or tokens < self._last[1]:
            self._last, self.rate, self._measuring = (now, tokens), None, False
            return
        t0, n0 = self._last
        if tokens == n0:
            return
        self._last = (now, tokens)
        if not self._measuring:
            self._measuring = True
            return
        dt = now - t0
        if dt <= 0:
            return
        rate = (tokens - n0) / dt
        alpha = 1.0 - math.exp(-dt / self.tau_s)
        self.rate = rate if self.rate is None else self.rate + alpha * (rate - self.rate)


class Progress:
    def __init__(self, sweep: str, console: Any = None, interactive: bool | None = None,
                 clock: Callable[[], float] = time.monotonic):
        from rla_ablate.terminal import PipeConsole

        self.sweep = sweep
        # Lines are never wrapped: logs stay greppable when stdout is a file. A reader that goes away (quitting
        # `| less`) makes it quiet and `closed`: the launch then stops its jobs gracefully (sweep.launch).
        self.closed = False
        self.console = console or PipeConsole(soft_wrap=True, on_closed=self._on_closed)
        self.interactive = (self.console.is_terminal if interactive is None else interactive)
        self.clock = clock
        self.rows: dict[str, dict[str, Any]] = {}
        self.started = clock()
        self._live: Live | None = None
        self._last_draw = 0.0
        self._last_refresh = self.started
        self._running_s = 0.0
        # tokens trained by the jobs this launch ran to the end, since the first of them started: the sweep's rate
        # where no running job has one yet (jobs that end within a report or two)
        self._finished_tokens = 0
        self._first_start: float | None = None

    def _on_closed(self) -> None:
        self.closed = True

    def _ensure_live(self) -> None:
        if self.interactive and self._live is None:
            from rich.live import Live

            self._live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()

    def update(self, job: Any, status: str, tokens: int | None = None, target: int | None = None) -> None:
        now = self.clock()
        row = self.rows.setdefault(job.job_id, {"name": job.name, "status": None, "tokens": 0,
                                                "target": job.tokens_target, "changed": 0.0, "meter": None})
        if target is not None:
            row["target"] = target
        changed = row["status"] != status
        row["status"] = status
        if tokens is not None:
            row["tokens"] = tokens
        if changed:
            if status == Status.RUNNING:
                row["ran_from"] = row["tokens"]
                self._first_start = now if self._first_start is None else self._first_start
            elif status == Status.FINISHED and "ran_from" in row:
                self._finished_tokens += max(0, row["tokens"] - row.pop("ran_from"))
            row["changed"] = now
            # Each attempt's rate is its own: a new meter when the job starts running, none while it does not.
            row["meter"] = RateMeter() if status == Status.RUNNING else None
            # Plain output: every change but the initial listing (queued jobs, and those an earlier launch ended).
            first = not row.get("seen")
            if not self.interactive and not (first and (status == Status.PENDING or status in TERMINAL)):
                self.console.print(f"[{self._elapsed()}] {escape(job.name)} ({job.job_id[:8]}): {status} "
                                   f"{fmt_tokens(row['tokens'])}/{fmt_tokens(row['target'])} tokens")
            row["seen"] = True
        if row["meter"] is not None and tokens is not None:
            row["meter"].add(now, tokens)
        self._ensure_live()

    def note(self, text: str) -> None:
        self.console.print(f"[{self._elapsed()}] {escape(text)}")

    def _elapsed(self) -> str:
        s = int(self.clock() - self.started)
        return f"{s // 60:02d}:{s % 60:02d}"

    def _counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rows.values():
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        return counts

    # rates and ETAs
    @staticmethod
    def _rate(row: dict[str, Any]) -> float | None:
        meter = row.get("meter")
        return meter.rate if meter is not None and row["status"] == Status.RUNNING else None

    def _job_eta(self, row: dict[str, Any]) -> float | None:
        rate = self._rate(row)
        return max(0, row["target"] - row["tokens"]) / rate if rate else None

    def sweep_rate(self) -> float | None:
        """Tokens/s of every running job together; where none has a rate yet, the tokens of the jobs this launch
        finished over the time since the first of them started; None before either."""
        rates = [r for r in (self._rate(row) for row in self.rows.values()) if r is not None]
        if rates:
            return sum(rates)
        span = self.clock() - self._first_start if self._first_start is not None else 0.0
        return self._finished_tokens / span if self._finished_tokens and span > 0 else None

    def sweep_eta(self) -> float | None:
        """An estimate: the tokens every pending and running job still has to train over the current aggregate
        rate (it assumes the jobs still queued will train as fast as the ones running now)."""
        rate = self.sweep_rate()
        if not rate:
            return None
        remaining = sum(max(0, r["target"] - r["tokens"]) for r in self.rows.values() if r["status"] in ACTIVE)
        return remaining / rate

    def progress_line(self) -> str:
        """"[02:10] 3 running, 2 finished, 1 pending: 412k tok/s, sweep ETA ~4m10s; NAME (ID) 1.2M/6.29M 140k tok/s
        ETA 36s; ..." (ETAs are estimates; "-" while a rate is unknown)."""
        counts = self._counts()
        text = ", ".join(f"{counts[s]} {s}" for s in COUNT_ORDER if counts.get(s))
        eta = self.sweep_eta()
        parts = [f"[{self._elapsed()}] {text}: {fmt_rate(self.sweep_rate())} tok/s, "
                 f"sweep ETA {'~' + fmt_duration(eta) if eta is not None else '-'}"]
        running = [(job_id, r) for job_id, r in self.rows.items() if r["status"] == Status.RUNNING]
        for job_id, r in running[:LINE_JOBS]:
            parts.append(f"{r['name']} ({job_id[:8]}) {fmt_tokens(r['tokens'])}/{fmt_tokens(r['target'])} "
                         f"{fmt_rate(self._rate(r))} tok/s ETA {fmt_duration(self._job_eta(r))}")
        if len(running) > LINE_JOBS:
            parts.append(f"{len(running) - LINE_JOBS} more running")
        return "; ".join(parts)

    def _table(self):
        from rich.table import Table

        counts = self._counts()
        title = f"sweep {escape(self.sweep)} [{self._elapsed()}]  " + "  ".join(
            f"[{STYLE.get(k, '')}]{k} {n}[/]" for k, n in sorted(counts.items()))
        if self.sweep_rate() is not None:
            title += (f"  {fmt_rate(self.sweep_rate())} tok/s, sweep ETA ~{fmt_duration(self.sweep_eta())} "
                      "(estimate)")
        table = Table(title=title, title_justify="left", expand=False)
        # a name too long for a narrow terminal folds onto more lines: its end (the seed) tells rows apart
        table.add_column("job", overflow="fold")
        table.add_column("id", style="dim")
        table.add_column("status")
        table.add_column("tokens", justify="right")
        table.add_column("%", justify="right")
        table.add_column("tok/s", justify="right")
        table.add_column("ETA", justify="right")
        rows = list(self.rows.items())
        if len(rows) > MAX_ROWS:
            rows.sort(key=lambda kv: (kv[1]["status"] != Status.RUNNING, -kv[1]["changed"]))
            rows = rows[:MAX_ROWS]
        for job_id, r in rows:
            pct = 100.0 * r["tokens"] / r["target"] if r["target"] else 0.0
            running = r["status"] == Status.RUNNING
            table.add_row(escape(r["name"]), job_id[:8], f"[{STYLE.get(r['status'], '')}]{r['status']}[/]",
                          f"{fmt_tokens(r['tokens'])}/{fmt_tokens(r['target'])}", f"{pct:.0f}",
                          fmt_rate(self._rate(r)) if running else "",
                          fmt_duration(self._job_eta(r)) if running else "")
        return table

    def refresh(self) -> None:
        now = self.clock()
        if self._live is not None and now - self._last_draw > 0.25:
            self._last_draw = now
            self._live.update(self._table())
        if self.interactive:
            return
        # A line per PROGRESS_EVERY_S of time in which some job ran: waits with nothing running (Ray starting, a
        # gap between two jobs) pause the period instead of starting it over.
        elapsed, self._last_refresh = now - self._last_refresh, now
        if not any(r["status"] == Status.RUNNING for r in self.rows.values()):
            return
        self._running_s += elapsed
        if self._running_s >= PROGRESS_EVERY_S:
            self._running_s = 0.0
            self.console.print(escape(self.progress_line()))

    def stop(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.stop()
            self._live = None

    def nothing_to_do(self, summary: Any, restored: bool = False) -> None:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(summary.counts.items()))
        self.console.print(f"sweep {self.sweep}: nothing to run ({counts}); no job started"
                           + ("" if restored else ", no MLflow run created"))
        if summary.evals_error is not None:
            self.console.print(f"  [red]evals stopped[/]: {escape(summary.evals_error)}")
            print("fix the task files or the sweep file's evals: section and launch the file again: only the jobs "
                  "not scored yet are scored", file=sys.stderr)

    def final(self, summary: Any, sdir: Any) -> None:
        self.stop()
        counts = ", ".join(f"{n} {k}" for k, n in sorted(summary.counts.items()))
        if summary.study_counts is not None:  # a search: this launch's trials, then the whole study's
            study = ", ".join(f"{n} {k}" for k, n in sorted(summary.study_counts.items()))
            invalid = (f"; {count(summary.invalid, 'trial')} failed making no valid job, see above"
                       if summary.invalid else "")
            self.console.print(f"sweep {self.sweep}: this launch's trials {counts or 'none'} in {self._elapsed()} "
                               f"({count(summary.ran, 'attempt')} run; {summary.pruned} pruned{invalid}); the "
                               f"study's jobs: {study}")
        else:
            resumed = f", {summary.resumed} of them from a checkpoint" if summary.resumed else ""
            self.console.print(f"sweep {self.sweep}: {counts} in {self._elapsed()} "
                               f"({count(summary.ran, 'attempt')} run{resumed}; {count(summary.skipped, 'job')} "
                               f"{'was' if summary.skipped == 1 else 'were'} already done)")
        store = sdir.store_uri()
        if store:
            self.console.print(f"runs: {escape(store)} (experiment rla-sweep/{self.sweep}); `rla-sweep status "
                               f"{self.sweep} --root {shell_arg(sdir.root)}` lists them")
        for f in summary.failed:
            self.console.print(f"  [red]failed[/] {escape(f.name)} ({f.job_id[:8]}), cause {f.cause or 'unknown'}: "
                               f"{escape(f.error)}")
            if f.log is not None:
                self.console.print(f"    traceback: {escape(str(f.log))}")
        if summary.evals_error is not None:
            self.console.print(f"  [red]evals stopped[/]: {escape(summary.evals_error)}")
        if summary.resume_helps:
            print(f"rerun `rla-sweep resume {self.sweep} --root {shell_arg(sdir.root)}` to resume unfinished jobs from their "
                  "checkpoints", file=sys.stderr)
        elif summary.evals_error is not None:
            print(f"a task file fixed: `rla-sweep resume {self.sweep} --root {shell_arg(sdir.root)}` scores the jobs not scored "
                  "yet; the evals: section fixed: launch the sweep file again (resume reads the copy it saved)",
                  file=sys.stderr)
        elif summary.failed:
            print("every failure above repeats on each attempt (cause config, compile or checkpoint): fix the sweep "
                  "file, the code or the checkpoints, then launch again", file=sys.stderr)
        elif summary.interrupted and summary.study_counts is None:  # stopped after the last job had ended
            then = (f"; `rla-sweep resume {self.sweep} --root {shell_arg(sdir.root)}` runs the sweep's evals: stage, "
                    "which a stopped launch skips" if summary.evals_pending else "; nothing is left to resume")
            print(f"stopped after every job had ended: their results stand{then}", file=sys.stderr)
