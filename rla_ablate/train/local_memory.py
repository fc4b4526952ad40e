"""The local memory the CUDA driver keeps for kernels that spill registers, given back once the kernels are tuned.

The driver sizes a context's local memory for every thread slot of the device (2,048 a streaming multiprocessor) at
the largest per-thread stack that any kernel it launched needed, and keeps it: its stack limit
(CU_LIMIT_STACK_SIZE) grows with each launch that needs more and never shrinks by itself. FLA's autotuner launches
every candidate configuration of a kernel once, and some candidates spill heavily, so a small training process
whose Triton cache lacked the autotune results kept about 5 GiB outside its allocator, against 0.7-0.8 GiB with
them (docs/RESULTS.md): memory that packing must reserve for every process on a shared GPU.

Setting the limit back to its starting value makes the driver give that memory back (it waits for the work already
queued). A later launch that needs a larger stack grows it again, as the first one did (the driver's documented
behaviour for every kernel launch), so an eager job may release at any point between steps: the training loop does
after each of its first steps and after every evaluation (new shapes autotune there too, a last partial batch
among them), and each call that finds nothing to give back costs one driver query. A graphed job releases only
after its first step, before the eager step that precedes its capture (`Trainer._release_local_memory`).

Packed jobs pass their autotuning one at a time per GPU (`TuningGate`), so that a GPU reserves that memory once for
all its jobs. On a GPU the gate is taken where the memory grows: Triton's autotuner enters it before it times a
kernel's candidate configurations (`gate_autotuning`), and the training loop gives the memory back and leaves the
gate after the step or evaluation in which that happened. A job whose autotune results are all in the Triton cache
never times a candidate and never waits. Where Triton's autotuner cannot be hooked, the loop gates every process's
first steps and first evaluation instead (where kernels compile and tune), as it does on the CPU.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import tempfile
import time
from pathlib import Path

import torch

CU_LIMIT_STACK_SIZE = 0


@functools.lru_cache(maxsize=1)
def _driver() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def stack_limit(device: torch.device) -> int | None:
    """The per-thread stack limit in bytes of `device`'s CUDA context (PyTorch's, the primary one); None without a
    CUDA driver."""
    lib = _driver()
    if lib is None:
        return None
    value = ctypes.c_size_t()
    with torch.cuda.device(device):  # makes the device's context the calling thread's current one
        return value.value if lib.cuCtxGetLimit(ctypes.byref(value), CU_LIMIT_STACK_SIZE) == 0 else None


class LocalMemory:
    """Gives a training process's spilled-stack memory back to the device (module docstring).

    `baseline` is the stack limit when the process starts training (the driver's default, 1,024 bytes, unless a
    kernel needed more before); `release()` sets the limit back to it when a launch grew it, and returns
    (limit before, limit after) in bytes a thread, or None when there was nothing to give back."""

    def __init__(self, device: torch.device):
        self.device = device
        self.baseline = stack_limit(device) if device.type == "cuda" else None
        self.said_unavailable = False  # the training loop says once when `unavailable`

    @property
    def unavailable(self) -> bool:
        """A CUDA device whose stack limit could not be read (no libcuda.so.1): nothing is ever given back."""
        return self.device.type == "cuda" and self.baseline is None

    def release(self) -> tuple[int, int] | None:
        if self.baseline is None:
            return None
        grown = stack_limit(self.device)
        if grown is None or grown <= self.baseline:
            return None
        lib = _driver()
        assert lib is not None
        with torch.cuda.device(self.device):
            if lib.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(self.baseline)) != 0:
                return None
        after = stack_limit(self.device)
        return grown, after if after is not None else self.baseline


GATES_ENV = "RLA_SWEEP_GATES_DIR"  # another folder for the gates (every process sharing the GPUs must name it)


def gates_dir() -> Path:
    """Where the GPUs' gates lie: $RLA_SWEEP_GATES_DIR, else /tmp/rla-sweep-gpu-gates. Not $TMPDIR: schedulers give
    each job its own (Slurm's per-job TMPDIR), and jobs of two sweeps on one GPU must see one gate. Without a
    writable /tmp, the temporary directory."""
    if os.environ.get(GATES_ENV):
        return Path(os.environ[GATES_ENV])
    shared = Path("/tmp")
    base = shared if shared.is_dir() and os.access(shared, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    return base / "rla-sweep-gpu-gates"


class TuningGate:
    """One packed job at a time per GPU through its autotuning: entered by Triton's hooked autotuner before it
    times candidates (`gate_autotuning`), or, where that hook is missing, through a process's first training steps
    and its first evaluation (new kernels, new shapes).

    Those are the steps in which a job may hold several GiB of spilled-stack memory (module docstring) until
    `LocalMemory.release` gives it back; a packed GPU reserves that room once for all its jobs
    (`rla_ablate.sweep.calibration.TUNING_BYTES`) rather than once per job, and this gate keeps that true. It also
    spares concurrent jobs of one shape from autotuning the same kernels side by side, timing candidates on a GPU
    the others are loading: the first tunes, the next ones read its results from the shared Triton cache.

    A flock on a file named by the GPU's UUID in `gates_dir()` (/tmp/rla-sweep-gpu-gates, a folder every user may
    write; the file opened read-only, which flock allows): every process on the machine that uses that GPU, of any
    sweep and any user, sees it, and the kernel drops it when a process dies. `enter` waits, polling
    `should_stop` unless told not to (a job stopped while waiting for its first steps starts nothing)."""

    POLL_S = 0.25
    SAY_AFTER_S = 1.0  # a wait this long is said (`enter`'s on_wait; the loop's events)

    def __init__(self, device: torch.device, should_stop=None, directory: str | os.PathLike | None = None):
        self.device, self.should_stop = device, should_stop
        base = Path(directory) if directory is not None else gates_dir()
        self.path = base / f"{_gpu_uuid(device)}.lock"
        self._fd: int | None = None
        self.waited_s = 0.0

    @property
    def held(self) -> bool:
        return self._fd is not None

    def enter(self, stoppable: bool = True, on_wait=None) -> bool:
        """Wait for the gate; True once held, False when `should_stop` said stop first (only if `stoppable`).
        `on_wait()` is called once if the wait lasts SAY_AFTER_S (another process holds it)."""
        if self._fd is not None:
            return True
        folder = self.path.parent
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            try:
                folder.chmod(0o1777)  # as /tmp: any user's jobs may add a GPU's file, none may remove another's
            except OSError:
                pass
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o644)
        started = time.monotonic()
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if on_wait is not None and time.monotonic() - started >= self.SAY_AFTER_S:
                        on_wait()
                        on_wait = None
                    if stoppable and self.should_stop is not None and self.should_stop():
                        os.close(fd)
                        return False
                    time.sleep(self.POLL_S)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.waited_s = time.monotonic() - started
        return True

    def leave(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


# The gate Triton's autotuner enters in this process (`gate_autotuning`), and what it calls when it must wait.
_ACTIVE: TuningGate | None = None
_ON_WAIT = None


def before_autotune() -> None:
    """What the hooked autotuner runs before timing a candidate configuration: enter the process's gate, if one is
    set, waiting without heeding a stop (the step it is in must end); the training loop leaves it after that step."""
    gate = _ACTIVE
    if gate is not None and not gate.held:
        gate.enter(stoppable=False, on_wait=_ON_WAIT)


_HOOKED = "rla_sweep_gated"  # the mark of the hooked Autotuner._bench


class _Missed(Exception):
    """Raised by the timing a first look at the disk cache hands Triton: the results were not there."""


def _missed() -> None:
    raise _Missed


def gated_disk_lookup(lookup, tuner, tuning_key, configs, bench_fn) -> bool:
    """Triton's `Autotuner.check_disk_cache` (`lookup`), gated: look for the key's timings on disk first, without
    the gate; on a miss, enter the gate and look again before timing, since the job of the same shape that held the
    gate may have written them while this one waited (it reads them instead of timing every candidate again)."""
    gate = _ACTIVE
    if gate is None or gate.held:
        return lookup(tuner, tuning_key, configs, bench_fn)
    try:
        return lookup(tuner, tuning_key, configs, _missed)
    except _Missed:
        pass
    before_autotune()
    return lookup(tuner, tuning_key, configs, bench_fn)


def gate_autotuning(gate: TuningGate | None, on_wait=None) -> bool:
    """Make Triton's autotuner enter `gate` in this process before it times candidate configurations (None: no
    gate any more). False when the autotuner cannot be hooked (Triton missing, or without `Autotuner._bench`, the
    method that times one candidate in Triton 3.x; FLA's CachedAutotuner inherits it). Its disk-cache lookup
    (`check_disk_cache`, where present) is gated as `gated_disk_lookup` says."""
    global _ACTIVE, _ON_WAIT
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return False
    bench = getattr(Autotuner, "_bench", None)
    if bench is None:
        return False
    if not getattr(bench, _HOOKED, False):
        @functools.wraps(bench)
        def gated_bench(self, *args, **kwargs):
            before_autotune()
            return bench(self, *args, **kwargs)

        setattr(gated_bench, _HOOKED, True)  # once per process, whoever asks again
        Autotuner._bench = gated_bench
        lookup = getattr(Autotuner, "check_disk_cache", None)
        if lookup is not None:
            Autotuner.check_disk_cache = functools.wraps(lookup)(
                lambda self, tuning_key, configs, bench_fn: gated_disk_lookup(lookup, self, tuning_key, configs,
                                                                              bench_fn))
    _ACTIVE, _ON_WAIT = gate, on_wait
    return True


def gates_autotuning(device: torch.device, gate: TuningGate, on_wait=None) -> bool:
    """Whether a packed job on `device` is gated where it autotunes (a CUDA device whose autotuner could be hooked)
    rather than through its first steps and evaluation."""
    return device.type == "cuda" and gate_autotuning(gate, on_wait)


def _gpu_uuid(device: torch.device) -> str:
    """The GPU's UUID (one name for it in every process, whatever CUDA_VISIBLE_DEVICES numbers it), else the
    device's type and index."""
    if device.type == "cuda":
        try:
            return str(torch.cuda.get_device_properties(device).uuid)
        except (AttributeError, RuntimeError, AssertionError):
            pass
    return f"{device.type}{device.index or 0}"
