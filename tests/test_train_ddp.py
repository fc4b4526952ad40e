"""Data parallel through Ray Train on 2 CPU workers (gloo): DDP and FSDP2 match a single process, the caller's
logger receives rank 0's records, and a sharded job resumes from its checkpoint bit for bit."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rla_ablate.ray_local import init_local_ray
from rla_ablate.train import metric_series, read_jsonl, run_job
from rla_ablate.train.checkpoint import list_checkpoints, load_checkpoint

from test_train_loop import tiny_job

pytestmark = pytest.mark.slow

# 4 steps of 512 tokens: one micro batch per worker and step with 2 workers, two in a single process.
SHORT = dict(tokens=2048, eval_every_tokens=1024, checkpoint_every_tokens=512, keep_checkpoints=4)


class Recorder:
    """A MetricLogger that keeps what it is given."""

    def __init__(self):
        self.metrics, self.events, self.closed = [], [], []

    def log(self, metrics, step):
        self.metrics.append((step, dict(metrics)))

    def event(self, name, step, detail):
        self.events.append((name, step))

    def close(self, status, reason=None):
        self.closed.append((status, reason))


@pytest.fixture(scope="module")
def ray_session():
    import ray

    if ray.is_initialized():
        yield
        return
    init_local_ray(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    result = run_job(tiny_job(**SHORT), out)
    assert result.status == "finished", result.error
    return out, result


def _final_model(out):
    return load_checkpoint(list_checkpoints(out)[-1][1])["model"]


def _assert_matches(out, ref_out, result, ref_result):
    got, ref = (metric_series(read_jsonl(d / "metrics.jsonl"), "train/loss") for d in (out, ref_out))
    assert [s for s, _ in got] == [s for s, _ in ref] == [512, 1024, 1536, 2048]
    # Same samples, same global mean; only the order of float sums differs.
    assert [v for _, v in got] == pytest.approx([v for _, v in ref], rel=1e-5)
    assert result.metrics["eval/val/loss"] == pytest.approx(ref_result.metrics["eval/val/loss"], rel=1e-5)
    params, ref_params = _final_model(out), _final_model(ref_out)
    assert params.keys() == ref_params.keys()
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=1e-4, atol=1e-6, msg=name)


def test_ddp_two_workers_match_one_process(ray_session, single, tmp_path):
    recorder = Recorder()
    result = run_job(tiny_job(num_workers=2, **SHORT), tmp_path, recorder)
    assert (result.status, result.tokens_done) == ("finished", 2048), result.error
    _assert_matches(tmp_path, single[0], result, single[1])
    # The caller's logger saw what rank 0 wrote, then the final status.
    assert [s for s, m in recorder.metrics if "train/loss" in m] == [512, 1024, 1536, 2048]
    assert ("start", 0) in recorder.events and recorder.closed == [("finished", None)]
    start = read_jsonl(tmp_path / "metrics.jsonl")[0]
    assert start["detail"]["world_size"] == 2 and start["detail"]["micro_batches_per_step"] == 1


def test_fsdp_matches_and_resumes_from_a_sharded_checkpoint(ray_session, single, tmp_path):
    job = tiny_job(num_workers=2, fsdp=True, **SHORT)
    first = run_job(job, tmp_path)
    assert first.status == "finished", first.error
    _assert_matches(tmp_path, single[0], first, single[1])
    reference = {k: v.clone() for k, v in _final_model(tmp_path).items()}
    losses = metric_series(read_jsonl(tmp_path / "metrics.jsonl"), "train/loss")
    # As if the job had died after step 2: drop the newer checkpoints and run again.
    for tokens, path in list_checkpoints(tmp_path):
        if tokens > 1024:
            path.unlink()
    recorder = Recorder()
    again = run_job(job, tmp_path, recorder)
    assert (again.status, again.tokens_done) == ("finished", 2048), again.error
    # The caller hears only what the resumed attempt wrote.
    assert [s for s, m in recorder.metrics if "train/loss" in m] == [1536, 2048]
    assert ("resumed", 1024) in recorder.events and recorder.closed == [("finished", None)]
    assert metric_series(read_jsonl(tmp_path / "metrics.jsonl"), "train/loss") == losses
    for name, tensor in _final_model(tmp_path).items():
        assert torch.equal(tensor, reference[name]), name


def test_ddp_with_document_resets_matches_one_process(ray_session, tmp_path):
    # Short documents (one per file), so that most rows hold boundaries and the packed path runs on every worker.
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(60):
        (docs / f"{i:03d}.txt").write_text(" ".join(f"word{(i * 7 + j) % 23}" for j in range(2 + i % 6)))
    job = tiny_job(reset_state_at_documents=True, **SHORT).model_dump()
    job["data"] = {"kind": "text", "path": str(docs)}
    job["eval"] = [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 1024}]
    from rla_ablate.data import make_train_stream

    cfg = type(tiny_job()).model_validate(job)
    assert next(make_train_stream(cfg.data, 64, 4, 0, documents=True)).doc_starts[:, 1:].sum() >= 4
    one = run_job(cfg, tmp_path / "one")
    job["train"]["num_workers"] = 2
    two = run_job(type(tiny_job()).model_validate(job), tmp_path / "two")
    assert one.status == two.status == "finished", (one.error, two.error)
    _assert_matches(tmp_path / "two", tmp_path / "one", two, one)


LOOPBACK_CHECK = """
import psutil
from rla_ablate.ray_local import init_local_ray
init_local_ray(num_cpus=1, include_dashboard=False, log_to_driver=False)
services = [p for p in psutil.Process().children(recursive=True) if p.name() in ("gcs_server", "raylet")]
assert services, "no Ray services among the driver's children"
for proc in services:
    for conn in proc.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN:
            assert conn.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1"), (proc.name(), conn.laddr)
print("loopback only:", len(services), "services")
"""


def test_local_ray_listens_on_loopback_only():
    # A fresh process: the Ray instance other tests share may have been started before this check ran.
    proc = subprocess.run([sys.executable, "-c", LOOPBACK_CHECK], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loopback only: 2 services" in proc.stdout
