"""User-facing errors: the CLI prints them without a traceback and exits with their code."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class UserError(Exception):
    """Bad input from the user (a file, a flag, a key). Printed as is; exit code 2."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None, key: str | None = None):
        self.file, self.line, self.key = file, line, key
        self.message = message
        """The message without its file:line: key prefix."""
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        if key:
            where += f"{key}: "
        super().__init__(where + message)


@contextmanager
def keys_under(section: str) -> Iterator[None]:
    """A UserError raised inside with a key relative to a config section (a data config's `glob`) is raised again
    keyed from the job's top (`data.glob`, `eval.0.data.glob`), as --set and a sweep file write it; a problem of the
    section as a whole (key 'data') is said at the section."""
    try:
        yield
    except UserError as exc:
        if exc.file is not None or not exc.key or exc.key.startswith("--"):
            raise
        key = section if exc.key == "data" else f"{section}.{exc.key}"
        raise UserError(exc.message, line=exc.line, key=key) from None


class Notice(UserWarning):
    """A warning of the project's for the user (a damaged line in a metrics.jsonl, unreadable checkpoints): the CLI
    prints it as one line, 'rla-sweep: warning: ...', without Python's file and source line."""


class CheckpointError(Exception):
    """A job has checkpoints but none of them loads: resuming cannot work until they are moved away."""


class JobFailed(Exception):
    """A job could not finish; the message says why and how to resume."""

    exit_code = 1


def closest(word: str, choices: Iterable[str], n: int = 1) -> list[str]:
    """Up to `n` choices close to `word`, closest first (what `did_you_mean` names)."""
    import difflib

    return difflib.get_close_matches(str(word), list(choices), n=n)


def did_you_mean(word: str, choices: Iterable[str], *, n: int = 1, prefix: str = "") -> str:
    """" (did you mean 'x'?)" naming the choice closest to `word`, or "" when none is close; with n > 1 up to n
    choices, unquoted: " (did you mean a, b?)". `prefix` goes before each choice shown (e.g. a section name)."""
    close = closest(word, choices, n)
    if not close:
        return ""
    if n == 1:
        return f" (did you mean '{prefix}{close[0]}'?)"
    return f" (did you mean {', '.join(prefix + c for c in close)}?)"


def exception_line(exc: BaseException, limit: int = 200) -> str:
    """An exception in one line: its type and its message's first non-empty line, cut at `limit` characters: after
    its last whole sentence that fits, else with an ellipsis (never mid-sentence without saying so)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    line = lines[0]
    if len(line) > limit:
        end = line.rfind(". ", 0, limit)
        line = line[:end + 1] if end > 0 else line[:limit - 1].rstrip() + "…"
    return f"{type(exc).__name__}: {line}"
