"""`rla-sweep launch` end to end: real CLI processes, a real local Ray instance, the real embedded MLflow server,
real (tiny) training jobs on CPU. One small sweep is launched, relaunched, edited (its new job fails once and
is retried from its checkpoint), then grown and SIGKILLed mid-run and relaunched. The tests run in file order
and share the sweep folder, like a user at a terminal.
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
import yaml
from cli_run import REPO, cli

pytestmark = pytest.mark.slow

TINY = {"vocab_size": 257, "num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "head_dim": 16}
SWEEP = {
    "name": "e2e",
    "models": [{"preset": "tiny-rla", "overrides": TINY}, {"preset": "tiny-gdn", "overrides": TINY}],
    "base": {
        "train": {"tokens": 4096, "seq_len": 64, "micro_batch_size": 4, "batch_tokens": 256, "warmup_tokens": 256,
                  "eval_every_tokens": 1024, "checkpoint_every_tokens": 1024, "cpu_threads": 1},
        "data": {"kind": "stdlib"},
        "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 512}],
    },
    "ablations": ["no_fitting"],
    "resources": {"cpus": 1, "retries": 1},
}


def write(path: Path, sweep: dict) -> Path:
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def status(root: Path, name: str = "e2e") -> dict:
    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.status import sweep_status

    return sweep_status(SweepDir(root, name))


def job_runs(tracking_uri: str, sweep: str = "e2e") -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(f"rla-sweep/{sweep}")
    return client.search_runs([exp.experiment_id], filter_string="tags.`rla.role` = 'job'", max_results=1000)


def assert_no_duplicate_steps(tracking_uri: str, run_id: str) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    keys = list(client.get_run(run_id).data.metrics)
    assert "train/loss" in keys
    for key in keys:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at some step of run {run_id}"
    return max(m.step for m in client.get_metric_history(run_id, "train/loss"))


def assert_run_has_every_metric(tracking_uri: str, run_id: str, job_dir: Path) -> None:
    """Every (metric, step) of the job's metrics.jsonl is in its MLflow run, once."""
    from mlflow.tracking import MlflowClient

    from rla_ablate.train.loggers import read_jsonl

    want = {(key, r["step"]) for r in read_jsonl(job_dir / "metrics.jsonl") if r.get("type") == "metrics"
            for key in r["values"]}
    client = MlflowClient(tracking_uri)
    have = []
    for key in {k for k, _ in want}:
        have += [(key, m.step) for m in client.get_metric_history(run_id, key)]
    assert len(have) == len(set(have)), f"run {run_id} holds some (metric, step) twice"
    missing = want - set(have)
    assert not missing, f"run {run_id} lacks {len(missing)} (metric, step) of metrics.jsonl, e.g. {sorted(missing)[:5]}"


def runs_by_id(runs: list) -> dict:
    return {r.info.run_id: r for r in runs}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    base = tmp_path_factory.mktemp("launch")
    return {"root": base / "runs", "dir": base}


@pytest.fixture
def launched(campaign):
    """The campaign after its first launch (test_launch_runs_every_job_and_tracks_it), which later tests build on."""
    if "first" not in campaign:
        pytest.skip("builds on test_launch_runs_every_job_and_tracks_it, which did not run or failed")
    return campaign


