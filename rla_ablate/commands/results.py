"""`rla-sweep results NAME`: one row per job with its identity and final metrics, as text, CSV or JSON."""

from __future__ import annotations

from rla_ablate.environment import add_root_option

import argparse
import csv
import json
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "results", help="print one row per job: identity (family, arm, ablations, grid keys, seed, series) and "
                        "final metrics",
        description="Read the sweep's runs (only those of its current expansion unless --include-stale) and print "
                    "one row per job: job_id, name, status, version, family, arm, preset, ablations, control, one "
                    "point.<key> column per grid/zip key, seed, series (the hash of the config without the seed: "
                    "rows with one series are replicates), tokens, and the final eval/*/{loss,ppl,acc}, "
                    "train/loss and diag/* values. --csv and --json load straight into pandas.")
    parser.add_argument("name", help="the sweep name (or its sweep file)")
    add_root_option(parser)
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV with a header row")
    fmt.add_argument("--json", action="store_true", help="a JSON list of objects (missing values: null)")
    parser.add_argument("--include-stale", action="store_true",
                        help="also list runs of earlier versions of the sweep file (version = older)")
    parser.add_argument("--tracking-uri", default=None,
                        help="read runs from this MLflow server instead of the sweep's own store")
    parser.set_defaults(func=run)


def _json_value(value, column: str):
    """A grid or search value (point.*) as the number it was logged from ('0.00123' -> 0.00123, '2' -> 2), so that
    pandas reads the column as numbers; other strings (clip, true) stay strings."""
    if not (isinstance(value, str) and column.startswith("point.")):
        return value
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        return value
    return number if number == number and abs(number) != float("inf") else value


def _text(value, column: str = "") -> str:
    """A cell of the text table: floats to 6 significant digits, and so are the grid and search values (point.*),
    which runs keep as the strings they were logged as (an Optuna float: 0.0012345678901234567)."""
    if value is None:
        return ""
    value = _json_value(value, column)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def run(args: argparse.Namespace) -> int:
    import contextlib

    from rla_ablate.dashboard.reading import open_tracking, read_runs
    from rla_ablate.dashboard.results import PROVENANCE, result_rows
    from rla_ablate.sweep.status import note_other_file, open_sweep_dir, resolve_name

    name = resolve_name(args.name)
    if args.tracking_uri is not None:
        from rla_ablate.tracking.read import reader_uri

        args.tracking_uri = reader_uri(args.tracking_uri)
    if args.tracking_uri is None:
        open_sweep_dir(args.root, name)
    ctx = contextlib.nullcontext(args.tracking_uri) if args.tracking_uri else open_tracking(args.root, name, read_only=True)
    with ctx as uri:
        runs, selection = read_runs(name, args.root, uri, include_stale=args.include_stale)
    note_other_file(args.root, args.name)
    from rla_ablate.sweep.search import trials_of_jobs
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(args.root, name)  # a search sweep's folder holds its study: each job's trial and value
    columns, rows = result_rows(runs.jobs, trials_of_jobs(sdir) if sdir.exists() else None)
    if sdir.exists() and sdir.has_job_list():
        # A job's status as `status` says it, from its folder: a run a killed launch left RUNNING in MLflow is
        # pending there. `tokens` stays the last step of the metrics the row shows (the run's), which a resume may
        # start before: `status` names that checkpoint.
        from rla_ablate.sweep.status import sweep_status

        known = {j["job_id"]: j for j in sweep_status(sdir)["jobs"]
                 if (sdir.job_dir(j["job_id"]) / "status.json").exists()}  # a job some launch has run
        for row in rows:
            job = known.get(row["job_id"])
            if job is not None:
                row["status"] = job["status"]
    if args.json:
        print(json.dumps([{c: _json_value(v, c) for c, v in row.items()} for row in rows], indent=1))
    elif args.csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    else:
        from rich.markup import escape

        from rla_ablate.terminal import count, fitted_table, stdout_console

        # what ran (kernels, glue) is in --csv and --json; the table keeps to what is compared
        hidden = ("run_id", "job_id", *PROVENANCE)
        shown = [c for c in columns if c not in hidden and any(r[c] is not None for r in rows)]
        cells = [[escape(_text(r[c], c)) for c in shown] for r in rows]
        console = stdout_console(pipe_width=400)
        # a narrow terminal keeps the names, what tells the runs apart and the first metrics; the rest is in --csv
        first = [c for c in ("version", "preset", "series", "arm", "control", "tokens") if c in shown]
        rest = [c for c in reversed(shown[2:]) if c not in first]
        metrics = [c for c in rest if "/" in c]
        console.print(fitted_table(console, f"sweep {name}: {count(len(rows), 'job')}", shown, cells, keep=2,
                                   drop_order=first + metrics + [c for c in rest if c not in metrics],
                                   captions=selection.notes(), whole="--csv"))
    for note in selection.notes() if (args.csv or args.json) else ():
        print(note, file=sys.stderr)
    return 0
