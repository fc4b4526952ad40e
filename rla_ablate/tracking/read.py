"""Reading a sweep's runs back (for dashboards), through the server's HTTP URI or the SQLite store directly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient

from rla_ablate.tracking.runs import JOB_ID, ROLE, STATUS, SWEEP, ablations_tag, experiment_name, param_value

# MLflow status -> what a dashboard says about a run that is not finished.
STATE = {"FINISHED": "finished", "RUNNING": "running", "SCHEDULED": "queued", "FAILED": "failed",
         "KILLED": "cancelled"}


def reader_uri(uri: str) -> str:
    """A `--tracking-uri` a reader may open, or a UserError: an MLflow server (http, https) or a database URI
    (sqlite:///path/mlflow.db, postgresql://..., mysql://...). A sqlite file must exist: MLflow would create an
    empty store in its place and read no runs from it."""
    from urllib.parse import urlparse

    from rla_ablate.errors import UserError

    scheme = urlparse(uri).scheme.split("+", 1)[0]
    allowed = "http(s)://HOST:PORT of an MLflow server, or a store's database URI (sqlite:///ABSOLUTE/PATH/mlflow.db)"
    if scheme not in ("http", "https", "sqlite", "postgresql", "mysql", "mssql"):
        hint = f" (did you mean 'sqlite:///{Path(uri).resolve()}'?)" if Path(uri).is_file() else ""
        raise UserError(f"'{uri}' is not a tracking URI; allowed: {allowed}{hint}", key="--tracking-uri")
    if scheme == "sqlite":
        path = uri.split(":///", 1)[1] if ":///" in uri else ""
        if not path or not Path(path).is_file():
            raise UserError(f"no SQLite store at '{path or uri}' (give an existing file: {allowed})",
                            key="--tracking-uri")
    return uri


@dataclass
class RunRecord:
    run_id: str
    experiment_id: str
    status: str
    """finished | running | queued | failed | cancelled."""
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]
    """The value at the largest step of each metric."""
    steps: dict[str, int] = field(default_factory=dict)
    """The largest step of each metric."""
    order: int = 0
    """Position of its job in the sweep's expansion (jobs.json), for a stable display order."""

    @property
    def name(self) -> str:
        return self.tags.get("mlflow.runName", self.run_id)

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def job_status(self) -> str:
        """The job's own status for a run that did not finish (the launch's tag: diverged, failed, ...): MLflow
        ends a diverged run as failed."""
        return self.status if self.finished else self.tags.get(STATUS) or self.status


class SweepRuns:
    """The parent run and the job runs of one sweep, with cached metric histories."""

    def __init__(self, tracking_uri: str, sweep: str):
        self.tracking_uri = tracking_uri
        self.sweep = sweep
        self.client = MlflowClient(tracking_uri)
        exp = self.client.get_experiment_by_name(experiment_name(sweep))
        self.experiment_id = exp.experiment_id if exp else None
        self.parent: RunRecord | None = None
        self.jobs: list[RunRecord] = []
        self._history: dict[tuple[str, str], list[tuple[int, float]]] = {}
        if self.experiment_id is None:
            return
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{SWEEP}` = '{sweep}'",
                                       max_results=50000)
        for run in runs:
            status = STATE.get(run.info.status, run.info.status.lower())
            rec = RunRecord(run.info.run_id, run.info.experiment_id, status,
                            dict(run.data.tags), dict(run.data.params), dict(run.data.metrics),
                            {m.key: m.step for m in getattr(run.data, "_metric_objs", [])})
            if rec.tags.get(ROLE) == "sweep":
                self.parent = rec
            elif rec.tags.get(ROLE) == "job" or JOB_ID in rec.tags:
                self.jobs.append(rec)
        self.jobs.sort(key=lambda r: (r.tags.get("family", ""), r.tags.get("ablations", ""), r.tags.get("seed", "")))

    def add_planned(self, jobs: list[dict], params: dict[str, dict[str, str]] | None = None,
                    cancelled: set[str] | frozenset = frozenset()) -> None:
        """Jobs of the sweep's expansion (its jobs.json) that have no run yet, shown as 'not started', or as
        'cancelled' where the job id is in `cancelled` (a cancel that came before the job started: the sweep's
        status says cancelled too); `params` (job id -> flattened resolved config) lets a figure group them by
        config keys like the runs."""
        have = {r.tags.get(JOB_ID) for r in self.jobs}
        for i, job in enumerate(jobs):
            if job.get("job_id") in have:
                continue
            tags = {SWEEP: self.sweep, JOB_ID: str(job.get("job_id")), "family": str(job.get("family")),
                    "ablations": ablations_tag(job.get("ablations")), "seed": str(job.get("seed")),
                    "mlflow.runName": str(job.get("name") or job.get("job_id"))}
            for key in ("arm", "preset", "control", "series"):
                if job.get(key):
                    tags[key] = str(job[key])
            for key, value in (job.get("point") or {}).items():
                tags[f"point.{key}"] = param_value(value)
            extra = dict((params or {}).get(str(job.get("job_id")), {}))
            status = "cancelled" if str(job.get("job_id")) in cancelled else "not started"
            self.jobs.append(RunRecord("", self.experiment_id or "", status, tags, extra, {}, order=i))

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """(step, value) of one metric, sorted by step; the last value logged wins at a repeated step."""
        if (run_id, key) not in self._history:
            points = sorted(self.client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
            by_step = {m.step: m.value for m in points}
            self._history[(run_id, key)] = sorted(by_step.items())
        return self._history[(run_id, key)]
