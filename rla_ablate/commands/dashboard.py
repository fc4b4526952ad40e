"""`rla-sweep dashboard NAME`: paper-style figures and tables of a sweep, as PNG, SVG and one HTML page."""

from __future__ import annotations

import argparse
import sys

from rla_ablate.environment import add_root_option
from rla_ablate.fileio import shell_arg


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "dashboard", help="render the figures and tables of dashboards/*.yaml from a sweep's tracked runs",
        description="Render every spec in dashboards/ (or --specs) from the sweep's MLflow runs to PNG and SVG, "
                    "write one self-contained HTML page with the figures, tables (mean ± 95% CI over seeds, "
                    "paired differences), the validity panel and the verdict on each claim, with run links, and log "
                    "them to the sweep's parent run. Only the runs of the sweep's current expansion are read "
                    "(see --include-stale). Unfinished or missing jobs are shown as such.")
    parser.add_argument("name", help="the sweep name (or its sweep file)")
    add_root_option(parser)
    parser.add_argument("--specs", default=None, help="folder of figure specs (default: the repository's dashboards/)")
    parser.add_argument("--out", default=None, help="output folder (default: ROOT/NAME/dashboard; with --specs DIR, "
                        "ROOT/NAME/dashboard-<DIR's name>: a page per set of specs)")
    parser.add_argument("--tracking-uri", default=None,
                        help="read runs from this MLflow server instead of the sweep's own store")
    parser.add_argument("--no-log", action="store_true",
                        help="write the page and figures only, without logging them to the sweep's parent run (a "
                             "draft or a debug render)")
    parser.add_argument("--include-stale", action="store_true",
                        help="also show runs of earlier versions of the sweep file (jobs no longer in its "
                             "expansion), labelled 'older sweep version'; by default only the current jobs")
    parser.set_defaults(func=run)


def _check_out(out: str) -> None:
    """A UserError before any work when --out cannot be the page's folder: a file, under one, or where the system
    refuses a folder (the render ended in a traceback after the server start, the read and every figure)."""
    from pathlib import Path

    from rla_ablate.fileio import check_folder, make_folder

    from rla_ablate.dashboard.build import FIGURES
    from rla_ablate.errors import UserError

    what = "the dashboard's page and figures"
    path = Path(out).absolute()
    if path.exists():
        check_folder(out, "--out", what)
        # a dashboard replaces its own page and figures (listed in FIGURES); another folder's files of those names
        # (index.html, a figure.png) would be overwritten without a word
        held = sorted(p.name for p in path.iterdir())
        if held and not (path / FIGURES).is_file():
            named = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
            raise UserError(f"{out} holds files a dashboard did not write ({len(held)}: {named}); give a new or empty "
                            "folder, or the folder of an earlier dashboard (it has figures.json)", key="--out")
        return
    # make it and its missing parents to see that the system allows them, then remove what was made
    missing = [path, *(p for p in path.parents if not p.exists())]
    make_folder(path, "--out", what)
    for p in missing:
        p.rmdir()


def run(args: argparse.Namespace) -> int:
    from rla_ablate.sweep.status import note_other_file, open_sweep_dir, resolve_name

    note_other_file(args.root, args.name)
    args.name = resolve_name(args.name)  # a sweep file names its sweep, as for status and results
    if args.out is not None:
        _check_out(args.out)
    if args.tracking_uri is not None:
        from rla_ablate.tracking.read import reader_uri

        args.tracking_uri = reader_uri(args.tracking_uri)
    else:  # the sweep's own store: an unknown sweep is said before anything else
        open_sweep_dir(args.root, args.name)
    # The imports and the specs' validation take seconds before build_dashboard reports its phases.
    print(f"dashboard {args.name}: loading the specs", file=sys.stderr, flush=True)
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn

    from rla_ablate.dashboard.build import build_dashboard
    from rla_ablate.dashboard.spec import load_specs

    from rla_ablate.terminal import PipeConsole

    console = PipeConsole()  # a reader that goes away (`| head`) ends the command with 141, as for every command
    n = len(load_specs(args.specs))
    columns = (TextColumn("[bold]dashboard[/] {task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"))
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("starting the tracking server", total=n)
        dash = build_dashboard(args.name, args.root, specs_dir=args.specs, out_dir=args.out,
                               tracking_uri=args.tracking_uri, include_stale=args.include_stale,
                               log_artifacts=not args.no_log,
                               progress=lambda spec: bar.update(task, advance=1, description=spec.name))
    if dash.synced:
        console.print(f"backfilled {dash.synced} metrics from the jobs' metrics.jsonl into MLflow", highlight=False)
    for r in dash.rendered:
        line = f"  {r.name:<28} {r.png}"
        if r.notes:
            line += f"  [yellow]({len(r.notes)} note{'s' if len(r.notes) > 1 else ''}: {escape(r.notes[0])}"
            line += " ...)" if len(r.notes) > 1 else ")"
        console.print(line, highlight=False, soft_wrap=True)
    for note in dash.notes:
        console.print(note, style="yellow", markup=False, highlight=False, soft_wrap=True)
    if dash.verdicts:
        console.print("verdicts (paired by seed, 95% t-interval; rules in each spec's claims:):", highlight=False)
        style = {"confirmed": "green", "contradicted": "red", "unresolved": "dim"}
        for v in dash.verdicts:
            rest = (f"{v.spec}: {v.claim.claim} | {v.comparison()}: Δ = {v.diff_text()} | {v.reason} | seeds for 80% "
                    f"power: {v.seeds_text()} | mechanism: {v.mechanism}")
            console.print(f"  [{style.get(v.verdict, '')}]{v.verdict:<12}[/] {escape(rest)}", highlight=False,
                          soft_wrap=True)
    console.print(f"page: [bold]{dash.page.resolve()}[/]", highlight=False, soft_wrap=True)
    if dash.logged_to:
        # the sweep's own store (`ui` serves it), or the shared server it logs to, or --tracking-uri
        where = (f"in the sweep's store: `rla-sweep ui {args.name} --root {shell_arg(args.root)}` serves it"
                 if dash.own_store else f"in {dash.tracking_uri}")
        from rla_ablate.dashboard.build import dashboard_folder

        console.print(f"logged to MLflow run {dash.logged_to} (artifacts/{dashboard_folder(args.specs)}/) {where}",
                      highlight=False, soft_wrap=True)
    elif args.no_log:
        console.print("not logged to MLflow (--no-log)", highlight=False)
    return 0
