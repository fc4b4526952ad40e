"""`rla-sweep status NAME`: where every job of a sweep stands (readable while a launch runs or after it)."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "status", help="show each job of a sweep: status, tokens, MLflow run",
        description="Read the sweep's state under --root. Status is one of pending, running, finished, failed, "
                    "diverged, cancelled.")
    parser.add_argument("name", help="the sweep name (or its sweep file)")
    parser.add_argument("--root", default="rla-runs", help="the launch's --root (default: ./rla-runs)")
    parser.add_argument("--json", action="store_true",
                        help='print {"sweep", "root", "tracking_uri", "jobs": [{job_id, name, ablations, status, '
                             'mlflow_run_id, tokens_done, tokens_target, error}]}')
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rla_ablate.sweep.progress import STYLE, fmt_tokens
    from rla_ablate.sweep.status import open_sweep, sweep_status

    doc = sweep_status(open_sweep(args.root, args.name))
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    counts: dict[str, int] = {}
    for j in doc["jobs"]:
        counts[j["status"]] = counts.get(j["status"], 0) + 1
    table = Table(title=f"sweep {doc['sweep']}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
                  caption=f"runs: {doc['tracking_uri']}")
    for col in ("job", "id", "ablations", "status", "tokens", "MLflow run", "error"):
        table.add_column(col, overflow="fold")
    for j in doc["jobs"]:
        table.add_row(j["name"], j["job_id"][:8], "+".join(j["ablations"]) or "-",
                      f"[{STYLE.get(j['status'], '')}]{j['status']}[/]",
                      f"{fmt_tokens(j['tokens_done'])}/{fmt_tokens(j['tokens_target'])}",
                      (j["mlflow_run_id"] or "")[:12], (j["error"] or "").splitlines()[0][:80] if j["error"] else "")
    # A pipe or a file gets full rows rather than rich's default 80 columns.
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0
