"""`rla-sweep resume NAME`: launch a sweep again from the copy of its file kept under --root."""

from __future__ import annotations

import argparse


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
                        f"again: `rla-sweep launch FILE --root {sdir.root}`")
    if not saved.is_file():
        raise no_sweep(sdir)
    return exit_code(launch(saved, options(args)))
