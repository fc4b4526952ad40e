"""The console the commands print their tables on."""

from __future__ import annotations

import errno
import sys

from rich.console import Console


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        # rich's own handling exits 1 from inside print(); the CLI handles a closed stdout the same way for every
        # command (rla_ablate.cli), so the error goes up to it.
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "stdout was closed")


def stdout_console(pipe_width: int = 200) -> Console:
    """A console on stdout: a terminal's own width; a pipe or a file gets `pipe_width` columns rather than rich's
    default 80, so that a table is printed whole (`rla-sweep models | less`), not with its columns cut."""
    return _StdoutConsole(width=None if sys.stdout.isatty() else pipe_width)
