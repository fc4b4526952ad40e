"""Job outcomes: statuses and failure causes (no Ray, no MLflow)."""

from __future__ import annotations

import json
import pickle

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


def test_outcome_round_trips():
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
