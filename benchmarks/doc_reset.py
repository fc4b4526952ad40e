"""The loss effect of `train.reset_state_at_documents` on the CPU: tiny presets trained with it off and on.

    python benchmarks/doc_reset.py [--presets tiny-rla tiny-gdn tiny-transformer] [--seeds 0 1 2]
                                   [--root /tmp/doc-reset] [--threads 1] [--json]

Each job is `rla-sweep train PRESET --profile cpu --set train.cpu_threads=1 --set train.seed=S`, and the same
with `--set train.reset_state_at_documents=true` (262,144 tokens of the embedded corpus, seq_len 128, 4096-token
batches): the same seed, the same data order, the same initial weights. Jobs already finished under --root are
read, not trained again. Per job: the last eval loss as the job logged it (its own protocol: with resets when
on), the final model on the same validation windows evaluated both without and with resets, and the mean training
loss of the last 8 steps. The caption counts the document boundaries the training rows hold and the share of
training tokens that come after one in their row (the only tokens a reset changes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from rla_ablate.commands.train import build_job
from rla_ablate.data import make_eval_batches, make_train_stream
from rla_ablate.models import build_model
from rla_ablate.train import metric_series, read_jsonl, run_job
from rla_ablate.train.checkpoint import load_latest

PRESETS = ("tiny-rla", "tiny-gdn", "tiny-transformer")


def job_for(preset: str, seed: int, threads: int, on: bool):
    sets = [f"train.cpu_threads={threads}", f"train.seed={seed}"]
    if on:
        sets.append("train.reset_state_at_documents=true")
    return build_job(preset, sets, None, "cpu")


@torch.no_grad()
def eval_loss(model, batches, resets: bool) -> float:
    nll, count = 0.0, 0
    for b in batches:
        logits = model(b.input_ids, cu_seqlens=b.cu_seqlens()) if resets else model(b.input_ids)
        nll += float(F.cross_entropy(logits.float().flatten(0, 1), b.labels.flatten(), reduction="sum"))
        count += b.labels.numel()
    return nll / count


def measure(preset: str, seed: int, threads: int, on: bool, root: Path) -> dict:
    job = job_for(preset, seed, threads, on)
    out = root / f"{preset}-{'on' if on else 'off'}-s{seed}"
    start = time.perf_counter()
    result = run_job(job, out)
    if result.status != "finished":
        raise RuntimeError(f"{out.name}: {result.status}: {result.error}")
    records = read_jsonl(out / "metrics.jsonl")
    train = [v for _, v in metric_series(records, "train/loss")]
    speeds = [v for _, v in metric_series(records, "train/tokens_per_s")]
    found = load_latest(out)
    assert found is not None
    model = build_model(job.model)
    model.load_state_dict(found[1]["model"])
    model.eval()
    batches = make_eval_batches(job.eval[0], job.train.seq_len, job.train.micro_batch_size, documents=True)
    return {"preset": preset, "seed": seed, "reset": on, "eval_loss_logged": metric_series(records, "eval/val/loss")[-1][1],
            "eval_loss_plain": eval_loss(model, batches, False), "eval_loss_reset": eval_loss(model, batches, True),
            "train_loss_last8": statistics.fmean(train[-8:]), "tokens_per_s": statistics.median(speeds[1:] or speeds),
            "seconds": time.perf_counter() - start}


def boundaries(threads: int, seed: int) -> dict:
    """Document boundaries inside the training rows of one job (the data, not the model, decides them)."""
    job = job_for(PRESETS[0], seed, threads, True)
    t = job.train
    stream = make_train_stream(job.data, t.seq_len, t.micro_batch_size, t.seed, documents=True)
    inside = after = total = 0
    for _ in range(t.total_tokens // (t.seq_len * t.micro_batch_size)):
        starts = next(stream).doc_starts.numpy()[:, 1:]
        first = np.argmax(starts, axis=1) + 1
        inside += int(starts.sum())
        after += int(((t.seq_len - first) * starts.any(axis=1)).sum())
        total += starts.shape[0] * t.seq_len
    return {"seed": seed, "boundaries": inside, "tokens_after_a_boundary": after, "tokens": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--root", type=Path, default=Path("/tmp/doc-reset"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: bit-reproducible)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    rows = [measure(p, s, args.threads, on, args.root) for p in args.presets for s in args.seeds for on in (False, True)]
    data = [boundaries(args.threads, s) for s in args.seeds]
    if args.json:
        for row in rows + data:
            print(json.dumps(row))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} thread(s), load average {load[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    for d in data:
        print(f"seed {d['seed']}: {d['boundaries']} document boundaries inside training rows; "
              f"{d['tokens_after_a_boundary']:,} of {d['tokens']:,} tokens "
              f"({100 * d['tokens_after_a_boundary'] / d['tokens']:.2f}%) follow one in their row")
    print("| preset | seeds | eval loss, off | eval loss, on | on - off | final model on val: off / on run, "
          "without resets | with resets | train loss (last 8 steps), off / on |")
    print("|---|---|---|---|---|---|---|---|")
    for p in args.presets:
        def mean(key: str, on: bool) -> float:
            return statistics.fmean(r[key] for r in rows if r["preset"] == p and r["reset"] == on)

        diffs = [r1["eval_loss_logged"] - r0["eval_loss_logged"]
                 for r0 in rows for r1 in rows if r0["preset"] == r1["preset"] == p and r0["seed"] == r1["seed"]
                 and not r0["reset"] and r1["reset"]]
        print(f"| {p} | {len(args.seeds)} | {mean('eval_loss_logged', False):.4f} | {mean('eval_loss_logged', True):.4f} "
              f"| {statistics.fmean(diffs):+.4f} (per seed {', '.join(f'{d:+.4f}' for d in diffs)}) "
              f"| {mean('eval_loss_plain', False):.4f} / {mean('eval_loss_plain', True):.4f} "
              f"| {mean('eval_loss_reset', False):.4f} / {mean('eval_loss_reset', True):.4f} "
              f"| {mean('train_loss_last8', False):.4f} / {mean('train_loss_last8', True):.4f} |")
    for p in args.presets:
        speed = {on: statistics.fmean(r["tokens_per_s"] for r in rows if r["preset"] == p and r["reset"] == on)
                 for on in (False, True)}
        print(f"{p}: training tokens/s off {speed[False]:,.0f}, on {speed[True]:,.0f}")


if __name__ == "__main__":
    main()
