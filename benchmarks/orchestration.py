"""Orchestration costs of `rla-sweep`: planning 10,000 jobs, and the per-job scheduling overhead of a launch.

    python benchmarks/orchestration.py                 # both, on this machine
    python benchmarks/orchestration.py --jobs 24       # more jobs in the overhead run

Per-job overhead is what a job costs beyond its own training (`run_job`, from the worker's point of view):
the driver creating its MLflow child run and submitting it, Ray dispatching the task to a worker, the
worker opening its MLflow logger, and the result travelling back. It is measured on real Ray + MLflow with
one-step jobs of the tiny preset and `--max-concurrent` equal to the CPU count, so no job waits for a free
slot. The launch's fixed start-up (MLflow server, Ray instance) is reported separately; so is the first
job of each worker process, which also imports torch and the package.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def bench_plan(n_target: int = 10_000) -> dict:
    t_import = time.perf_counter()
    import rla_ablate.models  # noqa: F401  (torch comes with it: timed apart from planning)
    import rla_ablate.train  # noqa: F401
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.plan import plan

    imports_s = time.perf_counter() - t_import

    lrs = [round(1e-4 * (i + 1), 6) for i in range(10)]
    warmups = list(range(1, 26))
    seeds = list(range(n_target // (2 * 5 * len(lrs) * len(warmups))))
    sweep = {
        "name": "plan-bench",
        "models": [{"preset": "1.5b-rla"}, {"preset": "1.5b-rdn"}],
        "base": {"train": {"tokens": 50_000_000_000}, "data": {"kind": "stdlib"}},
        "ablations": ["no_fitting", "tied_gamma", "no_output_gates", "no_clip"],
        "grid": {"train.lr": lrs},
        "zip": {"train.warmup_tokens": warmups},
        "seeds": seeds,
    }
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "plan-bench.yaml"
        f.write_text(yaml.safe_dump(sweep))
        t0 = time.perf_counter()
        loaded = load_sweep(f)
        t1 = time.perf_counter()
        doc = plan(loaded)
        t2 = time.perf_counter()
    return {"jobs": len(doc["jobs"]), "expand_s": t1 - t0, "plan_s": t2 - t1, "total_s": t2 - t0,
            "imports_s": imports_s}


def bench_overhead(n_jobs: int, root: Path) -> dict:
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.launch import LaunchOptions, launch_sweep

    cpus = os.cpu_count() or 1
    tiny = {"vocab_size": 257, "num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "head_dim": 16}
    sweep = {
        "name": "overhead-bench",
        "models": [{"preset": "tiny-rla", "overrides": tiny}],
        "base": {"train": {"tokens": 256, "seq_len": 64, "micro_batch_size": 4, "batch_tokens": 256,
                           "warmup_tokens": 0, "cpu_threads": 1},
                 "data": {"kind": "stdlib"},
                 "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 64}]},
        "seeds": list(range(n_jobs)),
        "resources": {"cpus": 1},
    }
    f = root / "overhead-bench.yaml"
    f.write_text(yaml.safe_dump(sweep))
    marks: dict[str, dict] = {}

    def on_event(name: str, detail: dict) -> None:
        rec = marks.setdefault(detail["job_id"], {})
        rec.setdefault(name, time.time())
        if name == "done":
            rec["timing"] = detail.get("timing")

    t0 = time.time()
    summary = launch_sweep(load_sweep(f), LaunchOptions(root=root, max_concurrent=cpus, interactive=False),
                           on_event=on_event)
    wall = time.time() - t0
    assert summary.ok, summary
    first_queued = min(m["queued"] for m in marks.values())
    rows = []
    for m in marks.values():
        t = m["timing"]
        rows.append({
            "overhead": (m["done"] - m["queued"]) - (t["run_job_end"] - t["run_job_start"]),
            "dispatch": t["entered"] - m["submitted"],
            "run_job": t["run_job_end"] - t["run_job_start"],
            "queued": m["queued"],
            "triton_cache": t["triton_cache"],
        })
    rows.sort(key=lambda r: r["queued"])
    warm = rows[cpus:] or rows
    return {
        "jobs": n_jobs, "cpus": cpus, "wall_s": wall, "startup_s": first_queued - t0,
        "first_jobs_overhead_s": [round(r["overhead"], 2) for r in rows[:cpus]],
        "warm_overhead_median_s": statistics.median(r["overhead"] for r in warm),
        "warm_overhead_max_s": max(r["overhead"] for r in warm),
        "warm_dispatch_median_s": statistics.median(r["dispatch"] for r in warm),
        "run_job_median_s": statistics.median(r["run_job"] for r in rows),
        "triton_cache_dirs": sorted({str(r["triton_cache"]) for r in rows}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=12, help="jobs in the overhead run (default 12)")
    parser.add_argument("--skip-launch", action="store_true", help="only time the planner")
    args = parser.parse_args()
    p = bench_plan()
    print(f"plan: {p['jobs']} jobs expanded in {p['expand_s']:.2f} s, planned in {p['plan_s']:.2f} s "
          f"({p['total_s']:.2f} s total; importing torch and the package before that: {p['imports_s']:.1f} s)")
    if args.skip_launch:
        return
    with tempfile.TemporaryDirectory() as tmp:
        o = bench_overhead(args.jobs, Path(tmp))
    print(f"launch: {o['jobs']} one-step jobs on {o['cpus']} CPUs in {o['wall_s']:.1f} s; start-up (MLflow + Ray) "
          f"{o['startup_s']:.1f} s")
    print(f"per-job overhead, warm workers: median {o['warm_overhead_median_s']:.2f} s, max "
          f"{o['warm_overhead_max_s']:.2f} s (Ray dispatch alone: median {o['warm_dispatch_median_s']:.3f} s); "
          f"first job per worker: {o['first_jobs_overhead_s']} s; run_job itself: median "
          f"{o['run_job_median_s']:.2f} s")
    print(f"workers' TRITON_CACHE_DIR: {', '.join(o['triton_cache_dirs'])}")


if __name__ == "__main__":
    main()
