"""`build_dashboard`: every spec of `dashboards/` rendered from a sweep's runs, one HTML page, logged to MLflow.

The sweep folder is read through `SweepDir` (sweep.json for the tracking store, jobs.json for the current
expansion, each job's status.json and job.json), never by opening its files here.

Only the specs the sweep has something to compare for are drawn (`render.has_comparison`); the claims it cannot
test are listed, one line each with the runs they need (`coverage.Untested`), on the page, in `notes` and in
verdicts.json. Each phase (starting the tracking server, reading the runs, rendering, writing, logging) is
announced as it starts through `phase`, by default one line on stderr, so a dashboard that takes half a minute
says what it is doing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from rla_ablate.dashboard.coverage import Untested
from rla_ablate.dashboard.html import write_page
from rla_ablate.dashboard.reading import check_answers, open_tracking, read_runs, tracking_of
from rla_ablate.dashboard.render import Rendered, has_comparison, render, validity_index
from rla_ablate.dashboard.search import search_part
from rla_ablate.dashboard.spec import load_specs, spec_dir
from rla_ablate.dashboard.verdict import adjust_for_many, evaluate
from rla_ablate.errors import UserError
from rla_ablate.fileio import shell_arg
from rla_ablate.sweep.state import SweepDir
from rla_ablate.tracking.runs import JOB_ID

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
    """What the page says about the selection (runs of older sweep versions left out or shown), then the claims
    this sweep cannot test, one line each after a heading line."""
    untested: list[Untested] = field(default_factory=list)
    """Every claim (and spec without claims) the sweep has no runs for: not drawn, no verdict."""
    own_store: bool = False
    """Read from the sweep's own (embedded) store, which `rla-sweep ui` serves; not a shared server or
    --tracking-uri."""

    @property
    def verdicts(self) -> list:
        return [v for r in self.rendered for v in r.verdicts]


def off_jobs(runs, cache: dict) -> set[str]:
    """The job ids whose runs had the mechanism off (the validity panel's default thresholds; `cache` as the specs
    share it): a search's trials are each their own series, checked as the panel checks them."""
    from types import SimpleNamespace

    from rla_ablate.dashboard import validity as V
    from rla_ablate.dashboard.spec import ValidityThresholds

    index = validity_index(cast(Any, SimpleNamespace(validity=ValidityThresholds())), runs, cache)
    return {r.tags.get(JOB_ID) for s in index.everything if (v := index.of(s)) is not None and v.state == V.OFF
            for r in s.runs}


def untested_lines(untested: list[Untested], n_specs: int, search: bool = False) -> list[str]:
    """A heading and one line per claim the sweep cannot test ([] when it tests every one). `search`: the sweep is
    a search, whose file holds no ablations or controls (the runs come from a grid sweep instead)."""
    if not untested:
        return []
    claims = sum(u.claim is not None for u in untested)
    skipped = len({u.spec for u in untested if not u.drawn})
    head = (f"not tested by this sweep: {claims} claim{'s' if claims != 1 else ''}"
            + (f"; {skipped} of {n_specs} specs {'has' if skipped == 1 else 'have'} nothing to compare here and "
               f"{'is' if skipped == 1 else 'are'} not drawn" if skipped else "")
            + (" (each needs the runs named, from a grid sweep: a search file holds no ablations or controls; the "
               "page lists them)" if search else " (each needs the runs named; add them to the sweep file and "
                                                 "relaunch: only new jobs run)"))
    # a search can test none of them, whatever it runs: one line, not a list of edits it cannot make
    return [head] if search else [head] + [f"  {u.line()}" for u in untested]


def say(text: str) -> None:
    """The default `phase` of `build_dashboard`: one line on stderr, at once."""
    print(f"dashboard: {text}", file=sys.stderr, flush=True)


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


