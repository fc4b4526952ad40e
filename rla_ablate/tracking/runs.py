"""Experiments and runs of a sweep: one experiment per sweep, one parent run, one child run per job.

Every call is idempotent: runs are found again by their tags (`rla.role`, `sweep`, `job_id`), so a
relaunched sweep reuses its runs and never creates a duplicate.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from mlflow.entities import Param, RunTag
from mlflow.tracking import MlflowClient

from rla_ablate.config.dotted import flat_dotted
from rla_ablate.outcome import Status

# Tag keys shared by the launcher, the jobs and the dashboards.
ROLE, SWEEP, JOB_ID = "rla.role", "sweep", "job_id"
FAMILY, ABLATIONS, SEED = "family", "ablations", "seed"
GIT_COMMIT, BACKEND, GLUE, HOST = "git_commit", "kernel_backend", "glue", "host"
STATUS, STATUS_REASON = "rla.status", "rla.status_reason"
# A search trial's run: its Optuna trial number, and `pruned` where the pruner stopped it (its status is cancelled).
TRIAL, CAUSE = "rla.trial", "rla.cause"
NO_ABLATION = "none"
CONFIG_ARTIFACT = "config.json"
# How a job ended (rla_ablate.outcome.Status) -> MLflow run status; a plain status string looks up the same entry.
RUN_STATUS = {Status.FINISHED: "FINISHED", Status.FAILED: "FAILED", Status.DIVERGED: "FAILED",
              Status.CANCELLED: "KILLED"}
_MAX_PARAM_LEN = 6000
_MAX_PER_BATCH = 100


def json_float(x: float) -> float | str:
    """A metric value for MLflow's REST API, which takes non-finite doubles as protobuf JSON strings."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def experiment_name(sweep: str) -> str:
    return f"rla-sweep/{sweep}"


def ablations_tag(ablations: list[str] | tuple[str, ...] | str | None) -> str:
    """Canonical tag value: sorted names joined by '+', or 'none' for the parent model."""
    if isinstance(ablations, str):
        ablations = [a for a in ablations.replace(",", "+").split("+") if a and a != NO_ABLATION]
    names = sorted(set(ablations or []))
    return "+".join(names) if names else NO_ABLATION


@lru_cache(maxsize=1)
def git_commit() -> str:
    """HEAD of the source tree this package runs from, '+dirty' when it has local changes."""
    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def param_value(value: Any) -> str:
    """How a config value is spelled as a param or tag: 0.05, 64, true, null, [1, 2]."""
    return json.dumps(value) if isinstance(value, (list, tuple, dict, bool)) or value is None else str(value)


def flatten(config: Any) -> dict[str, str]:
    """{"model": {"hidden": 64}, "eval": [{"name": "val"}]} -> {"model.hidden": "64", "eval.0.name": "val"}."""
    return {key: param_value(value)[:_MAX_PARAM_LEN] for key, value in flat_dotted(config).items()}


def accounting_params(config: dict) -> dict[str, str]:
    """params, state elements per layer and FLOPs per token of the job's model (for matched-budget plots)."""
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict):
        return {}
    try:
        from rla_ablate import models
        cfg = models.ModelConfig.model_validate(model)
        seq_len = (config.get("data") or {}).get("seq_len") or (config.get("train") or {}).get("seq_len") or 2048
        return {"accounting.params": str(models.count_params(cfg)),
                "accounting.state_elements_per_layer": str(models.state_elements_per_layer(cfg)),
                "accounting.flops_per_token": str(models.flops_per_token(cfg, int(seq_len)))}
    except (ImportError, AttributeError, ValueError, TypeError):
        return {}


def ensure_experiment(tracking_uri: str, name: str) -> str:
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        # Tells the MLflow UI this is a training experiment: it opens on the runs table, not the GenAI overview.
        return client.create_experiment(name, tags={"mlflow.experimentKind": "custom_model_development"})
    except Exception:
        # Another process created it between our lookup and create.
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def value_text(value: str) -> str:
    """A config value as runs keep it (the string it was logged as) for a label or a run's name: a float of more
    than 6 significant digits (an Optuna draw logs 0.7238517082858716) to 6; anything else as written (clip=1.0,
    target=clip)."""
    try:
        number = float(value)
    except ValueError:
        return value
    short = f"{number:.6g}"
    return short if math.isfinite(number) and float(short) != number else value


def _find_run(client: MlflowClient, experiment_id: str, tags: dict[str, str]) -> str | None:
    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = client.search_runs([experiment_id], filter_string=query, max_results=2,
                              order_by=["attributes.start_time ASC"])
    return runs[0].info.run_id if runs else None


def _log_tags_params(client: MlflowClient, run_id: str, tags: dict, params: dict) -> None:
    tag_list = [RunTag(str(k), str(v)) for k, v in tags.items()]
    existing = client.get_run(run_id).data.params
    # MLflow params are immutable: log only new keys (a job id hashes its config, so values agree).
    param_list = [Param(str(k), str(v)[:_MAX_PARAM_LEN]) for k, v in params.items() if str(k) not in existing]
    for i in range(0, len(tag_list), _MAX_PER_BATCH):
        client.log_batch(run_id, tags=tag_list[i:i + _MAX_PER_BATCH])
    for i in range(0, len(param_list), _MAX_PER_BATCH):
        client.log_batch(run_id, params=param_list[i:i + _MAX_PER_BATCH])


