"""Where a sweep's runs are tracked and reading them as the dashboard and `results` do: the light part of the
dashboard (no plotting), so that `rla-sweep results` imports MLflow's client and not matplotlib."""

from __future__ import annotations

import contextlib
from pathlib import Path

from rla_ablate.errors import UserError
from rla_ablate.sweep.state import SweepDir
from rla_ablate.sweep.status import open_sweep_dir


def tracking_of(root: str | Path, sweep: str) -> tuple[str | None, Path | None]:
    """(remote tracking URI, None) for a sweep logged to a shared server, or (None, store dir) for the embedded one."""
    sdir = open_sweep_dir(root, sweep)
    meta = sdir.meta()
    if not meta:
        raise UserError("missing: the sweep's record of its tracking store; restore it from a copy of the sweep "
                        "folder", file=str(sdir.path / "sweep.json"))
    if meta.get("embedded_tracking", True):
        return None, sdir.mlflow_dir
    uri = meta.get("tracking_uri")
    if not uri:
        raise UserError("the sweep has no tracking_uri", file=str(sdir.path / "sweep.json"))
    return uri, None


@contextlib.contextmanager
def open_tracking(root: str | Path, sweep: str, *, read_only: bool = False):
    """The sweep's tracking URI, starting the embedded server on its store when no launch is serving it.

    `read_only`: a reader that writes nothing (`results`) takes the running launch's server when there is one, else
    the store's SQLite file itself: SQLite serves readers without a server, which saves its start-up (5-15 s)."""
    uri, store = tracking_of(root, sweep)
    if uri is not None:
        yield uri
        return
    assert store is not None  # the embedded store: tracking_of gives one of the two
    from rla_ablate.tracking import TrackingServer

    SweepDir(root, sweep).check_own_store()
    if read_only:
        yield TrackingServer(store).reading_uri()
        return
    with TrackingServer(store) as server:
        yield server.uri


def check_answers(sweep: str, root: str | Path, uri: str) -> None:
    """An http(s) tracking server that does not answer is a UserError at once (MLflow's client retries for minutes):
    the sweep's own (its sweep.json names it) or the --tracking-uri given."""
    if uri.split(":", 1)[0].lower() in ("http", "https"):
        from rla_ablate.tracking.server import check_server_answers

        stored = tracking_of(root, sweep)[0] == uri if SweepDir(root, sweep).path.is_dir() else False
        check_server_answers(uri, remedy=(
            "the sweep logs there (its sweep.json): start that server again, or give --tracking-uri" if stored
            else "start it, or give another --tracking-uri"), key=None if stored else "--tracking-uri")


def read_runs(sweep: str, root: str | Path, uri: str, *, include_stale: bool = False, planned: bool = True,
              checked: bool = False):
    """The sweep's runs as a dashboard reads them: the current expansion's (older versions' with `include_stale`),
    identified (`rla_ablate.dashboard.selection`). Returns (SweepRuns, Selection). `checked`: the caller has
    already asked an http(s) store whether it answers (`check_answers`)."""
    from rla_ablate.dashboard.selection import select_runs
    from rla_ablate.tracking.read import SweepRuns

    if not checked:
        check_answers(sweep, root, uri)
    runs = SweepRuns(uri, sweep)
    if runs.experiment_id is None:
        raise UserError(f"the tracking store {uri} has no experiment for sweep '{sweep}'")
    sdir = SweepDir(root, sweep)
    selection = select_runs(runs, sdir if sdir.path.is_dir() else None, include_stale, planned=planned)
    return runs, selection
