"""What the commands say and return matches docs/SWEEPS.md: cancel and Ctrl-C exit 130, a relaunch of a sweep whose
jobs all ended (finished or diverged) exits 0, hints name --root, and a cancelled job's MLflow run ends KILLED even
when the job never started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rla_ablate.cli import main
from rla_ablate.sweep.progress import Progress

REPO = Path(__file__).resolve().parents[1]
TINY = {"vocab_size": 257, "num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "head_dim": 16}


def sweep_file(path: Path, name: str, tokens: int, cpus: int = 1, seeds=(0,)) -> Path:
    data = {"name": name, "models": [{"preset": "tiny-rla", "overrides": TINY}, {"preset": "tiny-gdn", "overrides": TINY}],
            "base": {"train": {"tokens": tokens, "seq_len": 64, "micro_batch_size": 4, "batch_tokens": 256,
                               "warmup_tokens": 256, "eval_every_tokens": tokens // 2,
                               "checkpoint_every_tokens": tokens // 4, "cpu_threads": 1},
                     "data": {"kind": "stdlib"},
                     "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 256}]},
            "seeds": list(seeds), "resources": {"cpus": cpus, "retries": 0}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def wait_training(proc: subprocess.Popen, sweep: Path, jobs: int, timeout: float = 240) -> None:
    """Until `jobs` of the launch's jobs have trained a step (or the launch ended, or `timeout` passed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        states = [json.loads(p.read_text()) for p in (sweep / "jobs").glob("*/status.json")]
        if sum(s["status"] == "running" and s["tokens_done"] > 0 for s in states) >= jobs:
            return
        time.sleep(0.3)


def test_relaunch_of_diverged_jobs_exits_0(tmp_path, capsys):
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.state import SweepDir

    path = sweep_file(tmp_path / "s.yaml", "div", 512)
    sweep = load_sweep(path)
    sdir = SweepDir(tmp_path / "runs", "div")
    sdir.set_status(sweep.jobs[0].job_id, status="diverged", error="diverged at 256 tokens")
    sdir.set_status(sweep.jobs[1].job_id, status="finished")
    assert main(["launch", str(path), "--root", str(tmp_path / "runs")]) == 0


def test_lock_refusal_names_root(tmp_path, capsys):
    from rla_ablate.errors import UserError
    from rla_ablate.sweep.state import SweepDir

    first = SweepDir(tmp_path / "r", "x")
    first.acquire()
    try:
        with pytest.raises(UserError) as info:
            SweepDir(tmp_path / "r", "x").acquire()
    finally:
        first.release()
    assert f"rla-sweep cancel x --root {(tmp_path / 'r').resolve()}" in str(info.value)


def test_dashboard_help_has_no_doubled_percent(capsys):
    with pytest.raises(SystemExit):
        main(["dashboard", "--help"])
    out = capsys.readouterr().out
    assert "95% CI" in " ".join(out.split()) and "%%" not in out


