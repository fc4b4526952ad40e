"""The local MLflow server, idempotent runs and the MLflow logger, against a real `mlflow server` process."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from rla_ablate.tracking import (MLflowLogger, TrackingServer, ablations_tag, create_or_get_child_run, flatten,
                                 is_healthy, sync_from_jsonl)
from rla_ablate.tracking.server import free_port

pytestmark = pytest.mark.slow

CONFIG = {"model": {"family": "rla", "hidden": 64, "n_layers": 2}, "train": {"lr": 3e-4, "seed": 1},
          "eval": [{"name": "val", "every": 100}]}


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def healthy_within(uri: str, timeout: float = 30) -> bool:
    """Whether the server answers within `timeout` s: one slow answer on a loaded machine is not an outage."""
    deadline = time.monotonic() + timeout
    while not is_healthy(uri):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_flatten_and_ablations_tag():
    assert flatten(CONFIG) == {"model.family": "rla", "model.hidden": "64", "model.n_layers": "2",
                               "train.lr": "0.0003", "train.seed": "1", "eval.0.name": "val", "eval.0.every": "100"}
    assert flatten({"a": [1, 2], "b": None, "c": True}) == {"a": "[1, 2]", "b": "null", "c": "true"}
    assert ablations_tag(["tied_gamma", "no_clip"]) == "no_clip+tied_gamma"
    assert ablations_tag([]) == ablations_tag(None) == ablations_tag("none") == "none"
    assert ablations_tag("no_norm,no_clip") == "no_clip+no_norm"


def test_runs_are_idempotent_and_status_is_mirrored(server, caplog):
    client = MlflowClient(server.uri)
    parent = server.ensure_parent_run("idem")
    assert server.ensure_parent_run("idem") == parent
    tags = {"family": "rla", "ablations": ["tied_gamma"], "seed": 1}
    run_id = server.create_or_get_child_run("idem", "job-a", tags=tags, config=CONFIG)
    # A relaunch finds the same run, from a fresh client as a new launcher process would.
    assert create_or_get_child_run(server.uri, "idem", "job-a", tags=tags, config=CONFIG) == run_id
    other = server.create_or_get_child_run("idem", "job-b", tags={**tags, "seed": 2}, config=CONFIG)
    assert other != run_id
    # a run's name shows its point, an Optuna draw to 6 significant digits (the tag keeps it whole)
    drawn = server.create_or_get_child_run("idem", "job-c", tags={**tags, "point.train.lr": "0.0013252449072696881",
                                                                  "point.model.clip": "1.0"}, config=CONFIG)
    assert client.get_run(drawn).data.tags["mlflow.runName"] == "rla-tied_gamma-lr=0.00132524-clip=1.0-s1-job-c"
    exp = client.get_experiment_by_name("rla-sweep/idem")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted([parent, run_id, other, drawn])

    run = client.get_run(run_id)
    assert run.info.status == "SCHEDULED"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert {k: run.data.tags[k] for k in ("sweep", "job_id", "family", "ablations", "seed")} == {
        "sweep": "idem", "job_id": "job-a", "family": "rla", "ablations": "tied_gamma", "seed": "1"}
    assert run.data.tags["git_commit"]
    assert run.data.params["model.hidden"] == "64" and run.data.params["eval.0.name"] == "val"
    path = client.download_artifacts(run_id, "config.json", dst_path=str(server.root / "dl"))
    assert json.loads(open(path).read()) == CONFIG

    logger = MLflowLogger(server.uri, run_id, flush_interval_s=0.1, system_metrics_interval_s=0.0)
    logger.log({"train/loss": 2.5, "lr": 1e-4}, step=1024)
    logger.log({"train/loss": float("nan")}, step=2048)
    logger.event("backend", 0, {"backend": "chunk", "glue": "torch"})
    # More than one request holds (MLflow caps a batch at 1000 metrics and tags together), sent while tags wait.
    logger.log({f"layer_{i:04d}/S_norm": float(i) for i in range(1500)}, step=1024)
    assert logger.flush(timeout=60)
    assert not [r for r in caplog.records if "one by one" in r.getMessage()]
    assert len(client.get_run(run_id).data.metrics) >= 1502
    assert client.get_run(run_id).info.status == "RUNNING"
    logger.close("cancelled", "SIGTERM from rla-sweep cancel")
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags["rla.status"] == "cancelled"
    assert run.data.tags["rla.status_reason"] == "SIGTERM from rla-sweep cancel"
    assert run.data.tags["kernel_backend"] == "chunk" and run.data.tags["glue"] == "torch" and run.data.tags["host"]
    losses = history(client, run_id, "train/loss")
    assert losses[0] == (1024, 2.5) and losses[1][0] == 2048 and losses[1][1] != losses[1][1]
    assert "system/cpu_percent" in run.data.metrics and "system/process_rss_gb" in run.data.metrics
    [attempt] = client.list_artifacts(run_id, "events")
    events = client.download_artifacts(run_id, attempt.path, dst_path=str(server.root / "dl"))
    assert [json.loads(line)["name"] for line in open(events)] == ["backend"]
    # A resumed attempt adds its own events file; the first attempt's events stay.
    again = MLflowLogger(server.uri, run_id, system_metrics_interval_s=None)
    again.event("resumed", 2048, {})
    again.close("finished")
    assert len(client.list_artifacts(run_id, "events")) == 2

    done = server.create_or_get_child_run("idem", "job-b")
    MLflowLogger(server.uri, done, system_metrics_interval_s=None).close("diverged", "loss is NaN at step 4096")
    assert client.get_run(done).info.status == "FAILED"


def test_buffer_flushed_when_the_process_exits_without_close(server):
    client = MlflowClient(server.uri)
    run_id = server.create_or_get_child_run("exits", "job-exits")
    code = ("import sys; from rla_ablate.tracking import MLflowLogger\n"
            "lg = MLflowLogger(sys.argv[1], sys.argv[2], flush_interval_s=3600, system_metrics_interval_s=None)\n"
            "for s in range(100): lg.log({'train/loss': s / 100}, (s + 1) * 1024)\n")
    subprocess.run([sys.executable, "-c", code, server.uri, run_id], check=True, timeout=120)
    assert history(client, run_id, "train/loss") == [((s + 1) * 1024, s / 100) for s in range(100)]


def test_unknown_run_gives_up_at_once(server, caplog):
    logger = MLflowLogger(server.uri, "0" * 32, flush_interval_s=0.05, system_metrics_interval_s=None)
    logger.log({"train/loss": 1.0}, step=1024)
    start = time.monotonic()
    assert not logger.flush(timeout=30)
    logger.close("finished")
    assert time.monotonic() - start < 20
    assert any("has no run" in r.getMessage() for r in caplog.records)


def test_backfill_from_metrics_jsonl(server, tmp_path):
    """A job killed with metrics still buffered: its metrics.jsonl fills the run's gap, exactly once."""
    from rla_ablate.train.loggers import JSONLLogger

    client = MlflowClient(server.uri)
    run_id = server.create_or_get_child_run("killed", "job-killed", tags={"family": "rdn", "seed": 0})
    jsonl = JSONLLogger(tmp_path / "metrics.jsonl")
    logger = MLflowLogger(server.uri, run_id, flush_interval_s=3600, system_metrics_interval_s=None)
    for step in range(1, 301):
        values = {"train/loss": 1.0 / step, "lr": 1e-3} | ({"eval/val/loss": 2.0 / step} if step % 50 == 0 else {})
        jsonl.log(values, step * 1024)
        logger.log(values, step * 1024)
        if step == 120:
            assert logger.flush(timeout=60)
            # SIGKILL from here on: the sender stops, the logger's buffer (steps 121-300) never reaches the server.
            logger._stop.set()
            logger._wake.set()
            logger._thread.join(30)
    jsonl.log({"train/loss": float("nan")}, 301 * 1024)
    jsonl.close("diverged", "loss is NaN at 308224 tokens")
    assert len(history(client, run_id, "train/loss")) == 120
    assert sync_from_jsonl(server.uri, run_id, tmp_path / "metrics.jsonl") == 180 + 180 + 4 + 1
    loss = history(client, run_id, "train/loss")
    assert [s for s, _ in loss] == [s * 1024 for s in range(1, 302)] and math.isnan(loss[-1][1])
    assert history(client, run_id, "eval/val/loss") == [(s * 1024, 2.0 / s) for s in range(50, 301, 50)]
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["rla.status"] == "diverged"
    # Idempotent: a second sync finds nothing to add.
    assert sync_from_jsonl(server.uri, run_id, tmp_path / "metrics.jsonl") == 0


