"""`rla-sweep server` on a real PostgreSQL: a throwaway cluster (initdb, in a temporary folder, on a free port), the
server on it, and two launches at once logging to it; every run and metric of both sweeps is then in that server
and in PostgreSQL's tables. Ctrl-C stops the server with exit 130. Bad store URIs and a port another server holds are
refused in seconds (exit 2), before any server starts.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from rla_ablate.cli import main
from rla_ablate.tracking.server import free_port, is_healthy
from cli_run import cli_background as cli


TINY = {"vocab_size": 257, "num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "head_dim": 16}
BASE = {
    "train": {"tokens": 2048, "seq_len": 64, "micro_batch_size": 4, "batch_tokens": 256, "warmup_tokens": 256,
              "eval_every_tokens": 1024, "checkpoint_every_tokens": 1024, "cpu_threads": 1},
    "data": {"kind": "stdlib"},
    "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 512}],
}


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (folder / name).exists():
            return str(folder / name)
    return None


def _as_pg_user(cmd: list[str], user: str | None) -> list[str]:
    # initdb and postgres refuse to run as root: run them as an unprivileged user then.
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


@pytest.fixture(scope="module")
def postgres():
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL is not installed (no initdb / pg_ctl on PATH or under /usr/lib/postgresql)")
    psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL driver (pip install 'rla-sweep[postgres]')")
    user = None
    # Under /tmp: short enough for PostgreSQL's socket path, and reachable by the unprivileged user below (a
    # TMPDIR of root's may not be).
    folder = Path(tempfile.mkdtemp(prefix="rla-pg-", dir="/tmp" if os.path.isdir("/tmp") else None))
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: initdb cannot run as root")
        for name in ("postgres", "nobody"):
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            user = name
            os.chown(folder, entry.pw_uid, entry.pw_gid)
            break
        else:
            pytest.skip("running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")
    data, log, port = folder / "data", folder / "postgres.log", free_port()
    opts = (f"-p {port} -k {folder} -h 127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off")
    for cmd in ([initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
                [pg_ctl, "-D", str(data), "-o", opts, "-l", str(log), "-w", "-t", "60", "start"]):
        done = subprocess.run(_as_pg_user(cmd, user), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            server_log = log.read_text(errors="replace") if log.exists() else ""
            shutil.rmtree(folder, ignore_errors=True)
            pytest.fail(f"{cmd[0]} failed ({done.returncode}):\n{done.stdout}{done.stderr}{server_log}")
    try:
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            conn.execute("CREATE DATABASE mlflow")
        yield {"uri": f"postgresql://postgres@127.0.0.1:{port}/mlflow", "port": port, "psycopg": psycopg}
    finally:
        subprocess.run(_as_pg_user([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], user),
                       capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_two_launches_share_one_server_on_postgresql(postgres, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from rla_ablate.train.loggers import read_jsonl

    root, port = tmp_path / "runs", free_port()
    server = cli("server", "--root", str(root), "--backend-store-uri", postgres["uri"], "--port", str(port),
                 "--workers", "1")
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not is_healthy(uri, timeout=1.0):
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, "the server did not answer within 120 s"
            time.sleep(0.25)
        sweeps = {}
        for name, preset in (("srv-a", "tiny-rla"), ("srv-b", "tiny-gdn")):
            f = tmp_path / f"{name}.yaml"
            f.write_text(yaml.safe_dump({"name": name, "models": [{"preset": preset, "overrides": TINY}],
                                         "base": BASE, "resources": {"cpus": 1}}, sort_keys=False))
            sweeps[name] = cli("launch", str(f), "--root", str(root), "--tracking-uri", uri)
        for name, proc in sweeps.items():
            out, _ = proc.communicate(timeout=900)
            assert proc.returncode == 0, f"{name}:\n{out}"

        client = MlflowClient(uri)
        for name in sweeps:
            meta = json.loads((root / name / "sweep.json").read_text())
            assert meta["tracking_uri"] == uri and meta["embedded_tracking"] is False
            assert not (root / name / "mlflow").exists(), "a launch with --tracking-uri started its own store"
            exp = client.get_experiment_by_name(f"rla-sweep/{name}")
            runs = client.search_runs([exp.experiment_id], filter_string="tags.`rla.role` = 'job'")
            assert len(runs) == 1 and runs[0].info.status == "FINISHED"
            (job_dir,) = (root / name / "jobs").iterdir()
            want = {(k, r["step"]) for r in read_jsonl(job_dir / "metrics.jsonl") if r.get("type") == "metrics"
                    for k in r["values"]}
            have = {(k, m.step) for k in {k for k, _ in want} for m in client.get_metric_history(runs[0].info.run_id, k)}
            assert want and want == have, f"{name}: the run lacks {sorted(want - have)[:5]}"
            assert max(s for k, s in have if k == "train/loss") == 2048
        # `ui` of either sweep names the one server that holds them all.
        assert main(["ui", "srv-a", "--root", str(root)]) == 0
        assert f"sweep srv-a logs to {uri}" in capsys.readouterr().out
        # Both sweeps are in PostgreSQL itself: parent and job runs, and their metrics.
        with postgres["psycopg"].connect(host="127.0.0.1", port=postgres["port"], user="postgres",
                                         dbname="mlflow") as conn:
            names = {r[0] for r in conn.execute("SELECT name FROM experiments")}
            assert {"rla-sweep/srv-a", "rla-sweep/srv-b"} <= names
            assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 4
            assert conn.execute("SELECT count(*) FROM metrics WHERE key = 'train/loss'").fetchone()[0] >= 2 * 8
    finally:
        server.send_signal(signal.SIGINT)
        try:
            out, _ = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            out, _ = server.communicate()
    assert server.returncode == 130, out
    assert f"--tracking-uri {uri}" in out and "postgresql://postgres@127.0.0.1" in out
    assert not is_healthy(uri), "the MLflow server outlived `rla-sweep server`"


@pytest.mark.parametrize("uri, says", [
    ("http://127.0.0.1:5000", "allowed schemes: postgresql, mysql, mssql, sqlite"),
    ("sqlite:////no/such/folder/mlflow.db", "the folder of /no/such/folder/mlflow.db does not exist"),
    ("postgresql://me:secret@127.0.0.1:{port}/mlflow", "cannot connect to postgresql://me:***@127.0.0.1:{port}/mlflow"),
])
def test_a_store_that_cannot_work_is_refused_before_the_server_starts(tmp_path, capsys, uri, says):
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (pip install 'rla-sweep[postgres]')")
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    code = main(["server", "--root", str(tmp_path / "runs"), "--backend-store-uri", uri.format(port=port)])
    err = capsys.readouterr().err
    assert code == 2 and "error: --backend-store-uri: " in err and says.format(port=port) in err, err
    assert "secret" not in err and "Traceback" not in err
    assert time.monotonic() - t0 < 15
    assert not (tmp_path / "runs" / "_server").exists()


def test_a_missing_driver_is_named_with_the_package_that_installs_it(tmp_path, capsys):
    """MySQL's driver module is MySQLdb, which pip knows as mysqlclient (`pip install MySQLdb` finds nothing)."""
    import importlib.util

    if importlib.util.find_spec("MySQLdb") is not None:
        pytest.skip("a MySQL driver is installed here")
    code = main(["server", "--root", str(tmp_path / "runs"), "--backend-store-uri", "mysql://u:pw@127.0.0.1:1/db"])
    err = capsys.readouterr().err
    assert code == 2 and "the mysql store needs its database driver (MySQLdb), which is not installed: pip install " \
        "mysqlclient" in err, err


