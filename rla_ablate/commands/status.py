"""`rla-sweep status NAME`: where every job of a sweep stands (readable while a launch runs or after it)."""

from __future__ import annotations

from rla_ablate.environment import add_root_option

import argparse
import json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "status", help="show each job of a sweep: status, tokens, MLflow run",
        description="Read the sweep's state under --root. Status is one of pending, running, finished, failed, "
                    "diverged, cancelled.")
    parser.add_argument("name", help="the sweep name (or its sweep file)")
    add_root_option(parser)
    parser.add_argument("--json", action="store_true",
                        help='print {"sweep", "root", "tracking_uri", "jobs": [{job_id, name, ablations, control, status, '
                             'mlflow_run_id, tokens_done, tokens_target, error, cause, traceback, error_log, notice'
                             '[, trial, value for a search]}]}')
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rla_ablate.sweep.progress import STYLE, fmt_tokens
    from rla_ablate.sweep.status import note_other_file, open_sweep, sweep_status

    doc = sweep_status(open_sweep(args.root, args.name))
    note_other_file(args.root, args.name)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    from rich.markup import escape

    from rla_ablate.sweep.plan import variant_label
    from rla_ablate.terminal import fitted_table, stdout_console

    counts: dict[str, int] = {}
    for j in doc["jobs"]:
        counts[j["status"]] = counts.get(j["status"], 0) + 1
    # Before any launch started MLflow the sweep has no store to name.
    store = doc["tracking_uri"] or "none yet (no launch of this sweep has started MLflow)"
    store = _embedded_store_state(args.root, doc["sweep"], doc) or store
    search = any("trial" in j for j in doc["jobs"])  # a search sweep: each job's trial and value beside it
    columns = ["job", "status", *(["trial", "value"] if search else []), "id", "variant", "tokens", "MLflow run",
               "cause", "error"]
    rows = []
    for j in doc["jobs"]:
        # The error is one line ("Type: message"); the traceback is in the job's error.log and in --json.
        error = (j["error"] or "").strip().splitlines()
        trial = ["" if j["trial"] is None else str(j["trial"]),
                 "" if j["value"] is None else f"{j['value']:.6g}"] if search else []
        rows.append([escape(j["name"]), f"[{STYLE.get(j['status'], '')}]{j['status']}[/]", *trial, j["job_id"][:8],
                     escape(variant_label(j["ablations"], j.get("control"))),
                     f"{fmt_tokens(j['tokens_done'])}/{fmt_tokens(j['tokens_target'])}",
                     (j["mlflow_run_id"] or "")[:12], j["cause"] or "", escape(error[0][:160]) if error else ""])
    console = stdout_console()
    title = f"sweep {doc['sweep']}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    console.print(fitted_table(console, title, columns, rows, keep=2, fold=("error",),
                               captions=[f"runs: {escape(store)}"],
                               drop_order=[c for c in ("MLflow run", "id", "variant", "cause", "tokens", "value",
                                                       "trial", "error") if c in columns]))
    for j in doc["jobs"]:
        if j["status"] == "failed" and j["error_log"]:
            console.print(f"{escape(j['name'])} ({j['job_id'][:8]}) tracebacks: {escape(j['error_log'])}",
                          soft_wrap=True)
        if j.get("notice"):
            console.print(f"{escape(j['name'])} ({j['job_id'][:8]}): {escape(j['notice'])}", soft_wrap=True)
    return 0


def _embedded_store_state(root, name: str, doc: dict) -> str | None:
    """What the `runs:` line says when the sweep's own store is gone or damaged (its jobs' runs unreadable), or
    None: `results` and `dashboard` refuse such a store (`SweepDir.check_own_store`), `status` reads none of it but
    says so."""
    from rla_ablate.errors import UserError
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(root, name)
    if not sdir.meta().get("embedded_tracking") or not any(j["mlflow_run_id"] for j in doc["jobs"]):
        return None
    try:
        sdir.check_own_store()
    except UserError as exc:
        return str(exc)
    return None
