"""Job outcomes: statuses, failure causes and the retry decisions the launch takes from them (no Ray, no MLflow)."""

from __future__ import annotations

import json
import pickle
import zipfile
from types import SimpleNamespace

import pytest

from rla_ablate.errors import UserError
from rla_ablate.outcome import TERMINAL, Cause, JobOutcome, Status, classify, error_line


def raised(exc: BaseException) -> BaseException:
    """`exc` with a traceback, as an except clause sees it."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_status_is_its_string_everywhere():
    assert Status.FAILED == "failed" and str(Status.FAILED) == "failed" and f"{Status.FAILED:>7}" == " failed"
    assert json.dumps({"status": Status.DIVERGED}) == '{"status": "diverged"}'
    assert {"finished": 1}[Status.FINISHED] == 1
    assert [s.value for s in Status] == ["pending", "running", "finished", "failed", "diverged", "cancelled"]
    assert TERMINAL == {"finished", "diverged"}


def test_config_errors():
    from pydantic import BaseModel

    class Cfg(BaseModel):
        lr: float

    with pytest.raises(Exception) as info:
        Cfg(lr="fast")
    assert classify(info.value) == Cause.CONFIG
    assert classify(raised(UserError("bad", key="train.lr"))) == Cause.CONFIG


def _fake(module: str, name: str) -> type:
    """An exception class as another library defines it (no need to have that library installed)."""
    return type(name, (RuntimeError,), {"__module__": module})


@pytest.mark.parametrize("module,name", [
    ("triton.compiler.errors", "CompilationError"),
    ("triton.compiler.errors", "CompileTimeAssertionFailure"),
    ("triton.compiler.errors", "UnsupportedLanguageConstruct"),
    ("triton.runtime.errors", "OutOfResources"),
    ("triton.runtime.errors", "PTXASError"),
    ("torch._dynamo.exc", "BackendCompilerFailed"),
])
def test_compile_errors_by_name(module, name):
    assert classify(raised(_fake(module, name)("at 12:4: bad"))) == Cause.COMPILE


def test_compile_error_subclass_and_chain():
    base = _fake("triton.compiler.errors", "CompilationError")
    sub = type("MyKernelError", (base,), {"__module__": "mine"})
    assert classify(raised(sub("x"))) == Cause.COMPILE
    # Raised while handling a compile error: the compile error is what failed.
    try:
        try:
            raise base("kernel")
        except RuntimeError as inner:
            raise ValueError("wrapper") from inner
    except ValueError as outer:
        assert classify(outer) == Cause.COMPILE
    # OutOfResources outside triton is no compile error.
    assert classify(raised(_fake("somewhere", "OutOfResources")("x"))) == Cause.OTHER


def test_out_of_memory():
    import torch

    assert classify(raised(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))) == Cause.OOM
    assert classify(raised(torch.cuda.OutOfMemoryError("x"))) == Cause.OOM
    assert classify(raised(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))) == Cause.OOM
    # A kernel launch that finds no memory: torch.AcceleratorError (a packed neighbour grew past its estimate).
    launch = _fake("torch", "AcceleratorError")("CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'")
    assert classify(raised(launch)) == Cause.OOM
    assert classify(raised(_fake("torch", "AcceleratorError")("CUDA error: an illegal memory access"))) == Cause.OTHER
    # The host's memory monitor killing a Ray worker is the worker dying, not a GPU allocation.
    assert classify(raised(_fake("ray.exceptions", "OutOfMemoryError")("task killed"))) == Cause.WORKER_DIED


def test_worker_died_and_other():
    import ray.exceptions

    assert classify(raised(ray.exceptions.WorkerCrashedError())) == Cause.WORKER_DIED
    assert classify(raised(_fake("ray.exceptions", "NodeDiedError")("node"))) == Cause.WORKER_DIED
    assert classify(raised(RuntimeError("injected failure"))) == Cause.OTHER
    assert classify(raised(KeyError("x"))) == Cause.OTHER


def test_outcome_from_exception_names_the_exception_not_the_traceback():
    out = JobOutcome.from_exception(raised(RuntimeError("injected failure at 1024 tokens\n(second line)")),
                                    tokens_done=1024)
    assert out.status == Status.FAILED and out.cause == Cause.OTHER and out.tokens_done == 1024
    assert out.error == "RuntimeError: injected failure at 1024 tokens (second line)"
    assert out.traceback.startswith("Traceback (most recent call last):") and "raise exc" in out.traceback
    import torch

    assert error_line(torch.OutOfMemoryError("CUDA out of memory")) == "torch.OutOfMemoryError: CUDA out of memory"
    assert error_line(UserError("bad", key="k")) == "UserError: k: bad"
    assert JobOutcome.from_exception(raised(UserError("bad"))).deterministic


def test_outcome_survives_pickle_and_json():
    out = JobOutcome.from_exception(raised(RuntimeError("CUDA out of memory")), tokens_done=7, metrics={"a": 1.0})
    out.gpu_memory_gib = 35.2
    again = pickle.loads(pickle.dumps(out))
    assert again == out and again.cause is Cause.OOM and again.status is Status.FAILED
    data = json.loads(json.dumps(out.to_dict()))
    assert data["status"] == "failed" and data["cause"] == "oom"
    assert JobOutcome.from_dict(data) == out
    # What a multi-worker job's rank 0 wrote before these fields existed still reads.
    old = JobOutcome.from_dict({"status": "finished", "tokens_done": 5, "metrics": {}, "error": None, "out_dir": None})
    assert old.status is Status.FINISHED and old.cause is None


def test_job_status_reads_folders_written_before_causes(tmp_path):
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(tmp_path, "s")
    tb = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nRuntimeError: boom\n"
    (sdir.job_dir("a")).mkdir(parents=True)
    (sdir.job_dir("a") / "status.json").write_text(json.dumps({"status": "failed", "error": tb, "attempts": 1}))
    (sdir.job_dir("b")).mkdir(parents=True)
    (sdir.job_dir("b") / "status.json").write_text(json.dumps({"status": "cancelled",
                                                               "error": "pruned by Optuna (trial 3)"}))
    a, b = sdir.status("a"), sdir.status("b")
    assert (a.status, a.error, a.traceback) == (Status.FAILED, "RuntimeError: boom", tb)
    assert b.cause == Cause.PRUNED
    st = sdir.set_status("a", status="running", cause="oom")
    assert st.status is Status.RUNNING and st.cause is Cause.OOM
    assert json.loads((sdir.job_dir("a") / "status.json").read_text())["status"] == "running"


def _runner(tmp_path, num_gpus: float, retries: int = 2, estimate: float | None = None):
    """A launch runner without Ray: only what the retry decisions read."""
    from rla_ablate.sweep.launch import _Runner
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(tmp_path, "s")
    rec = {"job_id": "j1", "name": "job"}
    if estimate is not None:
        rec["mem_estimate_gib"] = estimate
    sdir.path.mkdir(parents=True, exist_ok=True)
    sdir.write_job_list([rec])
    runner = _Runner.__new__(_Runner)
    runner.sdir = sdir
    runner.sweep = SimpleNamespace(config=SimpleNamespace(resources=SimpleNamespace(retries=retries)))
    runner.task_options = {"j1": {"num_cpus": 1, "num_gpus": num_gpus}}
    runner.tries = {"j1": 1}
    runner.more_memory = {}
    runner.oom_reruns = {}
    runner.gpu_bytes = None
    return runner, SimpleNamespace(job_id="j1", name="job")


def oom(had: float | None = None) -> JobOutcome:
    out = JobOutcome.from_exception(raised(RuntimeError("CUDA out of memory. Tried to allocate 4.00 GiB")))
    out.gpu_memory_gib = had
    return out


def test_oom_on_a_gpu_fraction_reruns_with_twice_the_share_then_alone_on_a_gpu(tmp_path):
    from rla_ablate.sweep.calibration import allocator_cap
    from rla_ablate.sweep.packing import Placement

    gpu = 140 * 2**30
    runner, job = _runner(tmp_path, num_gpus=0.06, retries=0)
    runner.gpu_bytes = gpu
    placement = Placement(0.06, allocator_cap(0.06, gpu), 2.5)
    assert runner._allocator_cap(placement, runner.task_options["j1"]) == placement.cap
    # A share a little short of the peak: twice the share, still packed, its allocator capped at the new share.
    assert runner._retry(job, oom(3.5)) == "rerunning with more memory (num_gpus=0.12)"
    assert runner.more_memory == {"j1": {"num_gpus": 0.12}}
    runner.task_options["j1"] = {"num_cpus": 1, **runner.more_memory["j1"]}
    assert runner._allocator_cap(placement, runner.task_options["j1"]) == allocator_cap(0.12, gpu) > placement.cap
    # Past half a GPU, the whole GPU (no cap); with the whole GPU there is no more memory to give: reported.
    runner.tries["j1"] = 2
    runner.task_options["j1"] = {"num_cpus": 1, "num_gpus": 0.3}
    assert runner._retry_with_more_memory(job, oom(40.0)) == {"num_gpus": 1.0}
    runner.task_options["j1"] = {"num_cpus": 1, "num_gpus": 1.0}
    assert runner._allocator_cap(placement, runner.task_options["j1"]) is None
    runner.tries["j1"] = 3
    assert runner._retry_with_more_memory(job, oom(140.0)) is None
    assert runner._retry(job, oom(140.0)) is None
    # Out-of-memory reruns use up none of `resources.retries` (0 here): a flaky failure after them is not retried
    # because retries is 0, not because of them; with retries 1 it is.
    flaky = JobOutcome.from_exception(raised(RuntimeError("flaky")))
    runner.oom_reruns["j1"] = 2
    assert runner._retry(job, flaky) is None
    runner.sweep.config.resources.retries = 1
    assert runner._retry(job, flaky) == "retrying"


def test_oom_on_a_whole_gpu_or_cpu_is_reported_with_the_estimate(tmp_path):
    runner, job = _runner(tmp_path, num_gpus=1.0, estimate=180.5)
    assert runner._retry_with_more_memory(job, oom(139.8)) is None
    assert runner._retry(job, oom(139.8)) is None
    report = runner._oom_report(job, oom(139.8))
    assert report.startswith("out of memory: estimated 180.5 GiB, had 139.8 GiB (RuntimeError: CUDA out of memory")
    runner, job = _runner(tmp_path / "cpu", num_gpus=0.0)
    assert runner._retry_with_more_memory(job, oom()) is None
    assert runner._oom_report(job, oom()).startswith("out of memory: estimate unknown, had unknown")


def test_retry_rules_by_cause(tmp_path):
    runner, job = _runner(tmp_path, num_gpus=0.0, retries=1)
    for exc in (UserError("bad"), _fake("triton.compiler.errors", "CompilationError")("bad")):
        assert runner._retry(job, JobOutcome.from_exception(raised(exc))) is None
    other = JobOutcome.from_exception(raised(RuntimeError("flaky")))
    died = JobOutcome.from_exception(raised(RuntimeError("crash")), cause=Cause.WORKER_DIED)
    assert runner._retry(job, other) and runner._retry(job, died)
    runner.tries["j1"] = 2
    assert runner._retry(job, other) is None and runner._retry(job, died) is None


def test_resume_hint_only_when_a_resume_can_help():
    from rla_ablate.sweep.launch import FailedJob, LaunchSummary

    compile_ = FailedJob("a", "a" * 12, "CompilationError: x", Cause.COMPILE)
    config = FailedJob("b", "b" * 12, "UserError: y", Cause.CONFIG)
    flaky = FailedJob("c", "c" * 12, "RuntimeError: z", Cause.OTHER)
    assert not LaunchSummary("s", counts={"failed": 2}, failed=[compile_, config]).resume_helps
    assert LaunchSummary("s", counts={"failed": 2}, failed=[compile_, flaky]).resume_helps
    # A job stopped by Ctrl-C resumes; so does one left pending.
    assert LaunchSummary("s", counts={"failed": 1, "cancelled": 1}, failed=[compile_]).resume_helps
    assert not LaunchSummary("s", counts={"finished": 3}).resume_helps
    # A search stopped between trials: every trial it counts is done (one pruned), the ones not asked for yet are in
    # no count; the launch is not ok (exit 130) and a resume helps.
    stopped = LaunchSummary("s", counts={"finished": 4, "cancelled": 1}, pruned=1, interrupted=True,
                            study_counts={"finished": 4, "cancelled": 1})
    assert not stopped.ok and stopped.resume_helps
    # A grid whose interrupt came as its last job ended: stopped (exit 130), but nothing left to resume.
    late = LaunchSummary("s", counts={"finished": 4}, interrupted=True)
    assert not late.ok and not late.resume_helps
    assert LaunchSummary("s", counts={"finished": 4, "cancelled": 1}, pruned=1).ok


def test_gpu_jobs_run_in_a_fresh_process_each():
    from rla_ablate.sweep.worker import remote_for

    # Ray reuses a CPU task's worker process; a GPU job's process exits with it (its CUDA memory goes with it).
    assert remote_for(0.25) is remote_for(1.0) and remote_for(0.25) is not remote_for(0.0)
    assert remote_for(0.25)._default_options.get("max_calls") == 1
    assert remote_for(0.0)._default_options.get("max_calls") in (None, 0)



def test_status_says_whether_a_resume_continues_an_interrupted_job_or_starts_it_again(tmp_path):
    """A job left running by a launch that is gone: status names the checkpoint a resume continues from, or says it
    starts again (none written yet, or the sweep folder was copied without its checkpoints)."""
    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.status import sweep_status

    sdir = SweepDir(tmp_path, "s")
    sdir.path.mkdir(parents=True)
    sdir.write_job_list([{"job_id": "a", "name": "a/seed0"}, {"job_id": "b", "name": "b/seed0"}])
    for job in ("a", "b"):
        sdir.set_status(job, status="running", attempts=1, tokens_done=2_400_000)
    (sdir.job_dir("b") / "checkpoints").mkdir()
    with zipfile.ZipFile(sdir.job_dir("b") / "checkpoints" / "ckpt-000000002500000.pt", "w") as z:
        z.writestr("data.pkl", b"")  # a torch checkpoint is a zip archive; a torn one is not, and is not said
    jobs = sweep_status(sdir)["jobs"]
    errors = {j["name"]: (j["status"], j["error"]) for j in jobs}
    assert errors["a/seed0"][0] == errors["b/seed0"][0] == "pending"
    # the tokens shown are those a resume keeps (the checkpoint's), not the last progress report's
    assert {j["name"]: j["tokens_done"] for j in jobs} == {"a/seed0": 0, "b/seed0": 2_500_000}
    assert errors["a/seed0"][1].endswith("`rla-sweep resume s --root " + str(tmp_path) + "` starts it again from its "
                                         "first step (no checkpoint)")
    assert errors["b/seed0"][1].endswith("resumes it from its checkpoint at 2,500,000 tokens")
