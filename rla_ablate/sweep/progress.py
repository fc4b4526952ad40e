"""Live view of a launch: a rich table of jobs (status, tokens) on a terminal, one line per change otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.markup import escape

from rla_ablate.outcome import Status

STYLE = {Status.PENDING: "dim", Status.RUNNING: "cyan", Status.FINISHED: "green", Status.FAILED: "red",
         Status.DIVERGED: "magenta", Status.CANCELLED: "yellow"}
# Beyond this many jobs the live table shows the running and recently changed ones, plus counts.
MAX_ROWS = 24


def fmt_tokens(n: int | None) -> str:
    if not n:
        return "0"
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)


class Progress:
    def __init__(self, sweep: str, console: Any = None, interactive: bool | None = None):
        from rich.console import Console

        self.sweep = sweep
        # Lines are never wrapped: logs stay greppable when stdout is a file.
        self.console = console or Console(soft_wrap=True)
        self.interactive = (self.console.is_terminal if interactive is None else interactive)
        self.rows: dict[str, dict[str, Any]] = {}
        self.started = time.monotonic()
        self._live = None
        self._last_draw = 0.0

    def _ensure_live(self) -> None:
        if self.interactive and self._live is None:
            from rich.live import Live

            self._live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()

    def update(self, job: Any, status: str, tokens: int | None = None, target: int | None = None) -> None:
        row = self.rows.setdefault(job.job_id, {"name": job.name, "status": None, "tokens": 0,
                                                "target": int(job.job.train.tokens), "changed": 0.0})
        if target is not None:
            row["target"] = target
        changed = row["status"] != status
        row["status"] = status
        if tokens is not None:
            row["tokens"] = tokens
        if changed:
            row["changed"] = time.monotonic()
            # Plain output: every change but the initial listing of queued jobs.
            if not self.interactive and (status != "pending" or row.get("seen")):
                self.console.print(f"[{self._elapsed()}] {job.name} ({job.job_id[:8]}): {status} "
                                   f"{fmt_tokens(row['tokens'])}/{fmt_tokens(row['target'])} tokens")
            row["seen"] = True
        self._ensure_live()

    def note(self, text: str) -> None:
        self.console.print(f"[{self._elapsed()}] {escape(text)}")

    def _elapsed(self) -> str:
        s = int(time.monotonic() - self.started)
        return f"{s // 60:02d}:{s % 60:02d}"

    def _counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rows.values():
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        return counts

    def _table(self):
        from rich.table import Table

        counts = self._counts()
        title = f"sweep {self.sweep} [{self._elapsed()}]  " + "  ".join(
            f"[{STYLE.get(k, '')}]{k} {n}[/]" for k, n in sorted(counts.items()))
        table = Table(title=title, title_justify="left", expand=False)
        table.add_column("job")
        table.add_column("id", style="dim")
        table.add_column("status")
        table.add_column("tokens", justify="right")
        table.add_column("%", justify="right")
        rows = list(self.rows.items())
        if len(rows) > MAX_ROWS:
            rows.sort(key=lambda kv: (kv[1]["status"] != "running", -kv[1]["changed"]))
            rows = rows[:MAX_ROWS]
        for job_id, r in rows:
            pct = 100.0 * r["tokens"] / r["target"] if r["target"] else 0.0
            table.add_row(r["name"], job_id[:8], f"[{STYLE.get(r['status'], '')}]{r['status']}[/]",
                          f"{fmt_tokens(r['tokens'])}/{fmt_tokens(r['target'])}", f"{pct:.0f}")
        return table

    def refresh(self) -> None:
        if self._live is not None and time.monotonic() - self._last_draw > 0.25:
            self._last_draw = time.monotonic()
            self._live.update(self._table())

    def stop(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.stop()
            self._live = None

    def nothing_to_do(self, summary: Any) -> None:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(summary.counts.items()))
        self.console.print(f"sweep {self.sweep}: nothing to run ({counts}); no job started, no MLflow run created")

    def final(self, summary: Any, sdir: Any) -> None:
        self.stop()
        counts = ", ".join(f"{n} {k}" for k, n in sorted(summary.counts.items()))
        self.console.print(f"sweep {self.sweep}: {counts} in {self._elapsed()} "
                           f"({summary.ran} attempts run; {summary.skipped} jobs were already done)")
        meta = sdir.meta()
        store = meta.get("backend_uri") if meta.get("embedded_tracking") else meta.get("tracking_uri")
        if store:
            self.console.print(f"runs: {escape(store)} (experiment rla-sweep/{self.sweep}); `rla-sweep status "
                               f"{self.sweep} --root {sdir.root}` lists them")
        for f in summary.failed:
            self.console.print(f"  [red]failed[/] {escape(f.name)} ({f.job_id[:8]}), cause {f.cause or 'unknown'}: "
                               f"{escape(f.error)}")
            if f.log is not None:
                self.console.print(f"    traceback: {escape(str(f.log))}")
        if summary.resume_helps:
            print(f"rerun `rla-sweep resume {self.sweep} --root {sdir.root}` to resume unfinished jobs from their "
                  "checkpoints", file=sys.stderr)
        elif not summary.ok:
            print("every failure above repeats on each attempt (cause config or compile): fix the sweep file or the "
                  "code, then launch again", file=sys.stderr)