def test_launch_runs_every_job_and_tracks_it(campaign):
    root, f = campaign["root"], write(campaign["dir"] / "e2e.yaml", SWEEP)
    out = cli("launch", str(f), "--root", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    cmd = cli("status", "e2e", "--root", str(root), "--json")
    assert cmd.returncode == 0, cmd.stderr
    doc = json.loads(cmd.stdout)
    assert doc == status(root)
    assert doc["sweep"] == "e2e" and doc["root"] == str(root.resolve())
    assert len(doc["jobs"]) == 3
    for job in doc["jobs"]:
        assert set(job) == {"job_id", "name", "ablations", "control", "status", "mlflow_run_id", "tokens_done",
                            "tokens_target", "error", "cause", "traceback", "error_log", "notice"}
        assert job["status"] == "finished" and job["tokens_done"] == job["tokens_target"] == 4096
        assert job["cause"] is job["traceback"] is job["error_log"] is job["notice"] is None
    # The embedded server is gone; the status' tracking URI (its SQLite store) still opens every run.
    assert doc["tracking_uri"].startswith("sqlite:///")
    runs = job_runs(doc["tracking_uri"])
    assert sorted(r.info.run_id for r in runs) == sorted(j["mlflow_run_id"] for j in doc["jobs"])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(doc["tracking_uri"])
    parents = {r.data.tags["mlflow.parentRunId"] for r in runs}
    assert len(parents) == 1 and client.get_run(parents.pop()).info.status == "FINISHED"
    for r in runs:
        assert r.info.status == "FINISHED"
        assert assert_no_duplicate_steps(doc["tracking_uri"], r.info.run_id) == 4096
    assert (root / "e2e" / "triton-cache").is_dir()
    # Nothing left running: the launch stopped Ray and MLflow at exit.
    rec = json.loads((root / "e2e" / "launch.json").read_text())
    assert rec["children"] == []
    campaign["runs"] = len(runs)
    campaign["tracking_uri"] = doc["tracking_uri"]
    campaign["first"] = {j["job_id"]: j for j in doc["jobs"]}


def test_relaunch_same_file_runs_nothing(launched):
    root = launched["root"]
    mtimes = {p: p.stat().st_mtime_ns for p in (root / "e2e" / "jobs").glob("*/metrics.jsonl")}
    out = cli("launch", str(launched["dir"] / "e2e.yaml"), "--root", str(root))
    assert out.returncode == 0, out.stderr
    assert "nothing to run" in out.stdout
    assert len(job_runs(launched["tracking_uri"])) == launched["runs"]
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes


def test_a_copied_sweep_folder_reads_and_logs_to_its_own_store(launched):
    """A sweep folder copied elsewhere names and opens its own store (sweep.json records where it was made), and a
    job's evaluation logs into the copy's runs, never the original's."""
    import shutil

    from rla_ablate.evals.core import tracking_target

    copy_root = launched["dir"] / "copied"
    shutil.copytree(launched["root"] / "e2e", copy_root / "e2e")
    out = cli("status", "e2e", "--root", str(copy_root), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    own = f"sqlite:///{(copy_root / 'e2e' / 'mlflow' / 'mlflow.db').resolve()}"
    assert doc["tracking_uri"] == own != launched["tracking_uri"]
    job = doc["jobs"][0]
    assert tracking_target(copy_root / "e2e" / "jobs" / job["job_id"]) == (own, job["mlflow_run_id"])
    assert tracking_target(launched["root"] / "e2e" / "jobs" / job["job_id"]) == (launched["tracking_uri"],
                                                                                  job["mlflow_run_id"])
    text = cli("status", "e2e", "--root", str(copy_root))
    assert text.returncode == 0 and str(copy_root.resolve()) in text.stdout.replace("\n", ""), text.stdout


def test_edited_file_runs_only_the_new_job_and_retries_a_failure(launched):
    root = launched["root"]
    edited = dict(SWEEP, ablations=["no_fitting", "tied_gamma"])
    f = write(launched["dir"] / "e2e.yaml", edited)
    from rla_ablate.sweep.expand import load_sweep

    new = [j for j in load_sweep(f).jobs if j.job_id not in launched["first"]]
    assert [j.name for j in new] == ["tiny-rla/tied_gamma/seed0"]
    new_id = new[0].job_id
    planned = cli("plan", str(f), "--root", str(root))  # what a launch there would run
    assert planned.returncode == 0, planned.stderr
    assert f"under {root}: 3 of these jobs are done (finished or diverged), so a launch runs the 1 left" in \
        " ".join(planned.stdout.split()), planned.stdout
    # The new job raises once at 2048 tokens (after its checkpoint at 2048); the retry resumes from there.
    out = cli("launch", str(f), "--root", str(root), env={"RLA_SWEEP_FAIL_ONCE": f"{new_id}@2048"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "retrying from its last checkpoint (2,048 tokens)" in out.stdout
    assert "(2 attempts run, 1 of them from a checkpoint; 3 jobs were already done)" in out.stdout, out.stdout
    doc = status(root)
    by_id = {j["job_id"]: j for j in doc["jobs"]}
    assert by_id[new_id]["status"] == "finished" and by_id[new_id]["tokens_done"] == 4096
    for job_id, before in launched["first"].items():
        assert by_id[job_id]["mlflow_run_id"] == before["mlflow_run_id"]
    job_dir = root / "e2e" / "jobs" / new_id
    assert (job_dir / ".failed-once").exists()
    state = json.loads((job_dir / "status.json").read_text())
    assert state["attempts"] == 2
    from rla_ablate.train import read_jsonl

    events = [r["name"] for r in read_jsonl(job_dir / "metrics.jsonl") if r.get("type") == "event"]
    assert "resumed" in events
    runs = job_runs(launched["tracking_uri"])
    assert len(runs) == launched["runs"] + 1
    assert assert_no_duplicate_steps(launched["tracking_uri"], by_id[new_id]["mlflow_run_id"]) == 4096


def test_a_failure_before_the_first_checkpoint_retries_in_a_new_run(launched):
    """An attempt that logged steps but wrote no checkpoint: the retry starts from its first step in a new MLflow
    run (the old one deleted, restorable), and the launch says so once, in the retry's note."""
    root = launched["root"]
    f = write(launched["dir"] / "e2e.yaml", dict(SWEEP, ablations=["no_fitting", "tied_gamma", "no_clip"]))
    from rla_ablate.sweep.expand import load_sweep

    new_id = next(j.job_id for j in load_sweep(f).jobs if j.name == "tiny-rla/no_clip/seed0")
    # steps of 256 tokens, the first checkpoint at 1024: the attempt fails after two steps logged
    out = cli("launch", str(f), "--root", str(root), env={"RLA_SWEEP_FAIL_ONCE": f"{new_id}@512"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("from its first step in a new MLflow run (it left no checkpoint; the earlier run") == 1
    assert "no checkpoint of its earlier attempt" not in out.stdout
    job = next(j for j in status(root)["jobs"] if j["job_id"] == new_id)
    assert job["status"] == "finished" and job["tokens_done"] == 4096
    from mlflow.tracking import MlflowClient

    from mlflow.entities import ViewType

    client = MlflowClient(launched["tracking_uri"])
    exp = client.get_experiment_by_name("rla-sweep/e2e")
    mine = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL,
                              filter_string=f"tags.job_id = '{new_id}'")
    assert sorted(r.info.lifecycle_stage for r in mine) == ["active", "deleted"]
    assert assert_no_duplicate_steps(launched["tracking_uri"], job["mlflow_run_id"]) == 4096


def test_a_finished_job_whose_folder_was_deleted_trains_in_a_new_run(launched):
    """A finished job's folder deleted (status, checkpoints, metrics): the relaunch trains it again, and not into
    its old FINISHED run (found by job id), whose values would mix with the new attempt's: that run is deleted
    (restorable), the launch says so, and the new run holds exactly the new metrics.jsonl."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    root, uri = launched["root"], launched["tracking_uri"]
    job_id, before = next(iter(launched["first"].items()))
    shutil.rmtree(root / "e2e" / "jobs" / job_id)
    out = cli("launch", str(launched["dir"] / "e2e.yaml"), "--root", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    said = " ".join((out.stdout + out.stderr).split())
    assert f"its folder has nothing of the attempt that logged to MLflow run {before['mlflow_run_id'][:12]}" in said
    job = next(j for j in status(root)["jobs"] if j["job_id"] == job_id)
    assert job["status"] == "finished" and job["mlflow_run_id"] != before["mlflow_run_id"]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("rla-sweep/e2e")
    mine = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, filter_string=f"tags.job_id = '{job_id}'")
    assert sorted(r.info.lifecycle_stage for r in mine) == ["active", "deleted"]
    assert_run_has_every_metric(uri, job["mlflow_run_id"], root / "e2e" / "jobs" / job_id)
    assert assert_no_duplicate_steps(uri, job["mlflow_run_id"]) == 4096


def _descendants_alive(pids: list[list]) -> list[int]:
    alive = []
    for pid, created in pids:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive


KILL_SWEEP = {
    "name": "e2e-kill",
    "models": [{"preset": "tiny-rla", "overrides": {"vocab_size": 257}},
               {"preset": "tiny-gdn", "overrides": {"vocab_size": 257}}],
    "base": {
        # 64 steps of 2048 tokens: the kill lands mid-run (after two checkpoints) on a fast or a busy machine.
        "train": {"tokens": 131072, "seq_len": 256, "micro_batch_size": 8, "batch_tokens": 2048,
                  "warmup_tokens": 2048, "eval_every_tokens": 32768, "checkpoint_every_tokens": 16384,
                  "cpu_threads": 1},
        "data": {"kind": "stdlib"},
        "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 1024}],
    },
    "resources": {"cpus": 1},
}


def test_a_lost_tracking_store_is_made_again_from_the_jobs_metrics(launched):
    """The sweep's embedded store moved away (or deleted): results say how to get it back, and a relaunch, with
    nothing left to train, makes every ended job's run again from its metrics.jsonl: one run per job, every
    (metric, step) once, finished, and `results` reads them."""
    root = launched["root"]
    shutil.move(root / "e2e" / "mlflow", launched["dir"] / "lost-mlflow")
    out = cli("results", "e2e", "--root", str(root))
    assert out.returncode == 2 and "its jobs ran, so it was moved or deleted" in " ".join(out.stderr.split())
    out = cli("status", "e2e", "--root", str(root))
    said = " ".join(out.stdout.split())  # the runs line says what `results` says, with the same way back
    assert out.returncode == 0 and "its jobs ran, so it was moved or deleted): put it back, or `rla-sweep resume e2e " \
        "--root" in said, said
    out = cli("launch", str(launched["dir"] / "e2e.yaml"), "--root", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    said = " ".join((out.stdout + out.stderr).split())
    assert "was gone: 5 runs of ended jobs made again from their metrics.jsonl" in said, said
    doc = status(root)
    # this process's MLflow client keeps its SQLite connection per URI, to the moved file: the new store by a link
    link = launched["dir"] / "store-link"
    link.symlink_to(root / "e2e" / "mlflow")
    uri = f"sqlite:///{link / 'mlflow.db'}"
    runs = runs_by_id(job_runs(uri))
    assert sorted(runs) == sorted(j["mlflow_run_id"] for j in doc["jobs"])
    from rla_ablate.train.loggers import read_jsonl

    for j in doc["jobs"]:
        run = runs[j["mlflow_run_id"]]
        assert run.info.status == "FINISHED"
        assert_run_has_every_metric(uri, j["mlflow_run_id"], root / "e2e" / "jobs" / j["job_id"])
        # what the events told the lost run: the backend and glue a dashboard groups by, an event.<name> tag each
        info = next(r["detail"] for r in read_jsonl(root / "e2e" / "jobs" / j["job_id"] / "metrics.jsonl")
                    if r.get("type") == "event" and r["name"] == "info")
        assert run.data.tags["kernel_backend"] == str(info["backend"]) and run.data.tags["glue"] == str(info["glue"])
        assert "event.info" in run.data.tags and "event.checkpoint" in run.data.tags
    from mlflow.tracking import MlflowClient

    assert MlflowClient(uri).get_run(json.loads((root / "e2e" / "sweep.json").read_text())["parent_run_id"]) \
        .info.status == "FINISHED"
    out = cli("results", "e2e", "--root", str(root), "--csv")
    assert out.returncode == 0 and len(out.stdout.strip().splitlines()) == 1 + 5, out.stdout + out.stderr


def test_sigkill_of_the_launch_group_then_relaunch_finishes(campaign):
    root = campaign["root"]
    f = write(campaign["dir"] / "kill.yaml", KILL_SWEEP)
    proc = subprocess.Popen([sys.executable, "-m", "rla_ablate.cli", "launch", str(f), "--root", str(root)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    killed_mid_run = False
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            states = [json.loads(p.read_text()) for p in (root / "e2e-kill" / "jobs").glob("*/status.json")]
            if any(s["status"] == "running" and 32768 < s["tokens_done"] < 98304 for s in states):
                # launch.json records the descendants every few seconds; the newest worker may not be in it yet.
                descendants = [[p.pid, p.create_time()] for p in psutil.Process(proc.pid).children(recursive=True)]
                os.killpg(proc.pid, signal.SIGKILL)
                killed_mid_run = True
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None and not killed_mid_run:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert killed_mid_run, "the launch ended before any job was seen mid-run"
    # The kernel dropped the lock; status.json still says running, which status reports as pending (resumable).
    doc = status(root, "e2e-kill")
    assert any(j["status"] == "pending" and "resume" in (j["error"] or "") for j in doc["jobs"])
    rec = json.loads((root / "e2e-kill" / "launch.json").read_text())
    assert rec["children"]
    # One job loses its checkpoints, as a sweep folder carried to another machine without them: it starts from its
    # first step in a new MLflow run (the old run's values would mix with the new attempt's). Ray gives each worker
    # its own process group, so a worker outlives the killed group by a second or two and may still write a
    # checkpoint; on another machine nothing would, so the folder is changed once they are gone.
    deadline = time.monotonic() + 60
    while _descendants_alive(rec["children"] + descendants) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _descendants_alive(rec["children"] + descendants) == [], "the killed launch's processes outlived it"
    doc = status(root, "e2e-kill")
    # `results` says what `status` says, once the killed workers are gone (MLflow still holds their runs as running)
    out = cli("results", "e2e-kill", "--root", str(root), "--json")
    assert out.returncode == 0, out.stderr
    assert {(r["job_id"], r["status"]) for r in json.loads(out.stdout)} == \
        {(j["job_id"], j["status"]) for j in doc["jobs"]}
    moved = max((j for j in doc["jobs"] if j["status"] != "finished"), key=lambda j: j["tokens_done"])
    assert moved["tokens_done"] > 0 and moved["mlflow_run_id"]
    shutil.rmtree(root / "e2e-kill" / "jobs" / moved["job_id"] / "checkpoints", ignore_errors=True)
    # and a line of its metrics.jsonl damaged from outside: the rewrite (here the launch's, for the new run) moves it
    # aside, and the launch says so
    metrics = root / "e2e-kill" / "jobs" / moved["job_id"] / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "\x00garbage", *lines[1:]]) + "\n")
    out = cli("launch", str(f), "--root", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no checkpoint of its earlier attempt, so it starts from its first step in a new MLflow run" in out.stdout
    said = " ".join((out.stdout + out.stderr).split())
    assert f"warning: {metrics}: line 2 is not a metrics record: moved to {metrics}.damaged" in said, out.stdout
    assert (metrics.parent / "metrics.jsonl.damaged").read_text() == "\x00garbage\n"
    from mlflow.tracking import MlflowClient

    assert MlflowClient(doc["tracking_uri"]).get_run(moved["mlflow_run_id"]).info.lifecycle_stage == "deleted"
    doc = status(root, "e2e-kill")
    assert next(j for j in doc["jobs"] if j["job_id"] == moved["job_id"])["mlflow_run_id"] != moved["mlflow_run_id"]
    assert all(j["status"] == "finished" and j["tokens_done"] == j["tokens_target"] == 131072 for j in doc["jobs"])
    runs = job_runs(doc["tracking_uri"], "e2e-kill")
    # One MLflow run per job, although each job's first attempt was killed.
    assert sorted(r.info.run_id for r in runs) == sorted(j["mlflow_run_id"] for j in doc["jobs"])
    for j in doc["jobs"]:
        assert assert_no_duplicate_steps(doc["tracking_uri"], j["mlflow_run_id"]) == 131072
        assert_run_has_every_metric(doc["tracking_uri"], j["mlflow_run_id"], root / "e2e-kill" / "jobs" / j["job_id"])
        assert runs_by_id(runs)[j["mlflow_run_id"]].info.status == "FINISHED"


def test_resume_reads_the_files_relative_paths_as_the_launch_did(tmp_path):
    """A sweep file's relative paths mean the folder it was launched from (data) and its own folder (evals'
    include_path). `resume` reads the copy under --root, from wherever it is typed: it runs from the launch's
    folder, so the data is the launch's (not a same-named file here, which was another job) and the task folder
    is found."""
    import shutil as sh

    here, elsewhere = tmp_path / "study", tmp_path / "elsewhere"
    (here / "tasks").mkdir(parents=True)
    elsewhere.mkdir()
    text = (REPO / "README.md").read_text(encoding="utf-8")[:20000]
    (here / "notes.txt").write_text(text, encoding="utf-8")
    (elsewhere / "notes.txt").write_text(text + "another file under the same name\n", encoding="utf-8")
    shipped = REPO / "rla_ablate" / "evals" / "tasks"
    (here / "tasks" / "my_choice.yaml").write_text(
        (shipped / "rla_choice.yaml").read_text().replace("task: rla_choice", "task: my_choice"))
    sh.copy(shipped / "rla_choice.jsonl", here / "tasks")
    sweep = {"name": "rel", "models": [{"preset": "tiny-rla", "overrides": TINY}],
             "base": {**SWEEP["base"], "train": {**SWEEP["base"]["train"], "tokens": 1024},
                      "data": {"kind": "text", "path": "notes.txt"}},
             "evals": {"tasks": ["my_choice"], "include_path": ["tasks"], "limit": 2, "batch_size": 2},
             "resources": {"cpus": 1}}
    write(here / "rel.yaml", sweep)
    root = tmp_path / "runs"

    def run(cwd, *args):
        return subprocess.run([sys.executable, "-m", "rla_ablate.cli", *args], cwd=cwd, capture_output=True,
                              text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})

    first = run(here, "launch", "rel.yaml", "--root", str(root))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "evals: 1 job(s) scored on my_choice" in first.stdout
    again = run(elsewhere, "resume", "rel", "--root", str(root))
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resume: from {here}" in again.stderr
    assert "nothing to run (1 finished)" in again.stdout and "1 already scored" in again.stdout
    assert len(json.loads((root / "rel" / "jobs.json").read_text())) == 1


def test_a_cancel_during_start_up_starts_no_job(tmp_path):
    """`rla-sweep cancel` while Ray and MLflow start: the launch stops before it submits anything (no attempt, each
    job cancelled before it started, exit 130), and `resume` would start them."""
    from cli_run import cli_background

    sweep = {**SWEEP, "name": "early", "models": [{"preset": "tiny-rla", "overrides": TINY}], "ablations": []}
    root = tmp_path / "runs"
    proc = cli_background("launch", str(write(tmp_path / "early.yaml", sweep)), "--root", str(root))
    deadline = time.monotonic() + 120
    while not (root / "early" / "launch.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    stopped = cli("cancel", "early", "--root", str(root))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, out + stopped.stdout + stopped.stderr
    assert "(0 attempts run;" in out and "running" not in out, out
    doc = status(root, "early")
    assert [(j["status"], j["error"]) for j in doc["jobs"]] == [
        ("cancelled", "cancelled by `rla-sweep cancel` before it started")]