def build_dashboard(sweep: str, root: str | Path = "rla-runs", *, specs_dir: str | Path | None = None,
                    out_dir: str | Path | None = None, tracking_uri: str | None = None, ui_url: str = UI_URL,
                    log_artifacts: bool = True, progress=None, include_stale: bool = False,
                    phase: Callable[[str], None] | None = say) -> Dashboard:
    """Render every spec for `sweep` that it has something to compare for; `tracking_uri` overrides the sweep's
    own store (tests, shared servers). `progress(spec)` is called after each spec, `phase(text)` as each phase
    starts (None: silent).

    Only the runs of the current expansion (ROOT/SWEEP/jobs.json) are read unless `include_stale`."""
    from mlflow.tracking import MlflowClient

    tell = phase or (lambda text: None)
    specs = load_specs(specs_dir)
    root = Path(root)
    sdir = SweepDir(root, sweep)
    folder = dashboard_folder(specs_dir)
    claim_folder(sdir, folder, specs_dir)
    out = Path(out_dir) if out_dir else sdir.path / folder
    hint = f"start it with `rla-sweep ui {sweep}" + (f" --root {shell_arg(root)}" if str(root) != "rla-runs" else "") + "`"
    shared, store = None, None
    if not tracking_uri:
        shared, store = tracking_of(root, sweep)
    # a sweep folder this user cannot write (another's, a read-only copy): its store is read as it is, without a
    # server (which writes its log there), a backfill or the page logged to its parent run
    read_only = not tracking_uri and shared is None and store is not None and store.is_dir() \
        and not os.access(store, os.W_OK)
    ctx = contextlib.nullcontext(tracking_uri) if tracking_uri else open_tracking(root, sweep, read_only=read_only)
    # a launch or `rla-sweep ui` already serving the store: its server is used, and left running
    running = None
    if not tracking_uri and shared is None and not read_only and store is not None:
        from rla_ablate.tracking.server import TrackingServer

        running = TrackingServer(store).serving()
    if not tracking_uri:
        tell(f"reading the sweep's store {store} as it is (its folder is read-only)" if read_only else
             f"using the MLflow server that serves the sweep's store, {running}" if running else
             f"starting an MLflow server on the sweep's store {store}" if shared is None
             else f"reading from the tracking server {shared}")
    if not tracking_uri and ui_url == UI_URL:
        # A sweep logged to a shared server (`rla-sweep server`): its links open that server's UI, never whatever
        # answers on the embedded stores' UI port.
        if shared is not None and shared.startswith(("http://", "https://")):
            ui_url, hint = shared.rstrip("/"), "the shared tracking server"
    with ctx as uri:
        tell(f"reading the runs of sweep '{sweep}'" + ("" if tracking_uri else
                                                        " (after adding what a job's metrics.jsonl has and MLflow lacks)"))
        check_answers(sweep, root, uri)  # before the backfill, which would warn once per run
        synced = 0 if tracking_uri or read_only else sync_jobs(sdir, uri)
        runs, selection = read_runs(sweep, root, uri, include_stale=include_stale, checked=True)
        exp = runs.experiment_id
        counts: dict[str, int] = {}
        for r in runs.jobs:
            counts[r.status] = counts.get(r.status, 0) + 1

        def run_url(run_id: str) -> str:
            return f"{ui_url}/#/experiments/{exp}/runs/{run_id}"

        validity: dict = {}
        drawn = [has_comparison(spec, runs, validity_index(spec, runs, validity)) for spec in specs]
        n_drawn = sum(drawn)
        status = ", ".join(f"{n} {st}" for st, n in sorted(counts.items())) or "none"
        searched = sdir.optuna_path.is_file()  # a search sweep: its study's figure besides (search_part)
        tell(f"rendering {n_drawn} of {len(specs)} specs" + (" and the search's figure" if searched else "")
             + f" from {len(runs.jobs)} jobs ({status})"
             + (f"; {len(specs) - n_drawn} {'has' if len(specs) - n_drawn == 1 else 'have'} nothing to compare in "
                "this sweep" if n_drawn < len(specs) else ""))
        # every verdict first, so that each figure's footer can give its q among all the dashboard's claims
        evaluated = [evaluate(spec, runs, validity_index(spec, runs, validity), drawn=draw)
                     for spec, draw in zip(specs, drawn)]
        many = adjust_for_many([v for (verdicts, _), draw in zip(evaluated, drawn) if draw for v in verdicts])
        every = []
        for spec, draw, ev in zip(specs, drawn, evaluated):
            every.append(render(spec, runs, out, run_url, validity, drawn=draw, evaluated=ev))
            if progress is not None:
                progress(spec)
        rendered = [r for r in every if r.drawn]
        untested = [u for r in every for u in r.untested]
        notes = selection.notes() + many
        search = search_part(sdir, out, run_url, {r.tags.get(JOB_ID): r.run_id for r in runs.jobs if r.run_id},
                             lambda: off_jobs(runs, validity))
        if search is not None:  # a search file holds no ablations, controls or grid: no such edit to suggest
            notes.insert(0, search.note)
            untested = [dataclasses.replace(u, hint="") for u in untested]
            if search.section is not None:
                rendered.insert(0, search.section)
        tell(f"writing {out / 'index.html'} and verdicts.json")
        out.mkdir(parents=True, exist_ok=True)          # no spec drawn: the page still lists what was not tested
        # the embedded store's server lives only while this command runs: the page names the store it read
        source = uri if tracking_uri or shared is not None else f"the sweep's MLflow store {store}"
        page = write_page(out / "index.html", sweep, rendered, tracking=source, run_url=run_url, n_runs=counts,
                          ui_hint=f"{ui_url} ({hint})", notes=notes, untested=untested)
        records = [v.as_dict() for r in rendered for v in r.verdicts] + [u.as_dict() for u in untested if u.claim]
        (out / "verdicts.json").write_text(json.dumps(records, indent=1))
        _forget_old_figures(out, rendered)
        logged, unlogged = None, []
        if read_only:
            unlogged.append("the sweep's folder is read-only: this page is not logged to its MLflow store, and runs "
                            "were read as the store holds them (not backfilled from each job's metrics.jsonl)")
        elif log_artifacts and runs.parent is not None:
            tell("logging the files to the sweep's parent run in MLflow")
            logged = _log_files(MlflowClient(uri), runs.parent.run_id, out, folder, uri, sweep, unlogged)
        if not tracking_uri and shared is None and not read_only and not running:
            tell("stopping the MLflow server")
    return Dashboard(page, out, rendered, uri, logged, synced,
                     unlogged + notes + untested_lines(untested, len(specs), search=search is not None), untested,
                     own_store=not tracking_uri and shared is None)


