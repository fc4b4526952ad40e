"""Where a job's metrics go: the `MetricLogger` protocol, the JSONL ground truth, fan-out and a progress bar.

Step is always the number of training tokens seen. Events carry what is not a time series: the job's
start (budget, kernel backend that ran, device), skipped steps, loss spikes, checkpoints, resumes.
"""

from __future__ import annotations

import json
import math
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Protocol, runtime_checkable

from rla_ablate.errors import Notice
from rla_ablate.fileio import atomic_write_text

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


@runtime_checkable
class MetricLogger(Protocol):
    """What the training loop logs to. A logger may also define `tokens_trained(tokens)`, which the loop calls after
    every step (a sweep's live rate between metric logs)."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def event(self, name: str, step: int, detail: dict) -> None: ...

    def close(self, status: str, reason: str | None = None) -> None: ...


def _plain(value: Any) -> Any:
    # JSON has no NaN/Inf; keep them readable and round-trippable as strings.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class JSONLLogger:
    """Appends one JSON object per line to `path`, flushed at once: the record that survives any crash.

    Records: {"type": "metrics", "step", "time", "values"}, {"type": "event", "step", "time", "name",
    "detail"}, {"type": "close", "time", "status", "reason"}.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(_plain(record), sort_keys=True) + "\n")
        self._file.flush()

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._write({"type": "metrics", "step": int(step), "time": time.time(), "values": dict(metrics)})

    def event(self, name: str, step: int, detail: dict) -> None:
        self._write({"type": "event", "step": int(step), "time": time.time(), "name": name, "detail": dict(detail)})

    def close(self, status: str, reason: str | None = None) -> None:
        if self._file.closed:
            return
        self._write({"type": "close", "time": time.time(), "status": status, "reason": reason})
        self._file.close()


def _parse_lines(lines: list[str]) -> tuple[list[tuple[str, dict]], list[tuple[int, str]]]:
    """(line, record) of each line that is a record, and (number, line) of each other line but the torn last line of
    a crash (a line cut mid-write, which is no damage): those are damage from outside (an edit, a disk error)."""
    records, damaged = [], []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("type"), str):
            records.append((line, record))
        elif number < len(lines) or record is not None:
            damaged.append((number, line))
    return records, damaged


def _warn_damaged(path: Path, damaged: list[tuple[int, str]], moved_to: Path | None = None) -> None:
    """Warn that these lines of `path` are not a metrics record: skipped, or moved to `moved_to`."""
    numbers = [n for n, _ in damaged]
    shown = ", ".join(map(str, numbers[:5])) + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")
    many = len(numbers) > 1
    what = (f" and {'were' if many else 'was'} skipped" if moved_to is None else
            f": moved to {moved_to} as the resumed job rewrites the file")
    warnings.warn(f"{path}: line{'s' if many else ''} {shown} {'are' if many else 'is'} not a metrics record{what}",
                  Notice, stacklevel=3)


def read_jsonl(path: str | Path) -> list[dict]:
    """All records of a metrics.jsonl file. A torn last line (a crash mid-write) is ignored; any other line that is
    not a record (damage from outside: an edit, a disk error) is dropped with a warning naming the file and its
    lines, so a curve with a hole never passes unnoticed."""
    path = Path(path)
    if not path.exists():
        return []
    records, damaged = _parse_lines(path.read_text(encoding="utf-8").splitlines())
    if damaged:
        _warn_damaged(path, damaged)
    return [record for _, record in records]


def last_close(records: Iterable[dict]) -> dict | None:
    """The run's last close record (how it ended: status, reason, time), or None while it has not ended."""
    closed = [r for r in records if r.get("type") == "close"]
    return closed[-1] if closed else None