def test_outage_loses_and_duplicates_no_metric(tmp_path):
    """Stop the real server mid-run, keep logging, restart it: every (key, step) arrives exactly once."""
    root, port = tmp_path / "mlflow", free_port()
    srv = TrackingServer(root, port=port).start()
    run_id = srv.create_or_get_child_run("outage", "job", tags={"family": "rdn", "seed": 0})
    keys = ["train/loss", "lr", "grad_norm", "layer_00/attn_out_norm", "layer_01/attn_out_norm"]
    logger = MLflowLogger(srv.uri, run_id, flush_interval_s=0.05, request_timeout_s=2.0, system_metrics_interval_s=None)

    def train(steps):
        for step in steps:
            logger.log({k: step * 0.001 + i for i, k in enumerate(keys)}, step=step * 512)
            time.sleep(0.002)

    try:
        train(range(0, 200))
        srv.stop()
        assert not is_healthy(f"http://127.0.0.1:{port}")
        train(range(200, 400))
        deadline = time.monotonic() + 30
        while logger.failures == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert logger.failures > 0
        assert not logger.flush(timeout=0.5)
        srv = TrackingServer(root, port=port).start()
        train(range(400, 600))
        logger.close("finished")
        client = MlflowClient(srv.uri)
        for i, key in enumerate(keys):
            assert history(client, run_id, key) == [(s * 512, s * 0.001 + i) for s in range(600)], key
        assert client.get_run(run_id).info.status == "FINISHED"

        # A job resumed from a checkpoint at step 500 re-logs steps 500..599: the server already has them.
        again = MLflowLogger(srv.uri, run_id, flush_interval_s=0.05, system_metrics_interval_s=None)
        for step in range(500, 700):
            again.log({k: step * 0.001 + i for i, k in enumerate(keys)}, step=step * 512)
        again.close("finished")
        for i, key in enumerate(keys):
            assert history(client, run_id, key) == [(s * 512, s * 0.001 + i) for s in range(700)], key
    finally:
        srv.stop()


