"""`rla-sweep launch FILE`: run every unfinished job of a sweep on Ray, logged to MLflow (see rla_ablate.sweep.launch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rla_ablate.commands import stopped_by_ctrl_c
from rla_ablate.environment import add_root_option


def add_run_options(parser: argparse.ArgumentParser) -> None:
    add_root_option(parser, "folder for the sweep's state, checkpoints and databases")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join (e.g. 10.0.0.1:6379 or 'auto'); default: start a local Ray instance")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking server for the jobs, http(s)://HOST:PORT (e.g. one `rla-sweep server` "
                             "started on a database store); default: start a local one on 127.0.0.1 with its SQLite "
                             "store under --root")
    parser.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                        help="hand Ray at most N jobs at a time, running or queued, so at most N run at once "
                             "(default: twice what the cluster's resources run at once, for a search exactly that)")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "launch", help="run a sweep on Ray: skip finished jobs, resume unfinished ones, log to MLflow",
        description="Expand the sweep file into jobs (each identified by a hash of its resolved config), skip the "
                    "finished ones, resume unfinished ones from their checkpoints and schedule the rest on Ray. "
                    "Exits 0 only when every job ended: finished, or diverged (a result, never rerun).")
    parser.add_argument("file", help="the sweep file (YAML), e.g. sweeps/smoke.yaml")
    add_run_options(parser)
    parser.add_argument("--new-version", action="store_true",
                        help="make FILE the next version of the sweep of its name even though it comes from another "
                             "path and shares none of its jobs (refused by default: it looks like another study)")
    parser.set_defaults(func=run)


def check_root(root: Path, *, write: bool) -> None:
    """--root must be a folder (or not exist yet); a launch must be able to write in it."""
    from rla_ablate.errors import UserError
    from rla_ablate.fileio import check_folder

    if root.exists() and not root.is_dir():
        raise UserError(f"{root} is a file, not a folder; give --root a folder (it is created if missing)",
                        key="--root")
    if write:
        check_folder(root, "--root", "the sweeps' state, checkpoints and databases")


def options(args: argparse.Namespace, new_version: bool = False):
    from rla_ablate.sweep.launch import LaunchOptions

    check_root(Path(args.root), write=True)
    if args.tracking_uri is not None:
        from rla_ablate.tracking.server import check_tracking_uri

        check_tracking_uri(args.tracking_uri)
    return LaunchOptions(root=Path(args.root), address=args.address, tracking_uri=args.tracking_uri,
                         max_concurrent=args.max_concurrent, new_version=new_version)


def run(args: argparse.Namespace) -> int:
    from rla_ablate.sweep.expand import check_sweep_file
    from rla_ablate.sweep.launch import launch

    check_sweep_file(args.file)
    with stopped_by_ctrl_c():  # also when started in the background by a script (`kill -INT` stops it)
        return exit_code(launch(args.file, options(args, args.new_version)))


def exit_code(summary) -> int:
    """A launch's exit status: 0 when every job ended (finished or diverged), 141 (128 + SIGPIPE, as for any command
    whose reader went away: rla_ablate.cli) when its output was closed, 130 when it was stopped otherwise, else 1."""
    if summary.output_closed:
        return 141
    return 0 if summary.ok else (130 if summary.interrupted else 1)
