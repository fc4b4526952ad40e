"""How long a CPU sweep (`resources.gpus: 0`) takes on this machine, for `rla-sweep plan`.

There is no calibration table for CPUs: each distinct job shape (model, sequence length, micro batch, threads,
precision) is timed here, on the real model: one warm-up and one timed training micro step (forward, backward,
AdamW) on random tokens, and one evaluation forward. Shapes past the timing budget take the
median FLOP/s of the timed ones. A job's time is its training tokens at its training rate plus its evaluations
(every eval set's tokens, at each evaluation) at its forward rate, plus building its model (timed here) and opening
its data (the data dry run's time for one config); the sweep's is the jobs placed longest first on as many slots as
a local launch runs at once (this machine's cores over `resources.cpus`). The launch's start-up (Ray and MLflow,
5-20 s), checkpoints and logging come on top: the estimate says so.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

# Seconds of timing a plan spends at most; the shapes after that are priced from the timed ones' FLOP/s.
TIMING_BUDGET_S = 5.0


@dataclass(frozen=True)
class CpuSpeed:
    """Tokens/s of one job shape on this CPU: training (micro steps with AdamW) and evaluation (forward only)."""

    train: float
    eval: float
    timed: bool
    """Timed here; otherwise priced from the timed shapes' FLOP/s."""
    build_s: float = 0.0
    """Seconds to build the model (each job does, at its start); an untimed shape's is the timed ones' median."""


def _threads(job: Any, cpus: float) -> int:
    """The threads a job's torch uses: train.cpu_threads, else the CPUs it asks Ray for (the worker's setting)."""
    return int(job.train.cpu_threads or max(1, int(cpus)))


def shape_key(job: Any, cpus: float) -> str:
    train = job.train
    return json.dumps([job.model.model_dump(mode="json"), train.seq_len, train.micro_batch_size,
                       _threads(job, cpus), train.precision], sort_keys=True)


def _time_shape(job: Any, threads: int) -> CpuSpeed:
    import torch

    from rla_ablate.models import build_model

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        model = build_model(job.model)
        build_s = time.perf_counter() - t0
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        mbs, seq = job.train.micro_batch_size, job.train.seq_len
        ids = torch.randint(0, job.model.vocab_size, (mbs, seq))
        bf16 = job.train.precision == "bf16"

        def step() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(ids, labels=ids) / (mbs * seq)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()  # warm-up: first-call costs (allocations, kernel choices)
        t0 = time.perf_counter()
        step()
        train = mbs * seq / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model(ids)
        evaluation = mbs * seq / (time.perf_counter() - t0)
        return CpuSpeed(train, evaluation, True, build_s)
    finally:
        torch.set_num_threads(previous)


def eval_tokens(job: Any) -> int:
    """Tokens the job's evaluations score in all: each eval set's tokens (text) or examples times its length
    (mqar, niah), at every evaluation (every `eval_every_steps`, and the last step)."""
    train = job.train
    per_eval = 0
    for ev in job.eval:
        data = ev.data
        if getattr(data, "kind", None) in ("mqar", "niah"):
            per_eval += ev.examples * int(getattr(data, "seq_len", None) or train.seq_len)
        else:
            per_eval += math.ceil(ev.tokens / train.seq_len) * train.seq_len
    return per_eval * math.ceil(train.total_steps / train.eval_every_steps)


def estimate(jobs: list[Any], cpus: float, data_s: float = 0.0, repeat: int = 1,
             budget_s: float = TIMING_BUDGET_S) -> dict[str, Any]:
    """The plan's CPU estimate: {"seconds": the sweep's time with `jobs_at_once` jobs at a time (None, with
    "failed", when no shape's step ran here), "job_seconds": its
    sum over jobs, "setup_seconds": the part of that sum each job spends building its model and opening its data
    (`data_s`: the data dry run's time for one config, what a job spends opening its data), "jobs_at_once",
    "shapes", "timed_shapes", "timing_s"}; the launch's own start-up comes on top. `cpus`: resources.cpus (a local
    launch runs this machine's cores over it at once); `repeat`: how many times each job runs (a search's trials)."""
    from rla_ablate.models.accounting import flops_per_token

    keys = [shape_key(job, cpus) for job in jobs]
    shapes: dict[str, Any] = {}
    for key, job in zip(keys, jobs):
        shapes.setdefault(key, job)
    speeds: dict[str, CpuSpeed] = {}
    started = time.perf_counter()
    failed = ""
    for key, job in shapes.items():
        if time.perf_counter() - started > budget_s:
            break
        try:
            speeds[key] = _time_shape(job, _threads(job, cpus))
        except Exception as exc:  # a shape that does not run here (a kernel backend without CUDA): the launch says why
            failed = failed or f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
    timing_s = time.perf_counter() - started
    if not speeds:
        return {"seconds": None, "failed": failed, "timing_s": round(timing_s, 2)}
    # the shapes not timed: at the timed ones' median FLOP/s (training and evaluation apart)
    rates = [(speeds[k].train * flops_per_token(shapes[k].model, shapes[k].train.seq_len),
              speeds[k].eval * flops_per_token(shapes[k].model, shapes[k].train.seq_len)) for k in speeds]
    train_flops = statistics.median(r[0] for r in rates)
    eval_flops = statistics.median(r[1] for r in rates)
    build_s = statistics.median(s.build_s for s in speeds.values())  # of the timed shapes: a model build
    for key, job in shapes.items():
        if key not in speeds:
            f = flops_per_token(job.model, job.train.seq_len)
            speeds[key] = CpuSpeed(train_flops / f, eval_flops / f, False, build_s)
    times, setup = [], 0.0
    for key, job in zip(keys, jobs):
        s = speeds[key]
        setup += (s.build_s + data_s) * repeat
        times += [s.build_s + data_s + job.train.total_tokens / s.train + eval_tokens(job) / s.eval] * repeat
    at_once = max(1, int((os.cpu_count() or 1) // max(cpus, 1e-9)))
    slots = [0.0] * min(at_once, len(times) or 1)
    for t in sorted(times, reverse=True):  # longest first, each on the slot that frees first
        slots[slots.index(min(slots))] += t
    return {"seconds": max(slots), "job_seconds": sum(times), "setup_seconds": setup, "jobs_at_once": len(slots),
            "shapes": len(shapes), "timed_shapes": sum(s.timed for s in speeds.values()), "failed": failed,
            "timing_s": round(timing_s, 2)}