FIGURES = "figures.json"


def dashboard_folder(specs_dir: str | Path | None) -> str:
    """Where a sweep's dashboard of these specs goes, under the sweep's folder and in its parent MLflow run:
    `dashboard` for the repository's specs, `dashboard-<folder name>` for another folder of specs (`--specs
    dashboards/questions`: dashboard-questions), so that rendering one set never replaces the page of another."""
    if specs_dir is None or Path(specs_dir).resolve() == spec_dir().resolve():
        return "dashboard"
    return f"dashboard-{Path(specs_dir).resolve().name}"


FOLDERS = "dashboards.json"  # in the sweep's folder: {page folder: the specs folder it was rendered from}


def claim_folder(sdir: SweepDir, folder: str, specs_dir: str | Path | None) -> None:
    """Record which specs folder renders into `folder` (the page under the sweep and the folder of its parent MLflow
    run), refusing a second folder of the same name (`a/specs`, `b/specs`): its page would delete the other's
    figures. A sweep folder this user cannot write records nothing."""
    from rla_ablate.sweep.state import read_json, write_json

    if folder == "dashboard":  # the repository's specs, wherever it is installed
        return
    path = sdir.path / FOLDERS
    specs = str((Path(specs_dir) if specs_dir else spec_dir()).resolve())
    claimed = read_json(path, default={})
    claimed = claimed if isinstance(claimed, dict) else {}
    if claimed.get(folder, specs) != specs:
        raise UserError(f"the sweep's {folder} is the page of the specs in {claimed[folder]}; these ({specs}) have "
                        f"the same folder name and would replace its figures: rename their folder (or, if those "
                        f"specs moved here, remove {folder!r} from {path})", key="--specs")
    if folder not in claimed and sdir.path.is_dir() and os.access(sdir.path, os.W_OK):
        write_json(path, {**claimed, folder: specs})


