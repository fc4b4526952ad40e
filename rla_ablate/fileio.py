"""Small file helpers shared by every component."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that a reader (status, a relaunch after SIGKILL) never sees a torn file:
    a temporary file in the same folder, then an atomic rename over the target."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
