"""The wheel carries the presets and dashboard specs: build it, install it into a fresh venv and run
`rla-sweep models` and `plan` from outside the repository (.ci/wheel-check; CI also runs a tiny launch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_wheel_installs_and_finds_its_data():
    done = subprocess.run([str(REPO / ".ci" / "wheel-check"), "--no-launch", sys.executable], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wheel-check: ok" in done.stdout


def test_models_fails_without_presets(monkeypatch, tmp_path, capsys):
    import rla_ablate.models.presets as presets
    from rla_ablate.cli import main

    monkeypatch.setattr(presets, "PRESET_DIR", tmp_path)
    assert main(["models"]) == 2
    assert "no model presets" in capsys.readouterr().err
