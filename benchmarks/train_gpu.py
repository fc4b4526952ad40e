"""Training throughput of whole models, one family after another in one harness: tokens/s and MFU.

    python benchmarks/train_gpu.py [--scale 1.5b] [--families rla rdn sgla gdn transformer]
                                   [--batch 4] [--seq-len 4096] [--steps 10] [--warmup 3] [--backend auto]
                                   [--json out.json] [--calibrate [TABLE]]

Each family builds the preset `<scale>-<family>` (models/), trains --warmup untimed then --steps timed AdamW steps
on random tokens (fp32 master weights, bf16 autocast, as the training job does on GPU) and reports tokens/s, MFU
(the model's analytic training FLOPs per token over the device's dense bf16 peak), peak memory and the op backend
that ran. A family that runs out of memory is reported as such. `--device cpu --scale tiny` checks the script.
`--calibrate` merges each measured row (model config, batch shape, tokens/s, peak memory, warm-up) into the
calibration table that `rla-sweep plan` and `resources.gpus: auto` read (rla_ablate/sweep/calibration/h200.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rla_ablate.models import build_model, load_preset
from rla_ablate.models.accounting import count_params, flops_per_token
from rla_ablate.train.loop import PEAK_BF16_FLOPS

CALIBRATION = Path(__file__).resolve().parents[1] / "rla_ablate" / "sweep" / "calibration" / "h200.json"


def say(line: str) -> None:
    # Progress on stderr: a fresh node compiles and autotunes for minutes inside the warm-up steps.
    print(line, file=sys.stderr, flush=True)


def device_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def measure(family: str, args, device: torch.device) -> dict:
    cfg = load_preset(f"{args.scale}-{family}")
    if family != "transformer" and args.backend != "auto":
        cfg = cfg.model_copy(update={"backend": args.backend})
    torch.manual_seed(0)
    t_build = time.perf_counter()
    with device:  # initialise on the device: a 1.5B model built on the CPU first takes longer than its timed steps
        model = build_model(cfg)
    say(f"{family}: built {count_params(cfg) / 1e6:.0f}M parameters in {time.perf_counter() - t_build:.1f} s")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=device.type == "cuda")
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step():
        with autocast:
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    t_warm = time.perf_counter()
    for i in range(args.warmup):
        float(step())
        say(f"{family}: warm-up step {i + 1}/{args.warmup} at {time.perf_counter() - t_warm:.1f} s")
    warmup_s = time.perf_counter() - t_warm
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    loss = float(loss)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    tok_s = args.batch * args.seq_len * args.steps / seconds
    peak = device_peak(device)
    return dict(family=family, preset=f"{args.scale}-{family}", model=cfg.model_dump(mode="json"),
                params=count_params(cfg), tokens_per_s=tok_s,
                mfu=flops_per_token(cfg, args.seq_len) * tok_s / peak if peak else None, loss=loss,
                backend=model.backend_used, warmup_s=warmup_s,
                peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="1.5b", help="preset scale: models/<scale>-<family>.yaml")
    parser.add_argument("--families", nargs="+", default=["rla", "rdn", "sgla", "gdn", "transformer"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--backend", default="auto", help="op backend of the linear families (auto, fla, triton)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None)
    parser.add_argument("--calibrate", nargs="?", const=str(CALIBRATION), default=None, metavar="TABLE",
                        help="merge the rows into this calibration table (default: the package's H200 table)")
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []
    for family in args.families:
        try:
            rows.append(measure(family, args, device))
        except torch.OutOfMemoryError:
            rows.append(dict(family=family, preset=f"{args.scale}-{family}", error="out of memory"))
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(json.dumps(rows[-1]), flush=True)
        if args.calibrate:
            # row by row: a run stopped at a time limit keeps what it measured
            calibrate(args.calibrate, rows[-1:], args, torch.cuda.get_device_name(device))
    base = {"rla": "sgla", "rdn": "gdn"}
    by_family = {r["family"]: r for r in rows}
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"\n{where} | batch {args.batch} x {args.seq_len} tokens | {args.steps} timed steps")
    print(f"{'preset':>18} {'params':>8} {'tokens/s':>10} {'MFU':>6} {'vs base':>8} {'backend':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['preset']:>18} {r['error']}")
            continue
        b = by_family.get(base.get(r["family"], ""), {})
        ratio = f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x" if "tokens_per_s" in b else ""
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        print(f"{r['preset']:>18} {r['params'] / 1e6:7.0f}M {r['tokens_per_s']:10.0f} {mfu:>6} {ratio:>8} "
              f"{str(r['backend']):>8}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=where, args=vars(args), results=rows), f, indent=1)


def calibrate(path: str, rows: list[dict], args, where: str) -> None:
    """Merge measured rows into the calibration table, replacing a row of the same preset, shape and backend."""
    import datetime

    import fla
    import triton

    table = json.loads(Path(path).read_text())
    if table.get("device") not in where:
        say(f"not calibrating: the table is for {table.get('device')}, this is {where}")
        return
    stamp = (f"{datetime.date.today()}, torch {torch.__version__}, triton {triton.__version__}, "
             f"FLA {getattr(fla, '__version__', '?')}")
    command = f"python3 benchmarks/train_gpu.py --scale {args.scale} --batch {args.batch} --seq-len {args.seq_len} " \
              f"--steps {args.steps} --warmup {args.warmup} --calibrate"
    for r in rows:
        if "error" in r:
            continue
        new = {"preset": r["preset"], "model": r["model"], "micro_batch_size": args.batch, "seq_len": args.seq_len,
               "tokens_per_s": round(r["tokens_per_s"]), "peak_gib": round(r["peak_mem_gib"], 2),
               "backend": r["backend"], "warmup_s": round(r["warmup_s"], 1), "measured": stamp, "command": command}
        key = (new["preset"], new["micro_batch_size"], new["seq_len"], new["backend"])
        table["rows"] = [x for x in table["rows"]
                         if (x["preset"], x["micro_batch_size"], x["seq_len"], x["backend"]) != key] + [new]
    Path(path).write_text(json.dumps(table, indent=1) + "\n")
    say(f"calibration: {len(rows)} rows merged into {path}")


if __name__ == "__main__":
    main()
