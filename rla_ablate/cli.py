"""The `rla-sweep` command line.

Each subcommand lives in its own module under `rla_ablate.commands` and exposes
`register(subparsers)`, which adds a parser whose `func(args) -> int` runs it.
User errors (`UserError`) print one clear message and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from rla_ablate import __version__
from rla_ablate.errors import JobFailed, UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rla-sweep",
        description="Run and compare ablation studies of RLA / RDN (Lai et al., arXiv:2509.25223).",
    )
    parser.add_argument("--version", action="version", version=f"rla-sweep {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import rla_ablate.commands as commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"rla_ablate.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"rla-sweep: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except JobFailed as exc:
        print(f"rla-sweep: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rla-sweep: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
