"""A sweep's folder under --root: what ran, what is running, and who owns the processes.

    <root>/<sweep>/
        sweep.yaml            the file of the last launch (resume reads it)
        sweep.json            {name, tracking_uri, backend_uri, parent_run_id}
        jobs.json             the current expansion: [{job_id, name, family, ablations, seed, tokens_target, ...}]
        jobs/<job_id>/        run_job's out_dir (checkpoints/, metrics.jsonl) plus job.json and status.json, and
                              error.log: the traceback of every failed attempt, appended, and evals/: task
                              scores (rla_ablate.evals)
        launch.lock           flock held by the running launch (the kernel drops it when the process dies)
        launch.json           {pid, pgid, host, started, children: [[pid, create_time], ...]}
        cancel.request        written by `rla-sweep cancel`; the launch stops its jobs at their next step
        mlflow/               the embedded tracking server's SQLite store and artifacts
        triton-cache/         TRITON_CACHE_DIR of every worker: kernels compile once per node
        optuna.db             the study of a `search:` sweep
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from rla_ablate.errors import UserError
from rla_ablate.fileio import LockHeld, atomic_write_text, lock_exclusive, shell_arg, unlock
from rla_ablate.outcome import Cause, Status, last_line

# The first line of a traceback.
_TRACEBACK_HEAD = "Traceback (most recent call last):"
# Folders written before `cause` existed marked a pruned trial by this error prefix.
_LEGACY_PRUNED = "pruned by Optuna"


def write_json(path: Path, data: Any) -> None:
    """Atomic: a reader (status, a relaunch after SIGKILL) never sees a torn file."""
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True, default=str))


_WARNED: set[str] = set()


def _warn_once(path: Path, text: str) -> None:
    """A Notice naming `path` (the CLI prints it as one line), once per file and process: a record read by every
    command many times is named once."""
    import warnings

    from rla_ablate.errors import Notice

    if str(path) not in _WARNED:
        _WARNED.add(str(path))
        warnings.warn(f"{path}: {text}", Notice, stacklevel=3)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def read_record(path: Path, default: Any, kind: type, remedy: str) -> Any:
    """A sweep-wide record (sweep.json, jobs.json): `default` when the file is absent; a UserError naming the file,
    with `remedy`, when it is there but is not a `kind` of what the sweep writes there (a sweep.json with its name,
    a jobs.json of objects with a job_id). Written atomically, such a file is damaged only from outside, and read
    as empty it would show every job of the sweep gone (status) or stale (results)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the sweep's record ({getattr(exc, 'strerror', None) or exc})",
                        file=str(path)) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        data = exc
    if not isinstance(data, kind):
        what = "a JSON object" if kind is dict else "a JSON list"
        raise UserError(f"damaged: not {what} ({data if isinstance(data, ValueError) else type(data).__name__}); "
                        f"{remedy}", file=str(path))
    if isinstance(data, dict) and "name" not in data:
        raise UserError(f"damaged: the sweep's name is missing; {remedy}", file=str(path))
    if isinstance(data, list) and not all(isinstance(r, dict) and isinstance(r.get("job_id"), str) for r in data):
        raise UserError(f"damaged: an entry is not a job's record (an object with its job_id); {remedy}",
                        file=str(path))
    return data


@dataclass
class JobStatus:
    status: Status = Status.PENDING
    mlflow_run_id: str | None = None
    tokens_done: int = 0
    tokens_target: int = 0
    error: str | None = None
    """One line: the last attempt's "Type: message", or why the job stopped."""
    attempts: int = 0
    tracking_uri: str | None = None
    updated: float = 0.0
    cause: Cause | None = None
    """Why the job did not finish (rla_ablate.outcome.Cause); None while it runs, once finished, or unknown."""
    traceback: str | None = None
    """The last failed attempt's traceback (every attempt's is in error.log)."""
    notice: str | None = None
    """Something the latest attempt did that the user should know, on one line (it skipped an unreadable
    checkpoint and resumed from an older one)."""

    def __post_init__(self) -> None:
        self.status = Status(self.status) if self.status in Status._value2member_map_ else Status.PENDING
        self.cause = Cause(self.cause) if self.cause in Cause._value2member_map_ else None
        if self.error and "\n" in self.error.strip() and self.traceback is None:
            # Folders written before `traceback` existed: a traceback, or "Type: message" and a traceback, in `error`.
            text = self.error.strip()
            line = last_line(text) if text.startswith(_TRACEBACK_HEAD) else text.splitlines()[0].strip()
            self.traceback, self.error = self.error, line
        if (self.cause is None and self.status == Status.CANCELLED
                and (self.error or "").startswith(_LEGACY_PRUNED)):
            self.cause = Cause.PRUNED