def test_a_hung_server_bounds_close_and_is_restarted_on_its_port(tmp_path):
    """A stopped (SIGSTOP) server: a logger's close() returns within its timeouts, and the supervising watchdog kills
    the server after `hang_timeout_s` and starts it again on the same store and port."""
    from rla_ablate.train.loggers import JSONLLogger

    srv = TrackingServer(tmp_path / "mlflow").start().supervise(interval_s=0.2, hang_timeout_s=3.0)
    try:
        uri, pgid = srv.uri, srv.proc.pid
        run_id = srv.create_or_get_child_run("hang", "job", tags={"family": "rla", "seed": 0})
        logger = MLflowLogger(uri, run_id, flush_interval_s=0.05, request_timeout_s=1.0, close_timeout_s=2.0,
                              system_metrics_interval_s=None)
        jsonl = JSONLLogger(tmp_path / "metrics.jsonl")
        for step in range(100):
            logger.log({"train/loss": step * 0.5}, step=step)
            jsonl.log({"train/loss": step * 0.5}, step=step)
        assert logger.flush(timeout=30)
        os.killpg(pgid, signal.SIGSTOP)
        for step in range(100, 200):
            logger.log({"train/loss": step * 0.5}, step=step)
            jsonl.log({"train/loss": step * 0.5}, step=step)
        jsonl.close("finished")
        t0 = time.monotonic()
        logger.close("finished")
        assert time.monotonic() - t0 < 12, "close() waited past its timeouts"
        assert srv.wait_healthy(timeout=90) and srv.restarts == 1 and srv.uri == uri
        assert srv.notices() == [f"tracking server did not answer for 3 s; restarted on {uri}"]
        assert not os.path.exists(f"/proc/{pgid}")
        # The run was left open with its tail missing; its metrics.jsonl completes and closes it, once.
        sync_from_jsonl(uri, run_id, tmp_path / "metrics.jsonl")
        client = MlflowClient(uri)
        assert history(client, run_id, "train/loss") == [(s, s * 0.5) for s in range(200)]
        assert client.get_run(run_id).info.status == "FINISHED"
    finally:
        srv.stop()


