"""The MLflow tracking server: one `mlflow server` process per tracking directory, the single writer.

A launch starts one per sweep (SQLite, 127.0.0.1, a free port); `rla-sweep server` starts one that several
launches share (`backend_store_uri`: a PostgreSQL, MySQL or SQLite store; `host` to open it to other machines).

Layout of `root_dir`:
    mlflow.db          SQLite backend store unless `backend_store_uri` names another (readable after the server
                       is gone: `backend_uri`)
    artifacts/         artifact store, served by the server over HTTP (jobs never need the path)
    server.json        {pid, pgid, owner_pid, port, uri, backend_uri, started}: lets a later process
                       reuse a live server or clean up one whose owner died
    server.log         the server's stdout and stderr

Supervision (`supervise()`): a watchdog thread polls the process and its /health. A server that died (a crash,
the OOM killer, `kill -9`) is started again on the same backend store and port, so clients that hold the URI
(the jobs' loggers) reconnect by themselves; one that stays alive but does not answer for `hang_timeout_s`
(a stopped or wedged process) is killed and started again. Each restart leaves one line in `notices()`.
"""

from __future__ import annotations

import atexit
import ctypes
import http.client
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


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def check_port(port: int) -> None:
    """A port a server can bind on 127.0.0.1, or a UserError naming --port."""
    if not 0 < port < 65536:
        raise UserError(f"{port} is not a port; give one in 1-65535", key="--port")


def free_port(host: str = HOST) -> int:
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cannot_bind(host: str) -> str | None:
    """Why no server can listen on `host` (not an address of this machine, a name that does not resolve), or None."""
    try:
        with socket.socket(_family(host), socket.SOCK_STREAM) as s:
            s.bind((host, 0))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on (host, port): bound the way the server binds (SO_REUSEADDR, so a port
    closed a moment ago in TIME_WAIT counts as free)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def redact(uri: str) -> str:
    """A store URI with its password replaced by ***, for messages and records."""
    parsed = urllib.parse.urlsplit(uri)
    if parsed.password is None:
        return uri
    netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parsed._replace(netloc=netloc))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _health(uri: str, timeout: float) -> tuple[str, str]:
    """What answers GET `uri`/health: ("ok", ""), ("http", status) for another HTTP status, ("not-http", the
    exception's name) for a reply that is not HTTP (a gRPC server's binary reply, say), or ("down", why)."""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as resp:
            return ("ok", "") if resp.status == 200 else ("http", str(resp.status))
    except urllib.error.HTTPError as exc:  # a subclass of URLError: something answers HTTP
        return "http", str(exc.code)
    except http.client.HTTPException as exc:
        return "not-http", type(exc).__name__
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return "down", str(getattr(reason, "strerror", None) or reason)


def is_healthy(uri: str, timeout: float = 2.0) -> bool:
    return _health(uri, timeout)[0] == "ok"


# Store URIs `rla-sweep server --backend-store-uri` takes; a launch's jobs log through a server's REST API.
STORE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def check_tracking_uri(uri: str, timeout: float = 5.0) -> None:
    """Refuse, in seconds, a launch's --tracking-uri that is not an MLflow server's http(s) URL or whose server does
    not answer. Its jobs log through the server's REST API, so a database URI is refused with the command that
    serves it (it was accepted once, and the jobs' metrics went nowhere)."""
    parsed = urllib.parse.urlparse(uri)
    scheme = parsed.scheme.split("+", 1)[0].lower()
    if scheme in STORE_SCHEMES:
        raise UserError(f"{uri!r} is a store, not a server: a launch's jobs log through an MLflow server. Serve it "
                        f"with `rla-sweep server --backend-store-uri {uri}` and launch with the http://HOST:PORT "
                        "it prints", key="--tracking-uri")
    if scheme not in ("http", "https"):
        raise UserError(f"{uri!r} is not a tracking server's URL; use http(s)://HOST:PORT of an MLflow server "
                        "(`rla-sweep server` starts one), or leave out --tracking-uri to use the sweep's own store",
                        key="--tracking-uri")
    check_server_answers(uri, timeout, "start one with `rla-sweep server` or leave out --tracking-uri to use the "
                                       "embedded one")


