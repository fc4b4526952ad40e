"""Fault injection on real processes: one real CLI launch, a real local Ray instance, the real embedded MLflow server
and tiny CPU jobs (the `faulted` fixture sets up every fault). Nothing is lost and nothing is left half-made:

- the MLflow server is paused (SIGSTOP, then SIGCONT) and later killed (SIGKILL of its process group) while the jobs
  train: the launch restarts it on the same store and port, says so in one line, and ends with every (metric, step)
  of each job's metrics.jsonl in its run exactly once and every run in a final state;
- a job whose newest checkpoint is torn resumes from the older one, says so in the launch output and in
  `status`, and ends bit for bit where the uninterrupted job ended;
- a job whose checkpoints are all unreadable fails once with cause `checkpoint` and a one-line reason: no retry,
  no `resume` hint.

(`status` and `cancel` on a read-only root: tests/test_front_door.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from rla_ablate.tracking import is_healthy
from cli_run import REPO, cli

pytestmark = pytest.mark.slow

TINY = {"vocab_size": 257, "num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "head_dim": 16}
TOKENS = 30720


def sweep_file(path: Path, name: str, retries: int = 0) -> Path:
    data = {"name": name, "models": [{"preset": "tiny-rla", "overrides": TINY}],
            "base": {"train": {"tokens": TOKENS, "seq_len": 64, "micro_batch_size": 4, "batch_tokens": 256,
                               "warmup_tokens": 256, "eval_every_tokens": TOKENS // 4,
                               "checkpoint_every_tokens": TOKENS // 6, "keep_checkpoints": 3, "cpu_threads": 1},
                     "data": {"kind": "stdlib"},
                     "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 256}]},
            "seeds": [0, 1, 2, 3], "resources": {"cpus": 1, "retries": retries}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def wait_for(what: str, check, timeout: float, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the launch exited ({proc.returncode}) before {what}:\n{out}\n{err}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def job_states(sweep_dir: Path) -> dict[str, dict]:
    out = {}
    for p in (sweep_dir / "jobs").glob("*/status.json"):
        try:
            out[p.parent.name] = json.loads(p.read_text())
        except ValueError:
            pass
    return out


def server_pgid(sweep_dir: Path) -> int | None:
    try:
        return int(json.loads((sweep_dir / "mlflow" / "server.json").read_text())["pgid"])
    except (OSError, ValueError, KeyError):
        return None


def check_runs(tracking_uri: str, sweep_dir: Path) -> dict[str, str]:
    """Every (metric, step) of each job's metrics.jsonl is in its run once; returns run status by job id."""
    from mlflow.tracking import MlflowClient

    from rla_ablate.train.loggers import read_jsonl

    client = MlflowClient(tracking_uri)
    statuses = {}
    for job_id, st in job_states(sweep_dir).items():
        want = {(key, r["step"]) for r in read_jsonl(sweep_dir / "jobs" / job_id / "metrics.jsonl")
                if r.get("type") == "metrics" for key in r["values"]}
        have = []
        for key in {k for k, _ in want}:
            have += [(key, m.step) for m in client.get_metric_history(st["mlflow_run_id"], key)]
        assert len(have) == len(set(have)), f"run of job {job_id} holds some (metric, step) twice"
        missing = want - set(have)
        assert not missing, f"run of job {job_id} lacks {len(missing)} points, e.g. {sorted(missing)[:5]}"
        statuses[job_id] = client.get_run(st["mlflow_run_id"]).info.status
    return statuses


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    """One launch of four jobs (seeds 0-3, two train at a time). Seeds 0 and 1 train from scratch while the MLflow
    server is paused for 2 s, then killed. Seed 2's folder holds the checkpoints of an uninterrupted run of the same
    job (the reference), its newest one torn in half; every checkpoint in seed 3's folder is unreadable."""
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.train import run_job
    from rla_ablate.train.checkpoint import list_checkpoints

    base = tmp_path_factory.mktemp("faults")
    root, sweep_dir = base / "runs", base / "runs" / "faults"
    path = sweep_file(base / "faults.yaml", "faults", retries=1)
    jobs = {j.seed: j for j in load_sweep(path).jobs}
    reference = base / "reference"
    assert run_job(jobs[2].job, reference).status == "finished"
    torn_dir, broken_dir = sweep_dir / "jobs" / jobs[2].job_id, sweep_dir / "jobs" / jobs[3].job_id
    shutil.copytree(reference / "checkpoints", torn_dir / "checkpoints")
    shutil.copy2(reference / "metrics.jsonl", torn_dir / "metrics.jsonl")
    ckpts = list_checkpoints(torn_dir)
    assert len(ckpts) == 3
    data = ckpts[-1][1].read_bytes()
    ckpts[-1][1].write_bytes(data[:len(data) // 2])
    (broken_dir / "checkpoints").mkdir(parents=True)
    for tokens, _ in ckpts:
        (broken_dir / "checkpoints" / f"ckpt-{tokens:015d}.pt").write_bytes(b"not a checkpoint")

    proc = subprocess.Popen([sys.executable, "-m", "rla_ablate.cli", "launch", str(path), "--root", str(root)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    fresh = {jobs[0].job_id, jobs[1].job_id}
    try:
        def tokens() -> int:
            return sum(s["tokens_done"] for k, s in job_states(sweep_dir).items() if k in fresh)

        wait_for("a job to train", lambda: tokens() > 0, 180, proc)
        pgid = server_pgid(sweep_dir)
        uri = json.loads((sweep_dir / "sweep.json").read_text())["tracking_uri"]
        os.killpg(pgid, signal.SIGSTOP)
        time.sleep(2.0)
        os.killpg(pgid, signal.SIGCONT)
        wait_for("the server to answer again", lambda: is_healthy(uri), 30, proc)
        os.killpg(pgid, signal.SIGKILL)
        running = [k for k, s in job_states(sweep_dir).items() if k in fresh and s["status"] == "running"]
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {"root": root, "dir": sweep_dir, "code": proc.returncode, "out": out, "err": err, "jobs": jobs,
            "running_at_kill": running,
            "reference": reference, "older": ckpts[-2][0]}


def test_a_killed_and_a_paused_server_lose_nothing(faulted):
    out, jobs = faulted["out"], faulted["jobs"]
    assert faulted["running_at_kill"], "the server was killed after the jobs it was meant to disturb had ended"
    # Seed 3 cannot resume (below); every other job finished.
    assert faulted["code"] == 1 and "sweep faults: 1 failed, 3 finished" in out, out + faulted["err"]
    meta = json.loads((faulted["dir"] / "sweep.json").read_text())
    lines = [ln for ln in out.splitlines() if "tracking server" in ln]
    # The pause was shorter than the hang timeout: only the kill restarts the server, on the same port.
    assert len(lines) == 1 and f"tracking server died (exit -9); restarted on {meta['tracking_uri']}" in lines[0], out
    assert "Traceback" not in out and "could not update MLflow run" not in out
    statuses = check_runs(meta["backend_uri"], faulted["dir"])
    assert statuses == {jobs[0].job_id: "FINISHED", jobs[1].job_id: "FINISHED", jobs[2].job_id: "FINISHED",
                        jobs[3].job_id: "FAILED"}
    # The restarted server stopped with its launch.
    store = str(faulted["dir"] / "mlflow")
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if store in " ".join(p.info["cmdline"] or [])]


def test_a_torn_newest_checkpoint_falls_back_and_resumes_bit_exact(faulted):
    from rla_ablate.train import metric_series, read_jsonl
    from rla_ablate.train.checkpoint import list_checkpoints, load_checkpoint

    job = faulted["dir"] / "jobs" / faulted["jobs"][2].job_id
    said = f"unreadable checkpoint skipped (ckpt-{TOKENS:015d}.pt: "
    line = next((ln for ln in faulted["out"].splitlines() if said in ln), None)
    assert line is not None, faulted["out"] + faulted["err"]
    assert f"resumed from the older one at {faulted['older']} tokens" in line
    doc = json.loads(cli("status", "faults", "--root", str(faulted["root"]), "--json").stdout)
    by_id = {j["job_id"]: j for j in doc["jobs"]}
    assert by_id[job.name]["status"] == "finished" and said in by_id[job.name]["notice"]
    table = cli("status", "faults", "--root", str(faulted["root"])).stdout
    assert said in " ".join(table.split())
    ref = load_checkpoint(list_checkpoints(faulted["reference"])[-1][1])
    got = load_checkpoint(list_checkpoints(job)[-1][1])
    assert got["tokens"] == ref["tokens"] == TOKENS
    for name, tensor in ref["model"].items():
        assert torch.equal(tensor, got["model"][name]), name
    for pid, state in ref["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, got["optimizer"]["state"][pid][key]), (pid, key)
    curves = [{k: metric_series(read_jsonl(d / "metrics.jsonl"), k) for k in ("train/loss", "eval/val/loss")}
              for d in (faulted["reference"], job)]
    assert curves[0] == curves[1]


def test_unreadable_checkpoints_fail_once_with_their_cause(faulted):
    out, err = faulted["out"], faulted["err"]
    job = faulted["dir"] / "jobs" / faulted["jobs"][3].job_id
    text = out + err
    assert "Traceback" not in out and "retrying" not in out
    assert "rla-sweep resume" not in err and "repeats on each attempt" in err
    assert f"cause checkpoint: CheckpointError: none of the 3 checkpoints in {job / 'checkpoints'} loads" in text
    state = json.loads((job / "status.json").read_text())
    assert (state["status"], state["cause"], state["attempts"]) == ("failed", "checkpoint", 1)
