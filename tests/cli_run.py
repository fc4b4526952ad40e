"""The `rla-sweep` command line as the tests run it: a fresh interpreter at the repository root (a module next to
the tests, like dashboard_synthetic.py, so every test file imports the same one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = (sys.executable, "-m", "rla_ablate.cli")


def cli(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run `rla-sweep ARGS` to the end; `env` is added to this process's environment."""
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def cli_background(*args: str) -> subprocess.Popen:
    """Start `rla-sweep ARGS` and return at once (stdout and stderr merged into one pipe)."""
    return subprocess.Popen([*CLI, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
