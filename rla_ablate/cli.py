"""The `rla-sweep` command line.

Each subcommand lives in its own module under `rla_ablate.commands` and exposes
`register(subparsers)`, which adds a parser whose `func(args) -> int` runs it.
User errors (`UserError`) print one clear message and exit 2, never a traceback. A reader that closes stdout or
stderr early (`rla-sweep results NAME --csv | head`, `rla-sweep train ... 2>&1 | head`) ends the command quietly
with exit status 141, as SIGPIPE ends a Unix tool.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from rla_ablate import __version__, environment
from rla_ablate.errors import JobFailed, UserError, closest, did_you_mean


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


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The arguments; what the command does not take is refused by the command's own parser (its usage, not the
    top-level one), naming the commands that take an unknown option where some do."""
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    words = sys.argv[1:] if argv is None else argv
    if words and not words[0].startswith("-") and words[0] not in subs:
        parser.error(f"unknown command '{words[0]}'{did_you_mean(words[0], subs)}; commands: {', '.join(sorted(subs))}")
    args, extras = parser.parse_known_args(argv)
    command = getattr(args, "command", None)
    if not extras:
        return args
    message = f"unrecognized arguments: {' '.join(extras)}"
    if command is None:
        parser.error(message)
    own = _innermost(subs[command], args)  # `data prepare`'s parser, not `data`'s
    every = dict(_all_parsers(subs))

    def takers_of(option: str) -> list[str]:
        return sorted(name for name, sub in every.items() if option in sub._option_string_actions)

    for option in dict.fromkeys(x.split("=", 1)[0] for x in extras if x.startswith("--")):
        takers = takers_of(option)
        if option == "--resume":
            message += ("; rerun the same command to resume: train goes on from the newest checkpoint in its --out, "
                        "a launch from each job's (`rla-sweep resume NAME` for a sweep)")
        elif takers:  # an option of other commands, exactly: not this command's closest option
            message += f"; {option} is an option of {', '.join(takers)}"
        else:
            # compared without the dashes, which every option shares (else "--foo" is close to "--root")
            mine = [o[2:] for o in own._option_string_actions if o.startswith("--")]
            anyone = {o[2:] for sub in every.values() for o in sub._option_string_actions if o.startswith("--")}
            word = option[2:]
            alone = extras == [option]  # named once: the hint follows it, not the option again
            hint = did_you_mean(word, mine, prefix="--")
            if not hint:
                # close to another command's option only: named as theirs, with what this command takes instead
                near = closest(word, sorted(anyone), 1)
                hint = (("; it is" if alone else " is") + " no command's option"
                        + (f" (--{near[0]} is an option of {', '.join(takers_of('--' + near[0]))})" if near else "")
                        + f"; {own.prog.removeprefix('rla-sweep ')} takes {', '.join('--' + o for o in sorted(mine))}")
            message += ("" if alone else f"; {option}") + hint
    own.error(message)
    raise AssertionError("unreachable")  # ArgumentParser.error exits


def _all_parsers(subs: dict, prefix: str = ""):
    """(name, parser) of every command and every action of one (`data prepare`)."""
    for name, sub in subs.items():
        yield prefix + name, sub
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                yield from _all_parsers(action.choices, f"{prefix}{name} ")


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command that was given: a command with actions of its own (`data prepare`) has them
    as a subparsers action whose dest the namespace holds."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest or "", None) in action.choices:
            return _innermost(action.choices[getattr(args, action.dest)], args)
    return parser


def _project_warnings() -> None:
    """The project's warnings for the user (`errors.Notice`: a damaged line in a metrics.jsonl, unreadable
    checkpoints) as one line each on stderr, 'rla-sweep: warning: ...', without Python's file and source line; other
    warnings as Python shows them."""
    import warnings

    from rla_ablate.errors import Notice

    if getattr(warnings.showwarning, "project_lines", False):  # main() again in one process (the tests)
        return
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, Notice):
            print(f"rla-sweep: warning: {message}", file=file or sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    show.project_lines = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    _project_warnings()
    parser = build_parser()
    args = _parse(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # MLflow's artifact transfers draw tqdm bars of their own ("Downloading artifacts: 0%") among the commands'
    # progress; a user's explicit setting stays
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        environment.check()
        code = int(args.func(args) or 0)
        # What is still buffered is written here, where a closed stdout is handled like one closed mid-command.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        closed = [stream for stream in (sys.stdout, sys.stderr) if _closed(stream)]
        if not closed:
            raise
        # The Python docs' handling of SIGPIPE: the closed stream (stdout, or stderr where progress goes, as in
        # `rla-sweep train ... 2>&1 | head`) points at /dev/null, so the interpreter's last flush of what is still
        # buffered cannot fail again. SIGPIPE itself stays ignored: with its default action a closed socket (Ray,
        # MLflow) would kill the process.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in closed:
            os.dup2(devnull, stream.fileno())
        return 141  # 128 + SIGPIPE
    except UserError as exc:
        print(f"rla-sweep: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except JobFailed as exc:
        print(f"rla-sweep: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rla-sweep: interrupted", file=sys.stderr)
        return 130


def _closed(stream) -> bool:
    """Whether `stream` (stdout, stderr) is a pipe that nobody reads any more (a BrokenPipeError can also come from
    a socket)."""
    import select

    try:
        poll = select.poll()
        poll.register(stream.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
