"""What a packed training process does about the local memory of spilling kernels (rla_ablate.train.local_memory):
the tuning gate that lets one job per GPU at a time through its autotuning steps (a real flock, real processes, the
real training loop on the CPU), and the release of the driver's stack limit (a fake driver here; the real one in
tests/test_train_gpu.py)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from rla_ablate.train import read_jsonl, run_job
from rla_ablate.train import local_memory as lm
from tests.test_train_loop import tiny_job

CPU = torch.device("cpu")


def test_one_holder_at_a_time_and_a_stop_ends_the_wait(tmp_path):
    first, second = lm.TuningGate(CPU, directory=tmp_path), lm.TuningGate(CPU, directory=tmp_path)
    assert first.path == second.path and first.enter() and first.held
    polls = []
    waiting = lm.TuningGate(CPU, lambda: polls.append(1) or len(polls) >= 3, directory=tmp_path)
    assert waiting.enter() is False and not waiting.held and len(polls) == 3
    entered = threading.Event()
    threading.Thread(target=lambda: second.enter() and entered.set(), daemon=True).start()
    assert not entered.wait(0.6)  # still held by the first
    first.leave()
    assert entered.wait(5) and second.held and second.waited_s >= 0.5
    second.leave()


def test_a_dead_holder_frees_the_gate(tmp_path):
    script = ("import sys, time, torch\nfrom rla_ablate.train.local_memory import TuningGate\n"
              f"g = TuningGate(torch.device('cpu'), directory={str(tmp_path)!r})\nassert g.enter()\n"
              "print('held', flush=True)\ntime.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        stop_after = time.monotonic() + 0.6
        assert not lm.TuningGate(CPU, lambda: time.monotonic() > stop_after, directory=tmp_path).enter()
        holder.kill()
        holder.wait(10)
        gate = lm.TuningGate(CPU, directory=tmp_path)
        assert gate.enter()  # the kernel dropped the dead process's lock
        gate.leave()
    finally:
        holder.kill()


@pytest.fixture
def gates(tmp_path, monkeypatch):
    """The gates' directory under this test's tmp_path (RLA_SWEEP_GATES_DIR, which worker processes inherit)."""
    monkeypatch.setenv(lm.GATES_ENV, str(tmp_path / "rla-sweep-gpu-gates"))
    return tmp_path / "rla-sweep-gpu-gates"


def test_the_gates_lie_in_one_folder_whatever_a_jobs_tmpdir(monkeypatch, tmp_path):
    """Two jobs of one GPU under schedulers that give each its own TMPDIR still see one gate."""
    monkeypatch.delenv(lm.GATES_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "job-a"))
    a = lm.gates_dir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "job-b"))
    assert lm.gates_dir() == a == Path("/tmp/rla-sweep-gpu-gates")
    monkeypatch.setenv(lm.GATES_ENV, str(tmp_path / "elsewhere"))
    assert lm.TuningGate(CPU).path.parent == tmp_path / "elsewhere"


def leave_once_logged(holder: "lm.TuningGate", log, marker: str) -> None:
    """In a thread: once the job's metrics.jsonl holds `marker` (the job is at the gate, or about to be), wait 1.2 s
    and let the holder leave the gate."""
    def leave():
        while not (log.exists() and marker in log.read_text()):
            time.sleep(0.05)
        time.sleep(1.2)
        holder.leave()

    threading.Thread(target=leave, daemon=True).start()


def test_a_packed_job_waits_at_the_gate_and_stops_there_without_a_step(gates, tmp_path):
    holder = lm.TuningGate(CPU)
    assert holder.enter() and holder.path.parent == gates
    polls = []
    result = run_job(tiny_job(tokens=2048), tmp_path / "job", shares_gpu=True,
                     should_stop=lambda: polls.append(1) or len(polls) > 4)
    holder.leave()
    assert result.status == "cancelled" and result.tokens_done == 0, result
    records = read_jsonl(tmp_path / "job" / "metrics.jsonl")
    assert not [r for r in records if r["type"] == "metrics"]


def test_a_packed_job_trains_as_an_unpacked_one_and_leaves_the_gate_free(gates, tmp_path):
    holder = lm.TuningGate(CPU)
    assert holder.enter()
    log = tmp_path / "packed" / "metrics.jsonl"

    # its start event comes just before its first step, which waits at the gate
    leave_once_logged(holder, log, '"start"')
    packed = run_job(tiny_job(tokens=4096), tmp_path / "packed", shares_gpu=True)
    alone = run_job(tiny_job(tokens=4096), tmp_path / "alone")
    assert packed.status == alone.status == "finished"
    numbers = lambda result: {k: v for k, v in result.metrics.items() if k == "train/loss" or k.startswith("eval/")}  # noqa: E731
    assert numbers(packed) == numbers(alone) and "eval/val/loss" in numbers(packed)
    details = [r["detail"] for r in read_jsonl(tmp_path / "packed" / "metrics.jsonl") if r["type"] == "event"]
    gate = [d for d in details if "tuning_gate" in d or "tuning_gate_wait_s" in d]
    # said while it waits (a sweep's launch shows it), then how long it waited
    assert [sorted(d) for d in gate] == [["tuning_gate"], ["tuning_gate_wait_s"]], gate
    assert gate[0]["tuning_gate"].startswith("waiting") and gate[1]["tuning_gate_wait_s"] >= 1.0, gate
    free = lm.TuningGate(CPU, lambda: True)
    assert free.enter()  # nothing holds it after the job
    free.leave()


class FakeDriver:
    """cuCtxGetLimit / cuCtxSetLimit over one stack limit, as libcuda's."""

    def __init__(self, stack: int):
        self.stack, self.sets = stack, []

    def cuCtxGetLimit(self, ref, limit):
        assert limit == lm.CU_LIMIT_STACK_SIZE
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_size_t)).contents.value = self.stack
        return 0

    def cuCtxSetLimit(self, limit, value):
        self.sets.append(value.value)
        self.stack = value.value
        return 0


