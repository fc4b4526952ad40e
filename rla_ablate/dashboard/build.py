"""`build_dashboard`: every spec of `dashboards/` rendered from a sweep's runs, one HTML page, logged to MLflow.

The sweep folder is read through `SweepDir` (sweep.json for the tracking store, jobs.json for the current
expansion, each job's status.json and job.json), never by opening its files here.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from rla_ablate.dashboard.html import write_page
from rla_ablate.dashboard.render import Rendered, render
from rla_ablate.dashboard.spec import load_specs
from rla_ablate.errors import UserError
from rla_ablate.sweep.state import SweepDir

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
    notes: list[str] = field(default_factory=list)
    """What the page says about the selection (runs of older sweep versions left out or shown)."""

    @property
    def verdicts(self) -> list:
        return [v for r in self.rendered for v in r.verdicts]


def sync_jobs(sdir: SweepDir, uri: str, job_ids: list[str] | None = None) -> int:
    """Backfill the MLflow runs of the sweep's ended jobs from their metrics.jsonl (running jobs log themselves);
    `job_ids` default to the current expansion."""
    from rla_ablate.tracking.sync import sync_from_jsonl

    total = 0
    ids = job_ids if job_ids is not None else [str(rec.get("job_id")) for rec in sdir.job_list()]
    for job_id in ids:
        status = sdir.status(job_id)
        jsonl = sdir.job_dir(job_id) / "metrics.jsonl"
        if not status.mlflow_run_id or not jsonl.exists() or status.status in ("pending", "running"):
            continue
        try:
            total += sync_from_jsonl(uri, status.mlflow_run_id, jsonl)
        except Exception as exc:  # noqa: BLE001 - a run the store does not know must not stop the dashboard
            log.warning("could not backfill run %s from %s: %s", status.mlflow_run_id, jsonl, exc)
    return total


def sweep_names(root: Path) -> list[str]:
    return sorted(p.parent.name for p in Path(root).glob("*/sweep.json"))


def open_sweep_dir(root: str | Path, sweep: str) -> SweepDir:
    """The sweep's folder, or a UserError naming the sweeps that exist under `root`."""
    sdir = SweepDir(root, sweep)
    if not sdir.exists():
        known = sweep_names(sdir.root)
        hint = (f"; sweeps there: {', '.join(known)}" if known
                else f"; launch one with `rla-sweep launch FILE --root {root}`")
        raise UserError(f"no sweep '{sweep}' under {sdir.root}{hint}")
    return sdir


def tracking_of(root: str | Path, sweep: str) -> tuple[str | None, Path | None]:
    """(remote tracking URI, None) for a sweep logged to a shared server, or (None, store dir) for the embedded one."""
    sdir = open_sweep_dir(root, sweep)
    meta = sdir.meta()
    if not meta:
        raise UserError("unreadable sweep state", file=str(sdir.path / "sweep.json"))
    if meta.get("embedded_tracking", True):
        return None, sdir.mlflow_dir
    uri = meta.get("tracking_uri")
    if not uri:
        raise UserError("the sweep has no tracking_uri", file=str(sdir.path / "sweep.json"))
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


def read_runs(sweep: str, root: str | Path, uri: str, *, include_stale: bool = False, planned: bool = True):
    """The sweep's runs as a dashboard reads them: the current expansion's (older versions' with `include_stale`),
    identified (`rla_ablate.dashboard.selection`). Returns (SweepRuns, Selection)."""
    from rla_ablate.dashboard.selection import select_runs
    from rla_ablate.tracking.read import SweepRuns

    runs = SweepRuns(uri, sweep)
    if runs.experiment_id is None:
        raise UserError(f"the tracking store {uri} has no experiment for sweep '{sweep}'")
    sdir = SweepDir(root, sweep)
    selection = select_runs(runs, sdir if sdir.path.is_dir() else None, include_stale, planned=planned)
    return runs, selection


def build_dashboard(sweep: str, root: str | Path = "rla-runs", *, specs_dir: str | Path | None = None,
                    out_dir: str | Path | None = None, tracking_uri: str | None = None, ui_url: str = UI_URL,
                    log_artifacts: bool = True, progress=None, include_stale: bool = False) -> Dashboard:
    """Render every spec for `sweep`; `tracking_uri` overrides the sweep's own store (tests, shared servers).

    Only the runs of the current expansion (ROOT/SWEEP/jobs.json) are read unless `include_stale`."""
    from mlflow.tracking import MlflowClient

    specs = load_specs(specs_dir)
    root = Path(root)
    sdir = SweepDir(root, sweep)
    out = Path(out_dir) if out_dir else sdir.path / "dashboard"
    ctx = contextlib.nullcontext(tracking_uri) if tracking_uri else open_tracking(root, sweep)
    hint = f"start it with `rla-sweep ui {sweep}`"
    if not tracking_uri and ui_url == UI_URL:
        # A sweep logged to a shared server (`rla-sweep server`): its links open that server's UI, never whatever
        # answers on the embedded stores' UI port.
        shared, _ = tracking_of(root, sweep)
        if shared is not None and shared.startswith(("http://", "https://")):
            ui_url, hint = shared.rstrip("/"), "the shared tracking server"
    with ctx as uri:
        synced = 0 if tracking_uri else sync_jobs(sdir, uri)
        runs, selection = read_runs(sweep, root, uri, include_stale=include_stale)
        exp = runs.experiment_id

        def run_url(run_id: str) -> str:
            return f"{ui_url}/#/experiments/{exp}/runs/{run_id}"

        rendered = []
        validity: dict = {}
        for spec in specs:
            rendered.append(render(spec, runs, out, run_url, validity))
            if progress is not None:
                progress(spec)
        counts: dict[str, int] = {}
        for r in runs.jobs:
            counts[r.status] = counts.get(r.status, 0) + 1
        notes = selection.notes()
        page = write_page(out / "index.html", sweep, rendered, tracking=uri, run_url=run_url, n_runs=counts,
                          ui_hint=f"{ui_url} ({hint})", notes=notes)
        (out / "verdicts.json").write_text(json.dumps([v.as_dict() for r in rendered for v in r.verdicts], indent=1))
        logged = None
        if log_artifacts and runs.parent is not None:
            MlflowClient(uri).log_artifacts(runs.parent.run_id, str(out), "dashboard")
            logged = runs.parent.run_id
    return Dashboard(page, out, rendered, uri, logged, synced, notes)