def test_server_reuse_and_stale_cleanup(tmp_path):
    """A live server is reused by another process; after its owner is SIGKILLed no server outlives it: one started
    from the main thread dies with its owner (PDEATHSIG), one started from a worker thread (where PDEATHSIG cannot
    be armed) is found stale through server.json and stopped by the next TrackingServer on that folder."""
    main_root, thread_root = tmp_path / "main", tmp_path / "thread"
    code = ("import sys, threading, time; from rla_ablate.tracking import TrackingServer\n"
            "servers = [None]\n"
            "t = threading.Thread(target=lambda: servers.__setitem__(0, TrackingServer(sys.argv[2]).start()))\n"
            "t.start(); s = TrackingServer(sys.argv[1]).start(); t.join()\n"
            "print(s.uri, servers[0].uri, flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code, str(main_root), str(thread_root)], stdout=subprocess.PIPE,
                             text=True)
    try:
        main_uri, thread_uri = owner.stdout.readline().split()
        assert healthy_within(main_uri) and healthy_within(thread_uri)
        with TrackingServer(main_root) as reused:
            assert reused.uri == main_uri and not reused.owned
        assert is_healthy(main_uri)
        # A reader finds the live server without starting or adopting one; a folder nobody serves has none.
        assert TrackingServer(main_root).serving() == main_uri and TrackingServer(tmp_path / "none").serving() is None
        pids = {root: json.loads((root / "server.json").read_text())["pid"] for root in (main_root, thread_root)}
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pids[main_root]}"):
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{pids[main_root]}"), "the server outlived its owner"
        assert healthy_within(thread_uri), "expected the thread-started server to survive its owner"
        stale = TrackingServer(thread_root)
        assert stale._adopt_or_clean() is False
        assert not os.path.exists(f"/proc/{pids[thread_root]}") and not is_healthy(thread_uri)
        assert not (thread_root / "server.json").exists()
    finally:
        owner.kill()
        for root in (main_root, thread_root):
            rec = TrackingServer(root).read_record()
            if rec and os.path.exists(f"/proc/{rec['pid']}"):
                os.killpg(rec["pgid"], signal.SIGKILL)


def test_a_chosen_port_taken_before_the_server_binds_it_is_replaced(tmp_path, monkeypatch):
    """A free port is free only when chosen: Ray, starting beside the server, opens dozens. When another process
    takes the server's port first (here a listener that answers in binary, as a gRPC server does), the health check
    says "not up" rather than raising, and the server starts again on another free port."""
    import socket
    import threading

    from rla_ablate.tracking import server as srv

    thief = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    thief.bind(("127.0.0.1", 0))
    thief.listen(8)
    taken = thief.getsockname()[1]

    def answer_in_binary():
        while True:
            try:
                conn, _ = thief.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\x00\x05\x00\x40\x00\x00\xfe\x03")

    threading.Thread(target=answer_in_binary, daemon=True).start()
    assert not srv.is_healthy(f"http://127.0.0.1:{taken}", timeout=2.0)
    # and a --tracking-uri naming such a port is refused with a message, not a traceback
    from rla_ablate.errors import UserError
    with pytest.raises(UserError, match="no MLflow server answers"):  # not in HTTP, or reset
        srv.check_server_answers(f"http://127.0.0.1:{taken}", timeout=2.0)
    ports = iter([taken])
    real = srv.free_port
    monkeypatch.setattr(srv, "free_port", lambda host=srv.HOST: next(ports, None) or real(host))
    try:
        with TrackingServer(tmp_path / "tracking") as server:
            assert server.port != taken and srv.is_healthy(server.uri)
            assert "was taken before the server bound it" in server.log_path.read_text()
            assert json.loads(server.record_path.read_text())["port"] == server.port
    finally:
        thief.close()
    # a port the user names is theirs: taken, it is refused at once, not replaced
    with pytest.raises(Exception, match="in use by another process"):
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            TrackingServer(tmp_path / "named", port=busy.getsockname()[1]).start()
    assert not (tmp_path / "named").exists()  # refused before it made its folder