def ensure_parent_run(tracking_uri: str, sweep: str, tags: dict | None = None) -> str:
    """The sweep's parent run (created once, found again by tag)."""
    client = MlflowClient(tracking_uri)
    exp_id = ensure_experiment(tracking_uri, experiment_name(sweep))
    run_id = _find_run(client, exp_id, {ROLE: "sweep", SWEEP: sweep})
    base = {ROLE: "sweep", SWEEP: sweep, GIT_COMMIT: git_commit(), HOST: socket.gethostname()}
    if run_id is None:
        run_id = client.create_run(exp_id, tags={**base, "mlflow.runName": sweep}, run_name=sweep).info.run_id
    if tags:
        _log_tags_params(client, run_id, tags, {})
    return run_id


def restore_events(tracking_uri: str, run_id: str, records: list[dict]) -> int:
    """A run made again from a job's metrics.jsonl (`records`) gets what `MLflowLogger.event` gave the lost one:
    a tag `event.<name>` per event (its last step), the kernel backend, glue and host the events name, and the events
    as an artifact. Returns the number of events."""
    events = [r for r in records if r.get("type") == "event"]
    tags: dict[str, str] = {}
    for r in events:
        detail = r.get("detail") or {}
        tags[f"event.{r.get('name')}"] = str(r.get("step", 0))
        for key, tag in (("backend", BACKEND), ("glue", GLUE), ("host", HOST)):
            if key in detail:
                tags[tag] = str(detail[key])
    if events:
        client = MlflowClient(tracking_uri)
        _log_tags_params(client, run_id, tags, {})
        text = "\n".join(json.dumps({k: r.get(k) for k in ("name", "step", "time", "detail")}, default=str)
                         for r in events) + "\n"
        client.log_text(run_id, text, "events/restored-from-metrics-jsonl.jsonl")
    return len(events)


def logged_child_run(tracking_uri: str, sweep: str, job_id: str) -> str | None:
    """The job's run found by `job_id` if an attempt logged to it (any status but SCHEDULED, which a run has from
    its creation until a job's logger opens it), else None. A launch asks when the job's folder has nothing of
    an earlier attempt (it was deleted): training again into that run would mix two attempts' values."""
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment_name(sweep))
    if exp is None:
        return None
    run_id = _find_run(client, exp.experiment_id, {ROLE: "job", SWEEP: sweep, JOB_ID: job_id})
    if run_id is None or client.get_run(run_id).info.status == "SCHEDULED":
        return None
    return run_id


def create_or_get_child_run(tracking_uri: str, sweep: str, job_id: str, tags: dict | None = None,
                            params: dict | None = None, config: dict | None = None) -> str:
    """The job's run under the sweep's parent run; found by `job_id` on relaunch, never duplicated.

    `tags` should carry family, ablations (see `ablations_tag`) and seed, and a sweep's jobs also their series
    identity (arm, preset, control, point.<key> per grid/zip key, series: `rla_ablate.sweep.identity`);
    `params` default to the flattened `config`, which is also stored as the artifact `config.json`.
    """
    client = MlflowClient(tracking_uri)
    parent = ensure_parent_run(tracking_uri, sweep)
    exp_id = client.get_run(parent).info.experiment_id
    tags = dict(tags or {})
    if ABLATIONS in tags:
        tags[ABLATIONS] = ablations_tag(tags[ABLATIONS])
    tags = {k: str(v) for k, v in tags.items()}
    all_tags = {ROLE: "job", SWEEP: sweep, JOB_ID: job_id, GIT_COMMIT: git_commit(),
                "mlflow.parentRunId": parent, **tags}
    run_id = _find_run(client, exp_id, {ROLE: "job", SWEEP: sweep, JOB_ID: job_id})
    created = run_id is None
    if created:
        # Grid/zip values in the name: the runs of a clip sweep are told apart in the MLflow UI's run list.
        point = [f"{k.rsplit('.', 1)[-1]}={value_text(v)}" for k, v in tags.items() if k.startswith("point.")]
        parts = (tags.get(FAMILY), tags.get(ABLATIONS), *point, f"s{tags[SEED]}" if SEED in tags else None)
        name = "-".join(str(x) for x in parts if x) or job_id
        run = client.create_run(exp_id, tags={**all_tags, "mlflow.runName": f"{name}-{job_id[:8]}"})
        run_id = run.info.run_id
        # A freshly created run is "scheduled", not running, until a job's logger opens it.
        client.update_run(run_id, status="SCHEDULED")
    all_params = dict(params) if params is not None else (flatten(config) if config is not None else {})
    if config is not None:
        all_params.update(accounting_params(config))
    _log_tags_params(client, run_id, {} if created else all_tags, all_params)
    if config is not None:
        client.log_text(run_id, json.dumps(config, indent=1, sort_keys=True, default=str), CONFIG_ARTIFACT)
    return run_id


def end_open_run(tracking_uri: str, run_id: str, status: str, reason: str | None = None) -> bool:
    """Give a run its final status (a rla_ablate.outcome.Status value) when it is still SCHEDULED or RUNNING: a job
    cancelled before it started, or killed before its logger closed the run. Returns whether it changed."""
    client = MlflowClient(tracking_uri)
    if client.get_run(run_id).info.status not in ("SCHEDULED", "RUNNING"):
        return False
    client.set_tag(run_id, STATUS, str(status))
    client.set_tag(run_id, STATUS_REASON, (reason or "")[:8000])
    client.set_terminated(run_id, status=RUN_STATUS.get(status, "FAILED"))
    return True