def test_release_sets_the_stack_back_only_when_a_launch_grew_it(monkeypatch):
    driver = FakeDriver(1024)
    monkeypatch.setattr(lm, "_driver", lambda: driver)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    memory = lm.LocalMemory(torch.device("cuda"))
    assert memory.baseline == 1024
    assert memory.release() is None and driver.sets == []  # nothing grew: one query, no set
    driver.stack = 19_456
    assert memory.release() == (19_456, 1024) and driver.sets == [1024]
    assert lm.LocalMemory(CPU).release() is None  # no CUDA: nothing to do


def test_without_a_driver_nothing_is_released(monkeypatch):
    monkeypatch.setattr(lm, "_driver", lambda: None)
    memory = lm.LocalMemory(torch.device("cuda"))
    assert memory.baseline is None and memory.release() is None


def test_a_sweep_worker_with_a_gpu_share_takes_the_gate(gates, tmp_path):
    """`worker.execute` with an allocator cap (a packed job's share) passes the gate; without one, it never waits."""
    from rla_ablate.sweep.worker import execute

    holder = lm.TuningGate(CPU)
    assert holder.enter()
    log = tmp_path / "packed" / "metrics.jsonl"

    leave_once_logged(holder, log, '"start"')
    packed = execute(tiny_job(tokens=2048), str(tmp_path / "packed"), "packed", None, None, None, cpus=1,
                     allocator_cap=0.5)
    assert packed.status == "finished", packed.error
    waits = [r for r in read_jsonl(log) if r["type"] == "event" and "tuning_gate_wait_s" in r.get("detail", {})]
    assert len(waits) == 1
    assert holder.enter()  # held again: a job without a share does not wait for it
    alone = execute(tiny_job(tokens=2048), str(tmp_path / "alone"), "alone", None, None, None, cpus=1)
    holder.leave()
    assert alone.status == "finished", alone.error


def test_a_cuda_job_says_once_when_the_release_is_unavailable(monkeypatch, tmp_path):
    """Without a readable stack limit on a CUDA device the loop logs it once (packing counts on the release)."""
    from rla_ablate.train.loop import Trainer
    from rla_ablate.train.parallel import WorkerContext

    events = []
    trainer = Trainer(tiny_job(), tmp_path, None, WorkerContext(), None)
    trainer.device, trainer.graphs = torch.device("cuda"), None
    monkeypatch.setattr(lm, "_driver", lambda: None)  # libcuda.so.1 cannot answer
    trainer.local_memory = lm.LocalMemory(torch.device("cuda"))
    trainer.logger = type("L", (), {"event": lambda self, *a: events.append(a)})()
    for step in (1, 2, 3):
        trainer._release_local_memory(step)
    assert len(events) == 1 and "unavailable" in events[0][2]["local_memory_released"]


def test_an_evaluation_within_the_warm_up_keeps_the_gate_to_its_end(gates, tmp_path, monkeypatch):
    """Evaluating every step: the first evaluation comes at step 1, and the gate stays held through the warm-up
    (the steps that compile, autotune and capture) rather than opening after that evaluation."""
    from rla_ablate.train.graphs import WARMUP_STEPS
    from rla_ablate.train.loop import Trainer

    order = []
    step, leave = Trainer.train_step, lm.TuningGate.leave
    monkeypatch.setattr(Trainer, "train_step", lambda self: order.append("step") or step(self))
    monkeypatch.setattr(lm.TuningGate, "leave", lambda self: (order.append("leave") if self.held else None, leave(self)))
    result = run_job(tiny_job(tokens=3072, eval_every_tokens=512), tmp_path / "job", shares_gpu=True)
    assert result.status == "finished", result.error
    assert order.index("leave") == WARMUP_STEPS + 1 and order.count("leave") == 1, order


