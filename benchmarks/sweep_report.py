"""What a finished (or running) sweep measured, per job: tokens/s, peak GPU memory against the plan's estimate, the
first step's wall time (kernel compilation and autotuning) and the sweep's wall time.

    python3 benchmarks/sweep_report.py SWEEP [--root rla-runs] [--json out.json]

Reads the sweep folder only (jobs.json, each job's status.json and metrics.jsonl): it works while the launch runs
and after the node that ran it is gone. tokens/s is the job's mean over its logged windows after the first (the
first includes compilation); `jobs at once` is the largest number of jobs whose runs overlapped in time. A sweep
finished over several launches (`resume` on a fresh node) has `wall_s`, the time with jobs running summed over its
`busy_spans` (a gap under TURNOVER_S between jobs, a task starting and building its model, counts as busy: it is the
launch's own); `span_s` runs from the first job's start to the last job's end, gaps between launches included.
"""

from __future__ import annotations

import argparse
import json
import statistics

from rla_ablate.sweep.state import SweepDir
from rla_ablate.train import read_jsonl


def job_rows(sdir: SweepDir) -> list[dict]:
    rows = []
    for rec in sdir.job_list():
        path = sdir.job_dir(rec["job_id"]) / "metrics.jsonl"
        records = read_jsonl(path) if path.exists() else []
        metrics = [r for r in records if r["type"] == "metrics"]
        rates = [r["values"]["train/tokens_per_s"] for r in metrics if "train/tokens_per_s" in r["values"]]
        peaks = [r["values"]["train/peak_mem_gib"] for r in metrics if "train/peak_mem_gib" in r["values"]]
        first = [r["detail"].get("first_step_s") for r in records if r["type"] == "event" and r["name"] == "info"]
        times = [r["time"] for r in records if "time" in r]
        est = rec.get("mem_estimate_gib")
        peak = max(peaks) if peaks else None
        rows.append({
            "name": rec["name"], "job_id": rec["job_id"], "status": sdir.status(rec["job_id"]).status,
            "tokens_per_s": statistics.mean(rates[1:] or rates) if rates else None,
            "peak_gib": peak, "estimate_gib": est,
            "estimate_error": (est - peak) / peak if est and peak else None,
            "first_step_s": [f for f in first if f is not None],
            "start": min(times) if times else None, "end": max(times) if times else None,
        })
    return rows


def overlap(rows: list[dict]) -> int:
    marks = sorted([(r["start"], 1) for r in rows if r["start"] is not None]
                   + [(r["end"], -1) for r in rows if r["end"] is not None])
    now = best = 0
    for _, d in marks:
        now += d
        best = max(best, now)
    return best


TURNOVER_S = 120.0


def busy_spans(rows: list[dict]) -> list[tuple[float, float]]:
    """The intervals in which jobs ran (a job from its first record to its last), in time order; intervals less
    than TURNOVER_S apart are one."""
    spans: list[list[float]] = []
    for start, end in sorted((r["start"], r["end"]) for r in rows if r["start"] is not None and r["end"] is not None):
        if spans and start <= spans[-1][1] + TURNOVER_S:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    return [(a, b) for a, b in spans]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep")
    parser.add_argument("--root", default="rla-runs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = job_rows(SweepDir(args.root, args.sweep))
    print(f"{'job':<38} {'status':<9} {'tok/s':>8} {'peak GiB':>9} {'est GiB':>8} {'est err':>8} {'first step s':>14}")
    for r in rows:
        tok = f"{r['tokens_per_s']:8.0f}" if r["tokens_per_s"] else f"{'-':>8}"
        peak = f"{r['peak_gib']:9.1f}" if r["peak_gib"] else f"{'-':>9}"
        est = f"{r['estimate_gib']:8.1f}" if r["estimate_gib"] else f"{'-':>8}"
        err = f"{r['estimate_error']:+8.1%}" if r["estimate_error"] is not None else f"{'-':>8}"
        first = ", ".join(f"{f:.1f}" for f in r["first_step_s"]) or "-"
        print(f"{r['name']:<38} {r['status']:<9} {tok} {peak} {est} {err} {first:>14}")
    starts = [r["start"] for r in rows if r["start"] is not None]
    ends = [r["end"] for r in rows if r["end"] is not None]
    spans = busy_spans(rows)
    errs = [abs(r["estimate_error"]) for r in rows if r["estimate_error"] is not None]
    total = sum(r["tokens_per_s"] or 0 for r in rows)
    summary = {"jobs": len(rows), "finished": sum(r["status"] == "finished" for r in rows),
               "wall_s": sum(b - a for a, b in spans) if spans else None, "busy_spans": len(spans),
               "span_s": max(ends) - min(starts) if starts else None, "jobs_at_once": overlap(rows),
               "sum_tokens_per_s": total, "max_abs_estimate_error": max(errs) if errs else None}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "jobs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