def _figure_names(manifest) -> list[str]:
    """The figures a FIGURES manifest lists (its JSON, parsed), read defensively: plain .png/.svg names in this
    folder only, whatever else the file holds."""
    names = manifest if isinstance(manifest, list) else []
    return [n for n in names if isinstance(n, str) and "/" not in n and n.endswith((".png", ".svg"))]


def _forget_old_figures(out: Path, rendered) -> None:
    """Remove the figures an earlier render wrote into `out` that this one did not (another --specs, a spec renamed):
    left there, they sat beside the page as if current. Only files listed in the earlier render's FIGURES go, so
    a user's own files in an --out folder are never touched."""
    written = sorted({p.name for r in rendered for p in (r.png, r.svg) if p is not None})
    manifest = out / FIGURES
    try:
        before = json.loads(manifest.read_text(encoding="utf-8")) if manifest.is_file() else []
    except (OSError, ValueError):
        before = []
    for name in _figure_names(before):
        if name not in written:
            (out / name).unlink(missing_ok=True)
    manifest.write_text(json.dumps(written, indent=1))


def _log_files(client, run_id: str, out: Path, folder: str, uri: str, sweep: str, unlogged: list[str]) -> str | None:
    """Log the dashboard's files to the sweep's parent run, under `folder` (`dashboard_folder`); returns its id, or
    None with the reason in `unlogged`.

    A launch's runs keep their artifacts behind its MLflow server (`mlflow-artifacts:` URIs): a client that reads
    the store directly (`--tracking-uri sqlite:///...`) can read their metrics but not write their files. The page
    is written either way, so that is a note, not a failure."""
    from mlflow.exceptions import MlflowException

    logged_before = _logged_figures(client, run_id, folder)
    try:
        client.log_artifacts(run_id, str(out), folder)
    except MlflowException as err:
        if "mlflow-artifacts" not in str(err):
            raise
        unlogged.append(f"not logged to MLflow: the sweep's files are served by its MLflow server, which {uri} "
                        f"bypasses; without --tracking-uri (or with the server's http:// address) the files are "
                        f"logged to the parent run of '{sweep}'")
        return None
    _forget_old_logged_figures(client, run_id, out, folder, uri, logged_before, unlogged)
    return run_id


def _logged_figures(client, run_id: str, folder: str) -> list[str]:
    """The figures the last render logged to the run's `folder` (its figures.json); none if it logged none."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as tmp:
            names = json.loads(Path(client.download_artifacts(run_id, f"{folder}/{FIGURES}", tmp)).read_text())
    except Exception:  # no earlier render logged here, or its manifest is unreadable: nothing to forget
        return []
    return _figure_names(names)


def _forget_old_logged_figures(client, run_id: str, out: Path, folder: str, uri: str, logged_before: list[str],
                               unlogged: list[str]) -> None:
    """Delete from the run the figures the last render logged (`logged_before`, its manifest) and this one did not
    write: logging adds and overwrites files but never removes one, so a figure of a spec since renamed or dropped
    sat beside the current page in the MLflow UI as if current. Only names from that manifest go, as in the folder
    (`_forget_old_figures`); a store that refuses is a note."""
    import requests
    from mlflow.exceptions import MlflowException
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    stale = [f"{folder}/{n}" for n in logged_before if not (out / n).is_file()]
    if not stale:
        return
    try:
        repo = get_artifact_repository(client.get_run(run_id).info.artifact_uri, tracking_uri=uri)
        for path in stale:
            repo.delete_artifacts(path)
    except (MlflowException, NotImplementedError, OSError, requests.RequestException) as err:
        unlogged.append(f"earlier figures left in MLflow beside the current ones ({', '.join(stale)}): the artifact "
                        f"store refused their deletion ({type(err).__name__})")
