"""A clip-radius sweep launched for real (tiny model, CPU, a few hundred tokens per job), then read back by
`rla-sweep results` and the dashboard: one series per clip value with n = seeds, from the tags `launch` wrote."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rla_ablate.cli import main

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

TINY = {"num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "head_dim": 16}
SWEEP = {
    "name": "clip-e2e",
    "models": [{"preset": "tiny-rla", "overrides": TINY}],
    "base": {
        "train": {"tokens": 512, "seq_len": 64, "micro_batch_size": 4, "batch_tokens": 256, "warmup_tokens": 0,
                  "eval_every_tokens": 512, "checkpoint_every_tokens": 512, "cpu_threads": 1},
        "data": {"kind": "stdlib"},
        "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 256}],
    },
    "grid": {"model.clip": [0.05, 0.2, 1.0]},
    "seeds": [0, 1],
    "resources": {"cpus": 1, "retries": 0},
}


def test_launched_clip_sweep_gives_one_series_per_clip_value(tmp_path, capsys, monkeypatch):
    path = tmp_path / "clip.yaml"
    path.write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    root = tmp_path / "runs"
    out = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "launch", str(path), "--root", str(root)],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    # The launch is over: read its SQLite store directly (no server to start).
    store = f"sqlite:///{root / 'clip-e2e' / 'mlflow' / 'mlflow.db'}"
    assert main(["results", "clip-e2e", "--root", str(root), "--tracking-uri", store, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 6 and {r["status"] for r in rows} == {"finished"}
    # what ran, beside the numbers
    assert {(r["kernel_backend"], r["glue"]) for r in rows} == {("chunk", "torch")}
    by_clip: dict[str, list[dict]] = {}
    for r in rows:
        by_clip.setdefault(r["point.model.clip"], []).append(r)
    assert sorted(by_clip) == ["0.05", "0.2", "1.0"]
    for clip, members in by_clip.items():
        assert sorted(r["seed"] for r in members) == ["0", "1"]
        assert len({r["series"] for r in members}) == 1, clip
        assert all(r["arm"] == "tiny-rla" and r["eval/val/loss"] for r in members)
    assert len({r["series"] for r in rows}) == 3
    # Without --tracking-uri, `results` reads a finished sweep's SQLite store itself: no MLflow server starts.
    from rla_ablate.tracking import TrackingServer

    def no_server(self, wait=True):
        raise AssertionError("results started an MLflow server to read a store nobody serves")

    with monkeypatch.context() as m:
        m.setattr(TrackingServer, "start", no_server)
        assert main(["results", "clip-e2e", "--root", str(root), "--csv"]) == 0
    assert list(csv.DictReader(io.StringIO(capsys.readouterr().out))) == rows
    # The question's table: one row per clip value, two seeds each (not "RLA (n=2)" for one of them). The paper's
    # specs compare ablations this sweep does not run: none is drawn, each claim is one line of what it needs.
    from rla_ablate.dashboard.build import build_dashboard

    dash = build_dashboard("clip-e2e", root, specs_dir=REPO / "dashboards" / "questions", tracking_uri=store,
                           log_artifacts=False, phase=None)
    table = next(r for r in dash.rendered if r.name == "clip_radius")
    labels = {row[0].text: row for row in table.rows}
    assert sorted(labels) == ["clip=0.05", "clip=0.2", "clip=1.0"]
    for row in labels.values():
        assert "(n=2)" in row[1].text and [t for t, _ in row[-1].links] == ["seed 0", "seed 1"]
    # At this size the mechanisms are off: the verdicts say so and suggest no seeds.
    assert {(v.mechanism, v.seeds_needed) for v in dash.verdicts} <= {("off", None), ("identical", None)}
    paper = build_dashboard("clip-e2e", root, tracking_uri=store, log_artifacts=False, phase=None)
    assert [r.name for r in paper.rendered] == ["validity"] and not paper.verdicts
    assert {u.spec for u in paper.untested} >= {"table4_no_fitting", "table5_output_gates"}
    # The command line on the store itself: the launch's runs keep their files behind its server (mlflow-artifacts:),
    # which a sqlite client cannot write to. The page is still written; the files' logging is a note, not a traceback.
    capsys.readouterr()
    assert main(["dashboard", "clip-e2e", "--root", str(root), "--tracking-uri", store, "--specs",
                 str(REPO / "dashboards" / "questions"), "--out", str(tmp_path / "dash")]) == 0
    said = capsys.readouterr().out
    assert "not logged to MLflow" in said and "logged to MLflow run" not in said, said
    assert (tmp_path / "dash" / "index.html").is_file()
    # without --tracking-uri the command serves the store only while it runs: the page names the store it read
    assert main(["dashboard", "clip-e2e", "--root", str(root), "--specs", str(REPO / "dashboards" / "questions"),
                 "--out", str(tmp_path / "dash2")]) == 0
    rendered = (tmp_path / "dash2" / "index.html").read_text().split("Rendered ", 1)[1].split("</p>", 1)[0]
    assert f"from the sweep&#x27;s MLflow store {root / 'clip-e2e' / 'mlflow'}" in rendered, rendered
    # a bare path or a missing store is no tracking URI: exit 2, and no empty store is created in its place
    db = root / "clip-e2e" / "mlflow" / "mlflow.db"
    for command in ("results", "dashboard"):
        assert main([command, "clip-e2e", "--root", str(root), "--tracking-uri", str(db)]) == 2
        assert f"did you mean 'sqlite:///{db.resolve()}'?" in capsys.readouterr().err
        assert main([command, "clip-e2e", "--root", str(root), "--tracking-uri", f"sqlite:///{tmp_path}/none.db"]) == 2
        assert "no SQLite store at" in capsys.readouterr().err and not (tmp_path / "none.db").exists()
