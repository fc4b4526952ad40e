"""Chunked vs naive residual attention on the CPU: forward and forward+backward, side by side in one run.

    python benchmarks/ops_cpu.py [--threads 2] [--repeats 3]

Prints median milliseconds and the naive/chunk speed-up for a few shapes, RLA and RDN.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from rla_ablate.ops import residual_attention

SHAPES = [  # B, T, H, K=V
    (1, 256, 4, 32),
    (2, 512, 4, 64),
    (1, 2048, 4, 64),
]


def inputs(B, T, H, D, grad):
    x = lambda *s: torch.randn(*s, requires_grad=grad)  # noqa: E731
    q, v = x(B, T, H, D), x(B, T, H, D)
    k = F.normalize(torch.randn(B, T, H, D), dim=-1).requires_grad_(grad)
    g = F.logsigmoid(torch.randn(B, T, H) + 3).requires_grad_(grad)
    beta, gamma = torch.rand(B, T, H).requires_grad_(grad), torch.rand(B, T, H).requires_grad_(grad)
    return q, k, v, g, beta, gamma


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    table = Table(title=f"residual_attention on CPU, float32, {args.threads} threads (median ms)")
    for col in ("rule", "B x T x H x D", "pass", "naive", "chunk", "naive / chunk"):
        table.add_column(col, justify="right")
    for rule in ("additive", "delta"):
        for B, T, H, D in SHAPES:
            for mode in ("fwd", "fwd+bwd"):
                grad = mode == "fwd+bwd"
                args_ = inputs(B, T, H, D, grad)

                def step(backend):
                    o, (S, R) = residual_attention(*args_, rule=rule, backend=backend)
                    if grad:
                        (o.sum() + S.sum() + R.sum()).backward()

                ms = {b: timed(lambda b=b: step(b), args.repeats) for b in ("naive", "chunk")}
                table.add_row(rule, f"{B}x{T}x{H}x{D}", mode, f"{ms['naive']:.1f}", f"{ms['chunk']:.1f}",
                              f"{ms['naive'] / ms['chunk']:.1f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
