"""The local MLflow tracking server: one `mlflow server` process per tracking directory, the single writer.

Layout of `root_dir`:
    mlflow.db          SQLite backend store (readable after the server is gone: `backend_uri`)
    artifacts/         artifact store, served by the server over HTTP (jobs never need the path)
    server.json        {pid, pgid, owner_pid, port, uri, backend_uri, started}: lets a later process
                       reuse a live server or clean up one whose owner died
    server.log         the server's stdout and stderr
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from rla_ablate.errors import UserError
from rla_ablate.fileio import atomic_write_text

HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_healthy(uri: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


# Schemes MLflow's client accepts as a tracking URI; http(s) ones are checked for an answer before a launch.
TRACKING_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks")


def check_tracking_uri(uri: str, timeout: float = 5.0) -> None:
    """Refuse, in seconds, a --tracking-uri that is not a URI MLflow reads or an HTTP server that does not answer."""
    parsed = urllib.parse.urlparse(uri)
    scheme = parsed.scheme.split("+", 1)[0].lower()
    if scheme not in TRACKING_SCHEMES:
        raise UserError(f"{uri!r} is not a tracking URI; use http://HOST:PORT of an MLflow server (or a "
                        f"{', '.join(TRACKING_SCHEMES[2:])} store URI)", key="--tracking-uri")
    if scheme not in ("http", "https"):
        return
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if not parsed.hostname or port == -1:
        raise UserError(f"{uri!r} is not a valid URL; expected http://HOST:PORT", key="--tracking-uri")
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout):
            pass
    except urllib.error.HTTPError:
        # Something answers HTTP (a proxy, an MLflow without /health): the jobs' client decides the rest.
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"no MLflow server answers at {uri} ({getattr(reason, 'strerror', None) or reason}); start "
                        "one (`mlflow server`) or leave out --tracking-uri to use the embedded one",
                        key="--tracking-uri") from None


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _die_with_parent() -> None:
    # Linux only: the server gets SIGTERM when the process that started it dies, even by SIGKILL.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _kill_group(pgid: int, timeout: float = 10.0, proc: subprocess.Popen | None = None) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Reap our own child, or its zombie keeps the process group alive.
            if proc is not None:
                proc.poll()
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


class TrackingServer:
    """A local `mlflow server` (SQLite + local artifacts, 127.0.0.1, free port) as a context manager.

    If a healthy server started by a live process already serves `root_dir`, it is reused (and left
    running at exit); a server whose owner died is stopped and replaced.
    """

    def __init__(self, root_dir: str | Path, *, port: int | None = None, workers: int = 1,
                 startup_timeout: float = 120.0):
        self.root = Path(root_dir).resolve()
        self.port = port
        self.workers = workers
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.owned = False
        self._prev_handlers: dict[int, object] = {}

    @property
    def backend_uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def artifacts_dir(self) -> Path:
        return self.root / "artifacts"

    @property
    def record_path(self) -> Path:
        return self.root / "server.json"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    @property
    def uri(self) -> str:
        if self.port is None:
            raise RuntimeError("the tracking server is not started")
        return f"http://{HOST}:{self.port}"

    def read_record(self) -> dict | None:
        try:
            return json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return None

    def _adopt_or_clean(self) -> bool:
        """Reuse a live server for this directory (True) or stop a stale one (False)."""
        rec = self.read_record()
        if not rec:
            return False
        pid, owner = rec.get("pid"), rec.get("owner_pid")
        ours = _alive(pid) and "mlflow" in _cmdline(pid) and str(self.root) in _cmdline(pid)
        if ours and _alive(owner) and owner != os.getpid():
            # Its owner may still be waiting for it to come up: give it the startup time before judging it.
            deadline = time.monotonic() + self.startup_timeout
            while _alive(pid) and time.monotonic() < deadline:
                if is_healthy(rec["uri"]):
                    self.port = int(rec["port"])
                    return True
                time.sleep(0.25)
        if ours:
            _kill_group(int(rec.get("pgid") or pid))
        self.record_path.unlink(missing_ok=True)
        return False

    def start(self) -> "TrackingServer":
        try:
            return self._start()
        except OSError as exc:
            # An unwritable folder, a missing interpreter: say what could not start, not a traceback.
            self.stop()
            raise UserError(f"cannot start the MLflow server: {exc.strerror or exc}"
                            + (f" ({exc.filename})" if exc.filename else ""), file=str(self.root)) from None

    def _start(self) -> "TrackingServer":
        self.root.mkdir(parents=True, exist_ok=True)
        self.artifacts_dir.mkdir(exist_ok=True)
        if self.proc is not None or self._adopt_or_clean():
            return self
        port = self.port or free_port()
        cmd = [sys.executable, "-m", "mlflow", "server",
               "--backend-store-uri", self.backend_uri,
               "--artifacts-destination", str(self.artifacts_dir),
               "--serve-artifacts",
               "--host", HOST, "--port", str(port), "--workers", str(self.workers)]
        # The job-execution runner (GenAI jobs) is an extra process we never use.
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", PYTHONUNBUFFERED="1")
        log = open(self.log_path, "ab")
        # PDEATHSIG fires when the creating *thread* exits, so only the main thread may arm it.
        in_main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=self.root, start_new_session=True,
                                     preexec_fn=_die_with_parent if in_main else None)
        log.close()
        self.port, self.owned = port, True
        atomic_write_text(self.record_path, json.dumps({
            "pid": self.proc.pid, "pgid": self.proc.pid, "owner_pid": os.getpid(), "port": port,
            "uri": self.uri, "backend_uri": self.backend_uri, "started": time.time()}, indent=1))
        self._install_handlers()
        deadline = time.monotonic() + self.startup_timeout
        while not is_healthy(self.uri, timeout=1.0):
            code = self.proc.poll()
            if code is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                # stop() forgets the process: keep its exit code for the message.
                self.stop()
                raise UserError(f"the MLflow server exited with code {code} before answering; "
                                f"log {self.log_path}:\n{tail}")
            if time.monotonic() > deadline:
                self.stop()
                raise UserError(f"the MLflow server did not answer within {self.startup_timeout:.0f} s; "
                                f"see {self.log_path}")
            time.sleep(0.25)
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        _kill_group(self.proc.pid, proc=self.proc)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        rec = self.read_record()
        if rec and rec.get("pid") == self.proc.pid:
            self.record_path.unlink(missing_ok=True)
        self.proc = None
        self._restore_handlers()

    def _install_handlers(self) -> None:
        atexit.register(self.stop)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            prev = signal.getsignal(sig)
            if prev is signal.SIG_IGN:
                continue
            self._prev_handlers[sig] = prev

            def handler(signum, frame, prev=prev):
                self.stop()
                if callable(prev):
                    prev(signum, frame)
                else:
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)

            signal.signal(sig, handler)

    def _restore_handlers(self) -> None:
        atexit.unregister(self.stop)
        if threading.current_thread() is threading.main_thread():
            for sig, prev in self._prev_handlers.items():
                signal.signal(sig, prev)
        self._prev_handlers.clear()

    def __enter__(self) -> "TrackingServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def ensure_experiment(self, name: str) -> str:
        from rla_ablate.tracking.runs import ensure_experiment
        return ensure_experiment(self.uri, name)

    def ensure_parent_run(self, sweep: str, tags: dict | None = None) -> str:
        from rla_ablate.tracking.runs import ensure_parent_run
        return ensure_parent_run(self.uri, sweep, tags)

    def create_or_get_child_run(self, sweep: str, job_id: str, tags: dict | None = None,
                                params: dict | None = None, config: dict | None = None) -> str:
        from rla_ablate.tracking.runs import create_or_get_child_run
        return create_or_get_child_run(self.uri, sweep, job_id, tags, params, config)
