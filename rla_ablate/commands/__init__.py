"""CLI subcommands: one module each, discovered by `rla_ablate.cli` (add a file, get a command)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def stopped_by_ctrl_c() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt inside (restored after), for the commands that run until Ctrl-C (`server`,
    `ui`). A process started in the background by a non-interactive shell (`cmd &`) inherits SIGINT ignored and
    Python leaves it so: `kill -INT`, the documented way to stop them, did nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
