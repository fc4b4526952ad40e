"""Failed jobs name their cause: real CLI launches of small CPU sweeps whose jobs raise once (RLA_SWEEP_FAIL_ONCE,
RLA_SWEEP_FAIL_KIND picks the exception, per job). The summary and `status` show "Type: message" and the error.log path,
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


def test_deterministic_failures_are_not_retried_and_oom_is_reported(tmp_path):
    # One launch, one job per failure kind (RLA_SWEEP_FAIL_KIND per job id), retries allowed.
    from rla_ablate.sweep import load_sweep

    f = tmp_path / "fail-kinds.yaml"
    f.write_text(yaml.safe_dump({**sweep("fail-kinds", retries=2), "seeds": [0, 1, 2]}, sort_keys=False))
    ids = [job.job_id for job in load_sweep(f).jobs]
    kinds = dict(zip(ids, ["compile", "config", "oom"]))
    env = {"RLA_SWEEP_FAIL_ONCE": "*@1024", "RLA_SWEEP_FAIL_KIND": ",".join(f"{i}={k}" for i, k in kinds.items())}
    out = cli("launch", str(f), "--root", str(tmp_path / "runs"), env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "retrying" not in out.stdout and "rerunning" not in out.stdout
    for shown in ("cause compile: CompilationError: injected failure at 1024 tokens",
                  "cause config: UserError: injected failure at 1024 tokens"):
        assert shown in out.stdout
    # jobs.json carries the plan's estimate; a CPU job has no GPU share to report
    assert re.search(r"cause oom: out of memory: estimated [0-9.e-]+ GiB, had unknown \(RuntimeError: CUDA out of memory",
                     out.stdout), out.stdout
    jobs = json.loads(cli("status", "fail-kinds", "--root", str(tmp_path / "runs"), "--json").stdout)["jobs"]
    for job in jobs:
        assert (job["cause"], job["status"]) == (kinds[job["job_id"]], "failed")
        state = json.loads((tmp_path / "runs" / "fail-kinds" / "jobs" / job["job_id"] / "status.json").read_text())
        assert state["attempts"] == 1
    # Out of memory may pass when the GPU has more free memory: the resume hint stays (a launch whose every failure
    # is deterministic has none: tests/test_faults.py, tests/test_outcome.py).
    assert "rla-sweep resume fail-kinds" in out.stderr


def test_an_attempt_a_stop_interrupted_while_it_started_is_cancelled_not_failed():
    from rla_ablate.outcome import Cause, JobOutcome, Status
    from rla_ablate.sweep.launch import stopped_outcome

    wrapped = JobOutcome(Status.FAILED, tokens_done=0, cause=Cause.OTHER, error="SchemaError: Error building ...",
                         traceback="Traceback ...\n  SchemaError: Error building `literal` serializer:\n  KeyboardInterrupt: \n")
    got = stopped_outcome(wrapped, "cancelled by `rla-sweep cancel`")
    assert got.status == Status.CANCELLED and got.error == "cancelled by `rla-sweep cancel` while it started"
    real = JobOutcome(Status.FAILED, tokens_done=512, cause=Cause.OTHER, error="ValueError: bad", traceback="ValueError")
    assert stopped_outcome(real, "interrupted") is real
    done = JobOutcome(Status.CANCELLED, tokens_done=512, error="cancelled at 512 tokens")
    assert stopped_outcome(done, "interrupted") is done


def test_a_relaunch_that_would_log_to_another_store_is_refused(tmp_path):
    """A sweep's runs stay in the store its first launch logged to: a relaunch with another --tracking-uri (or
    none after one) would leave the finished jobs' runs behind, and results and dashboards would show them as not
    started. `resume` logs to the server the sweep was launched with."""
    from rla_ablate.errors import UserError
    from rla_ablate.sweep.launch import check_store, stored_tracking_uri
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(tmp_path, "s")
    sdir.path.mkdir(parents=True)
    check_store(sdir, "http://127.0.0.1:5088")  # no launch yet: any store
    sdir.write_meta(tracking_uri="http://127.0.0.1:41234", backend_uri="sqlite:///x.db", embedded_tracking=True)
    assert stored_tracking_uri(sdir) is None
    check_store(sdir, None)
    with pytest.raises(UserError, match="logs its runs to its own store under --root .* Launch with no "
                                        "--tracking-uri") as err:
        check_store(sdir, "http://127.0.0.1:5088")
    assert err.value.key == "--tracking-uri"
    sdir.write_meta(tracking_uri="http://127.0.0.1:5088", embedded_tracking=False)
    assert stored_tracking_uri(sdir) == "http://127.0.0.1:5088"
    check_store(sdir, "http://127.0.0.1:5088/")
    check_store(sdir, "http://localhost:5088")  # this machine's server under its other name
    for other in (None, "http://127.0.0.1:5099", "http://10.0.0.2:5088", "https://127.0.0.1:5088"):
        with pytest.raises(UserError, match="Launch with --tracking-uri http://127.0.0.1:5088"):
            check_store(sdir, other)
