"""`rla-sweep resume NAME`: launch a sweep again from the copy of its file kept under --root."""

from __future__ import annotations

import argparse

from rla_ablate.commands import stopped_by_ctrl_c
from rla_ablate.fileio import shell_arg


def register(subparsers) -> None:
    from rla_ablate.commands.launch import add_run_options

    parser = subparsers.add_parser(
        "resume", help="relaunch a sweep from its saved file: only unfinished jobs run, from their checkpoints",
        description="Launch the sweep file saved by the last `rla-sweep launch` of NAME under --root again.")
    parser.add_argument("name", help="the sweep name (the `name:` of its file), or that file")
    add_run_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rla_ablate.commands.launch import exit_code, options
    from rla_ablate.errors import UserError
    from rla_ablate.sweep.launch import launch
    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.status import no_sweep, resolve_name

    args.name = resolve_name(args.name)  # a sweep file names its sweep, as for status and results
    sdir = SweepDir(args.root, args.name)
    saved = sdir.path / "sweep.yaml"
    if not saved.is_file() and (sdir.path / "jobs.json").is_file():
        raise UserError(f"sweep '{args.name}' under {sdir.root} has no saved sweep file ({saved}); launch its file "
                        f"again: `rla-sweep launch FILE --root {shell_arg(sdir.root)}`")
    if not saved.is_file():
        raise no_sweep(sdir)
    saved = saved.resolve()
    from rla_ablate.sweep.launch import stored_tracking_uri

    stored = stored_tracking_uri(sdir)
    if args.tracking_uri is None and stored is not None:  # the server its runs are on, as the launch gave it
        import sys

        print(f"resume: logging to {stored}, the tracking server sweep '{args.name}' was launched with",
              file=sys.stderr)
        args.tracking_uri = stored
    _from_launch_folder(args, sdir)
    with stopped_by_ctrl_c():  # also when started in the background by a script (`kill -INT` stops it)
        return exit_code(launch(saved, options(args)))


def _from_launch_folder(args: argparse.Namespace, sdir) -> None:
    """Run from the folder the sweep was launched in: the saved file's relative data paths meant that folder, and
    read from another they name other files (a missing one, or another job under the same name)."""
    import os
    import sys
    from pathlib import Path

    cwd = sdir.meta().get("cwd")
    if not cwd or Path(cwd).resolve() == Path.cwd().resolve():
        return
    if not Path(cwd).is_dir():
        print(f"note: the folder sweep '{args.name}' was launched from, {cwd}, is gone: its file's relative paths "
              "are read from this one", file=sys.stderr)
        return
    args.root = str(Path(args.root).resolve())  # the only path among the options (--tracking-uri is http(s))
    os.chdir(cwd)
    print(f"resume: from {cwd}, the folder '{args.name}' was launched from (its file's relative paths mean that one)",
          file=sys.stderr)
