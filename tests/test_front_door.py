"""Bad input at the front door: every case is one clear message, exit 2, no traceback, nothing half-made."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest
import torch
import yaml

from rla_ablate.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = {"vocab_size": 257, "num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "head_dim": 16}


def tiny_sweep(path: Path, name: str = "door", **extra) -> Path:
    data = {"name": name, "models": [{"preset": "tiny-rla", "overrides": TINY}],
            "base": {"train": {"tokens": 512, "seq_len": 64, "micro_batch_size": 4, "batch_tokens": 256,
                               "warmup_tokens": 256, "cpu_threads": 1}, "data": {"kind": "stdlib"}},
            "resources": {"cpus": 1}, **extra}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_dead_tracking_uri_is_refused_in_seconds(tmp_path, capsys):
    from rla_ablate.tracking.server import free_port

    sweep = tiny_sweep(tmp_path / "s.yaml")
    t0 = time.monotonic()
    code, err = run_cli(capsys, "launch", str(sweep), "--root", str(tmp_path / "runs"), "--tracking-uri",
                        f"http://127.0.0.1:{free_port()}")
    assert code == 2 and "--tracking-uri: no MLflow server answers" in err
    assert "start one with `rla-sweep server`" in err
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("uri", ["garbage", "http//x:5000", "http://:5000", "ftp://host/x", "file:///tmp/mlruns"])
def test_garbage_tracking_uri_is_refused(tmp_path, capsys, uri):
    code, err = run_cli(capsys, "launch", str(tiny_sweep(tmp_path / "s.yaml")), "--root", str(tmp_path / "r"),
                        "--tracking-uri", uri)
    assert code == 2 and "--tracking-uri:" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("uri", ["sqlite:////tmp/store.db", "postgresql://user@db.example/mlflow"])
def test_a_store_uri_is_refused_by_launch_with_the_server_that_serves_it(tmp_path, capsys, uri):
    """A launch's jobs log through a server's REST API: a database URI is no place for them to log to (accepted, the
    sweep 'finished' and MLflow got no metric). The message names the command that serves the store."""
    code, err = run_cli(capsys, "launch", str(tiny_sweep(tmp_path / "s.yaml")), "--root", str(tmp_path / "r"),
                        "--tracking-uri", uri)
    assert code == 2 and f"rla-sweep server --backend-store-uri {uri}" in err
    assert not (tmp_path / "r").exists()


def test_readers_refuse_a_tracking_server_that_does_not_answer_in_seconds(tmp_path, capsys):
    """`results` and `dashboard` against a server that is down: exit 2 in seconds (MLflow's client retried for
    minutes, then a traceback), whether the URI is given or the sweep's sweep.json names it."""
    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.tracking.server import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    sdir = SweepDir(tmp_path / "runs", "shared")
    sdir.path.mkdir(parents=True)
    sdir.write_meta(tracking_uri=dead, backend_uri=dead, embedded_tracking=False)
    for command in ("results", "dashboard"):
        for given in ([], ["--tracking-uri", dead]):
            t0 = time.monotonic()
            code, err = run_cli(capsys, command, "shared", "--root", str(tmp_path / "runs"), *given)
            assert code == 2 and f"no MLflow server answers at {dead}" in err, err
            assert "the sweep logs there (its sweep.json)" in err, err  # the given URI is the sweep's own here
            assert time.monotonic() - t0 < 30
    assert not (sdir.path / "dashboard").exists()


def test_mlflow_server_that_dies_at_start_up_says_so(tmp_path, monkeypatch):
    from rla_ablate.errors import UserError
    from rla_ablate.tracking import server

    monkeypatch.setattr(server.sys, "executable", "/bin/false")
    with pytest.raises(UserError) as info:
        server.TrackingServer(tmp_path / "mlflow", startup_timeout=20).start()
    assert "the MLflow server exited with code 1" in str(info.value)


