"""`rla-sweep cancel NAME`: stop a running launch; its jobs checkpoint and `resume` continues them."""

from __future__ import annotations

from rla_ablate.environment import add_root_option

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "cancel", help="stop a running sweep (jobs save a checkpoint first)",
        description="Ask the launch of NAME to stop its jobs at their next step and exit; without a running launch, "
                    "mark its unfinished jobs cancelled.")
    parser.add_argument("name", help="the sweep name (or its sweep file)")
    add_root_option(parser)
    parser.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                        help="how long to wait for the launch to exit (default 120)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rla_ablate.sweep.status import cancel, open_sweep

    return 0 if cancel(open_sweep(args.root, args.name), args.wait) else 1
