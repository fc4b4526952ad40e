"""The loss effect of `train.reset_state_at_documents` on the CPU: tiny presets trained with it off and on.

    python benchmarks/doc_reset.py [--presets tiny-rla tiny-gdn tiny-transformer] [--seeds 0 1 2]
                                   [--arms off on rounding] [--root /tmp/doc-reset] [--threads 1] [--json]

Each job is `rla-sweep train PRESET --profile cpu --set train.cpu_threads=1 --set train.seed=S`, and the same
with `--set train.reset_state_at_documents=true` (262,144 tokens of the embedded corpus, seq_len 128, 4096-token
batches): the same seed, the same data order, the same initial weights. Jobs already finished under --root are
read, not trained again. Per job: the last eval loss as the job logged it (its own protocol: with resets when
on), the final model on the same validation windows evaluated both without and with resets, and the mean training
loss of the last 8 steps. The caption counts the document boundaries the training rows hold and the share of
training tokens that come after one in their row (the only tokens a reset changes).

The arm `rounding` is a control: the job of `on`, run through the packed path with offsets at the row starts
only (no EOS boundaries), which computes the `off` model up to floating-point rounding (rows run one at a time
instead of as a batch). Its difference from `off` is what rounding alone does to a run: the noise floor of the
paired on - off difference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import rla_ablate.data.stream as stream_module
import rla_ablate.models.model as model_module
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


@contextlib.contextmanager
def rows_only_packed():
    """The `rounding` arm: documents are whole rows, and row-start offsets still take the packed path."""
    starts, offsets = stream_module.document_starts, model_module._packed_offsets
    stream_module.document_starts = lambda inputs, eos_id: starts(inputs, None)

    def always_packed(cu, B, T):
        offsets(cu, B, T)  # the same checks
        return cu

    model_module._packed_offsets = always_packed
    try:
        yield
    finally:
        stream_module.document_starts, model_module._packed_offsets = starts, offsets


def measure(preset: str, seed: int, threads: int, arm: str, root: Path) -> dict:
    on = arm != "off"
    job = job_for(preset, seed, threads, on)
    out = root / f"{preset}-{arm}-s{seed}"
    start = time.perf_counter()
    with rows_only_packed() if arm == "rounding" else contextlib.nullcontext():
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
    return {"preset": preset, "seed": seed, "arm": arm, "eval_loss_logged": metric_series(records, "eval/val/loss")[-1][1],
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
    parser.add_argument("--arms", nargs="+", choices=["off", "on", "rounding"], default=["off", "on", "rounding"])
    parser.add_argument("--root", type=Path, default=Path("/tmp/doc-reset"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: bit-reproducible)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    rows = [measure(p, s, args.threads, arm, args.root) for p in args.presets for s in args.seeds for arm in args.arms]
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

    def pick(p: str, arm: str) -> list[dict]:
        return sorted((r for r in rows if r["preset"] == p and r["arm"] == arm), key=lambda r: r["seed"])

    def fmt(values: list[float]) -> str:
        spread = f" +- {statistics.stdev(values) / len(values) ** 0.5:.4f}" if len(values) > 1 else ""
        return f"{statistics.fmean(values):+.4f}{spread} ({', '.join(f'{v:+.4f}' for v in values)})"

    print("| preset | arm | eval loss (own protocol), mean over seeds | minus off: mean +- s.e. (per seed) "
          "| final model on val without / with resets | train loss, last 8 steps | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for p in args.presets:
        base = pick(p, "off")
        for arm in args.arms:
            got = pick(p, arm)
            diff = fmt([g["eval_loss_logged"] - b["eval_loss_logged"] for g, b in zip(got, base)]) \
                if arm != "off" and len(got) == len(base) else ""
            print(f"| {p} | {arm} | {statistics.fmean(r['eval_loss_logged'] for r in got):.4f} | {diff} "
                  f"| {statistics.fmean(r['eval_loss_plain'] for r in got):.4f} / "
                  f"{statistics.fmean(r['eval_loss_reset'] for r in got):.4f} "
                  f"| {statistics.fmean(r['train_loss_last8'] for r in got):.4f} "
                  f"| {statistics.fmean(r['tokens_per_s'] for r in got):,.0f} |")


if __name__ == "__main__":
    main()