def test_mlflow_server_that_cannot_be_started_says_so(tmp_path, monkeypatch):
    from rla_ablate.errors import UserError
    from rla_ablate.tracking import server

    monkeypatch.setattr(server.sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(UserError) as info:
        server.TrackingServer(tmp_path / "mlflow", startup_timeout=20).start()
    assert "cannot start the MLflow server" in str(info.value)


def test_non_utf8_sweep_file(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    code, err = run_cli(capsys, "plan", str(path))
    assert code == 2 and "not UTF-8" in err


def test_root_that_is_a_file(tmp_path, capsys):
    root = tmp_path / "file"
    root.write_text("x")
    code, err = run_cli(capsys, "launch", str(tiny_sweep(tmp_path / "s.yaml")), "--root", str(root))
    assert code == 2 and "is a file" in err
    code, err = run_cli(capsys, "status", "door", "--root", str(root))
    assert code == 2 and "is a file" in err
    code, err = run_cli(capsys, "cancel", "door", "--root", str(root))
    assert code == 2 and "is a file" in err


def test_dashboard_out_eval_device_and_data_show_seq_len_are_checked_before_any_work(tmp_path, capsys):
    """Refused with exit 2 before the dashboard starts a server or reads a run, before eval loads a model, before
    data show opens the data (each ended in a traceback: FileExistsError after rendering, torch's assertion or
    RuntimeError, ZeroDivisionError); nothing is left behind."""
    out = tmp_path / "file"
    out.write_text("x")
    for bad, said in ((out, f"{out} is a file, not a folder"), (out / "sub", f"{out} is a file, so no folder"),
                      (Path("/proc/rla-sweep-test/x"), "cannot make /proc/rla-sweep-test/x")):
        code, err = run_cli(capsys, "dashboard", "nosweep", "--root", str(tmp_path / "runs"), "--out", str(bad))
        assert code == 2 and f"--out: {said}" in err, err
    code, err = run_cli(capsys, "dashboard", "nosweep", "--root", str(tmp_path / "runs"),
                        "--out", str(tmp_path / "new" / "page"))
    assert code == 2 and "no sweep 'nosweep'" in err and not (tmp_path / "new").exists()
    for device, said in (("tpu", "'tpu' is not a device here; allowed: cpu, cuda, cuda:N"),
                         ("cuda:x", "'cuda:x' is not a device here")):
        code, err = run_cli(capsys, "eval", str(tmp_path), "--tasks", "rla_choice", "--device", device)
        assert code == 2 and f"--device: {said}" in err, err
    if not torch.cuda.is_available():
        code, err = run_cli(capsys, "eval", str(tmp_path), "--tasks", "rla_choice", "--device", "cuda")
        assert code == 2 and "--device: cuda asked for but CUDA is not available here; allowed here: cpu" in err
    config = tmp_path / "d.yaml"
    config.write_text("data: {kind: stdlib}\n")
    for seq_len in ("0", "-3"):
        code, err = run_cli(capsys, "data", "show", str(config), "--seq-len", seq_len)
        assert code == 2 and f"--seq-len: must be >= 1 (got {seq_len})" in err, err


def test_train_out_that_is_a_file(tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("x")
    code, err = run_cli(capsys, "train", "tiny-rla", "--out", str(out))
    assert code == 2 and "--out:" in err and "is a file" in err
    # a file above the folder, or a place the system refuses: named, no traceback, nothing made
    code, err = run_cli(capsys, "train", "tiny-rla", "--out", str(out / "sub"))
    assert code == 2 and f"--out: {out} is a file, so no folder can be made under it" in err
    code, err = run_cli(capsys, "train", "tiny-rla", "--out", "/proc/rla-sweep-test", "--set", "train.tokens=4096")
    assert code == 2 and "--out: cannot make /proc/rla-sweep-test:" in err and "Traceback" not in err
    code, err = run_cli(capsys, "launch", str(tiny_sweep(tmp_path / "s.yaml")), "--root", str(out / "runs"))
    assert code == 2 and f"--root: {out} is a file, so no folder can be made under it" in err
    from rla_ablate.errors import UserError
    from rla_ablate.fileio import check_folder  # export's OUT goes through it too

    with pytest.raises(UserError, match=f"OUT: {out} is a file, so no folder"):
        check_folder(out / "hf", "OUT", "the exported model")


def _read_only(monkeypatch):
    """The sweep folder as on a read-only filesystem (the tests run as root, so chmod would not stop a write)."""
    import os

    from rla_ablate.sweep import state

    real_open = os.open

    def ro_open(path, flags, *args):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(state.os, "open", ro_open)
    monkeypatch.setattr(state, "write_json", refuse)
    monkeypatch.setattr(state.SweepDir, "request_cancel", refuse)


def _finished_sweep(root: Path, active: bool) -> None:
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(root, "door")
    sdir.path.mkdir(parents=True)
    sdir.write_job_list([{"job_id": "j1", "name": "tiny-rla/seed0", "tokens_target": 512}])
    sdir.set_status("j1", status="running" if active else "finished", attempts=1)
    (sdir.path / "launch.lock").write_text("")


def test_status_and_cancel_work_on_a_read_only_root(tmp_path, capsys, monkeypatch):
    _finished_sweep(tmp_path / "done", active=False)
    _finished_sweep(tmp_path / "active", active=True)
    _read_only(monkeypatch)
    code, err = run_cli(capsys, "status", "door", "--root", str(tmp_path / "done"), "--json")
    assert code == 0
    code, err = run_cli(capsys, "cancel", "door", "--root", str(tmp_path / "done"))
    assert code == 0
    # An unfinished job would have to be marked cancelled: that needs a write, and says so.
    code, err = run_cli(capsys, "cancel", "door", "--root", str(tmp_path / "active"))
    assert code == 2 and "cannot write to the sweep folder" in err


def test_cancel_says_whether_the_launch_stopped_for_it_or_had_ended_on_its_own(tmp_path, capsys):
    """A launch takes the request when it stops for it; one that ends on its own first (its jobs done) leaves it:
    cancel then says nothing was stopped, not "stopped; resume continues", and removes the request."""
    import subprocess
    import sys

    from rla_ablate.sweep.state import SweepDir

    _finished_sweep(tmp_path, active=False)
    sdir = SweepDir(tmp_path, "door")
    holder = ("import fcntl, os, sys, time\n"
              "fd = os.open(sys.argv[1] + '/launch.lock', os.O_RDWR | os.O_CREAT)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True)\n"
              "request = sys.argv[1] + '/cancel.request'\n"
              "while sys.argv[2] == 'take' and not os.path.exists(request): time.sleep(0.05)\n"
              "if sys.argv[2] == 'take': os.unlink(request)\n"
              "else: time.sleep(1.0)\n")
    for mode, says in (("take", "stopped; `rla-sweep resume door"),
                       ("ends", "the launch ended on its own before it read the request: nothing was stopped")):
        proc = subprocess.Popen([sys.executable, "-c", holder, str(sdir.path), mode], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "locked"
        code = main(["cancel", "door", "--root", str(tmp_path), "--wait", "20"])
        proc.wait(10)
        out = " ".join(capsys.readouterr().out.split())
        assert code == 0 and says in out, out
        assert not sdir.cancel_path.exists()


def test_a_launch_on_a_read_only_root_is_refused(tmp_path, capsys, monkeypatch):
    from rla_ablate import fileio

    monkeypatch.setattr(fileio.os, "access", lambda path, mode: False)
    code, err = run_cli(capsys, "launch", str(tiny_sweep(tmp_path / "s.yaml")), "--root", str(tmp_path / "r"))
    assert code == 2 and "cannot write under" in err


def test_job_cap_is_checked_before_expanding(tmp_path, capsys):
    sweep = tiny_sweep(tmp_path / "s.yaml", grid={"train.lr": [1e-3 * (i + 1) for i in range(1000)],
                                                  "train.min_lr": [1e-6 * (i + 1) for i in range(200)]})
    t0 = time.monotonic()
    code, err = run_cli(capsys, "plan", str(sweep))
    assert code == 2 and "200,000 jobs" in err and "grid.train.lr" in err and "grid.train.min_lr" in err
    assert time.monotonic() - t0 < 10


def test_a_failed_launch_leaves_no_new_sweep_behind(tmp_path, capsys):
    from rla_ablate.tracking.server import free_port

    root = tmp_path / "runs"
    code, err = run_cli(capsys, "launch", str(tiny_sweep(tmp_path / "s.yaml")), "--root", str(root),
                        "--address", f"127.0.0.1:{free_port()}")
    assert code == 2 and "--address" in err
    assert not (root / "door").exists()


def test_a_failed_data_prepare_leaves_no_folder(tmp_path, capsys, monkeypatch):
    import rla_ablate.data.sources as sources

    def boom(docs, tok):
        yield from ()
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(sources, "tokenize_documents", boom)
    out = tmp_path / "shards"
    with pytest.raises(OSError):
        main(["data", "prepare", "stdlib", str(out)])
    assert not out.exists()


def test_a_folder_given_for_the_sweep_file(tmp_path, capsys):
    folder = tmp_path / "my"
    folder.mkdir()
    tiny_sweep(folder / "s.yaml")
    for args in (["launch", str(folder), "--root", str(tmp_path / "runs")], ["plan", str(folder)]):
        code, err = run_cli(capsys, *args)
        assert code == 2 and f"{folder}: is a folder, not a file; expected a sweep file (YAML)" in err
        assert "(it holds s.yaml)" in err
    assert not (tmp_path / "runs").exists()
    # something that exists without being a file, and nothing at all
    assert run_cli(capsys, "plan", "/dev/null") == (
        2, "rla-sweep: error: /dev/null: not a regular file; expected a sweep file (YAML), e.g. sweeps/smoke.yaml\n")
    code, err = run_cli(capsys, "plan", str(tmp_path / "nope.yaml"))
    assert code == 2 and err.endswith("nope.yaml: no such file\n")


def test_data_show_of_a_shard_folder_reads_it_as_train_data_does(tmp_path, capsys):
    """`data show DIR` reads the folder as `train --data DIR` would; a damaged index is named (it was a KeyError)."""
    shards = tmp_path / "shards"
    shards.mkdir()
    head = '"format": "rla-sweep-shards", "version": 1, "dtype": "uint16", "tokenizer": "bytes"'
    for index, words in (("{}", "is not a rla-sweep-shards v1 index"),
                         ('{"format": "rla-sweep-shards", "version": 1, "dtype": "uint16"}',
                          "lacks vocab_size, eos_id, tokenizer, shards"),
                         ('{%s, "vocab_size": 257, "eos_id": 9999, "shards": []}' % head,
                          "has eos_id 9999 outside its vocabulary"),
                         ('{%s, "vocab_size": 257, "eos_id": 256, "shards": [{"file": "../x.bin", "tokens": 3}]}'
                          % head, "has a shard list that is not one {file, tokens} a shard file of the folder"),
                         ('{%s, "vocab_size": 257, "eos_id": 256, "shards": [], "tokens": "many"}' % head,
                          "has tokens 'many'")):
        (shards / "index.json").write_text(index)
        code, err = run_cli(capsys, "data", "show", str(shards))
        assert code == 2 and f"data.path: {shards / 'index.json'} {words}; write the folder" in err, err
        assert "Traceback" not in err
    (tmp_path / "a.txt").write_text("plain text " * 40)
    assert main(["data", "prepare", str(tmp_path / "a.txt"), str(tmp_path / "ok")]) == 0
    capsys.readouterr()
    assert main(["data", "show", str(tmp_path / "ok"), "--seq-len", "16"]) == 0
    assert capsys.readouterr().out.startswith("kind: shards, vocabulary: 257\ntokens: 441")


def test_rla_root_is_the_default_root(tmp_path, capsys, monkeypatch):
    """RLA_ROOT names the folder every command's --root defaults to (gpu_sweep.sh's variable, which users set for the
    CLI too); --root still wins."""
    monkeypatch.setenv("RLA_ROOT", str(tmp_path / "env-root"))
    code, err = run_cli(capsys, "status", "nope")
    assert code == 2 and f"no sweep 'nope' under {tmp_path / 'env-root'}" in err, err
    code, err = run_cli(capsys, "status", "nope", "--root", str(tmp_path / "flag-root"))
    assert code == 2 and f"under {tmp_path / 'flag-root'}" in err, err


def test_data_show_takes_the_kinds_train_data_takes_by_name(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "show", "mqar", "--seq-len", "64"]) == 0
    assert capsys.readouterr().out.startswith("kind: mqar, vocabulary: 8192\nfirst example: [")
    code, err = run_cli(capsys, "data", "show", "stdlb")
    assert (code, err) == (2, "rla-sweep: error: stdlb: no such file or folder; `data show` takes stdlib, mqar, "
                              "niah, a YAML data config, or the data as `train --data` names it\n")


@pytest.mark.parametrize("command", ["status", "cancel", "resume"])
def test_an_unknown_sweep_is_named_with_its_root(tmp_path, capsys, command):
    root = tmp_path / "runs"
    code, err = run_cli(capsys, command, "nope", "--root", str(root))
    assert code == 2
    assert err.startswith(f"rla-sweep: error: no sweep 'nope' under {root}; launch one with `rla-sweep launch "
                          f"FILE --root {root}`"), err
    _finished_sweep(root, active=False)
    code, err = run_cli(capsys, command, "nope", "--root", str(root))
    assert code == 2 and err.startswith(f"rla-sweep: error: no sweep 'nope' under {root}; sweeps there: door"), err


@pytest.mark.parametrize("command", ["status", "cancel", "resume", "results", "dashboard"])
def test_a_sweep_file_that_does_not_exist_is_said_to_be_missing(tmp_path, capsys, command):
    """A path (a sweep name has no '/' and no .yaml) to no file: not looked up as a sweep of that name."""
    root = tmp_path / "runs"
    for missing in (str(tmp_path / "sw" / "nonexist.yaml"), "nonexist.yml"):
        code, err = run_cli(capsys, command, missing, "--root", str(root))
        assert (code, err) == (2, f"rla-sweep: error: {missing}: no such file; give a sweep file or the name of a "
                                  "launched sweep\n")
    # a folder given by path: a sweep's, said with the name and root that find it; one job's (`train --out`)
    sweep, job = root / "door", tmp_path / "one"
    for folder, record in ((sweep, "jobs.json"), (job, "job.json")):
        folder.mkdir(parents=True)
        (folder / record).write_text("[]")
    code, err = run_cli(capsys, command, str(sweep), "--root", str(tmp_path))
    assert (code, err) == (2, f"rla-sweep: error: {sweep} is a sweep's folder; give its name and root: door --root "
                              f"{root}\n")
    code, err = run_cli(capsys, command, str(job), "--root", str(root))
    assert code == 2 and err.startswith(f"rla-sweep: error: {job} is one job's folder (`rla-sweep train --out`), not "
                                        f"a sweep: its metrics are in {job / 'metrics.jsonl'}"), err


def test_an_unknown_control_is_one_problem(tmp_path, capsys):
    path = tiny_sweep(tmp_path / "s.yaml", controls=["matched_stat"])
    code, err = run_cli(capsys, "plan", str(path))
    line = path.read_text().splitlines().index("- matched_stat") + 1
    assert code == 2 and err == (f"rla-sweep: error: {path}:{line}: controls.0: unknown control 'matched_stat' (did "
                                 "you mean 'matched_state'?); allowed: matched_state, matched_params, "
                                 "matched_wallclock\n")


def test_validator_messages_have_no_pydantic_prefix(tmp_path, capsys):
    code, err = run_cli(capsys, "eval", str(tmp_path), "--tasks", "a,a")
    assert code == 2 and err == "rla-sweep: error: --tasks: names a more than once; give each task once\n"
    path = tiny_sweep(tmp_path / "s.yaml", seeds=[3, 1, 3])
    code, err = run_cli(capsys, "plan", str(path))
    assert code == 2 and err.endswith(": seeds: seed 3 listed more than once; each seed runs once per job\n"), err


def test_a_narrow_terminal_leaves_out_whole_columns_not_letters():
    """`plan`, `status` and `results` keep the columns that name a row and drop others whole, in the given order,
    until the rest fits; free text folds; markup counts as printed."""
    from rich.console import Console

    from rla_ablate.terminal import fit_columns

    columns = ["job", "status", "id", "tokens", "error"]
    rows = [["tiny-rla/no_fitting/seed0", "[green]finished[/]", "f0cf3c6c", "16.4k/16.4k", "x" * 150]]
    wide, none = fit_columns(Console(width=300), columns, rows, keep=2)
    assert wide == [0, 1, 2, 3, 4] and none == []
    kept, left_out = fit_columns(Console(width=60), columns, rows, keep=2, fold=("error",),
                                 drop_order=["id", "tokens", "error"])
    # job 25 + status 8 + error folded to 30, each with 3 of padding and border, and 1: 73 > 60
    assert [columns[i] for i in kept] == ["job", "status"] and left_out == ["id", "tokens", "error"]
    kept, left_out = fit_columns(Console(width=80), columns, rows, keep=2, fold=("error",),
                                 drop_order=["id", "tokens", "error"])
    assert [columns[i] for i in kept] == ["job", "status", "error"] and left_out == ["id", "tokens"]


def test_a_sweep_name_where_its_file_belongs_and_a_file_where_its_name_does(tmp_path, capsys, monkeypatch):
    """`plan smoke` points at sweeps/smoke.yaml; dashboard, resume and ui take the sweep file as status and
    results do (the name inside it), so their 'no sweep' names the sweep, not the file's path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweeps").mkdir()
    sweep = tiny_sweep(tmp_path / "sweeps" / "mine.yaml", name="door")
    for command in (["plan"], ["launch", "--root", str(tmp_path / "runs")]):
        code, err = run_cli(capsys, command[0], "mine", *command[1:])
        assert code == 2 and "mine: no such file (did you mean sweeps/mine.yaml?" in err, err
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs").mkdir()
    for command in ("dashboard", "resume", "ui", "status", "results"):
        code, err = run_cli(capsys, command, str(sweep), "--root", str(tmp_path / "runs"))
        assert code == 2 and "no sweep 'door'" in err, (command, err)
    # a --root that is a file is said to be one, not a place to launch into
    for command in (["dashboard"], ["status"], ["results"], ["eval", "--tasks", "rla_choice"]):
        code, err = run_cli(capsys, command[0], "door", *command[1:], "--root", str(sweep))
        assert code == 2 and f"--root: {sweep} is a file, not a folder" in err and "launch one" not in err, (command, err)


def test_status_and_results_of_a_file_that_is_not_the_launched_one_say_so(tmp_path, capsys):
    """Given a sweep file, status and results show the sweep its `name:` names; a file other than the one that sweep
    was last launched with (here another token budget) gets a note on stderr that the jobs shown are not its own."""
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.sources import job_record
    from rla_ablate.sweep.state import SweepDir

    launched = tiny_sweep(tmp_path / "mine.yaml")
    sdir = SweepDir(tmp_path / "runs", "door")
    sdir.path.mkdir(parents=True)
    (sdir.path / "sweep.yaml").write_text(launched.read_text())  # as a launch leaves it
    sdir.write_job_list([job_record(j) for j in load_sweep(launched).jobs])
    other = tmp_path / "other" / "mine.yaml"
    other.parent.mkdir()
    other.write_text(launched.read_text().replace("tokens: 512", "tokens: 1024"))
    assert other.read_text() != launched.read_text()
    for path, noted in ((launched, False), (other, True), (sdir.path / "sweep.yaml", False)):
        code, err = run_cli(capsys, "status", str(path), "--root", str(tmp_path / "runs"))
        assert code == 0 and ("is not the file sweep 'door' was last launched with" in err) == noted, (path, err)
    code, err = run_cli(capsys, "status", "door", "--root", str(tmp_path / "runs"), "--json")
    assert code == 0 and "note" not in err


def test_a_train_refused_before_its_first_step_leaves_no_folder_it_made(tmp_path, capsys):
    """Data found unusable once the job opens it (here an empty text file: no token) is exit 2 naming the path, and
    the --out folder the command made for it goes (it kept a job.json of a job that never ran)."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    out = tmp_path / "job"
    code, err = run_cli(capsys, "train", "tiny-rla", "--out", str(out), "--data", str(empty),
                        "--set", "train.tokens=8192")
    assert code == 2 and f"data: the data at {empty} (text) holds no text: its documents are empty" in err, err
    assert not out.exists()


def test_a_data_config_given_to_train_is_checked_at_its_own_lines(tmp_path, capsys):
    """`train --data FILE.yaml`: a mistake in the file is reported at its line there (it was blamed on --set)."""
    bad = tmp_path / "data.yaml"
    bad.write_text("kind: shards\npath: /tmp/x\nsplit: train\n")
    code, err = run_cli(capsys, "train", "tiny-rla", "--out", str(tmp_path / "job"), "--data", str(bad))
    assert code == 2 and f"{bad}:3: data.split: unknown key 'split'" in err, err
    assert not (tmp_path / "job").exists()
    # shards without their index (written last): an interrupted `data prepare`, not a folder of text
    partial = tmp_path / "shards"
    partial.mkdir()
    (partial / "tokens-00000.bin").write_bytes(b"\0\0")
    code, err = run_cli(capsys, "train", "tiny-rla", "--out", str(tmp_path / "job"), "--data", str(partial))
    assert code == 2 and "no index.json: a `data prepare` that did not finish" in err, err


def test_plan_says_when_the_file_leaves_the_token_budget_at_the_papers(tmp_path, capsys):
    """A sweep without train.tokens trains every job 50B tokens (`rla-sweep train` defaults by machine): plan says
    so, and says nothing once the file sets it (in base, or as a grid key)."""
    import yaml as _yaml

    path = tiny_sweep(tmp_path / "s.yaml")
    data = _yaml.safe_load(path.read_text())
    del data["base"]["train"]["tokens"]
    path.write_text(_yaml.safe_dump(data, sort_keys=False))
    assert main(["plan", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"train.tokens is not set in {path}: each job trains the default 50,000,000,000 tokens" in out, out
    data["grid"] = {"train.tokens": [512, 1024]}
    path.write_text(_yaml.safe_dump(data, sort_keys=False))
    assert main(["plan", str(path)]) == 0
    assert "is not set" not in capsys.readouterr().out


def test_status_and_cancel_import_neither_torch_nor_matplotlib(tmp_path):
    """`status` and `cancel` are run by hand and by scripts that poll: they read the sweep folder's files, and
    import neither torch nor matplotlib (torch was 2 s of a 2.4 s `status`)."""
    import subprocess
    import sys

    from cli_run import REPO
    from dashboard_synthetic import sweep_file, write_sweep_folder

    from rla_ablate.sweep.expand import load_sweep

    sweep = load_sweep(sweep_file(tmp_path, "name: light\nmodels: [{preset: tiny-rla}]\n"))
    write_sweep_folder(tmp_path / "runs", sweep, f"sqlite:///{tmp_path / 'mlflow.db'}")
    code = ("import sys; from rla_ablate.cli import main; "
            "codes = [main([c, 'light', '--root', sys.argv[1]]) for c in ('status', 'cancel')]; "
            "print(codes, [m for m in ('torch', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "runs")], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.stdout.strip().endswith("[0, 0] []"), out.stdout + out.stderr
    assert "tiny-rla/seed0" in out.stdout and "no launch of sweep 'light' is running" in out.stdout + out.stderr
