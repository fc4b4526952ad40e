"""What MLflow logging costs a training loop: `MLflowLogger.log()` on the training thread, and the slowdown of a
fixed-compute loop that logs a realistic metric dict every step (the background sender shares the CPU and GIL).

    python benchmarks/tracking_overhead.py [--steps 300] [--step-ms 20] [--layers 16]

Starts a real local `mlflow server` in a temporary folder. Prints a table; results go in docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from rla_ablate.tracking import MLflowLogger, TrackingServer


def metrics(step: int, layers: int) -> dict[str, float]:
    out = {"train/loss": 3.0 + 1.0 / (step + 1), "lr": 3e-4, "grad_norm": 0.7, "train/tokens_per_s": 1.2e5,
           "train/mfu": 0.41}
    for i in range(layers):
        out |= {f"layer_{i:02d}/attn_out_norm": 1.0 + i, f"layer_{i:02d}/S_norm": 2.0, f"layer_{i:02d}/R_norm": 0.5}
    return out


def workload(step_ms: float) -> tuple[torch.Tensor, int]:
    """A matmul chain sized to take about `step_ms` here (stands in for forward + backward); median of 5 tries."""
    a = torch.randn(256, 256) / 16
    t = []
    for _ in range(5):
        start = time.perf_counter()
        torch.tanh(a @ a)
        t.append(time.perf_counter() - start)
    return a, max(1, round(step_ms / 1000 / statistics.median(t)))


def loop(steps: int, a: torch.Tensor, reps: int, logger, layers: int, every: int = 1) -> list[float]:
    times = []
    for step in range(steps):
        t = time.perf_counter()
        for _ in range(reps):
            a = torch.tanh(a @ a)
        if logger is not None and step % every == 0:
            logger.log(metrics(step, layers), step=(step + 1) * 4096)
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per measurement")
    parser.add_argument("--step-ms", type=float, default=20.0, help="compute per step (ms)")
    parser.add_argument("--log-every", type=int, default=1, help="log every N steps")
    parser.add_argument("--layers", type=int, default=16, help="layers with attn_out_norm, S_norm, R_norm")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n_metrics = len(metrics(0, args.layers))
    with tempfile.TemporaryDirectory() as tmp, TrackingServer(tmp) as server:
        run_id = server.create_or_get_child_run("bench", "job", tags={"family": "rla", "seed": 0})
        logger = MLflowLogger(server.uri, run_id, system_metrics_interval_s=None)

        # log() alone: the cost the training thread pays per call.
        calls = []
        for step in range(2000):
            m = metrics(step, args.layers)
            t = time.perf_counter_ns()
            logger.log(m, step=10**9 + step)
            calls.append(time.perf_counter_ns() - t)
        t = time.perf_counter()
        assert logger.flush(timeout=600)
        drain_s = time.perf_counter() - t

        a, reps = workload(args.step_ms)
        loop(20, a, reps, None, args.layers)
        # Interleaved blocks, so drift in machine load hits both arms alike.
        base, logged = [], []
        for _ in range(6):
            base += loop(args.steps // 6, a, reps, None, args.layers)
            logged += loop(args.steps // 6, a, reps, logger, args.layers, args.log_every)
        t = time.perf_counter()
        logger.close("finished")
        close_s = time.perf_counter() - t

    base_ms = statistics.median(base) * 1000
    logged_ms = statistics.median(logged) * 1000
    print(f"metrics per log() call           {n_metrics}")
    print(f"log() on the training thread     median {statistics.median(calls) / 1000:.1f} us, "
          f"p99 {sorted(calls)[int(0.99 * len(calls))] / 1000:.1f} us")
    print(f"server ingest (2000 calls)       {2000 * n_metrics / drain_s:,.0f} metrics/s "
          f"({2000 * n_metrics} metrics in {drain_s:.1f} s)")
    print(f"step time, no logging            {base_ms:.2f} ms (median of {len(base)})")
    print(f"step time, logging every {args.log_every:<3d} step {logged_ms:.2f} ms (median of {len(logged)})")
    print(f"overhead                          {100 * (logged_ms - base_ms) / base_ms:+.2f} % "
          f"(mean: {100 * (statistics.mean(logged) - statistics.mean(base)) / statistics.mean(base):+.2f} %)")
    print(f"close() (final flush + status)   {close_s:.2f} s")


if __name__ == "__main__":
    main()
