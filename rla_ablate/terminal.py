"""The console the commands print their tables on."""

from __future__ import annotations

import errno
import sys
from typing import Callable

from rich.console import Console

# The width a free-text column (fit_columns' `fold`) is given at the least: it wraps within it.
FOLD_WIDTH = 30


class PipeConsole(Console):
    """A console for a pipe its reader may close (`| head`, quitting `| less`): rich's own handling exits 1 from
    inside print(), which in a long command (a training job, a launch) would end it at once, mid-step.

    Without `on_closed` the console goes quiet and raises BrokenPipeError, which the CLI turns into exit 141 for
    every command (rla_ablate.cli): a table is cut short. With `on_closed` it goes quiet and calls it, and the
    command goes on to stop gracefully (a job checkpoints, a launch stops its jobs) instead of dying mid-write.
    """

    def __init__(self, *args, on_closed: Callable[[], None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.on_closed = on_closed
        if "soft_wrap" not in kwargs and not self.is_terminal:
            # into a pipe or a log file, a line of text stays one line: wrapped at 80 columns it broke the paths and
            # hints in it for grep and copy-paste (tables keep their width)
            self.soft_wrap = True

    def on_broken_pipe(self) -> None:
        self.quiet = True
        if self.on_closed is None:
            raise BrokenPipeError(errno.EPIPE, "the output was closed")
        self.on_closed()


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 step', '2 steps', '12,288 steps': a number with its noun in the number's form."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def stdout_console(pipe_width: int = 200) -> Console:
    """A console on stdout: a terminal's own width; a pipe or a file gets `pipe_width` columns rather than rich's
    default 80, so that a table is printed whole (`rla-sweep models | less`), not with its columns cut."""
    return PipeConsole(width=None if sys.stdout.isatty() else pipe_width)


def fit_columns(console: Console, columns: list[str], rows: list[list[str]], keep: int,
                drop_order: list[str] | None = None, fold: tuple[str, ...] = ()) -> tuple[list[int], list[str]]:
    """Which columns of a table fit the console's width: (indices kept, names left out).

    A table squeezed into a narrow terminal cuts every cell to a few letters ("tiny-…"), its names and ids
    unreadable; instead, whole columns are left out until the rest fits at their natural widths. The first `keep`
    columns (what names a row) always stay; the others leave in `drop_order` (default: from the last). Columns in
    `fold` (free text, e.g. an error) count as at most `FOLD_WIDTH` wide: they wrap. Markup counts as printed."""
    from rich.text import Text

    def width(cell: str) -> int:
        return max((len(line) for line in Text.from_markup(cell).plain.splitlines()), default=0)

    natural = [min(max([len(name)] + [width(r[i]) for r in rows]), FOLD_WIDTH if name in fold else 10**6) + 3
               for i, name in enumerate(columns)]
    kept = list(range(len(columns)))
    order = [columns.index(c) for c in drop_order] if drop_order else list(range(len(columns) - 1, keep - 1, -1))
    for i in order:
        if sum(natural[j] for j in kept) + 1 <= console.width:
            break
        if i >= keep:
            kept.remove(i)
    return kept, [columns[i] for i in range(len(columns)) if i not in kept]


def fitted_table(console: Console, title: str, columns: list[str], rows: list[list[str]], *, keep: int,
                 drop_order: list[str] | None = None, fold: tuple[str, ...] = (), right: tuple[str, ...] = (),
                 captions: tuple[str, ...] | list[str] = (), whole: str = "--json"):
    """A table of the `columns` that fit the console (`fit_columns`), with `captions` under it and, when columns
    were left out, a line naming them and the option (`whole`) that prints every column."""
    from rich.table import Table

    kept, left_out = fit_columns(console, columns, rows, keep, drop_order, fold)
    notes = list(captions) + ([f"left out for the terminal's width: {', '.join(left_out)} ({whole} has every "
                               "column)"] if left_out else [])
    table = Table(title=title, caption="\n".join(notes) or None)
    for i in kept:
        table.add_column(columns[i], justify="right" if columns[i] in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(row[i] for i in kept))
    return table
