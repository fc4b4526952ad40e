"""How much of a GPU each job asks Ray for, decided before anything is submitted.

`resources.gpus: auto` gives each job the share of one GPU its estimated peak memory needs
(rla_ablate.sweep.calibration, plus `resources.memory_margin` and the process's CUDA context), so Ray's fractional
GPUs pack as many jobs on a device as their memory allows; an explicit fraction is checked against the same
estimate and refused at launch when its share of the GPU cannot hold the job. Ray does not limit GPU memory, so
each worker also caps its own allocator at its share (`torch.cuda.set_per_process_memory_fraction`): a job whose
estimate was too low fails alone with an out-of-memory error instead of taking its neighbours down with it.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from rla_ablate.errors import UserError
from rla_ablate.sweep.calibration import GiB, allocator_cap, estimate_memory, gpu_share


@dataclass(frozen=True)
class Placement:
    """What one job asks Ray for and what its worker caps its allocator at."""

    gpus: float
    """Ray's num_gpus for the job's task (0: CPU)."""
    cap: float | None
    """The allocator's fraction of the device (None: no cap, the job has whole GPUs or none)."""
    estimate_gib: float
    """The job's estimated peak GPU memory."""


def gpu_identity() -> tuple[str, int] | None:
    """(name, memory in bytes) of this machine's first GPU, read from nvidia-smi (the driver process stays off the
    GPU: asking torch would create a CUDA context in it); None without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        name, mib = out.strip().splitlines()[0].rsplit(",", 1)
        return name.strip(), int(float(mib)) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def gpu_memory_bytes() -> int | None:
    """Memory of this machine's first GPU (nvidia-smi), or None."""
    found = gpu_identity()
    return found[1] if found else None


def probe_cluster_gpu_memory(ray: Any, timeout_s: float = 60.0) -> int | None:
    """Memory of one GPU of a joined cluster: a tiny task on a GPU node runs nvidia-smi there."""
    task = ray.remote(num_gpus=0.01, num_cpus=0)(gpu_memory_bytes)
    ref = task.remote()
    ready, _ = ray.wait([ref], timeout=timeout_s)
    if not ready:
        ray.cancel(ref, force=True)
        return None
    return ray.get(ready[0])


def place(sweep: Any, gpu_bytes: int | None) -> dict[str, Placement]:
    """job_id -> Placement for every job of the sweep; a job that cannot fit is a UserError at the resources line."""
    res = sweep.config.resources
    line = sweep.source.line(("resources", "gpus")) or sweep.source.line(("resources",))
    out: dict[str, Placement] = {}
    for job in sweep.jobs:
        est = estimate_memory(job.job)
        multi = job.job.train.num_workers > 1
        if res.auto:
            if gpu_bytes is None:
                out[job.job_id] = Placement(0.0, None, est.gib)
                continue
            share = gpu_share(est, gpu_bytes, res.memory_margin)
            if share > 1.0:
                raise UserError(
                    f"job {job.name} needs an estimated {est.gib:.1f} GiB of GPU memory (+{res.memory_margin:.0%} "
                    f"margin) but a GPU has {gpu_bytes / GiB:.0f} GiB; lower train.micro_batch_size (gradients "
                    "accumulate to the same batch_tokens) or train on several GPUs with train.num_workers and "
                    "train.fsdp", file=sweep.source.file, line=line, key="resources.gpus")
            gpus = 1.0 if multi else share
            out[job.job_id] = Placement(gpus, None if gpus >= 1 else allocator_cap(share, gpu_bytes), est.gib)
            continue
        gpus = float(res.gpus)
        cap = None
        if gpu_bytes is not None and 0 < gpus < 1 and not multi:
            need = gpu_share(est, gpu_bytes, res.memory_margin)
            if need > gpus + 1e-9:
                raise UserError(
                    f"resources.gpus {gpus:g} gives each job {gpus * gpu_bytes / GiB:.1f} GiB of a "
                    f"{gpu_bytes / GiB:.0f} GiB GPU, but job {job.name} needs an estimated {est.gib:.1f} GiB "
                    f"(+{res.memory_margin:.0%} margin and the CUDA context: a share of {need:.2f}); use "
                    f"gpus: {min(1.0, need):.2f} or more, or gpus: auto to pack jobs by their estimates",
                    file=sweep.source.file, line=line, key="resources.gpus")
            cap = allocator_cap(gpus, gpu_bytes)
        out[job.job_id] = Placement(gpus, cap, est.gib)
    return out


def jobs_per_gpu(placements: dict[str, Placement]) -> float:
    """How many of these jobs one GPU holds at once on average (for the plan's summary)."""
    shares = [p.gpus for p in placements.values() if 0 < p.gpus < 1]
    return len(shares) / sum(shares) if shares else 1.0
