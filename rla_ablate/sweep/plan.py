"""What a sweep will cost before any of it runs: per job params, recurrent state, FLOPs, tokens and GPU-hours.

GPU-hours = flops_per_token (training: forward + backward) x tokens / (resources.assumed_tflops x 1e12) / 3600.
It is the same whether a job runs on a fraction of a GPU or on several: it estimates GPU time, not wall time.
"""

from __future__ import annotations

from typing import Any

from rla_ablate.sweep.expand import ResolvedJob, Sweep


def plan_rows(sweep: Sweep) -> list[dict[str, Any]]:
    from rla_ablate.models import count_params, flops_per_token, state_elements_per_layer

    tflops = sweep.config.resources.assumed_tflops
    cache: dict[int, tuple[int, int, float]] = {}
    rows = []
    for job in sweep.jobs:
        model, train = job.job.model, job.job.train
        key = (id(model), train.seq_len)
        if key not in cache:
            cache[key] = (count_params(model), state_elements_per_layer(model), flops_per_token(model, train.seq_len))
        params, state, flops = cache[key]
        rows.append({
            "job_id": job.job_id, "name": job.name, "family": job.family, "ablations": list(job.ablations),
            "params": int(params), "state_elements": int(state), "flops_per_token": float(flops),
            "tokens": int(train.tokens), "gpu_hours": float(flops) * train.tokens / (tflops * 1e12) / 3600.0,
        })
    return rows


def plan(sweep: Sweep) -> dict[str, Any]:
    """The `rla-sweep plan --json` document: {"jobs": [...], "totals": {...}}."""
    rows = plan_rows(sweep)
    search = sweep.config.search
    trials = search.n_trials if search else 1
    by_family: dict[str, int] = {}
    for r in rows:
        by_family[r["family"]] = by_family.get(r["family"], 0) + 1
    totals = {
        "sweep": sweep.name,
        "jobs": len(rows) * trials,
        "tokens": sum(r["tokens"] for r in rows) * trials,
        "gpu_hours": sum(r["gpu_hours"] for r in rows) * trials,
        "flops": sum(r["flops_per_token"] * r["tokens"] for r in rows) * trials,
        "jobs_by_family": by_family,
        "gpus_per_job": sweep.config.resources.gpus,
        "cpus_per_job": sweep.config.resources.cpus,
        "assumed_tflops": sweep.config.resources.assumed_tflops,
    }
    if search:
        totals["search_trials"] = search.n_trials
    return {"jobs": rows, "totals": totals}


def job_label(job: ResolvedJob) -> str:
    return "+".join(job.ablations) or "-"
