"""Failed jobs name their cause: real CLI launches of a one-job CPU sweep whose job raises once (RLA_SWEEP_FAIL_ONCE,
RLA_SWEEP_FAIL_KIND picks the exception). The summary and `status` show "Type: message" and the error.log path,
`status --json` keeps the traceback, and a deterministic failure is never retried."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from cli_run import cli

pytestmark = pytest.mark.slow

TINY = {"vocab_size": 257, "num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "head_dim": 16}


def sweep(name: str, retries: int) -> dict:
    return {
        "name": name,
        "models": [{"preset": "tiny-rla", "overrides": TINY}],
        "base": {
            "train": {"tokens": 2048, "seq_len": 64, "micro_batch_size": 4, "batch_tokens": 256, "warmup_tokens": 256,
                      "eval_every_tokens": 1024, "checkpoint_every_tokens": 1024, "cpu_threads": 1},
            "data": {"kind": "stdlib"},
            "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 256}],
        },
        "resources": {"cpus": 1, "retries": retries},
    }


def launch_failing(tmp_path: Path, name: str, retries: int, kind: str) -> subprocess.CompletedProcess:
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(sweep(name, retries), sort_keys=False))
    env = {"RLA_SWEEP_FAIL_ONCE": "*@1024", "RLA_SWEEP_FAIL_KIND": kind}
    return cli("launch", str(f), "--root", str(tmp_path / "runs"), env=env)


def test_a_failure_names_its_exception_and_its_log(tmp_path):
    out = launch_failing(tmp_path, "fail-other", retries=0, kind="other")
    assert out.returncode == 1, out.stdout + out.stderr
    line = "RuntimeError: injected failure at 1024 tokens (RLA_SWEEP_FAIL_ONCE, RLA_SWEEP_FAIL_KIND=other)"
    assert f"cause other: {line}" in out.stdout
    assert "Traceback (most recent call last)" not in out.stdout
    doc = json.loads(cli("status", "fail-other", "--root", str(tmp_path / "runs"), "--json").stdout)
    (job,) = doc["jobs"]
    assert (job["status"], job["cause"], job["error"]) == ("failed", "other", line)
    assert job["traceback"].startswith("Traceback (most recent call last):") and job["traceback"].rstrip().endswith(line)
    log = Path(job["error_log"])
    assert f"traceback: {log}" in out.stdout
    text = log.read_text()
    assert text.startswith("=== attempt 1 at ") and "cause other" in text and line in text
    table = cli("status", "fail-other", "--root", str(tmp_path / "runs"))
    assert table.returncode == 0, table.stderr
    assert "RuntimeError: injected failure at 1024 tokens" in table.stdout and "Traceback (most" not in table.stdout
    assert str(log) in table.stdout and "runs: None" not in table.stdout
    # A transient failure: resuming may help, and the summary says how.
    assert "rla-sweep resume fail-other" in out.stderr


@pytest.mark.parametrize("kind,cause,shown", [
    ("compile", "compile", "CompilationError: injected failure at 1024 tokens"),
    ("config", "config", "UserError: injected failure at 1024 tokens"),
])
def test_a_deterministic_failure_is_not_retried(tmp_path, kind, cause, shown):
    name = f"fail-{kind}"
    out = launch_failing(tmp_path, name, retries=2, kind=kind)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "retrying" not in out.stdout and f"cause {cause}: {shown}" in out.stdout
    (job,) = json.loads(cli("status", name, "--root", str(tmp_path / "runs"), "--json").stdout)["jobs"]
    assert job["cause"] == cause and job["status"] == "failed"
    state = json.loads((tmp_path / "runs" / name / "jobs" / job["job_id"] / "status.json").read_text())
    assert state["attempts"] == 1
    # A resume would fail the same way: no resume hint.
    assert "rla-sweep resume" not in out.stderr and "repeats on each attempt" in out.stderr


def test_out_of_memory_on_cpu_is_reported_not_retried(tmp_path):
    out = launch_failing(tmp_path, "fail-oom", retries=2, kind="oom")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "retrying" not in out.stdout and "rerunning" not in out.stdout
    # jobs.json carries the plan's estimate; a CPU job has no GPU share to report
    assert re.search(r"cause oom: out of memory: estimated [0-9.e-]+ GiB, had unknown \(RuntimeError: CUDA out of memory",
                     out.stdout), out.stdout
