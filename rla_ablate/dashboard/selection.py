"""Which runs a dashboard or `rla-sweep results` reads, and the series identity of each.

Only the current sweep: the jobs of the expansion the last launch recorded (ROOT/SWEEP/jobs.json, read through
`SweepDir`). Runs of earlier versions of the sweep file (their job ids are no longer in jobs.json) are left
out unless `include_stale`; then every one is tagged `version = older`, which figures and tables print next
to its label, and which keeps it in a series of its own (it is never pooled with, nor paired against, a run
of the current version).

Every run gets the tags a spec may group by, whatever wrote it: `series` (see `rla_ablate.sweep.identity`),
`arm`, `preset`, `control`, `point.<key>`, `version`. They come from the current jobs.json record when the job
is in it, else from the run's own tags, else from the job's job.json under the sweep folder; a run with none
of these (a run logged by hand) gets a series from its config params or, lacking those, from its tags.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rla_ablate.outcome import Status
from rla_ablate.sweep.expand import budget_lines, budget_ratio
from rla_ablate.sweep.identity import ARM, CONTROL, NO_CONTROL, POINT_PREFIX, PRESET, SERIES, series_id
from rla_ablate.sweep.ids import canonical_json, hash_text
from rla_ablate.sweep.state import SweepDir
from rla_ablate.tracking.read import RunRecord, SweepRuns
from rla_ablate.tracking.runs import JOB_ID, flatten, param_value

VERSION = "version"
BUDGET = "budget"  # a matched wall-clock control's tokens over its reference job's, e.g. "1.10"
CURRENT, OLDER = "current", "older"
# Params that are not part of a job's config: they never tell two series apart.
NOT_CONFIG = ("accounting.",)
SEED_PARAM = "train.seed"


@dataclass
class Selection:
    """What was read: the runs, and how many runs of older versions were left out or kept."""

    runs: SweepRuns
    stale_excluded: int = 0
    """Runs of earlier versions of the sweep file left out (pass include_stale to see them)."""
    stale_included: int = 0
    """Runs of earlier versions kept (include_stale), each tagged version = older."""
    expansion_known: bool = True
    """False when the sweep folder has no jobs.json: then every run of the experiment counts as current."""
    budgets: list[str] = field(default_factory=list)
    """One line per matched wall-clock control of the expansion: its token budget and the speeds it came from."""

    def notes(self) -> list[str]:
        out = list(self.budgets)
        if self.stale_excluded:
            out.append(f"{self.stale_excluded} run(s) of earlier versions of the sweep file are not shown "
                       "(pass --include-stale to show them, labelled 'older sweep version')")
        if self.stale_included:
            out.append(f"{self.stale_included} run(s) of earlier versions of the sweep file are shown, each "
                       "labelled 'older sweep version'")
        if not self.expansion_known:
            out.append("the sweep folder has no jobs.json: every run of the experiment is shown")
        return out


def config_params(params: dict[str, str]) -> dict[str, str]:
    """A run's resolved-config params without the seed: equal for every run of one series."""
    return {k: v for k, v in params.items() if k != SEED_PARAM and not k.startswith(NOT_CONFIG)}


def _fallback_series(run: RunRecord) -> str:
    """A series for a run without identity tags or job.json: its config params, else its descriptive tags."""
    cfg = config_params(run.params)
    if any(k.startswith("model.") for k in cfg):
        return "p" + hash_text(canonical_json(cfg))[1:]
    keys = sorted(k for k in run.tags if k in ("family", "ablations", ARM, PRESET, CONTROL, "control_of")
                  or k.startswith(POINT_PREFIX))
    described = {k: run.tags[k] for k in keys}
    # The job name without its seed ("tiny-rla/no_fitting/clip=0.2/seed1" -> ".../clip=0.2").
    if "name" in run.tags:
        described["name"] = re.sub(r"/seed-?\d+$", "", run.tags["name"])
    return "t" + hash_text(canonical_json(described))[1:]


def identify(run: RunRecord, record: dict | None, sdir: SweepDir | None) -> None:
    """Fill the run's identity tags (series, arm, preset, control, point.*, and a derived control's budget ratio,
    `budget`) in place."""
    tags = run.tags
    if record:
        for key in (ARM, PRESET, CONTROL, SERIES):
            if record.get(key):
                tags[key] = str(record[key])
        for key, value in (record.get("point") or {}).items():
            tags[POINT_PREFIX + key] = param_value(value)
        ratio = budget_ratio(record)
        if ratio is not None:
            tags[BUDGET] = f"{ratio:.2f}"
    if CONTROL not in tags:
        # Runs written before the control tag: a derived control names the job it matches in `control_of`.
        tags[CONTROL] = tags.get("ablations", NO_CONTROL) if tags.get("control_of") else NO_CONTROL
    if SERIES not in tags:
        config = sdir.job_config(tags.get(JOB_ID, "")) if sdir is not None and tags.get(JOB_ID) else None
        tags[SERIES] = series_id(config) if config else _fallback_series(run)


def select_runs(runs: SweepRuns, sdir: SweepDir | None, include_stale: bool = False,
                planned: bool = True) -> Selection:
    """Keep the runs of the current expansion (and older ones with `include_stale`), identified; with `planned`,
    add the current jobs that have no run yet as 'not started' records."""
    known = sdir is not None and sdir.has_job_list()
    records = sdir.job_list() if known else []
    current = {str(rec.get("job_id")): (i, rec) for i, rec in enumerate(records)}
    sel = Selection(runs, expansion_known=known)
    lines = budget_lines(records)
    if lines:
        sel.budgets = ["matched wall-clock budgets:"] + [f"  {line}" for line in lines]
    kept = []
    for run in runs.jobs:
        job_id = run.tags.get(JOB_ID, "")
        stale = known and job_id not in current
        if stale and not include_stale:
            sel.stale_excluded += 1
            continue
        order, record = current.get(job_id, (len(current) + len(kept), None))
        identify(run, record, sdir)
        run.tags[VERSION] = OLDER if stale else CURRENT
        run.order = order
        sel.stale_included += stale
        kept.append(run)
    runs.jobs = kept
    if planned and known:
        have = {r.tags.get(JOB_ID) for r in kept}
        params, cancelled = {}, set()
        for job_id in current:
            if job_id not in have and sdir is not None:
                config = sdir.job_config(job_id)
                if config:
                    params[job_id] = flatten(config)
                if sdir.status(job_id).status == Status.CANCELLED:
                    cancelled.add(job_id)
        before = len(runs.jobs)
        runs.add_planned(records, params, cancelled)
        for run in runs.jobs[before:]:
            identify(run, current[run.tags[JOB_ID]][1], sdir)
            run.tags[VERSION] = CURRENT
    runs.jobs.sort(key=lambda r: r.order)
    return sel
