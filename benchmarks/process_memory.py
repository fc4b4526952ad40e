"""GPU memory a training process holds outside PyTorch's caching allocator (what packing calls its context).

    python benchmarks/process_memory.py proxy-lm-rla [--graphs true|false] [--tokens 1048576] [--limit 110]
                                        [--stacks 15]
    python benchmarks/process_memory.py --phases [--families rla rdn] [--stacks 15]

Runs `rla-sweep train MODEL` (the proxy study's code-LM shape: 32 x 512 bytes a micro batch, batches of 65,536
tokens, bf16, fused glue) in this process on an otherwise idle GPU, and samples every 50 ms the device's used bytes
(`torch.cuda.mem_get_info`, less what nvidia-smi saw in use before this process created its CUDA context) against
the allocator's reserved bytes. Their difference is what the process holds beyond its allocator: the CUDA context,
loaded kernels and the local memory the driver keeps for kernels that spill registers, until the training loop
gives it back after its first steps (the lines `gave back the local memory`; rla_ablate/train/local_memory.py).
`--limit` seconds end the run early; the summary prints every 10 s, so a run cut by a node's time limit still
reports. Packing adds the tuned process's figure to every job's estimate (`CONTEXT_BYTES`) and keeps the growth
while kernels autotune free once per GPU (`TUNING_BYTES`, rla_ablate/sweep/calibration.py).

`--phases` instead runs, in one process, a bf16 matmul and then one eager training micro step of each proxy code-LM
family (Transformer, sGLA, GDN, RLA, RDN; `--families` to choose), and prints after each how much the memory
outside the allocator grew and the driver's per-thread stack size (`cuCtxGetLimit`): local memory is kept for
every thread slot of the device at the largest stack a launched kernel needed, so a growth that follows the stack
size names the family whose kernels spill.

`--stacks N` then lists the N compiled Triton kernels in $TRITON_CACHE_DIR with the largest per-thread stack
(`cuobjdump -res-usage` of each cubin): the driver reserves local memory for the whole device (every thread slot
of every SM) at the largest stack a launched kernel needs, and keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
import threading
import time

import torch

GiB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="a model preset (proxy-lm-rla) or YAML path")
    parser.add_argument("--graphs", choices=["true", "false"], default="true", help="train.cuda_graphs")
    parser.add_argument("--tokens", type=int, default=1_048_576)
    parser.add_argument("--limit", type=float, default=0, help="stop after this many seconds (0: run to the end)")
    parser.add_argument("--phases", action="store_true", help="attribute the growth to each family's first step")
    parser.add_argument("--families", nargs="+", default=["transformer", "sgla", "gdn", "rla", "rdn"])
    parser.add_argument("--stacks", type=int, default=0, metavar="N",
                        help="then list the N Triton kernels of $TRITON_CACHE_DIR with the largest stack")
    args = parser.parse_args()
    if not args.phases and not args.model:
        parser.error("name a model, or pass --phases")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/process_memory.py needs a CUDA GPU")
    from rla_ablate.cli import main as cli

    if args.phases:
        phases(args.families)
        if args.stacks:
            print_stacks(args.stacks)
        return
    before, total = baseline()
    samples: list[tuple[float, int, int]] = []  # (seconds, device bytes used by this process, reserved bytes)
    done = threading.Event()
    t0 = time.time()

    def summary(final: bool) -> str:
        t, used, reserved = samples[-1]
        most = max(u - r for _, u, r in samples)
        if final:
            return json.dumps({"model": args.model, "graphs": args.graphs, "seconds": round(t, 1),
                               "device_used_gib": round(max(u for _, u, _ in samples) / GiB, 3),
                               "reserved_gib": round(max(r for _, _, r in samples) / GiB, 3),
                               "outside_allocator_gib": round(most / GiB, 3)})
        return (f"t={t:.0f}s used {used / GiB:.2f} GiB, reserved {reserved / GiB:.2f}, outside the allocator "
                f"{(used - reserved) / GiB:.2f} (most so far {most / GiB:.2f})")

    def sample() -> None:
        shown = 0.0
        while not done.is_set():
            free, _ = torch.cuda.mem_get_info()
            samples.append((time.time() - t0, total - free - before, torch.cuda.memory_reserved()))
            if samples[-1][0] - shown >= 10:
                shown = samples[-1][0]
                print(summary(False), flush=True)
            time.sleep(0.05)

    def time_is_up(*_) -> None:
        raise KeyboardInterrupt

    if args.limit:  # as Ctrl-C: the training command stops at the step it is in
        signal.signal(signal.SIGALRM, time_is_up)
        signal.setitimer(signal.ITIMER_REAL, args.limit)
    threading.Thread(target=sample, daemon=True).start()
    out = tempfile.mkdtemp(prefix="process-memory-")
    code = 0
    try:
        code = cli(["train", args.model, "--out", out, "--profile", "cpu", "--set", "train.device=cuda",
             "--set", f"train.cuda_graphs={args.graphs}", "--set", f"train.tokens={args.tokens}",
             "--set", "train.seq_len=512", "--set", "train.micro_batch_size=32", "--set", "train.batch_tokens=65536",
             "--set", "train.precision=bf16", "--set", f"train.eval_every_tokens={args.tokens}",
             "--set", f"train.checkpoint_every_tokens={args.tokens}", "--set", "train.log_every_tokens=262144"])
    except KeyboardInterrupt:  # the time limit: what was sampled so far is the result
        pass
    signal.setitimer(signal.ITIMER_REAL, 0)
    done.set()
    time.sleep(0.1)
    print(summary(True), flush=True)
    print_releases(os.path.join(out, "metrics.jsonl"))
    shutil.rmtree(out, ignore_errors=True)
    if args.stacks:
        print_stacks(args.stacks)
    if code not in (0, 130):  # refused or failed (130: stopped by the time limit)
        raise SystemExit(f"benchmarks/process_memory.py: the training command exited with {code}: the figures above "
                         "are not a training process's")


def print_releases(metrics: str) -> None:
    """The training run's gives-back of spilled-stack memory (rla_ablate.train.local_memory), from its event log."""
    from rla_ablate.train import read_jsonl

    if not os.path.exists(metrics):
        return
    for r in read_jsonl(metrics):
        released = r.get("detail", {}).get("local_memory_released") if r["type"] == "event" else None
        if isinstance(released, str):
            print(f"  the local memory could not be given back: {released}", flush=True)
        elif released:
            print(f"  gave back the local memory at {r['step']:,} tokens: stack {released['stack_bytes_per_thread']:,} -> "
                  f"{released['now']:,} B a thread", flush=True)


