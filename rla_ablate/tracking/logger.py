"""`MLflowLogger`: the training job's `MetricLogger`, writing to an MLflow run over HTTP.

`log()` only appends to a buffer; a background thread sends the buffer with `runs/log-batch` (up to
1000 metrics a request) every `flush_interval_s`. When the server cannot be reached the buffer is kept
and retried with backoff, so nothing is lost. Nothing is duplicated either: a metric carries its
timestamp from `log()` time, and after any failed request (which may have been committed before the
connection broke) or when the run already has metrics (a resumed job re-logs the steps after its
checkpoint), pending metrics whose (key, step) the server already holds are dropped.

Every request has a timeout (`request_timeout_s`) and `close()` waits at most `close_timeout_s`, so a server that
is down or stopped (SIGSTOP) never holds a job up for longer than that: what is not delivered by then stays in the
job's metrics.jsonl, from which the launch backfills the run (`rla_ablate.tracking.sync`) once the server answers.
"""

from __future__ import annotations

import atexit
import json
import logging
import socket
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import requests

from rla_ablate.outcome import Status
from rla_ablate.tracking.runs import BACKEND, GLUE, HOST, RUN_STATUS, STATUS, STATUS_REASON, json_float

log = logging.getLogger(__name__)

_BATCH = 1000
_MAX_TAGS = 100


class _UnknownRun(Exception):
    pass