def test_a_wait_at_the_gate_is_said_to_the_launch_and_not_kept_in_the_jobs_status(tmp_path):
    """SweepLogger turns the loop's waiting event into a note for the launch's output only (keep=False): the wait
    passes, a status notice would outlive it. Unit test with a recording stand-in for the Ray monitor."""
    from rla_ablate.sweep.worker import Monitor, SweepLogger

    notes = []

    class Remote:
        def __init__(self, fn):
            self.remote = fn

    class Recorder:
        note = Remote(lambda job_id, text, keep=True: notes.append((job_id, text, keep)))

    log = SweepLogger(None, Recorder(), "job1", tmp_path)
    log.event("info", 0, {"tuning_gate": "waiting: another job on this GPU is in its first steps"})
    log.event("info", 0, {"tuning_gate_wait_s": 3.2})
    log.event("info", 0, {"local_memory_released": {"from": 2048, "to": 1024}})
    assert len(notes) == 1 and notes[0][0] == "job1" and notes[0][2] is False, notes
    assert "tuning gate" in notes[0][1], notes
    # the monitor hands both kinds on with their flag (the launch keeps only the first in the job's status)
    monitor = Monitor.__ray_actor_class__()  # the actor's own class, outside Ray
    monitor.note("a", "unreadable checkpoint skipped")
    monitor.note("b", "waits for its GPU's tuning gate", False)
    assert monitor.snapshot()[3] == [("a", "unreadable checkpoint skipped", True),
                                     ("b", "waits for its GPU's tuning gate", False)]


HOOK_SCRIPT = r'''
import json, os, sys, time
from pathlib import Path
gates, flags, device = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # Triton's own autotuner, its kernels run by the interpreter on the CPU
import torch, triton, triton.language as tl
from rla_ablate.train import local_memory as lm

def bench(fn, quantiles=None, **kwargs):  # the autotuner's timer on the CPU, a stand-in for CUDA events
    fn()
    return [1.0, 1.0, 1.0]

timer = dict(do_bench=bench) if device == "cpu" else {}  # on a GPU, Triton's own

@triton.autotune(configs=[triton.Config({"B": 16}), triton.Config({"B": 32})], key=["n"], **timer)
@triton.jit
def double(x, y, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(y + i, tl.load(x + i, mask=i < n) * 2, mask=i < n)

def call(n):
    x = torch.arange(float(n), device=device)
    y = torch.empty(n, device=device)
    double[lambda meta: (triton.cdiv(n, meta["B"]),)](x, y, n)
    assert torch.equal(y, 2 * x)

gate = lm.TuningGate(torch.device(device), directory=gates)
said = []
assert lm.gate_autotuning(gate, on_wait=lambda: (said.append(1), (flags / "waiting").touch()))
t = time.monotonic()
call(64)                      # a new key: timing its candidates enters the gate, which the test holds
first, held = time.monotonic() - t, gate.held
gate.leave()
(flags / "tuned").touch()
while not (flags / "held-again").exists():
    time.sleep(0.05)
call(64)                      # its key tuned: no candidate is timed, the gate (held again) is not asked for
held_cached = gate.held
lm.gate_autotuning(None)
call(128)                     # a new key with no gate set: tuned without one
print(json.dumps(dict(first=first, held=held, said=len(said), waited=gate.waited_s, held_cached=held_cached,
                      held_unhooked=gate.held)))
'''


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def test_tritons_autotuner_enters_the_gate_only_when_it_times_candidates(gates, tmp_path, device):
    """The hook on the real Triton autotuner (its interpreter on the CPU; on a GPU, its own timer and a fresh Triton
    cache): timing a new key's candidates waits for the gate and keeps it; a key already tuned runs while another
    process holds the gate; without a gate set, nothing waits. A hang here (the test's timeout) would mean a tuned
    kernel asked for the gate."""
    flags = tmp_path / "flags"
    flags.mkdir()
    dev = torch.device(device)
    holder = lm.TuningGate(dev if device == "cpu" else torch.device("cuda", torch.cuda.current_device()),
                           directory=gates)
    assert holder.enter()
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))  # no autotune result to read
    script = tmp_path / "hook_script.py"  # a file: Triton compiles a @jit function from its source lines
    script.write_text(HOOK_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(gates), str(flags), device], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_for(name: str) -> None:
        deadline = time.monotonic() + 120
        while not (flags / name).exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, name
            time.sleep(0.05)

    try:
        wait_for("waiting")
        time.sleep(1.0)
        holder.leave()
        wait_for("tuned")
        assert holder.enter()
        (flags / "held-again").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        holder.leave()
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert got["said"] == 1 and got["held"] and got["first"] >= 1.0 and got["waited"] >= 1.0, got
    assert not got["held_cached"] and not got["held_unhooked"], got


