"""How a job attempt ends: `Status` (the states of a job), `Cause` (why it did not finish) and `JobOutcome`
(what an attempt returns: `run_job` in the training process, the sweep worker through Ray to the launch).

This module imports nothing heavy (no torch, no ray, no pydantic): the training loop, the sweep's state and
status, the launch and the tracking logger all use it, and `rla-sweep status` must stay instant.
"""

from __future__ import annotations

import traceback as _traceback
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


class _Plain(str, Enum):
    """A str-valued enum printed and formatted as its plain value on every Python version (3.12 changed the
    mixin's default)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Status(_Plain):
    """A job's state. str-valued: status.json, jobs' JSONL records and MLflow tags hold the plain strings."""

    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    DIVERGED = "diverged"
    CANCELLED = "cancelled"


# Not ended yet: queued, or running in some process.
ACTIVE = frozenset({Status.PENDING, Status.RUNNING})
# What an attempt can end in.
ENDED = frozenset({Status.FINISHED, Status.FAILED, Status.DIVERGED, Status.CANCELLED})
# Final states a relaunch does not rerun: a diverged job diverges again (same config, same seed).
TERMINAL = frozenset({Status.FINISHED, Status.DIVERGED})


class Cause(_Plain):
    """Why a job did not finish. A failed job has one of the first five; a cancelled one may be `pruned`."""

    CONFIG = "config"
    """UserError or a pydantic ValidationError: the configuration cannot run."""
    COMPILE = "compile"
    """A kernel that does not compile (Triton's CompilationError and friends, torch.compile's backend errors)."""
    OOM = "oom"
    """Out of GPU memory (torch.OutOfMemoryError, "CUDA out of memory")."""
    WORKER_DIED = "worker_died"
    """The Ray worker process died (segfault, the OOM killer, a lost node); nothing came back from it."""
    CHECKPOINT = "checkpoint"
    """Every checkpoint of the job is unreadable (rla_ablate.errors.CheckpointError): a resume cannot load one."""
    OTHER = "other"
    """Any other exception."""
    PRUNED = "pruned"
    """A search trial stopped by Optuna's pruner (status cancelled): a result, not a failure."""

    @property
    def deterministic(self) -> bool:
        """The same failure on every attempt: retrying (or resuming) without a change cannot help."""
        return self in (Cause.CONFIG, Cause.COMPILE, Cause.CHECKPOINT)


# Class names of compile failures, matched by name so that classification works without triton installed
# (triton.compiler.errors, triton.runtime.errors, torch._dynamo.exc).
COMPILE_ERRORS = frozenset({"CompilationError", "CompileTimeAssertionFailure", "UnsupportedLanguageConstruct",
                            "PTXASError", "BackendCompilerFailed"})
# Triton's "out of resource: shared memory" is a launch configuration the GPU cannot run: the same every time.
TRITON_ONLY_COMPILE_ERRORS = frozenset({"OutOfResources"})
# Ray's ways of saying the worker process is gone (ray.exceptions); its OutOfMemoryError is the host's memory
# monitor killing the worker, not a GPU allocation failure.
RAY_WORKER_DEATHS = frozenset({"WorkerCrashedError", "ActorDiedError", "NodeDiedError", "LocalRayletDiedError",
                               "OwnerDiedError", "OutOfMemoryError", "RayActorError", "ObjectLostError"})