def check_server_answers(uri: str, timeout: float = 5.0, remedy: str = "", key: str | None = "--tracking-uri") -> None:
    """A UserError, within `timeout` seconds, unless something answers HTTP at the http(s) `uri` (MLflow's client
    would retry for minutes and end in a traceback); `remedy` ends the message."""
    parsed = urllib.parse.urlparse(uri)
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if not parsed.hostname or port == -1:
        raise UserError(f"{uri!r} is not a valid URL; expected http://HOST:PORT", key=key)
    answer, detail = _health(uri, timeout)
    if answer in ("ok", "http"):  # another HTTP status (a proxy, an MLflow without /health): the client decides
        return
    why = f"it does not speak HTTP: {detail}" if answer == "not-http" else detail
    raise UserError(f"no MLflow server answers at {uri} ({why})" + (f"; {remedy}" if remedy else ""), key=key)


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


def _cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


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
    """An `mlflow server` (SQLite + local artifacts under `root_dir`, 127.0.0.1, free port by default) as a context
    manager.

    `backend_store_uri` replaces the SQLite store (postgresql://..., mysql://...), `artifacts_destination` the
    artifacts folder (a path or an object-store URI; the server proxies it, so clients never need it), `host`
    the loopback interface (0.0.0.0 opens it to the network; `uri` then still names 127.0.0.1, `public_uri`
    this machine's name), `allowed_hosts` MLflow's list of accepted Host headers.
    If a healthy server started by a live process already serves `root_dir`, it is reused (and left
    running at exit); a server whose owner died is stopped and replaced.
    """

    def __init__(self, root_dir: str | Path, *, port: int | None = None, workers: int = 1,
                 startup_timeout: float = 120.0, host: str = HOST, backend_store_uri: str | None = None,
                 artifacts_destination: str | None = None, allowed_hosts: str | None = None):
        self.root = Path(root_dir).resolve()
        self.port = port
        self.workers = workers
        self.startup_timeout = startup_timeout
        self.host = host
        self.backend_store_uri = backend_store_uri
        self.artifacts_destination = artifacts_destination
        self.allowed_hosts = allowed_hosts
        self.proc: subprocess.Popen | None = None
        self.owned = False
        self._prev_handlers: dict[int, object] = {}
        self.restarts = 0
        self._notices: list[str] = []
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._restarting = False
        self._port_chosen = False  # the port came from free_port(), not the user
        self._port_tries = 0

    @property
    def backend_uri(self) -> str:
        return self.backend_store_uri or f"sqlite:///{self.root / 'mlflow.db'}"

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
        """The address this machine reaches the server at (loopback when it listens on every interface)."""
        if self.port is None:
            raise RuntimeError("the tracking server is not started")
        host = HOST if self.host in WILDCARD_HOSTS else self.host
        return f"http://{_url_host(host)}:{self.port}"

    @property
    def public_uri(self) -> str:
        """The address to give other machines: this machine's name when the server listens on every interface."""
        if self.host not in WILDCARD_HOSTS:
            return self.uri
        return f"http://{_url_host(socket.getfqdn())}:{self.port}"

    def read_record(self) -> dict | None:
        try:
            return json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return None

    def serving(self) -> str | None:
        """The URI of a healthy server that a live process runs on this directory, else None (changes nothing). A
        record copied with the folder names the original's server, which runs on another directory: None."""
        rec = self.read_record()
        pid = rec.get("pid") if rec else None
        if rec and self._ours(pid) and is_healthy(rec.get("uri", "")):
            return str(rec["uri"])
        return None

    def reading_uri(self) -> str:
        """Where a reader of this store goes: the server a launch runs on it, else the SQLite file itself (SQLite
        serves readers without a server, which saves its start-up)."""
        return self.serving() or self.backend_uri

    def _ours(self, pid) -> bool:
        """Whether `pid` is a live MLflow server on this directory (its command line or working folder)."""
        return _alive(pid) and "mlflow" in _cmdline(pid) and (str(self.root) in _cmdline(pid) or _cwd(pid) == self.root)

    def _adopt_or_clean(self) -> bool:
        """Reuse a live server for this directory (True) or stop a stale one (False)."""
        rec = self.read_record()
        if not rec:
            return False
        pid, owner = rec.get("pid"), rec.get("owner_pid")
        ours = self._ours(pid)
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

    def start(self, wait: bool = True) -> "TrackingServer":
        """Start (or adopt) the server; with wait=False return once its process is spawned and call
        `wait_until_up()` later: the server's seconds of imports then overlap with other start-up work."""
        try:
            return self._start(wait)
        except OSError as exc:
            # An unwritable folder, a missing interpreter: say what could not start, not a traceback.
            self.stop()
            raise UserError(f"cannot start the MLflow server: {exc.strerror or exc}"
                            + (f" ({exc.filename})" if exc.filename else ""), file=str(self.root)) from None

    def _start(self, wait: bool) -> "TrackingServer":
        if self.proc is not None or self._adopt_or_clean():
            return self
        self._stopping.clear()
        why = cannot_bind(self.host)
        if why is not None:
            raise UserError(f"cannot listen on {self.host}: {why}; give --host an address of this machine (127.0.0.1, "
                            "the default, or 0.0.0.0 for every interface)", key="--host")
        if self.port is not None and port_in_use(self.host, self.port):
            # Whatever answers there is not this store's server: waiting for its /health would show the wrong runs.
            raise UserError(f"port {self.port} on {self.host} is in use by another process (another `rla-sweep ui` "
                            "or server?); pick a free one with --port", key="--port")
        # only now: a refused start leaves no folder behind
        self.root.mkdir(parents=True, exist_ok=True)
        self.artifacts_dir.mkdir(exist_ok=True)
        # PDEATHSIG fires when the creating *thread* exits, so only the main thread may arm it.
        self._port_chosen = self.port is None  # ours to change if another process takes it first
        self._spawn(self.port or free_port(self.host), deathsig=threading.current_thread() is threading.main_thread())
        self._install_handlers()
        if wait:
            self._wait_until_up()
        return self

    def wait_until_up(self) -> "TrackingServer":
        """After `start(wait=False)`: return when the server answers /health (UserError if it exits or times out)."""
        if self.proc is not None:
            self._wait_until_up()
        return self

    def _spawn(self, port: int, *, deathsig: bool) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server",
               "--artifacts-destination", self.artifacts_destination or str(self.artifacts_dir),
               "--serve-artifacts",
               "--host", self.host, "--port", str(port), "--workers", str(self.workers)]
        if self.allowed_hosts:
            cmd += ["--allowed-hosts", self.allowed_hosts]
        # The job-execution runner (GenAI jobs) is an extra process we never use.
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", PYTHONUNBUFFERED="1")
        if self.backend_store_uri:
            # Through the environment: a store URI with a password stays out of the process list.
            env["MLFLOW_BACKEND_STORE_URI"] = self.backend_store_uri
        else:
            cmd[4:4] = ["--backend-store-uri", self.backend_uri]
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=self.root, start_new_session=True,
                                         preexec_fn=_die_with_parent if deathsig else None)
        finally:
            log.close()
        self.port, self.owned = port, True
        atomic_write_text(self.record_path, json.dumps({
            "pid": self.proc.pid, "pgid": self.proc.pid, "owner_pid": os.getpid(), "port": port,
            "uri": self.uri, "backend_uri": redact(self.backend_uri), "host": self.host,
            "started": time.time()}, indent=1))

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not is_healthy(self.uri, timeout=1.0):
            if self._stopping.is_set():
                return
            code = self.proc.poll()
            if code is not None and self._lost_its_port():
                continue  # started again on another free port
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

    PORT_TRIES = 3

    def _lost_its_port(self) -> bool:
        """The server exited because the free port it was given was taken before it bound it (a free port is free
        only when chosen: Ray, starting beside it, opens dozens): spawn it on another, starting it at most
        PORT_TRIES times in all. Never for a port the user named."""
        if not self._port_chosen or self._port_tries + 1 >= self.PORT_TRIES or not port_in_use(self.host, self.port):
            return False
        with self._lock:
            if self._stopping.is_set() or self.proc is None:
                return False
            _kill_group(self.proc.pid, timeout=5.0, proc=self.proc)  # what is left of it, as a restart does
            self._port_tries += 1
            with open(self.log_path, "a") as log:
                log.write(f"\n[rla-sweep] port {self.port} was taken before the server bound it; "
                          "starting it on another\n")
            # PDEATHSIG ties the process to the thread that spawns it: armed only from the main thread, as at start
            self._spawn(free_port(self.host), deathsig=threading.current_thread() is threading.main_thread())
        return True

    # -- supervision ---------------------------------------------------------------------------------------------

    def supervise(self, *, interval_s: float = 1.0, hang_timeout_s: float = 60.0) -> "TrackingServer":
        """Watch the server this object started and start it again, same store and port, when it dies or hangs."""
        if not self.owned or self._watchdog is not None:
            return self
        self._watchdog = threading.Thread(target=self._watch, args=(interval_s, hang_timeout_s),
                                          name="mlflow-watchdog", daemon=True)
        self._watchdog.start()
        return self

    def notices(self) -> list[str]:
        """The restart lines since the last call (one per restart, for the launch's output)."""
        with self._lock:
            out, self._notices = self._notices, []
        return out

    def wait_healthy(self, timeout: float) -> bool:
        """Whether the server answers /health within `timeout` seconds (a restart under way included: its notice
        is in `notices()` once this returns True)."""
        deadline = time.monotonic() + timeout
        while True:
            if (not self._restarting and self.port is not None
                    and is_healthy(self.uri, timeout=min(2.0, max(0.1, timeout)))):
                return True
            if time.monotonic() >= deadline or self._stopping.is_set():
                return False
            time.sleep(0.2)

    def _watch(self, interval_s: float, hang_timeout_s: float) -> None:
        # This thread also starts the replacement servers: it lives as long as they do, so it may arm PDEATHSIG.
        silent_since: float | None = None
        failed = 0
        while not self._stopping.wait(interval_s):
            try:
                proc = self.proc
                if proc is None:
                    return
                code = proc.poll()
                if code is not None:
                    if failed:
                        # A server that keeps failing to start: try again less and less often (at most every 30 s).
                        if self._stopping.wait(min(30.0, 2.0 ** failed)):
                            return
                    failed = 0 if self._restart(f"tracking server died (exit {code})") else failed + 1
                    silent_since = None
                    continue
                if is_healthy(self.uri, timeout=min(2.0, hang_timeout_s)):
                    silent_since = None
                    continue
                now = time.monotonic()
                silent_since = silent_since or now
                if now - silent_since >= hang_timeout_s:
                    self._restart(f"tracking server did not answer for {hang_timeout_s:.0f} s")
                    silent_since = None
            except Exception as exc:  # noqa: BLE001 - the watchdog must outlive any one failed check
                with self._lock:
                    self._notices.append(f"tracking server supervision: {type(exc).__name__}: {exc}")

    def _restart(self, why: str) -> bool:
        """Start the server again; True once it answers."""
        self._restarting = True
        try:
            return self._restart_once(why)
        finally:
            self._restarting = False

    def _restart_once(self, why: str) -> bool:
        with self._lock:
            if self._stopping.is_set() or self.proc is None:
                return False
            # Whatever is left of the old one (a wedged process, an orphaned uvicorn worker) frees the port first.
            _kill_group(self.proc.pid, timeout=5.0, proc=self.proc)
            try:
                self._spawn(self.port or free_port(self.host), deathsig=True)
            except OSError as exc:
                self._notices.append(f"{why}; cannot start it again ({exc.strerror or exc}), trying again")
                return False
            self.restarts += 1
        deadline = time.monotonic() + self.startup_timeout
        while not self._stopping.is_set():
            if is_healthy(self.uri, timeout=1.0):
                with self._lock:
                    self._notices.append(f"{why}; restarted on {self.uri}")
                return True
            code = self.proc.poll() if self.proc is not None else None
            if code is not None or time.monotonic() > deadline:
                with self._lock:
                    self._notices.append(f"{why}; restart on {self.uri} failed "
                                         f"({'exit ' + str(code) if code is not None else 'no answer'}), "
                                         f"trying again; log {self.log_path}")
                return False
            time.sleep(0.25)
        return False

    def stop_soon(self) -> None:
        """Ask the server to exit (SIGTERM to its process group) and return at once: its second or so of shutdown
        then overlaps other work, and `stop()` later finds it gone. Nothing is restarted from here on."""
        with self._lock:  # as in stop(): a replacement started before the flag is the one signalled
            self._stopping.set()
            proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self) -> None:
        # Under the lock: a restart checks the flag and starts its replacement under it, so a replacement either
        # exists before the flag is set (and is stopped below) or is never started.
        with self._lock:
            self._stopping.set()
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog is not threading.current_thread():
            watchdog.join(timeout=self.startup_timeout + 15)
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
