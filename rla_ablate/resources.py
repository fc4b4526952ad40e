"""Data folders that ship with the package: the model presets (`models/`) and dashboard specs (`dashboards/`).

The top-level folders of the repository are the only source. Building a wheel copies them into
`rla_ablate/_bundled/` (see setup.py); a checkout (editable install, PYTHONPATH) has no such copy and
reads the top-level folders directly.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

BUNDLED = ("models", "dashboards")


def bundled_dir(name: str) -> Path:
    """The folder `name` ("models" or "dashboards"): the wheel's copy, else the checkout's top-level folder."""
    if name not in BUNDLED:
        raise ValueError(f"unknown bundled folder {name!r}; known: {', '.join(BUNDLED)}")
    packaged = importlib.resources.files("rla_ablate") / "_bundled" / name
    if packaged.is_dir():
        # Wheels install unzipped, so the traversable is a real folder on disk.
        return Path(str(packaged))
    return Path(__file__).resolve().parents[1] / name
