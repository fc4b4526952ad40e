"""Training throughput of the CPU-tiny presets through the real job loop (data, forward, backward, AdamW).

    python benchmarks/train_cpu.py [--threads 1] [--tokens 65536] [--seq-len 128] [--repeats 1] [--json]

Each preset trains for `--tokens` tokens on the embedded corpus (batches of 4096 tokens, micro batches of
8 sequences); tokens/s is the median over the logged steps after the first (which pays one-time costs), read
from the job's metrics.jsonl, and the best of `--repeats` runs (as timeit does: on a shared machine the
slower runs measure the neighbours). Eval runs once, at the end, outside the timed steps. The caption shows
the load average before and after, so a reader can judge how quiet the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile

import torch
from rich.console import Console
from rich.table import Table

from rla_ablate.models import count_params, flops_per_token, load_preset
from rla_ablate.train import JobConfig, metric_series, read_jsonl, run_job

PRESETS = ("tiny-transformer", "tiny-sgla", "tiny-rla", "tiny-gdn", "tiny-rdn")


def measure(preset: str, tokens: int, seq_len: int, threads: int) -> dict:
    model = load_preset(preset).replace(vocab_size=257)
    job = JobConfig.model_validate({
        "model": model.model_dump(),
        "train": {"tokens": tokens, "seq_len": seq_len, "micro_batch_size": 8, "batch_tokens": 4096,
                  "lr": 3e-3, "min_lr": 3e-4, "cpu_threads": threads, "eval_every_tokens": tokens,
                  "checkpoint_every_tokens": tokens},
        "data": {"kind": "stdlib"},
        "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 4096}],
    })
    with tempfile.TemporaryDirectory() as out:
        result = run_job(job, out)
        if result.status != "finished":
            raise RuntimeError(f"{preset}: {result.status}: {result.error}")
        speeds = [v for _, v in metric_series(read_jsonl(os.path.join(out, "metrics.jsonl")), "train/tokens_per_s")]
    tokens_per_s = statistics.median(speeds[1:] or speeds)
    fpt = flops_per_token(model, seq_len)
    return {"preset": preset, "family": model.family, "params": count_params(model), "tokens_per_s": tokens_per_s,
            "flops_per_token": fpt, "gflops_per_s": fpt * tokens_per_s / 1e9,
            "final_train_loss": result.metrics["train/loss"], "eval_loss": result.metrics["eval/val/loss"]}


def best_of(preset: str, tokens: int, seq_len: int, threads: int, repeats: int) -> dict:
    runs = [measure(preset, tokens, seq_len, threads) for _ in range(repeats)]
    return max(runs, key=lambda r: r["tokens_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--tokens", type=int, default=65536, help="training tokens per preset (default 65536)")
    parser.add_argument("--seq-len", type=int, default=128, help="sequence length (default 128)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per preset; the fastest is reported")
    parser.add_argument("--presets", nargs="*", default=list(PRESETS), help="presets to measure")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = [best_of(p, args.tokens, args.seq_len, args.threads, args.repeats) for p in args.presets]
    load_after = os.getloadavg()[0]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"training on CPU ({platform.processor() or platform.machine()}, {args.threads} threads, "
                        f"torch {torch.__version__}), seq_len {args.seq_len}, 4096-token batches, best of "
                        f"{args.repeats}; load average {load_before:.1f} before, {load_after:.1f} after")
    for col in ("preset", "params", "tokens/s", "GFLOP/s", f"eval loss after {args.tokens:,}"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["preset"], f"{r['params']:,}", f"{r['tokens_per_s']:,.0f}", f"{r['gflops_per_s']:.2f}",
                      f"{r['eval_loss']:.4f}")
    Console().print(table)


if __name__ == "__main__":
    main()