class MLflowLogger:
    """MetricLogger for one MLflow run: `log(metrics, step)`, `event(name, step, detail)`, `close(status, reason)`."""

    def __init__(self, tracking_uri: str, run_id: str, *, flush_interval_s: float = 2.0,
                 system_metrics_interval_s: float | None = 30.0, request_timeout_s: float = 10.0,
                 close_timeout_s: float = 120.0, backfill: str | Path | None = None):
        self.uri = tracking_uri.rstrip("/")
        # A resumed job's metrics.jsonl: what earlier attempts wrote is uploaded before anything this logger sends.
        self.backfill = Path(backfill) if backfill is not None else None
        self.run_id = run_id
        self.flush_interval_s = flush_interval_s
        self.system_metrics_interval_s = system_metrics_interval_s
        self.request_timeout_s = request_timeout_s
        self.close_timeout_s = close_timeout_s
        self._http = requests.Session()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pending: list[dict[str, Any]] = []
        self._pending_tags: dict[str, str] = {HOST: socket.gethostname()}
        self._events: list[dict[str, Any]] = []
        self._events_sent = 0
        # One file per attempt (sorted by start time): a resumed job must not overwrite its earlier attempts' events.
        self._events_artifact = f"events/{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:12]}.jsonl"
        # key -> steps the server holds; read back only when needed (resume, or after a failed request), never
        # grown per send, so a long run does not accumulate its whole history in memory.
        self._server_steps: dict[str, set[int]] = {}
        self._verify = True
        self._opened = False
        self._artifact_uri: str | None = None
        self._last_step = 0
        self._last_system_step: int | None = None
        self._last_system_time = 0.0
        self.sent = 0
        self.failures = 0
        self._closed = False
        # Set when the server does not know the run: nothing can ever be delivered.
        self._dead = False
        self._thread = threading.Thread(target=self._run, name=f"mlflow-logger-{run_id[:8]}", daemon=True)
        self._thread.start()
        atexit.register(self._flush_at_exit)

    def _flush_at_exit(self) -> None:
        # A job process that ends without close() still gets its buffer out (the run stays RUNNING: no status).
        if not self._closed:
            self.flush(timeout=10.0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._dead:
            return
        ts = int(time.time() * 1000)
        rows = []
        for key, value in metrics.items():
            try:
                rows.append({"key": key, "value": float(value), "timestamp": ts, "step": int(step)})
            except (TypeError, ValueError):
                continue
        with self._lock:
            self._pending.extend(rows)
            self._last_step = max(self._last_step, int(step))
            big = len(self._pending) >= _BATCH
        if big:
            self._wake.set()

    def event(self, name: str, step: int, detail: dict | None = None) -> None:
        detail = dict(detail or {})
        with self._lock:
            self._events.append({"name": name, "step": int(step), "time": time.time(), "detail": detail})
            self._pending_tags[f"event.{name}"] = str(step)
            if "backend" in detail:
                self._pending_tags[BACKEND] = str(detail["backend"])
            if "glue" in detail:
                self._pending_tags[GLUE] = str(detail["glue"])
        self._wake.set()

    def set_tags(self, tags: dict[str, Any]) -> None:
        with self._lock:
            self._pending_tags.update({str(k): str(v) for k, v in tags.items()})
        self._wake.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything buffered; True when the buffer is empty (False after `timeout` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._dead:
                return False
            with self._lock:
                empty = not self._pending and not self._pending_tags and self._opened
            if empty:
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            self._wake.set()
            time.sleep(0.05)

    def close(self, status: str = Status.FINISHED, reason: str | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._flush_at_exit)
        if self._dead:
            return
        self.set_tags({STATUS: status, STATUS_REASON: reason or ""})
        done = self.flush(self.close_timeout_s)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self.request_timeout_s + 5)
        if not done:
            with self._lock:
                lost = len(self._pending)
            log.error("MLflow server %s unreachable for %.0f s: %d metrics of run %s not sent (the job's "
                      "metrics.jsonl has them)", self.uri, self.close_timeout_s, lost, self.run_id)
            return
        try:
            self._upload_events()
            self._post("runs/update", {"run_id": self.run_id, "status": RUN_STATUS.get(status, "FAILED"),
                                       "end_time": int(time.time() * 1000)})
        except Exception as exc:  # noqa: BLE001 - the launch closes the run from metrics.jsonl instead
            log.error("could not mark MLflow run %s as %s: %s", self.run_id, status, exc)

    def _post(self, endpoint: str, body: dict) -> dict:
        resp = self._http.post(f"{self.uri}/api/2.0/mlflow/{endpoint}", json=body, timeout=self.request_timeout_s)
        resp.raise_for_status()
        return resp.json() if resp.content else {}

    def _get(self, endpoint: str, params: dict) -> dict:
        resp = self._http.get(f"{self.uri}/api/2.0/mlflow/{endpoint}", params=params, timeout=self.request_timeout_s)
        resp.raise_for_status()
        return resp.json()

    def _history_steps(self, key: str) -> set[int]:
        steps: set[int] = set()
        token = None
        while True:
            params = {"run_id": self.run_id, "metric_key": key, "max_results": 25000}
            if token:
                params["page_token"] = token
            body = self._get("metrics/get-history", params)
            steps.update(int(m.get("step", 0)) for m in body.get("metrics", []))
            token = body.get("next_page_token")
            if not token:
                return steps

    def _open(self) -> None:
        """First contact: backfill from metrics.jsonl, mark the run running and learn what it already holds.

        Retried until it succeeds, so the run always holds the file's history before the first metric this logger
        sends: the backfill's rule (a key is complete up to the last step the run holds) stays true."""
        try:
            run = self._get("runs/get", {"run_id": self.run_id})["run"]
        except requests.HTTPError as exc:
            # The server answers but does not know the run: retrying cannot help.
            if exc.response is not None and 400 <= exc.response.status_code < 500:
                raise _UnknownRun(exc.response.text[:300]) from None
            raise
        if self.backfill is not None and self.backfill.exists():
            from rla_ablate.tracking.sync import sync_from_jsonl

            if sync_from_jsonl(self.uri, self.run_id, self.backfill, timeout=self.request_timeout_s):
                run = self._get("runs/get", {"run_id": self.run_id})["run"]
        self._artifact_uri = run.get("info", {}).get("artifact_uri")
        for m in run.get("data", {}).get("metrics", []):
            self._server_steps[m["key"]] = self._history_steps(m["key"])
        self._post("runs/update", {"run_id": self.run_id, "status": "RUNNING"})
        self._opened = True
        self._verify = False

    def _refresh(self, keys: set[str]) -> None:
        for key in keys:
            self._server_steps[key] = self._history_steps(key)
        self._verify = False

    def _send_once(self) -> None:
        if not self._opened:
            self._open()
        with self._lock:
            tags = dict(list(self._pending_tags.items())[:_MAX_TAGS])
            # MLflow caps a log-batch request at 1000 entities, metrics and tags together.
            batch = list(self._pending[:_BATCH - len(tags)])
        if self._verify:
            self._refresh({m["key"] for m in batch})
        fresh = [m for m in batch if m["step"] not in self._server_steps.get(m["key"], ())]
        body: dict[str, Any] = {"run_id": self.run_id,
                                "metrics": [dict(m, value=json_float(m["value"])) for m in fresh]}
        if tags:
            body["tags"] = [{"key": k, "value": v[:8000]} for k, v in tags.items()]
        if fresh or tags:
            try:
                self._post("runs/log-batch", body)
            except requests.HTTPError as exc:
                if exc.response is None or exc.response.status_code >= 500:
                    raise
                self._send_individually(fresh, tags, exc)
        with self._lock:
            del self._pending[:len(batch)]
            for k, v in tags.items():
                if self._pending_tags.get(k) == v:
                    del self._pending_tags[k]
        self.sent += len(fresh)

    def _send_individually(self, metrics: list[dict], tags: dict, exc: Exception) -> None:
        # A 4xx rejects the whole batch; find the offending entries instead of retrying them forever.
        log.warning("MLflow rejected a batch for run %s (%s); sending entries one by one", self.run_id, exc)
        for m in metrics:
            try:
                one = [dict(m, value=json_float(m["value"]))]
                self._post("runs/log-batch", {"run_id": self.run_id, "metrics": one})
            except requests.HTTPError as err:
                if err.response is None or err.response.status_code >= 500:
                    raise
                log.warning("dropping metric %s@%s: %s", m["key"], m["step"], err.response.text[:200])
        for k, v in tags.items():
            try:
                self._post("runs/set-tag", {"run_id": self.run_id, "key": k, "value": v[:8000]})
            except requests.HTTPError as one:
                if one.response is None or one.response.status_code >= 500:
                    raise
                log.warning("dropping tag %s: %s", k, one.response.text[:200])

    def _upload_events(self) -> None:
        with self._lock:
            events = list(self._events)
        if len(events) == self._events_sent:
            return
        text = "".join(json.dumps(e, default=str) + "\n" for e in events)
        parsed = urllib.parse.urlparse(self._artifact_uri or "")
        if parsed.scheme == "mlflow-artifacts":
            # Served by the tracking server itself: one PUT, under this logger's request timeout.
            path = f"{parsed.path.strip('/')}/{self._events_artifact}"
            base = f"http://{parsed.netloc}" if parsed.netloc else self.uri
            resp = self._http.put(f"{base}/api/2.0/mlflow-artifacts/artifacts/{path}", data=text.encode(),
                                  headers={"Content-Type": "text/plain"}, timeout=self.request_timeout_s)
            resp.raise_for_status()
        else:
            # Another artifact store (S3, a shared folder): MLflow's client knows how to write to it.
            from mlflow.tracking import MlflowClient
            MlflowClient(self.uri).log_text(self.run_id, text, self._events_artifact)
        self._events_sent = len(events)

    def _sample_system(self) -> None:
        if self.system_metrics_interval_s is None:
            return
        now = time.monotonic()
        step = self._last_step
        if now - self._last_system_time < self.system_metrics_interval_s or step == self._last_system_step:
            return
        self._last_system_time, self._last_system_step = now, step
        self.log(system_metrics(), step)

    def _run(self) -> None:
        backoff = 0.5
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._sample_system()
            except Exception as exc:  # noqa: BLE001 - a broken sensor must never stop metric logging
                log.debug("system metrics failed: %s", exc)
            while True:
                with self._lock:
                    work = bool(self._pending or self._pending_tags) or not self._opened
                if not work or self._stop.is_set():
                    break
                try:
                    self._send_once()
                    backoff = 0.5
                except _UnknownRun as exc:
                    with self._lock:
                        lost = len(self._pending)
                        self._pending.clear()
                        self._pending_tags.clear()
                    self._opened = self._dead = True
                    log.error("MLflow server %s has no run %s (%s): dropping %d metrics (the job's metrics.jsonl "
                              "has them)", self.uri, self.run_id, exc, lost)
                    self._stop.set()
                    return
                except (requests.RequestException, KeyError, ValueError) as exc:
                    self.failures += 1
                    # The failed request may have been committed before the connection broke.
                    self._verify = True
                    log.warning("MLflow server %s unreachable (%s); retrying in %.1f s", self.uri,
                                type(exc).__name__, backoff)
                    if self._stop.wait(backoff):
                        return
                    backoff = min(backoff * 2, 10.0)


def system_metrics() -> dict[str, float]:
    """CPU and memory of this host and process; memory and utilization of the GPUs this process uses."""
    import psutil

    out = {"system/cpu_percent": psutil.cpu_percent(interval=None),
           "system/memory_percent": psutil.virtual_memory().percent,
           "system/process_rss_gb": psutil.Process().memory_info().rss / 2**30}
    import sys
    torch = sys.modules.get("torch")
    # Only look at GPUs when the job already initialized CUDA: never create a context here.
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            out[f"system/gpu{i}_memory_gb"] = torch.cuda.memory_allocated(i) / 2**30
            out[f"system/gpu{i}_max_memory_gb"] = torch.cuda.max_memory_allocated(i) / 2**30
            try:
                out[f"system/gpu{i}_utilization"] = float(torch.cuda.utilization(i))
            except Exception:  # noqa: BLE001 - needs pynvml, which is optional
                pass
    return out