def metric_series(records: Iterable[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric, in the order they were logged."""
    out = []
    for r in records:
        if r.get("type") == "metrics" and key in r["values"]:
            value = r["values"][key]
            out.append((r["step"], float(value)))
    return out


def truncate_jsonl(path: str | Path, after_step: int) -> int:
    """Drop metric and event records past `after_step` and any close record (a resumed job rewrites them).

    A line that is not a record (damage from outside) is moved, not dropped: appended to `<file>.damaged` beside it,
    with a warning naming both, so the rewrite loses nothing a person could still read; the torn last line of a crash
    goes. Written to a temp file and renamed, so a crash here leaves the old file. Returns how many were dropped.
    """
    path = Path(path)
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    records, damaged = _parse_lines(lines)
    keep = [line for line, record in records if record.get("type") != "close" and record.get("step", 0) <= after_step]
    if damaged:
        aside = path.with_name(path.name + ".damaged")
        with open(aside, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for _, line in damaged))
        _warn_damaged(path, damaged, moved_to=aside)
    atomic_write_text(path, "".join(line + "\n" for line in keep))
    return len(lines) - len(keep)


class CompositeLogger:
    """Sends everything to several loggers; one that raises does not stop the others or the job."""

    def __init__(self, *loggers: MetricLogger | None):
        self.loggers = [lg for lg in loggers if lg is not None]
        self.errors: list[str] = []

    def _each(self, method: str, *args) -> None:
        for lg in self.loggers:
            try:
                getattr(lg, method)(*args)
            except Exception as exc:  # a tracking outage must never kill a training run
                self.errors.append(f"{type(lg).__name__}.{method}: {exc!r}")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._each("log", metrics, step)

    def event(self, name: str, step: int, detail: dict) -> None:
        self._each("event", name, step, detail)

    def close(self, status: str, reason: str | None = None) -> None:
        self._each("close", status, reason)


class NullLogger:
    """Discards everything (the JSONL log is written regardless)."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def event(self, name: str, step: int, detail: dict) -> None:
        pass

    def close(self, status: str, reason: str | None = None) -> None:
        pass


def human(n: float) -> str:
    """12345678 -> '12.3M' (token counts in one glance)."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


class ProgressLogger:
    """A rich progress bar over the token budget with the latest loss, eval loss and throughput.

    It learns the budget from the job's "start" event. Without a terminal (a log file, CI) it prints one
    line per eval and per event instead of redrawing a bar, and a progress line (tokens, loss, rate, ETA) at least
    every `every_s` seconds while training logs (the first after `first_s`), so that a piped run between evals is
    not silent; when no record comes for `every_s` (a long step: a large batch on the CPU, the first step's kernel
    tuning), a thread says so every `every_s` until one does.
    """

    every_s = 30.0
    first_s = 10.0

    def __init__(self, description: str = "train", console=None, interactive: bool | None = None):
        from rla_ablate.terminal import PipeConsole

        self.console = console or PipeConsole(stderr=True)
        self.interactive = self.console.is_terminal if interactive is None else interactive
        self.description = description
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        # the bar's own text fields, passed to rich as extra keyword arguments
        self._fields: dict[str, Any] = {"loss": "", "eval": "", "speed": ""}
        self._total = 0
        self._said_at = time.monotonic() - (self.every_s - self.first_s)  # the first line after first_s
        self._rate_from: tuple[float, int] | None = None     # (time, tokens) where this run's rate starts
        self._record_at, self._step = time.monotonic(), 0    # the last record from the loop, and its tokens
        self._closed = threading.Event()
        self._beat: threading.Thread | None = None

    def _start(self, total: int, done: int) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.table import Column

        self._total = total
        self._rate_from = (time.monotonic(), done)
        self._record_at, self._step = time.monotonic(), done
        if not self.interactive and self._beat is None and self.every_s >= 1:
            self._beat = threading.Thread(target=self._heartbeat, name="progress-heartbeat", daemon=True)
            self._beat.start()
        if not self.interactive or self._progress is not None:
            return
        # On a narrow terminal the bar and then the loss text give way; the tokens and both times are kept whole
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=4)),
            TextColumn("{task.fields[tokens]}", table_column=Column(no_wrap=True)),
            TimeElapsedColumn(table_column=Column(min_width=7, no_wrap=True)),
            TimeRemainingColumn(table_column=Column(min_width=7, no_wrap=True)),
            TextColumn("{task.fields[loss]} {task.fields[eval]} {task.fields[speed]}",
                       table_column=Column(ratio=3, no_wrap=True, overflow="ellipsis")),
            console=self.console,
        )
        self._progress.start()
        self._task = self._progress.add_task(self.description, total=total, completed=done,
                                             tokens=self._tokens(done), **self._fields)

    def _tokens(self, done: int) -> str:
        return f"{human(done)}/{human(self._total)} tokens"

    def _eta_line(self, step: int) -> str:
        """'1.2M/10M tokens (12%): loss 3.1234, 2,345 tok/s, ETA 1:02:03' (rate over this run so far)."""
        line = self._tokens(step)
        if self._total:
            line += f" ({step / self._total:.0%})"
        parts = [p for p in (self._fields["loss"], self._fields["speed"]) if p]
        if self._rate_from is not None and self._total:
            t0, done0 = self._rate_from
            rate = (step - done0) / max(time.monotonic() - t0, 1e-9)
            if rate > 0:
                left = int((self._total - step) / rate)
                parts.append(f"ETA {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}")
        return line + (": " + ", ".join(parts) if parts else "")

    def _heartbeat(self) -> None:
        """Without a terminal: a line when the loop has sent no record for `every_s` (the bar's elapsed time says
        as much on a terminal)."""
        while not self._closed.wait(self.every_s / 4):
            now = time.monotonic()
            quiet = now - self._record_at
            if quiet >= self.every_s and now - self._said_at >= self.every_s:
                try:
                    self._line(f"{self.description} {self._eta_line(self._step)}: still running, no record for "
                               f"{quiet:.0f} s")
                except OSError:  # a closed pipe: the training thread's next line meets it and stops the job
                    return
                self._said_at = now

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._record_at, self._step = time.monotonic(), step
        if "train/loss" in metrics:
            self._fields["loss"] = f"loss {metrics['train/loss']:.4f}"
        if "train/tokens_per_s" in metrics:
            self._fields["speed"] = f"{metrics['train/tokens_per_s']:,.0f} tok/s"
        evals = {k: v for k, v in metrics.items() if k.startswith("eval/") and k.endswith("/loss")}
        if evals:
            self._fields["eval"] = " ".join(f"{k[5:-5]} {v:.4f}" for k, v in sorted(evals.items()))
            if not self.interactive:  # with the rate and ETA: a short job may print nothing else
                self._line(f"{self.description} {self._eta_line(step)}; eval {self._fields['eval']}")
                self._said_at = time.monotonic()
        elif not self.interactive and time.monotonic() - self._said_at >= self.every_s:
            self._line(f"{self.description} {self._eta_line(step)}")
            self._said_at = time.monotonic()
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=step, tokens=self._tokens(step), **self._fields)

    def event(self, name: str, step: int, detail: dict) -> None:
        if name == "start":
            self._start(int(detail["tokens_total"]), int(step))
            if not self.interactive:
                self._line(f"{self.description}: {detail['tokens_total']:,} tokens from {step:,}")
        elif name == "resumed":
            skipped = detail.get("skipped_checkpoints")
            self._say(f"{self.description}: resumed at {step:,} tokens (step {detail.get('step', '?'):,})"
                      + (f"; skipped unreadable checkpoints {', '.join(map(str, skipped))}" if skipped else ""))
        elif name in ("skipped_step", "loss_spike"):
            self._say(f"{self.description} {step:,} tokens: {name} {detail}")
        elif name == "info" and detail.get("cuda_graph") == "captured":
            self._say(f"{self.description} {step:,} tokens: micro step captured in a CUDA graph after "
                      f"{detail['after_eager_steps']} eager steps ({detail['capture_s']} s); replayed from here")

    def _say(self, text: str) -> None:
        (self._progress.console if self._progress else self.console).print(text, soft_wrap=not self.interactive)

    def _line(self, text: str) -> None:
        """A progress record where no bar is drawn (a pipe, a file): one line whatever its length, never wrapped
        mid-record at the console's width (a log reader greps it whole)."""
        self.console.print(text, soft_wrap=True)

    def close(self, status: str, reason: str | None = None) -> None:
        self._closed.set()
        if self._beat is not None:
            self._beat.join(timeout=5)  # it wakes at once: no line of it after the last
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        tail = f": {reason}" if reason else ""
        self.console.print(f"{self.description}: {status}{tail}", soft_wrap=not self.interactive)