def test_ui_never_serves_another_servers_runs(tmp_path, capsys):
    """A port held by another process (another sweep's `ui`, say) is refused: its /health would answer and the UI
    would show the wrong sweep's runs."""
    from rla_ablate.sweep.state import SweepDir

    root = tmp_path / "runs"
    sdir = SweepDir(root, "mine")
    sdir.path.mkdir(parents=True)
    sdir.write_meta(embedded_tracking=True, tracking_uri=None, backend_uri=None)
    (sdir.mlflow_dir).mkdir()
    (sdir.mlflow_dir / "mlflow.db").touch()
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert main(["ui", "mine", "--root", str(root), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port: port {port} on 127.0.0.1 is in use by another process" in err, err
    for bad in ("70000", "-1", "0"):  # refused before the socket call that raised OverflowError on them
        assert main(["ui", "mine", "--root", str(root), "--port", bad]) == 2
        err = capsys.readouterr().err
        assert f"--port: {bad} is not a port; give one in 1-65535" in err and "Traceback" not in err, err


def test_a_host_that_is_not_this_machines_is_named_not_a_busy_port(tmp_path, capsys):
    """`server --host` at an address no interface of this machine has (192.0.2.1, reserved for documentation): the
    address is the problem, not the port; nothing is left behind."""
    root = tmp_path / "srv"
    assert main(["server", "--root", str(root), "--host", "192.0.2.1", "--port", "5082"]) == 2
    err = capsys.readouterr().err
    assert "--host: cannot listen on 192.0.2.1: Cannot assign requested address; give --host an address of this " \
           "machine" in err, err
    assert "in use" not in err and not (root / "_server").exists()


def test_ui_of_a_sweep_on_a_server_that_does_not_answer_says_so(tmp_path, capsys):
    """A sweep launched with --tracking-uri: `ui` names its server, and says when it does not answer instead of
    sending the user to a dead address."""
    from rla_ablate.sweep.state import SweepDir

    root = tmp_path / "runs"
    sdir = SweepDir(root, "theirs")
    sdir.path.mkdir(parents=True)
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    sdir.write_meta(embedded_tracking=False, tracking_uri=uri, backend_uri=None)
    assert main(["ui", "theirs", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"sweep theirs logs to {uri}, which does not answer now" in err and "Traceback" not in err, err


def test_ctrl_c_stops_a_server_started_with_sigint_ignored(tmp_path):
    """A process a non-interactive shell starts in the background (`rla-sweep server &`) inherits SIGINT ignored,
    and Python leaves it so: `kill -INT` (Ctrl-C's signal, the documented way to stop) did nothing, until the test
    that stops its server this way killed it after 60 s. The server sets SIGINT itself."""
    from cli_run import CLI, REPO

    port = free_port()
    proc = subprocess.Popen([*CLI, "server", "--root", str(tmp_path / "runs"), "--port", str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 120
        while not is_healthy(f"http://127.0.0.1:{port}", timeout=1.0):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the server did not answer within 120 s"
            time.sleep(0.25)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "tracking server stopped" in out, out
    assert not is_healthy(f"http://127.0.0.1:{port}", timeout=1.0)
