"""The proxy study's CPU twin (sweeps/proxy-study-tiny.yaml) end to end through `rla-sweep launch`: MQAR trained
with labels on the queries only and scored at two difficulties, per-arm data, the wall-clock-matched baseline,
and the mechanism diagnostics of the proxy options."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_tiny_proxy_study_launches_and_engages_the_mechanisms(tmp_path):
    root = tmp_path / "runs"
    out = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "launch", "sweeps/proxy-study-tiny.yaml",
                          "--root", str(root)], cwd=REPO, capture_output=True, text=True, timeout=900,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    from mlflow.tracking import MlflowClient

    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.status import sweep_status

    doc = sweep_status(SweepDir(root, "proxy-study-tiny"))
    jobs = {j["name"]: j for j in doc["jobs"]}
    assert len(jobs) == 4 and {j["status"] for j in jobs.values()} == {"finished"}, jobs
    client = MlflowClient(doc["tracking_uri"])
    metrics = {name: client.get_run(j["mlflow_run_id"]).data.metrics for name, j in jobs.items()}

    mqar = metrics["mqar-rla/seed0"]
    assert {"eval/mqar_kv4/acc", "eval/mqar_kv8/acc"} <= set(mqar) and "eval/val/loss" not in mqar
    assert "eval/val/loss" in metrics["lm-rla/seed0"]
    # The proxy options engage both mechanisms (thresholds of docs/TRAINING.md).
    for name in ("mqar-rla/seed0", "lm-rla/seed0"):
        assert metrics[name]["diag/target_engaged"] > 1e-3, name
        assert metrics[name]["diag/mixer_rms_over_sqrt_eps"] >= 1.0, name
    # The wall-clock control trains the baseline for the residual job's estimated time: its tokens are the residual
    # job's times the speed ratio, rounded up to whole batches.
    from rla_ablate.sweep.expand import load_sweep

    planned = {j.name: j for j in load_sweep(REPO / "sweeps" / "proxy-study-tiny.yaml").jobs}
    for arm in ("mqar-rla", "lm-rla"):
        name = f"sgla~matched_wallclock({arm})/seed0"
        report, train = planned[name].control_report, planned[name].job.train
        assert report["tokens"] == train.tokens == math.ceil(report["reference_tokens"] * report["speed_ratio"])
        assert jobs[name]["tokens_done"] == train.total_tokens
    # The control is the plain baseline: no gamma (no R), beta fixed at 1.
    control = metrics["sgla~matched_wallclock(mqar-rla)/seed0"]
    assert control["diag/beta_mean"] == 1.0 and "diag/gamma_mean" not in control
    # What a reader of the figures sees of it: each control's label carries its budget, and the page's notes say
    # where the budget came from (estimated speeds, fixed before the run).
    from rla_ablate.dashboard.reading import read_runs
    from rla_ablate.dashboard.data import group
    from rla_ablate.dashboard.spec import load_specs

    runs, selection = read_runs("proxy-study-tiny", root, doc["tracking_uri"])
    spec = next(s for s in load_specs(REPO / "dashboards" / "study") if s.name == "table_matched_state")
    labels = [s.label for series in group(spec, runs).values() for s in series]
    for arm in ("mqar-rla", "lm-rla"):
        control = planned[f"sgla~matched_wallclock({arm})/seed0"]
        report = control.control_report
        # the budget as trained (whole batches), which is what the pair compares
        assert report["tokens_trained"] == control.job.train.total_tokens == jobs[control.name]["tokens_done"]
        ratio = report["tokens_trained"] / report["reference_tokens_trained"]
        assert f"sGLA for RLA's time, {arm} ({ratio:.2f}x tokens)" in labels, labels  # the spec's name for it
    notes = selection.notes()
    assert notes[0] == "matched wall-clock budgets:" and len(notes) == 3, notes
    assert all("x the tokens of" in n and "as trained" in n and "measured" in n for n in notes[1:]), notes
