"""The GPU benchmark scripts' CPU modes: they must keep running where they are not timed (CI has no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_train_gpu_runs_tiny_presets_on_the_cpu(tmp_path):
    out = tmp_path / "train.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/train_gpu.py", "--device", "cpu", "--scale", "tiny", "--families", "rla", "sgla",
         "--batch", "2", "--seq-len", "64", "--steps", "1", "--warmup", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["family"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"rla", "sgla"}
    for r in rows.values():
        assert r["tokens_per_s"] > 0 and r["backend"] == "chunk" and r["warmup_s"] >= 0
    assert "rla: warm-up step 1/1" in proc.stderr  # progress for the minutes a fresh GPU node spends compiling
    assert "tiny-rla" in proc.stdout and "x " in proc.stdout.split("tiny-rla")[-1].splitlines()[0]  # the ratio column