class SweepDir:
    """The state of one sweep under a root folder."""

    def __init__(self, root: str | Path, name: str):
        self.root = Path(root).resolve()
        self.name = name
        self.path = self.root / name
        self._lock_fd: int | None = None  # the launch lock (None also while held on a file system without locks)
        self._locked = False

    # layout
    @property
    def jobs_dir(self) -> Path:
        return self.path / "jobs"

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    @property
    def mlflow_dir(self) -> Path:
        return self.path / "mlflow"

    @property
    def triton_cache(self) -> Path:
        return self.path / "triton-cache"

    @property
    def cancel_path(self) -> Path:
        return self.path / "cancel.request"

    def error_log(self, job_id: str) -> Path:
        """Every failed attempt's traceback, appended (attempt number, time, cause)."""
        return self.job_dir(job_id) / "error.log"

    @property
    def optuna_path(self) -> Path:
        """The study of a search sweep (absent for a grid sweep and before a search's first launch)."""
        return self.path / "optuna.db"

    @property
    def optuna_uri(self) -> str:
        return f"sqlite:///{self.optuna_path}"

    def exists(self) -> bool:
        return (self.path / "sweep.json").exists()

    # sweep-level records
    def meta(self) -> dict:
        return read_record(self.path / "sweep.json", {}, dict, "restore it from a copy of the sweep folder (it "
                           "names the sweep's tracking store and parent run)")

    def write_meta(self, **changes: Any) -> dict:
        meta = self.meta()
        meta.update(changes, name=self.name)
        write_json(self.path / "sweep.json", meta)
        return meta

    def job_list(self) -> list[dict]:
        return read_record(self.path / "jobs.json", [], list, "launching the sweep's file again (or `rla-sweep "
                           f"resume {shell_arg(self.name)} --root {shell_arg(self.root)}`) writes it anew")

    def write_job_list(self, jobs: list[dict]) -> None:
        write_json(self.path / "jobs.json", jobs)

    def has_job_list(self) -> bool:
        """Whether a launch has recorded the sweep's current expansion (jobs.json)."""
        return (self.path / "jobs.json").exists()

    def store_uri(self) -> str | None:
        """Where the sweep's runs are: for the embedded server, the SQLite file in this folder's mlflow/ (a copied or
        moved sweep folder reads its own store, never the one recorded where the folder was made); for a shared
        server, its URI; None before a launch started one."""
        meta = self.meta()
        if meta.get("embedded_tracking", True):
            return f"sqlite:///{self.mlflow_dir / 'mlflow.db'}" if meta.get("backend_uri") else None
        return meta.get("tracking_uri")

    def check_own_store(self) -> None:
        """The sweep's embedded tracking store is there and is an SQLite file, or a UserError says what happened
        to it (and, when its jobs ran, how to make it again from their metrics.jsonl)."""
        db = self.mlflow_dir / "mlflow.db"
        if not db.exists():
            ran = any(self.status(j["job_id"]).mlflow_run_id for j in self.job_list())
            raise UserError(f"the sweep '{self.name}' has no tracking store ({db} is missing"
                            + ("; its jobs ran, so it was moved or deleted): put it back, or `rla-sweep resume "
                               f"{shell_arg(self.name)} --root {shell_arg(self.root)}` makes the runs again from each "
                               "job's metrics.jsonl" if ran else "; no launch has run a job yet)"))
        self.check_store_intact()

    def check_store_intact(self) -> None:
        """A UserError when the embedded tracking store is there but damaged (`check_sqlite`), saying how to make it
        again: its runs come back from the jobs' metrics.jsonl."""
        from rla_ablate.fileio import check_sqlite

        folder = self.mlflow_dir
        check_sqlite(folder / "mlflow.db", remedy=(
            f"restore it from a copy, or move its folder aside (`mv {shell_arg(folder)} "
            f"{shell_arg(str(folder) + '.damaged')}`: the database and any files beside it) and `rla-sweep resume "
            f"{shell_arg(self.name)} --root {shell_arg(self.root)}` makes the runs again from each job's metrics.jsonl"))

    def job_config(self, job_id: str) -> dict | None:
        """The resolved JobConfig a job ran with (its job.json), also for jobs of earlier versions of the file."""
        data = read_json(self.job_dir(job_id) / "job.json")
        return data if isinstance(data, dict) else None

    # per-job records
    def status(self, job_id: str) -> JobStatus:
        path = self.job_dir(job_id) / "status.json"
        data = read_json(path)
        if not isinstance(data, dict) or not data:
            if path.exists():
                # Written atomically, it is damaged only from outside. Read as an attempt that ran: pending, and a
                # resume continues from the newest checkpoint (what the job's folder still holds), as said here.
                _warn_once(path, "damaged: not a job's status record; the job is read as pending, and a resume "
                                 "continues it from its newest checkpoint (if any)")
                return JobStatus(attempts=1)
            return JobStatus()
        known = {k: v for k, v in data.items() if k in JobStatus.__dataclass_fields__}
        try:
            return JobStatus(**known)
        except (AttributeError, TypeError, ValueError):  # e.g. an error that is not text
            _warn_once(path, "damaged: a value of the job's status record is not one the launch writes; the job is "
                             "read as pending")
            return JobStatus(attempts=1)

    def set_status(self, job_id: str, **changes: Any) -> JobStatus:
        st = self.status(job_id)
        for key, value in changes.items():
            setattr(st, key, value)
        # Values set as plain strings become the enums again (and unknown ones fail here, not in a reader).
        st.status = Status(st.status)
        st.cause = Cause(st.cause) if st.cause is not None else None
        st.updated = time.time()
        self.job_dir(job_id).mkdir(parents=True, exist_ok=True)
        write_json(self.job_dir(job_id) / "status.json", asdict(st))
        return st

    def log_failure(self, job_id: str, attempt: int, outcome: Any) -> Path:
        """Append a failed attempt's traceback (or its error line when there is none) to the job's error.log."""
        path = self.error_log(job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
        body = (outcome.traceback or outcome.error or "no error recorded").rstrip("\n")
        with path.open("a", encoding="utf-8") as f:
            f.write(f"=== attempt {attempt} at {stamp}: {outcome.status}, cause {outcome.cause or 'unknown'}, "
                    f"{outcome.tokens_done} tokens ===\n{body}\n\n")
        return path

    # ownership
    def lock_held_by_other(self) -> bool:
        """True while a live launch of this sweep holds the lock."""
        path = self.path / "launch.lock"
        if not path.exists():
            return False
        # Read-only is enough for flock, so status and cancel work on a read-only root.
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def acquire(self) -> None:
        """Take the launch lock or raise a UserError naming the running launch."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = lock_exclusive(self.path / "launch.lock")
        except LockHeld:
            rec = read_json(self.path / "launch.json", {}) or {}
            raise UserError(f"sweep '{self.name}' is already being launched (pid {rec.get('pid', '?')} on "
                            f"{rec.get('host', '?')}); watch it with `rla-sweep status {self.name} --root {shell_arg(self.root)}` "
                            f"or stop it with `rla-sweep cancel {self.name} --root {shell_arg(self.root)}`", file=str(self.path / "launch.lock")) from None
        except OSError as exc:
            raise UserError(f"cannot write the sweep folder ({exc.strerror or exc}); a launch needs a writable "
                            "--root", file=str(self.path)) from None
        self._lock_fd = fd
        self._locked = True
        self.cleanup_stale()
        self.cancel_path.unlink(missing_ok=True)
        write_json(self.path / "launch.json", {"pid": os.getpid(), "pgid": os.getpgid(0), "host": socket.gethostname(),
                                               "started": time.time(), "children": []})

    def release(self) -> None:
        if not self._locked:
            return
        rec = read_json(self.path / "launch.json", {}) or {}
        if rec.get("pid") == os.getpid():
            rec["children"] = []
            rec["ended"] = time.time()
            write_json(self.path / "launch.json", rec)
        unlock(self._lock_fd)
        self._lock_fd = None
        self._locked = False

    def record_children(self) -> None:
        """Remember every descendant (Ray's GCS, raylet, workers; the MLflow server) with its start time."""
        me = psutil.Process()
        kids = []
        for p in me.children(recursive=True):
            try:
                kids.append([p.pid, p.create_time()])
            except psutil.Error:
                continue
        rec = read_json(self.path / "launch.json", {}) or {}
        known = {tuple(k) for k in rec.get("children", [])}
        if known >= {tuple(k) for k in kids} and rec.get("pid") == os.getpid():
            return
        rec["children"] = sorted({tuple(k) for k in kids} | known)
        write_json(self.path / "launch.json", rec)

    def cleanup_stale(self) -> list[int]:
        """Stop what a dead launch left behind (matched by pid and start time, never by name). Returns the pids."""
        rec = read_json(self.path / "launch.json", {}) or {}
        if not rec or rec.get("pid") == os.getpid() or rec.get("host") != socket.gethostname():
            return []
        procs = []
        for pid, created in rec.get("children", []):
            try:
                p = psutil.Process(int(pid))
                if abs(p.create_time() - float(created)) < 0.01:
                    procs.append(p)
            except psutil.Error:
                continue
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=5)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        return [p.pid for p in procs]

    def request_cancel(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.cancel_path.write_text(str(time.time()))

    def take_cancel_request(self) -> bool:
        """For the launch: whether `rla-sweep cancel` asked it to stop; the request is taken (removed), so that the
        command can tell a launch that stopped for it from one that ended before it read it."""
        if not self.cancel_path.exists():
            return False
        try:
            self.cancel_path.unlink(missing_ok=True)
        except OSError:
            pass
        return True