# An error line longer than this is cut (the traceback keeps everything).
MAX_ERROR_LINE = 1000


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception, then what it was raised from or while handling, without loops."""
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not s for s in seen):
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _names(exc: BaseException) -> list[tuple[str, str]]:
    return [(c.__module__ or "", c.__name__) for c in type(exc).__mro__]


def _cause_of_one(exc: BaseException) -> Cause | None:
    from rla_ablate.errors import CheckpointError, UserError

    names = _names(exc)
    if isinstance(exc, CheckpointError):
        return Cause.CHECKPOINT
    if isinstance(exc, UserError) or any(n == "ValidationError" and m.startswith("pydantic") for m, n in names):
        return Cause.CONFIG
    if any(n in COMPILE_ERRORS or (n in TRITON_ONLY_COMPILE_ERRORS and m.startswith("triton")) for m, n in names):
        return Cause.COMPILE
    if any(m.startswith("ray") and n in RAY_WORKER_DEATHS for m, n in names):
        return Cause.WORKER_DIED
    # torch.OutOfMemoryError from the caching allocator; a kernel launch or cuBLAS that finds no memory raises
    # torch.AcceleratorError "CUDA error: out of memory" (cudaErrorMemoryAllocation) instead.
    text = str(exc)
    if (any(n == "OutOfMemoryError" and m.startswith("torch") for m, n in names)
            or any(s in text for s in ("CUDA out of memory", "CUDA error: out of memory", "cudaErrorMemoryAllocation"))):
        return Cause.OOM
    return None


def classify(exc: BaseException) -> Cause:
    """The cause of a failure raised as `exc`: the first exception of its chain (the one raised, then what it was
    raised from) that names a known cause decides; `other` when none does."""
    for e in _chain(exc):
        cause = _cause_of_one(e)
        if cause is not None:
            return cause
    return Cause.OTHER


def error_line(exc: BaseException) -> str:
    """"Type: message" on one line, as a traceback's last line says it."""
    typ = type(exc)
    module = typ.__module__ or ""
    # Builtin and our own types by their name; others with their module (torch.OutOfMemoryError, triton....).
    short = module in ("builtins", "__main__") or module.split(".")[0] == "rla_ablate"
    name = typ.__qualname__ if short else f"{module}.{typ.__qualname__}"
    message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    line = f"{name}: {message}" if message else name
    return line if len(line) <= MAX_ERROR_LINE else line[:MAX_ERROR_LINE - 3] + "..."


def last_line(text: str | None) -> str:
    """The error line of a traceback text (its last non-empty line); the text itself when it is one line."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


@dataclass
class JobOutcome:
    """What one attempt of a job returns; failures are values, not exceptions. Picklable (Ray returns it from
    the worker) and JSON-friendly through `to_dict` / `from_dict`."""

    status: Status
    """finished | diverged | failed | cancelled."""
    tokens_done: int = 0
    """Training tokens seen when the attempt stopped."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The last value of every metric logged (final eval included)."""
    error: str | None = None
    """One line: "RuntimeError: ..." for a failure, "diverged at N tokens", "cancelled at N tokens", ..."""
    traceback: str | None = None
    """The full traceback of a failure (None when there was no exception)."""
    cause: Cause | None = None
    """Why a failed (or pruned) job did not finish; None for finished, diverged and stopped jobs."""
    out_dir: Path | None = None
    """Where metrics.jsonl and checkpoints are."""
    gpu_memory_gib: float | None = None
    """GPU memory the attempt had (device total x its GPU fraction); None without CUDA or when unknown."""
    timing: dict[str, Any] | None = None
    """Wall-clock marks of the sweep worker (epoch seconds), for the scheduling-overhead benchmark."""

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        if self.cause is not None:
            self.cause = Cause(self.cause)
        self.tokens_done = int(self.tokens_done or 0)

    @classmethod
    def from_exception(cls, exc: BaseException, *, tokens_done: int = 0, metrics: dict[str, float] | None = None,
                       out_dir: Path | None = None, cause: Cause | None = None) -> "JobOutcome":
        """A failed attempt: the exception's line, its traceback, and its cause (classified unless given)."""
        tb = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(status=Status.FAILED, tokens_done=tokens_done, metrics=dict(metrics or {}), error=error_line(exc),
                   traceback=tb, cause=cause or classify(exc), out_dir=out_dir)

    @property
    def deterministic(self) -> bool:
        """A failure that repeats on every attempt (config, compile)."""
        return self.status == Status.FAILED and self.cause is not None and self.cause.deterministic

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "tokens_done": self.tokens_done, "metrics": dict(self.metrics),
                "error": self.error, "traceback": self.traceback,
                "cause": self.cause.value if self.cause is not None else None,
                "out_dir": str(self.out_dir) if self.out_dir else None, "gpu_memory_gib": self.gpu_memory_gib,
                "timing": self.timing}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobOutcome":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if known.get("out_dir"):
            known["out_dir"] = Path(known["out_dir"])
        return cls(**known)
