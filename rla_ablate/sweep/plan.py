"""What a sweep will cost before any of it runs: per job params, recurrent state, FLOPs, tokens, estimated peak GPU
memory, GPU share and GPU-hours.

GPU-hours = tokens / (the job's tokens/s alone on one GPU) / 3600, the tokens/s from the achieved FLOP/s of its
family's nearest measured row in the calibration table (rla_ablate/sweep/calibration/), or from
`resources.assumed_tflops` for a family without one (`cost_source` says which). It is GPU time, not wall time:
jobs packed on one GPU share it.
"""

from __future__ import annotations

from typing import Any

from rla_ablate.sweep.expand import Sweep


def plan_rows(sweep: Sweep, gpu_bytes: int | None = None) -> list[dict[str, Any]]:
    from rla_ablate.models import count_params, flops_per_token, state_elements_per_layer
    from rla_ablate.sweep.calibration import GiB, estimate_memory, estimate_speed, gpu_share

    res = sweep.config.resources
    cache: dict[tuple, tuple] = {}
    rows = []
    for job in sweep.jobs:
        model, train = job.job.model, job.job.train
        key = (id(model), train.seq_len, train.micro_batch_size, train.num_workers, train.fsdp, train.cuda_graphs)
        if key not in cache:
            mem = estimate_memory(job.job)
            speed = estimate_speed(job.job, res.assumed_tflops)
            share = None
            if gpu_bytes and (res.auto or 0 < float(res.gpus) < 1):
                share = gpu_share(mem, gpu_bytes, res.memory_margin)
            cache[key] = (count_params(model), state_elements_per_layer(model), flops_per_token(model, train.seq_len),
                          mem, share, speed)
        params, state, flops, mem, share, speed = cache[key]
        rows.append({
            "job_id": job.job_id, "name": job.name, "family": job.family, "ablations": list(job.ablations),
            "control": job.control,
            "params": int(params), "state_elements": int(state), "flops_per_token": float(flops),
            # what the job trains on: train.tokens rounded up to whole batches
            "tokens": int(train.total_tokens), "mem_gib": round(mem.gib, 2), "mem_glue": mem.glue,
            # train.cuda_graphs: mem_gib includes the graph's pool, tokens_per_s comes from graphed rows if any
            "cuda_graphs": bool(train.cuda_graphs), "mem_graph_pool_gib": round(mem.graph_pool / GiB, 2),
            "gpu_share": share, "tokens_per_s": round(speed.tokens_per_s),
            "gpu_hours": train.total_tokens / speed.tokens_per_s / 3600.0,
            "cost_source": speed.source,
            # a derived control's derivation (matched_wallclock: both speeds, their sources, the budgets)
            "control_report": job.control_report,
        })
    return rows


def plan(sweep: Sweep, gpu_bytes: int | None = None) -> dict[str, Any]:
    """The `rla-sweep plan --json` document: {"jobs": [...], "totals": {...}}. `gpu_bytes`: memory of the GPU the
    shares are computed for (default: this machine's, else the calibration device's)."""
    from rla_ablate.sweep.calibration import GiB, load_table
    from rla_ablate.sweep.packing import gpu_identity

    table = load_table()
    gpu_name = "this machine's GPU"
    if gpu_bytes is None:
        found = gpu_identity()
        if found is not None:
            gpu_name, gpu_bytes = found
    if gpu_bytes is None:
        gpu_bytes, gpu_name = int(table["gpu_memory_bytes"]), table["device"]
    rows = plan_rows(sweep, gpu_bytes)
    search = sweep.config.search
    trials = search.n_trials if search else 1
    by_family: dict[str, int] = {}
    for r in rows:
        by_family[r["family"]] = by_family.get(r["family"], 0) + trials
    shares = [r["gpu_share"] for r in rows if r["gpu_share"]]
    res = sweep.config.resources
    totals = {
        "sweep": sweep.name,
        "jobs": len(rows) * trials,
        "tokens": sum(r["tokens"] for r in rows) * trials,
        "gpu_hours": sum(r["gpu_hours"] for r in rows) * trials,
        "flops": sum(r["flops_per_token"] * r["tokens"] for r in rows) * trials,
        "jobs_by_family": by_family,
        # gpus: 0 trains on the CPU, whose speed is not calibrated: the GPU-hours are what one GPU would take
        "runs_on": "cpu" if not res.auto and float(res.gpus) == 0 else "gpu",
        "gpus_per_job": res.gpus,
        "cpus_per_job": res.cpus,
        "assumed_tflops": res.assumed_tflops,
        "memory_margin": res.memory_margin,
        "gpu": gpu_name,
        # every tok/s and GPU-hour is the calibration table's GPU's, whatever GPU the shares are computed for
        "speeds_measured_on": table["device"],
        "gpu_memory_gib": round(gpu_bytes / GiB, 1),
        "max_mem_gib": max((r["mem_gib"] for r in rows), default=0.0),
        # jobs one GPU holds at once on average when packed by memory (auto) or by an explicit fraction
        "jobs_per_gpu": round(len(shares) / sum(shares), 2) if shares else None,
    }
    if search:
        totals["search_trials"] = search.n_trials
        totals["search"] = search.model_dump(mode="json")
    from rla_ablate.sweep.expand import budget_lines

    totals["budgets"] = budget_lines([j.describe() for j in sweep.jobs])
    return {"jobs": rows, "totals": totals}


def variant_label(ablations: list[str], control: str | None) -> str:
    """A job's variant in a table: a derived control by its tag (matched_state[heads], matched_wallclock), an
    ablated job by its ablations, the unablated one '-'. The sweep's records keep a control's name under
    `ablations` too, where the dashboards' run filters look for it."""
    return control or "+".join(ablations) or "-"


def unset_budget_note(sweep, on_cpu: bool) -> str | None:
    """Where the file never sets train.tokens (base, grid, zip or search): every job trains the default, the
    paper's budget, which is days of a GPU and years of a CPU; said, since `rla-sweep train` defaults differently."""
    from rla_ablate.train.config import TrainConfig

    cfg = sweep.config
    keys = set(cfg.grid) | set(cfg.zip) | (set(cfg.search.params) if cfg.search else set())
    if "tokens" in (cfg.base.get("train") or {}) or "train.tokens" in keys:
        return None
    default = TrainConfig.model_fields["tokens"].default
    where = "on the CPU " if on_cpu else ""
    return (f"train.tokens is not set in {sweep.source.file}: each job trains the default {default:,} tokens "
            f"{where}(the paper's budget); set base.train.tokens")
