"""One row per job: its identity and final metrics, for `rla-sweep results` (and pandas).

    family, arm, preset, ablations, control, point.<key> per grid/zip key, seed, series  (identity: arm and preset
        are the model the arm wrote; a control's job trains a model derived from it, which family and control name)
    eval/<set>/{loss,ppl,acc}, train/loss, diag/*                                          (final values)
"""

from __future__ import annotations

import fnmatch
import math

from rla_ablate.dashboard.selection import VERSION
from rla_ablate.sweep.identity import ARM, CONTROL, POINT_PREFIX, PRESET, SERIES
from rla_ablate.tracking.read import RunRecord
from rla_ablate.tracking.runs import BACKEND, GLUE, JOB_ID

IDENTITY_COLUMNS = ("job_id", "name", "status", VERSION, "family", ARM, PRESET, "ablations", CONTROL)
# the eval sets' loss, ppl and token accuracy first, then every other eval metric (lm-eval's acc_norm,
# exact_match, perplexity of each task), the final training loss and the diagnostics
METRIC_PATTERNS = ("eval/*/loss", "eval/*/ppl", "eval/*/acc", "eval/*", "train/loss", "diag/*")


def _seed(value: str | None):
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


# Tags of what ran, beside the numbers: two runs of one config can differ here (rla_ablate.tracking.runs).
PROVENANCE = (BACKEND, GLUE)


def result_rows(jobs: list[RunRecord], trials: dict[str, tuple] | None = None) -> tuple[list[str], list[dict]]:
    """(columns, rows): identity columns, the grid/zip keys, a search's trial and its value (`trials`: job id ->
    (trial, value), `search.trials_of_jobs`), seed, series, tokens, every final metric, then what ran (the kernels'
    tag and the glue: `PROVENANCE`) and the run id."""
    points = sorted({k for r in jobs for k in r.tags if k.startswith(POINT_PREFIX)})
    metrics = []
    for pattern in METRIC_PATTERNS:
        metrics += sorted({k for r in jobs for k in r.metrics if fnmatch.fnmatchcase(k, pattern)} - set(metrics))
    searched = ["trial", "value"] if trials else []
    columns = [*IDENTITY_COLUMNS, *points, *searched, "seed", SERIES, "tokens", *metrics, *PROVENANCE, "run_id"]
    rows = []
    for r in jobs:
        row: dict = {c: r.tags.get(c) for c in (*IDENTITY_COLUMNS, *points, SERIES, *PROVENANCE)}
        row["name"] = r.tags.get("name") or r.name
        row["status"] = r.job_status  # diverged, not MLflow's failed
        row["seed"] = _seed(r.tags.get("seed"))
        row["tokens"] = max(r.steps.values()) if r.steps else None
        for m in metrics:
            v = r.metrics.get(m)
            # A diverged run's NaN/inf is no number to analyse (its status says why): missing, like an unlogged one.
            row[m] = v if v is not None and math.isfinite(v) else None
        row["run_id"] = r.run_id or None
        if trials:
            row["trial"], row["value"] = trials.get(r.tags.get(JOB_ID, ""), (None, None))
        rows.append({c: row.get(c) for c in columns})
    return columns, rows