def test_an_option_a_command_does_not_take_is_refused_with_that_commands_usage(capsys):
    """`plan FILE --tracking-uri U`: plan's usage, not the top-level one, and which commands take --tracking-uri;
    exit 2."""
    with pytest.raises(SystemExit) as info:
        main(["plan", "sweeps/smoke.yaml", "--tracking-uri", "sqlite:///x.db"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: rla-sweep plan" in err and "unrecognized arguments: --tracking-uri sqlite:///x.db" in err
    assert "--tracking-uri is an option of dashboard, launch, results, resume" in err
    with pytest.raises(SystemExit) as info:
        main(["status", "x", "--bogus=1"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "usage: rla-sweep status" in err and "is an option of" not in err
    with pytest.raises(SystemExit) as info:
        main(["train", "tiny-rla", "--out", "x", "--resume"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "rerun the same command to resume" in err
    # a misspelt option of a command's action: that action's usage and the option it is close to
    with pytest.raises(SystemExit) as info:
        main(["data", "prepare", "corpus", "out", "--tokenzier", "t.json"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "usage: rla-sweep data prepare" in err, err
    assert "--tokenzier (did you mean '--tokenizer'?)" in err, err
    # an option other commands take is named as theirs, not as this command's closest option
    for argv, said in ((["launch", "f.yaml", "--port", "5000"], "--port is an option of server, ui"),
                       (["eval", "x", "--tasks", "t", "--tokenizer", "t.json"], "--tokenizer is an option of data prepare"),
                       # close to other commands' option only: named as theirs, with what this command takes
                       (["models", "--roott"], "--roott; it is no command's option (--root is an option of "
                                               "cancel, dashboard, eval, export, launch, plan, results, resume, "
                                               "server, status, ui); models takes --help, --json, --seq-len\n"),
                       (["plan", "f.yaml", "--roott", "r"], "--roott (did you mean '--root'?)"),
                       (["launch", "f.yaml", "--foo"], "arguments: --foo; it is no command's option; launch takes "
                                                       "--address, --help"),
                       # the only word refused: its hint follows it, the option is not named twice
                       (["status", "x", "--jsn"], "arguments: --jsn (did you mean '--json'?)\n")):
        with pytest.raises(SystemExit) as info:
            main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and said in err, err  # "--foo": the dashes alone make no option close to it
    # a misspelt command: the close one, and the list
    for typo, close in (("lauch", "launch"), ("statu", "status")):
        with pytest.raises(SystemExit) as info:
            main([typo, "x"])
        err = capsys.readouterr().err
        assert info.value.code == 2 and f"unknown command '{typo}' (did you mean '{close}'?); commands:" in err, err
    with pytest.raises(SystemExit):
        main(["zzz"])
    err = capsys.readouterr().err
    assert "unknown command 'zzz'; commands: cancel," in err and "did you mean" not in err


@pytest.mark.slow
def test_cancel_exits_130_and_ends_every_run_killed(tmp_path):
    from mlflow.tracking import MlflowClient

    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.status import sweep_status

    root = tmp_path / "runs"
    # Each job takes every CPU, so one runs and the others wait in Ray's queue: those are cancelled before starting.
    path = sweep_file(tmp_path / "s.yaml", "stop", 1 << 20, cpus=os.cpu_count() or 1, seeds=(0, 1))
    cmd = [sys.executable, "-m", "rla_ablate.cli"]
    proc = subprocess.Popen([*cmd, "launch", str(path), "--root", str(root), "--max-concurrent", "3"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_training(proc, root / "stop", 1)
        out = subprocess.run([*cmd, "cancel", "stop", "--root", str(root)], cwd=REPO, capture_output=True,
                             text=True, timeout=200)
        assert out.returncode == 0, out.stdout + out.stderr
        assert proc.wait(timeout=120) == 130, proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    doc = sweep_status(SweepDir(root, "stop"))
    assert {j["status"] for j in doc["jobs"]} == {"cancelled"}
    # each at what a resume keeps: the one that ran at its cancellation checkpoint, the queued ones at 0
    from rla_ablate.sweep.status import resume_tokens

    sdir = SweepDir(root, "stop")
    assert [j["tokens_done"] for j in doc["jobs"]] == [resume_tokens(sdir, j["job_id"]) for j in doc["jobs"]]
    assert any(j["tokens_done"] > 0 for j in doc["jobs"]), doc["jobs"]
    client = MlflowClient(doc["tracking_uri"])
    run_ids = [j["mlflow_run_id"] for j in doc["jobs"] if j["mlflow_run_id"]]
    assert len(run_ids) >= 2
    statuses = {rid: client.get_run(rid).info.status for rid in run_ids}
    assert set(statuses.values()) == {"KILLED"}, statuses


@pytest.mark.slow
def test_a_second_ctrl_c_abandons_the_jobs_closes_their_runs_and_says_how_to_resume(tmp_path):
    """Ctrl-C twice: exit 130 at once, the running jobs' MLflow runs closed as cancelled (not RUNNING until the
    next launch) with no metric step logged twice, their folders pending (`status` says to resume), and the launch
    names the command."""
    import signal

    from mlflow.tracking import MlflowClient

    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.status import sweep_status

    root = tmp_path / "runs"
    path = sweep_file(tmp_path / "s.yaml", "twice", 1 << 20)
    cmd = [sys.executable, "-m", "rla_ablate.cli"]
    proc = subprocess.Popen([*cmd, "launch", str(path), "--root", str(root), "--max-concurrent", "2"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_training(proc, root / "twice", 2)
        proc.send_signal(signal.SIGINT)
        # the second once the first has been taken (two signals before the launch's next check are one)
        err = ""
        while "stopping: interrupted" not in err:
            line = proc.stdout.readline()
            assert line, err
            err += line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
        err += proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert err.count("abandoned 2 running jobs (their MLflow runs closed as cancelled)") == 1, err
    assert f"`rla-sweep resume twice --root {root.resolve()}` continues them" in err.replace("\n", ""), err
    doc = sweep_status(SweepDir(root, "twice"))
    assert len(doc["jobs"]) == 2
    for job in doc["jobs"]:
        assert job["status"] == "pending" and "rla-sweep resume twice" in job["error"], job
    client = MlflowClient(doc["tracking_uri"])
    for job in doc["jobs"]:
        run = client.get_run(job["mlflow_run_id"])
        # closed by this launch, or by the job itself (its stop beat the second Ctrl-C, or Ray's exit ended it)
        assert run.info.status == "KILLED", run.data.tags.get("rla.status_reason")
        # the workers were ended before the runs were filled from metrics.jsonl: no step of any metric twice
        for key in run.data.metrics:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert len(steps) == len(set(steps)), (key, sorted(steps))
    parent = json.loads((root / "twice" / "sweep.json").read_text())["parent_run_id"]
    assert client.get_run(parent).info.status == "KILLED"  # the sweep's own run too


@pytest.mark.parametrize("args", [["models"], ["models", "--json"], ["plan", "sweeps/ablations.yaml", "--json"]],
                         ids=["table", "json", "plan-json"])
def test_a_closed_stdout_ends_quietly_with_141(args):
    # `rla-sweep ... | head -1`: the reader is gone before the command writes; 141 = 128 + SIGPIPE, as for a Unix tool
    proc = subprocess.Popen([sys.executable, "-m", "rla_ablate.cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, err
    assert err == ""


def test_a_closed_progress_pipe_stops_a_training_job_with_a_checkpoint(tmp_path):
    """`rla-sweep train ... 2>&1 | head`: the progress goes to stderr; once its reader is gone the job stops at the
    next step with a checkpoint and its log closed as cancelled (exit 141), and the same command resumes it. (Rich
    would exit 1 from inside the print, mid-step, with no checkpoint and the log left open.)"""
    from rla_ablate.train import read_jsonl
    from rla_ablate.train.checkpoint import list_checkpoints

    out = tmp_path / "job"
    command = [sys.executable, "-m", "rla_ablate.cli", "train", "tiny-rla", "--out", str(out),
               "--set", "train.tokens=16384"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc.stderr.read(40)  # the first line has begun: the job is past its checks
    proc.stderr.close()
    assert proc.wait(timeout=300) == 141
    records = read_jsonl(out / "metrics.jsonl")
    assert records[-1]["type"] == "close" and records[-1]["status"] == "cancelled"
    assert list_checkpoints(out)
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert read_jsonl(out / "metrics.jsonl")[-1]["status"] == "finished"


@pytest.mark.slow
def test_a_second_ctrl_c_of_train_says_what_a_rerun_does(tmp_path):
    """Ctrl-C, and again while the step it waits for runs, of `rla-sweep train`: exit 130 at once, no checkpoint of
    that step, and the line says what the same command will do (resume from the newest checkpoint the folder holds,
    or start again). The second signal is sent once the first was heard: two at once may arrive as one."""
    import signal

    from rla_ablate.train.checkpoint import is_whole, list_checkpoints

    out = tmp_path / "job"
    command = [sys.executable, "-m", "rla_ablate.cli", "train", "tiny-rla", "--out", str(out), "--set",
               "train.tokens=4194304", "--set", "train.batch_tokens=65536"]  # steps of seconds each
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    heard = []

    def wait_for(text: str) -> None:
        while not heard or text not in heard[-1]:
            line = proc.stderr.readline()
            assert line, "".join(heard)
            heard.append(line)

    wait_for("tok/s")  # a step is logged: the next one runs
    proc.send_signal(signal.SIGINT)
    wait_for("stopping after this step")
    proc.send_signal(signal.SIGINT)
    err = " ".join(("".join(heard) + proc.communicate(timeout=120)[1]).split())
    assert proc.returncode == 130, err
    kept = [(t, path) for t, path in list_checkpoints(out) if is_whole(path)]
    then = (f"the same command resumes from {kept[-1][1]} ({kept[-1][0]:,} tokens)" if kept else
            "no checkpoint was written: the same command starts again from the first step")
    assert f"aborted without a checkpoint of this step; {then}" in err, err


def test_a_launch_whose_output_closes_stops_its_jobs_with_141():
    """Quitting `rla-sweep launch ... | less`: the progress console goes quiet and the runner stops the sweep as Ctrl-C
    does (jobs checkpoint; `resume` goes on); the exit status says why."""
    from rla_ablate.commands.launch import exit_code
    from rla_ablate.sweep.summary import LaunchSummary
    from rla_ablate.terminal import PipeConsole

    read, write = os.pipe()
    os.close(read)
    progress = Progress("s", console=None, interactive=False)
    progress.console = PipeConsole(file=os.fdopen(write, "w"), soft_wrap=True, on_closed=progress._on_closed)
    progress.note("a line nobody reads")
    assert progress.closed and progress.console.quiet
    progress.note("and no error after it")
    summary = LaunchSummary(sweep="s", counts={"pending": 2}, interrupted=True, output_closed=True)
    assert exit_code(summary) == 141
    summary.output_closed = False
    assert exit_code(summary) == 130
    # a table's console (no on_closed) raises, for the CLI's 141
    read, write = os.pipe()
    os.close(read)
    with pytest.raises(BrokenPipeError):
        PipeConsole(file=os.fdopen(write, "w")).print("a row")


def test_a_launch_stopped_after_its_last_job_ended_gives_no_failure_advice(tmp_path, capsys):
    """Ctrl-C after every job of a grid had ended: the jobs' results stand and no job failed, so the last line says
    so (and that a resume runs the evals: stage a stopped launch skips) instead of the advice for failed jobs."""
    from types import SimpleNamespace

    from rla_ablate.outcome import Cause, Status
    from rla_ablate.sweep.progress import Progress
    from rla_ablate.sweep.summary import FailedJob, LaunchSummary

    sdir = SimpleNamespace(store_uri=lambda: None, root=tmp_path)
    for pending, words in ((False, "nothing is left to resume"), (True, "runs the sweep's evals: stage")):
        summary = LaunchSummary(sweep="s", counts={Status.FINISHED: 3}, interrupted=True, evals_pending=pending)
        Progress("s", console=None, interactive=False).final(summary, sdir)
        err = capsys.readouterr().err
        assert "stopped after every job had ended: their results stand" in err and words in err, err
        assert "every failure above" not in err
    failed = LaunchSummary(sweep="s", counts={Status.FINISHED: 2, Status.FAILED: 1}, interrupted=True,
                           failed=[FailedJob("j", "0" * 12, "ValueError: x", cause=Cause.CONFIG)])
    Progress("s", console=None, interactive=False).final(failed, sdir)
    assert "every failure above repeats on each attempt" in capsys.readouterr().err


def test_a_bad_glue_setting_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    """RLA_GLUE (rla_ablate.environment) names a mode or every command exits 2 naming the variable; a good one
    reaches every model a process builds."""
    from rla_ablate.models import build_model, load_preset

    path = sweep_file(tmp_path / "s.yaml", "glue", 512)
    monkeypatch.setenv("RLA_GLUE", "fused")
    assert main(["launch", str(path), "--root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "RLA_GLUE: 'fused' is not a glue mode; allowed: auto, torch" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()
    monkeypatch.setenv("RLA_GLUE", "torch")
    assert build_model(load_preset("tiny-rla")).glue == "torch"
    monkeypatch.delenv("RLA_GLUE")
    assert build_model(load_preset("tiny-rla")).glue == "auto"


def test_a_launch_on_gpus_notes_a_glue_mode_other_than_the_sweeps_last(tmp_path, monkeypatch):
    from rla_ablate.sweep.launch import _glue_change
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(tmp_path, "s")
    sdir.path.mkdir()
    monkeypatch.delenv("RLA_GLUE", raising=False)
    assert _glue_change(sdir, True) is None and sdir.meta()["glue_mode"] == "auto"
    monkeypatch.setenv("RLA_GLUE", "torch")
    assert _glue_change(sdir, False) is None and sdir.meta()["glue_mode"] == "auto"  # the CPU runs one glue
    note = _glue_change(sdir, True)
    assert note.startswith("an earlier launch of this sweep ran with RLA_GLUE=auto, this one with torch")
    assert sdir.meta()["glue_mode"] == "torch"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without CUDA")
def test_a_cuda_sweep_without_a_gpu_is_refused_before_anything_starts(tmp_path, capsys):
    path = sweep_file(tmp_path / "s.yaml", "gpu", 512)
    data = yaml.safe_load(path.read_text())
    data["base"]["train"]["device"] = "cuda"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # with resources.gpus 0 (the default) no task would hold a GPU: refused wherever the sweep is read
    for command in ("plan", "launch"):
        assert main([command, str(path)] + (["--root", str(tmp_path / "runs")] if command == "launch" else [])) == 2
        err = capsys.readouterr().err
        line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "device: cuda" in text)
        assert f"s.yaml:{line}: train.device: 2 job(s) need CUDA (train.device cuda or train.cuda_graphs) " \
               "(tiny-rla/seed0, ...) but resources.gpus is 0" in err, err
        assert "allowed: resources.gpus auto or above 0, or train.device auto or cpu" in err
    data["resources"]["gpus"] = "auto"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["launch", str(path), "--root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "device: cuda" in text)
    assert f"s.yaml:{line}: train.device: 2 job(s) need CUDA (train.device cuda or train.cuda_graphs)" in err, err
    assert "allowed here: train.device auto or cpu" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()
    # set by a grid instead of the base: the error points there
    del data["base"]["train"]["device"]
    data["grid"] = {"train.device": ["cpu", "cuda"]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["launch", str(path), "--root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "train.device:" in text)
    assert f"s.yaml:{line}: train.device: 2 job(s) need CUDA (train.device cuda or train.cuda_graphs)" in err, err
    # a resumed sweep counts only the jobs it would run: one of the two cuda jobs finished earlier on a GPU node
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.state import SweepDir

    cuda_jobs = [j for j in load_sweep(path).jobs if j.job.train.device == "cuda"]
    SweepDir(tmp_path / "runs", "gpu").set_status(cuda_jobs[0].job_id, status="finished")
    assert main(["launch", str(path), "--root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"train.device: {len(cuda_jobs) - 1} job(s) need CUDA (train.device cuda or train.cuda_graphs) " \
           f"({cuda_jobs[1].name})" in err, err
    # CUDA graphs need CUDA as device cuda does: the error names their line
    del data["grid"]
    data["base"]["train"]["cuda_graphs"] = True
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["launch", str(path), "--root", str(tmp_path / "runs2")]) == 2
    err = capsys.readouterr().err
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "cuda_graphs:" in text)
    assert f"s.yaml:{line}: train.cuda_graphs: 2 job(s) need CUDA" in err, err
    assert "allowed here: train.device auto or cpu and train.cuda_graphs false" in err
    assert not (tmp_path / "runs2").exists()


def test_every_command_prints_through_a_console_that_handles_a_closed_pipe():
    """rich's own Console exits 1 from inside print() when its reader goes away (`rla-sweep dashboard X | head -0`
    did); the commands' consoles are PipeConsoles, which the CLI turns into 141."""
    import re

    plain = [f"{p.name}:{i}" for p in sorted((REPO / "rla_ablate").rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"(?<![A-Za-z_])Console\(", line) and "class " not in line]
    assert plain == [], plain
