"""`build_dashboard`: every spec of `dashboards/` rendered from a sweep's runs, one HTML page, logged to MLflow."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from rla_ablate.dashboard.html import write_page
from rla_ablate.dashboard.render import Rendered, render
from rla_ablate.dashboard.spec import load_specs
from rla_ablate.errors import UserError

log = logging.getLogger(__name__)
UI_PORT = 5050
UI_URL = f"http://127.0.0.1:{UI_PORT}"


@dataclass
class Dashboard:
    page: Path
    out_dir: Path
    rendered: list[Rendered]
    tracking_uri: str
    logged_to: str | None
    """The parent run the files were logged to, or None when the sweep has none."""
    synced: int = 0
    """Metrics backfilled from the jobs' metrics.jsonl before rendering (after a tracking outage)."""


def sync_jobs(root: Path, sweep: str, uri: str) -> int:
    """Backfill the MLflow runs of the sweep's ended jobs from their metrics.jsonl (running jobs log themselves)."""
    from rla_ablate.tracking.sync import sync_from_jsonl

    total = 0
    for status_path in sorted((root / sweep / "jobs").glob("*/status.json")):
        try:
            status = json.loads(status_path.read_text())
        except ValueError:
            continue
        jsonl = status_path.parent / "metrics.jsonl"
        run_id = status.get("mlflow_run_id")
        if not run_id or not jsonl.exists() or status.get("status") in ("pending", "running"):
            continue
        try:
            total += sync_from_jsonl(uri, run_id, jsonl)
        except Exception as exc:  # noqa: BLE001 - a run the store does not know must not stop the dashboard
            log.warning("could not backfill run %s from %s: %s", run_id, jsonl, exc)
    return total


def sweep_names(root: Path) -> list[str]:
    return sorted(p.parent.name for p in root.glob("*/sweep.json"))


def tracking_of(root: str | Path, sweep: str) -> tuple[str | None, Path | None]:
    """(remote tracking URI, None) for a sweep logged to a shared server, or (None, store dir) for the embedded one."""
    root = Path(root)
    sdir = root / sweep
    meta_path = sdir / "sweep.json"
    if not meta_path.exists():
        known = sweep_names(root)
        hint = (f"; sweeps there: {', '.join(known)}" if known
                else f"; launch one with `rla-sweep launch FILE --root {root}`")
        raise UserError(f"no sweep '{sweep}' under {root.resolve()}{hint}")
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as exc:
        raise UserError(f"unreadable sweep state: {exc}", file=str(meta_path)) from None
    if meta.get("embedded_tracking", True):
        return None, sdir / "mlflow"
    uri = meta.get("tracking_uri")
    if not uri:
        raise UserError("the sweep has no tracking_uri", file=str(meta_path))
    return uri, None


@contextlib.contextmanager
def open_tracking(root: str | Path, sweep: str):
    """The sweep's tracking URI, starting the embedded server on its store when no launch is serving it."""
    uri, store = tracking_of(root, sweep)
    if uri is not None:
        yield uri
        return
    from rla_ablate.tracking import TrackingServer

    if not (store / "mlflow.db").exists():
        raise UserError(f"the sweep '{sweep}' has no tracking store yet ({store / 'mlflow.db'} is missing)")
    with TrackingServer(store) as server:
        yield server.uri


def build_dashboard(sweep: str, root: str | Path = "rla-runs", *, specs_dir: str | Path | None = None,
                    out_dir: str | Path | None = None, tracking_uri: str | None = None, ui_url: str = UI_URL,
                    log_artifacts: bool = True, progress=None) -> Dashboard:
    """Render every spec for `sweep`; `tracking_uri` overrides the sweep's own store (tests, shared servers)."""
    from mlflow.tracking import MlflowClient

    from rla_ablate.tracking.read import SweepRuns

    specs = load_specs(specs_dir)
    root = Path(root)
    out = Path(out_dir) if out_dir else root / sweep / "dashboard"
    ctx = contextlib.nullcontext(tracking_uri) if tracking_uri else open_tracking(root, sweep)
    with ctx as uri:
        synced = 0 if tracking_uri else sync_jobs(root, sweep, uri)
        runs = SweepRuns(uri, sweep)
        if runs.experiment_id is None:
            raise UserError(f"the tracking store {uri} has no experiment for sweep '{sweep}'")
        exp = runs.experiment_id
        planned = root / sweep / "jobs.json"
        if planned.exists():
            try:
                runs.add_planned(json.loads(planned.read_text()))
            except ValueError:
                pass

        def run_url(run_id: str) -> str:
            return f"{ui_url}/#/experiments/{exp}/runs/{run_id}"

        rendered = []
        for spec in specs:
            rendered.append(render(spec, runs, out, run_url))
            if progress is not None:
                progress(spec)
        counts: dict[str, int] = {}
        for r in runs.jobs:
            counts[r.status] = counts.get(r.status, 0) + 1
        page = write_page(out / "index.html", sweep, rendered, tracking=uri, run_url=run_url, n_runs=counts,
                          ui_hint=f"{ui_url} (start it with `rla-sweep ui {sweep}`)")
        logged = None
        if log_artifacts and runs.parent is not None:
            MlflowClient(uri).log_artifacts(runs.parent.run_id, str(out), "dashboard")
            logged = runs.parent.run_id
    return Dashboard(page, out, rendered, uri, logged, synced)
