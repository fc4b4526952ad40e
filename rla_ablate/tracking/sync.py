"""Backfill an MLflow run from its job's `metrics.jsonl` (the ground truth every job writes).

`MLflowLogger` keeps metrics across short outages, but a server that stays away past `close()`'s timeout, or a
job killed with metrics still buffered, leaves the run short of its tail. The logger sends in order, so what is
missing is, per key, the steps after the last one the server holds: only keys whose last step on the server is
behind the file are read back and compared, which keeps a sync of an intact sweep to one request per run.
"""

from __future__ import annotations

from pathlib import Path

import requests

from rla_ablate.tracking.runs import RUN_STATUS, STATUS, STATUS_REASON, json_float

_BATCH = 1000


def _float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def sync_from_jsonl(tracking_uri: str, run_id: str, path: str | Path, *, timeout: float = 30.0,
                    records: list[dict] | None = None) -> int:
    """Upload every (key, step) of `path` that the run lacks; mirror the file's close status if the run is still
    open. Returns the number of metrics uploaded. `records`: the file as the caller already read it."""
    from rla_ablate.train.loggers import last_close, read_jsonl

    api = f"{tracking_uri.rstrip('/')}/api/2.0/mlflow"
    http = requests.Session()
    records = read_jsonl(path) if records is None else records
    last: dict[str, int] = {}
    for r in records:
        if r.get("type") == "metrics":
            for key in r.get("values", {}):
                last[key] = max(last.get(key, -1), int(r["step"]))
    resp = http.get(f"{api}/runs/get", params={"run_id": run_id}, timeout=timeout)
    resp.raise_for_status()
    run = resp.json()["run"]
    on_server = {m["key"]: int(m.get("step", 0)) for m in run.get("data", {}).get("metrics", [])}
    lagging = {k for k, step in last.items() if on_server.get(k, -1) < step}
    have: dict[str, set[int]] = {}
    for key in lagging & on_server.keys():
        steps, token = set(), None
        while True:
            params = {"run_id": run_id, "metric_key": key, "max_results": 25000}
            if token:
                params["page_token"] = token
            body = http.get(f"{api}/metrics/get-history", params=params, timeout=timeout).json()
            steps.update(int(m.get("step", 0)) for m in body.get("metrics", []))
            token = body.get("next_page_token")
            if not token:
                break
        have[key] = steps
    missing = []
    for r in records:
        if r.get("type") != "metrics":
            continue
        step, ts = int(r["step"]), int(float(r.get("time", 0)) * 1000)
        for key, value in r.get("values", {}).items():
            v = _float(value)
            if key in lagging and v is not None and step not in have.setdefault(key, set()):
                have[key].add(step)
                missing.append({"key": key, "value": json_float(v), "timestamp": ts, "step": step})
    for i in range(0, len(missing), _BATCH):
        http.post(f"{api}/runs/log-batch", json={"run_id": run_id, "metrics": missing[i:i + _BATCH]},
                  timeout=timeout).raise_for_status()
    c = last_close(records)
    if c and run["info"]["status"] in ("RUNNING", "SCHEDULED"):
        status = str(c.get("status") or "failed")
        tags = [{"key": STATUS, "value": status}, {"key": STATUS_REASON, "value": str(c.get("reason") or "")[:8000]}]
        http.post(f"{api}/runs/log-batch", json={"run_id": run_id, "tags": tags}, timeout=timeout).raise_for_status()
        http.post(f"{api}/runs/update", json={"run_id": run_id, "status": RUN_STATUS.get(status, "FAILED"),
                                              "end_time": int(float(c.get("time", 0)) * 1000)},
                  timeout=timeout).raise_for_status()
    return len(missing)