def baseline() -> tuple[int, int]:
    """(bytes in use on the GPU before this process, the GPU's total bytes), then creates the CUDA context: what
    the process uses is the device's used bytes less the first."""
    used_before = used_before_cuda()  # other processes (none on an idle GPU), before this one's context
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()  # the context exists from here on
    return (used_before if used_before is not None else total - free), total


def used_before_cuda() -> int | None:
    """Bytes in use on the GPU this process will use, read with nvidia-smi before the process creates its CUDA
    context (any CUDA call, `mem_get_info` included, creates it): the baseline that counts the context as the
    process's. None where nvidia-smi cannot say; the baseline is then taken after the context, which it leaves
    out (say 0.5 GiB)."""
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run(["nvidia-smi", "-i", visible, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
        return int(float(out.stdout.split()[0]) * 2**20) if out.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def phases(families: list[str]) -> None:
    """One process: a matmul, then one eager bf16 micro step (32 x 512 bytes) of each proxy code-LM family; after
    each, the memory outside the allocator and the driver's stack size."""
    from rla_ablate.models import build_model, load_preset
    from rla_ablate.train.local_memory import stack_limit

    device = torch.device("cuda")
    before, total = baseline()

    def outside() -> int:
        torch.cuda.synchronize()
        free, _ = torch.cuda.mem_get_info()
        return total - free - before - torch.cuda.memory_reserved()

    last = 0

    def report(what: str, seconds: float) -> None:
        nonlocal last
        now = outside()
        stack = stack_limit(device)
        print(json.dumps({"phase": what, "seconds": round(seconds, 1), "outside_allocator_gib": round(now / GiB, 3),
                          "grew_gib": round((now - last) / GiB, 3), "stack_bytes_per_thread": stack}), flush=True)
        last = now

    t = time.time()
    torch.zeros(1, device=device)
    report("context", time.time() - t)
    t = time.time()
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16, requires_grad=True)
    (a @ a).float().sum().backward()
    report("bf16 matmul", time.time() - t)
    del a
    for family in families:
        t = time.time()
        cfg = load_preset(f"proxy-lm-{family}")
        torch.manual_seed(0)
        with device:
            model = build_model(cfg)
        ids = torch.randint(0, cfg.vocab_size, (32, 513), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids[:, :-1], labels=ids[:, 1:])
        loss.backward()
        report(f"proxy-lm-{family} step", time.time() - t)
        del model, loss
        torch.cuda.empty_cache()


def print_stacks(n: int) -> None:
    for stack, regs, name in largest_stacks(n):
        print(f"  stack {stack:>7,} B/thread  {regs:>3} registers  {name}")


def largest_stacks(n: int) -> list[tuple[int, int, str]]:
    """(stack bytes a thread, registers, kernel) of the n compiled kernels in the Triton cache with the largest stack,
    by `cuobjdump -res-usage` (Triton's bundled copy) of each cubin."""
    import re
    import subprocess
    from pathlib import Path

    import triton

    cache = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    rows = []
    for cubin in cache.rglob("*.cubin"):
        text = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
        for name, regs, stack in re.findall(r"Function (\S+):\s+REG:(\d+) STACK:(\d+)", text):
            rows.append((int(stack), int(regs), name))
    return sorted(rows, reverse=True)[:n]


if __name__ == "__main__":
    main()