def test_gated_where_it_autotunes_a_packed_job_trains_past_a_held_gate_and_waits_only_to_tune(gates, tmp_path,
                                                                                              monkeypatch):
    """With the autotuner hooked (a GPU's mode, forced here on the CPU), a packed job does not wait for its first
    steps: it takes the gate only when its autotuner times candidates (here its second step calls what the hooked
    autotuner calls), waits there for the other holder, and leaves the gate after that step; it trains to the
    losses of an unpacked run, and its process has no gate set afterwards."""
    from rla_ablate.train import loop

    monkeypatch.setattr(lm, "gates_autotuning", lambda device, gate, on_wait=None: lm.gate_autotuning(gate, on_wait))
    real_step = loop.Trainer.train_step
    steps = []

    def step_that_autotunes_second(self):
        steps.append(self.step)
        if len(steps) == 2:
            lm.before_autotune()
        return real_step(self)

    holder = lm.TuningGate(CPU)
    assert holder.enter()
    log = tmp_path / "packed" / "metrics.jsonl"

    left_after = []  # the steps begun when the job's gate was left while held
    real_leave = lm.TuningGate.leave

    def leave(gate):
        if gate.held and gate is not holder:
            left_after.append(len(steps))
        real_leave(gate)

    leave_once_logged(holder, log, '"tuning_gate"')
    monkeypatch.setattr(loop.Trainer, "train_step", step_that_autotunes_second)
    monkeypatch.setattr(lm.TuningGate, "leave", leave)
    packed = run_job(tiny_job(tokens=4096), tmp_path / "packed", shares_gpu=True)
    assert left_after == [2], left_after  # right after the step that tuned, not at the job's end
    monkeypatch.setattr(loop.Trainer, "train_step", real_step)
    alone = run_job(tiny_job(tokens=4096), tmp_path / "alone")
    assert packed.status == alone.status == "finished"
    numbers = lambda result: {k: v for k, v in result.metrics.items() if k == "train/loss" or k.startswith("eval/")}  # noqa: E731
    assert numbers(packed) == numbers(alone)
    details = [r["detail"] for r in read_jsonl(log) if r["type"] == "event"]
    said = [next(iter(d)) for d in details if {"first_step_s", "tuning_gate", "tuning_gate_wait_s"} & set(d)]
    # its first step ran while the other process held the gate; the second waited
    assert said == ["backend", "tuning_gate", "tuning_gate_wait_s"], details
    assert [d for d in details if "tuning_gate_wait_s" in d][0]["tuning_gate_wait_s"] >= 1.0
    assert lm._ACTIVE is None
    free = lm.TuningGate(CPU, lambda: True)
    assert free.enter()  # left after the step that tuned
    free.leave()


def test_a_job_that_waited_to_tune_reads_what_the_holder_wrote_to_disk(gates, monkeypatch):
    """Triton looks a key's timings up on disk before timing (`check_disk_cache`). Gated: the first look takes no
    gate; on a miss the job waits, then looks again, and reads the timings the job of its shape wrote meanwhile
    instead of timing every candidate again. A stand-in for Triton's lookup, a dict as its disk."""
    disk, timed = {}, []

    def lookup(tuner, key, configs, bench_fn):  # check_disk_cache's contract: True when read from disk
        if key in disk:
            return True
        bench_fn()
        disk[key] = "timed here"
        return False

    gate = lm.TuningGate(CPU)
    monkeypatch.setattr(lm, "_ACTIVE", gate)
    holder = lm.TuningGate(CPU)
    assert holder.enter()
    disk["tuned"] = "shipped"
    assert lm.gated_disk_lookup(lookup, None, "tuned", [], lambda: timed.append("tuned")) and not gate.held

    def write_and_leave():
        time.sleep(0.6)
        disk["shape"] = "timed by the holder"
        holder.leave()

    threading.Thread(target=write_and_leave, daemon=True).start()
    assert lm.gated_disk_lookup(lookup, None, "shape", [], lambda: timed.append("shape"))  # read, after waiting
    assert gate.held and gate.waited_s >= 0.5 and timed == []
    gate.leave()
    assert not lm.gated_disk_lookup(lookup, None, "new", [], lambda: timed.append("new"))  # a true miss: timed
    assert timed == ["new"] and disk["new"] == "timed here" and gate.held
    gate.leave()
