"""Training throughput of whole models, one family after another in one harness: tokens/s and MFU.

    python benchmarks/train_gpu.py [--scale 1.5b [100m ...]] [--families rla rdn sgla gdn transformer]
                                   [--batch B] [--seq-len T] [--steps 10] [--warmup 3] [--backend auto]
                                   [--glue auto [torch]] [--inputs shared [separate]] [--graph off [on]]
                                   [--profile [STEPS] [--top-ops N]] [--rla-split PROGRAMS:CHUNKS]
                                   [--rla-launch KERNEL:KEY=VALUE,... ...] [--rla-read-own] [--rdn-one-function]
                                   [--json out.json] [--calibrate [TABLE]]

Each family builds the preset `<scale>-<family>` (models/), trains --warmup untimed then --steps timed AdamW steps
on random tokens (fp32 master weights, bf16 autocast and one host read per step, as the training job does on
GPU) and reports tokens/s, MFU
(the model's analytic training FLOPs per token over the device's dense bf16 peak), peak memory and the op backend
that ran. A family that runs out of memory is reported as such. `--device cpu --scale tiny` checks the script.
Several scales run in one invocation, each at its batch shape (SHAPES; --batch / --seq-len override them all),
and a last table sets them side by side: RLA/sGLA, RDN/GDN, the linear families' MFU range and the
transformer's MFU per scale (`summary` in --json).
`--profile` then runs a few more steps under torch.profiler and splits a step's time: the wall time, the GPU's
busy time by kind of kernel (ours, FLA's, GEMMs, attention, PyTorch's elementwise and reductions, copies, the
optimizer) and the time the GPU waited for the host (launch overhead, syncs) — on the CPU, the ops' self time;
`--top-ops N` adds the N costliest PyTorch ops of each family with their input shapes and, on the GPU, its N
costliest kernels by name (where the Triton kernels' time shows). `--glue auto torch` runs
each family twice, with FLA's fused glue (in the blocks, and around the op of the linear mixers:
rla_ablate/models/fusion.py) and with the plain-torch glue, and gives the ratio. `--inputs shared separate` runs
the fused glue twice, the readers of each layer's input (a mixer's projections, the MLP's two) sharing one backward
(`fusion.SharedInput`, the fused glue's way) and as a linear each (rows "auto/separate"). `--graph off on` runs each family
also with each micro batch's forward and backward captured once in a CUDA graph and replayed, as a job with
`train.cuda_graphs: true` trains (the same class, rla_ablate/train/graphs.py; the clip and AdamW stay eager): the
host then launches one graph a micro batch instead of every kernel, which shows how much of a step is the host's (a
step the GPU waits for). The graphed run starts from the same weights and data as the eager one, so their losses
after every timed step must agree (`graph_vs_eager`: the largest relative difference of a step's loss or gradient
norm).
`--calibrate` merges each measured row (model config, batch shape, tokens/s, peak memory, warm-up) into the
calibration table that `rla-sweep plan` and `resources.gpus: auto` read (rla_ablate/sweep/calibration/h200.json).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

from rla_ablate.data.stream import Batch
from rla_ablate.models import build_model, fusion, load_preset
from rla_ablate.models.accounting import count_params, flops_per_token
from rla_ablate.sweep.calibration import row_glue
from rla_ablate.train.graphs import GraphedMicroStep, peak_memory_bytes
from rla_ablate.train.loop import PEAK_BF16_FLOPS

CALIBRATION = Path(__file__).resolve().parents[1] / "rla_ablate" / "sweep" / "calibration" / "h200.json"
# Each scale's batch shape (micro batch, sequence length): the presets' training shapes in docs/RESULTS.md and,
# for the proxies, sweeps/proxy-study.yaml's (there, one step of MQAR is one micro batch of 16 x 64 tokens).
SHAPES = {"tiny": (4, 128), "proxy-mqar": (16, 64), "proxy-lm": (32, 512), "100m": (16, 2048), "1.5b": (4, 4096)}
# Kernel (GPU) or op (CPU) name -> kind, first match wins; our own Triton kernels are recognised by name first.
KINDS = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("GEMM", re.compile(r"gemm|cutlass|cublas|nvjet|xmma|sm90_|sm80_|aten::(mm|addmm|bmm|matmul|linear)\b", re.I)),
    # FLA's fused glue (rla_ablate/models/fusion.py) apart from its mixer kernels
    ("FLA glue", re.compile(r"l2norm|causal_conv|layer_norm|swiglu|cross_entropy_(fwd|bwd)|logsumexp_fwd|"
                            r"elementwise_mul_kernel", re.I)),
    ("FLA", re.compile(r"chunk_|fused_recurrent|wy_|solve_tril|merge_16x16|kkt|recompute_w", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam|foreach", re.I)),
    ("copies, casts", re.compile(r"copy|aten::cat\b|CatArray|contiguous|clone|aten::to\b|fill_|zero_", re.I)),
    ("norms", re.compile(r"norm", re.I)),
    ("elementwise, reductions", re.compile(r"elementwise|vectorized|reduce|unrolled|index|scatter|gather|softmax|"
                                            r"nll|cross_entropy|aten::", re.I)),
)


def say(line: str) -> None:
    # Progress on stderr: a fresh node compiles and autotunes for minutes inside the warm-up steps.
    print(line, file=sys.stderr, flush=True)


def device_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def our_kernel_names() -> set[str]:
    """The names of rla_ablate's own Triton kernels (empty where Triton is not installed)."""
    try:
        import importlib

        from triton.runtime.jit import JITFunction
    except ImportError:
        return set()
    names = set()
    for module in ("common", "rla", "rdn", "glue"):
        mod = importlib.import_module(f"rla_ablate.ops.triton.{module}")
        names |= {name for name, obj in vars(mod).items() if isinstance(obj, JITFunction)}
    return names


def kind_of(name: str, ours: set[str]) -> str:
    if name in ours or any(name.startswith(n + "_") for n in ours):
        return "ours"
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def profile_steps(step, steps: int, device: torch.device, top: int = 0) -> dict:
    """ms per step: wall, GPU busy (CUDA) or ops' self time (CPU) by kind, and on CUDA the GPU's idle time.

    top > 0: also the `top` costliest PyTorch ops with their input shapes (`top_ops`), each with the GPU time of
    the kernels it launched itself (CUDA) or its self time (CPU): which tensor of which layer the time goes to; and
    on CUDA the `top` costliest kernels by name with their kind (`top_kernels`): Triton kernels (ours, FLA's) are
    no PyTorch op, so this is where their time shows.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=top > 0) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
        wall = (time.perf_counter() - t0) / steps * 1e3
    ours, by_kind = our_kernel_names(), {}
    averages = prof.key_averages()
    for avg in averages:
        if cuda and avg.device_type != DeviceType.CUDA:
            continue
        if not cuda and (avg.device_type != DeviceType.CPU or not avg.key.startswith("aten::")):
            continue
        us = avg.self_device_time_total if cuda else avg.self_cpu_time_total
        kind = kind_of(avg.key, ours)
        by_kind[kind] = by_kind.get(kind, 0.0) + us / 1e3 / steps
    busy = sum(by_kind.values())
    out = {"wall_ms": wall, "busy_ms": busy, "kinds_ms": dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))}
    if cuda:
        out["gpu_idle_ms"] = max(wall - busy, 0.0)
    if top > 0:
        out["top_ops"] = top_ops(prof, steps, cuda, top)
        if cuda:
            kernels = [{"kernel": avg.key[:120], "kind": kind_of(avg.key, ours), "calls": avg.count / steps,
                        "ms": avg.self_device_time_total / 1e3 / steps}
                       for avg in averages if avg.device_type == DeviceType.CUDA]
            out["top_kernels"] = sorted(kernels, key=lambda r: -r["ms"])[:top]
    return out


def top_ops(prof, steps: int, cuda: bool, top: int) -> list[dict]:
    """The `top` PyTorch ops (aten::, grouped by input shapes) by the time of what they ran themselves, per step."""
    from torch.autograd import DeviceType

    rows = []
    for avg in prof.key_averages(group_by_input_shape=True):
        if avg.device_type != DeviceType.CPU or not avg.key.startswith("aten::"):
            continue
        us = avg.self_device_time_total if cuda else avg.self_cpu_time_total
        if us > 0:
            rows.append({"op": avg.key, "shapes": str(avg.input_shapes), "ms": us / 1e3 / steps,
                         "calls": avg.count / steps})
    return sorted(rows, key=lambda r: -r["ms"])[:top]


def forward_loss(model, input_ids, labels):
    """The summed loss of a micro batch under bf16 autocast on the GPU, as the training loop computes it."""
    cuda = input_ids.device.type == "cuda"
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=cuda):
        return model(input_ids, labels=labels)


def measure(family: str, scale: str, args, device: torch.device, glue: str = "auto", graph: bool = False) -> dict:
    """One family's row; glue "auto/separate": the fused glue with a linear for each reader of an input."""
    glue_mode, _, inputs = glue.partition("/")
    fusion.SHARE_INPUTS = inputs != "separate"
    try:
        return _measure(family, scale, args, device, glue, glue_mode, graph)
    finally:
        fusion.SHARE_INPUTS = True


def _measure(family: str, scale: str, args, device: torch.device, glue: str, glue_mode: str, graph: bool) -> dict:
    batch, seq_len = args.batch or SHAPES[scale][0], args.seq_len or SHAPES[scale][1]
    cfg = load_preset(f"{scale}-{family}")
    if family != "transformer" and args.backend != "auto":
        cfg = cfg.model_copy(update={"backend": args.backend})
    torch.manual_seed(0)
    t_build = time.perf_counter()
    with device:  # initialise on the device: a 1.5B model built on the CPU first takes longer than its timed steps
        model = build_model(cfg)
    model.set_glue(glue_mode)
    say(f"{family}: built {count_params(cfg) / 1e6:.0f}M parameters in {time.perf_counter() - t_build:.1f} s")
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=cuda)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), device=device)
    micro = Batch(tokens[:, :-1], tokens[:, 1:])
    loss_scale = 1.0 / (batch * seq_len)
    # The training loop's graphed micro step (rla_ablate.train.graphs)
    graphs = GraphedMicroStep(lambda ids, labels: forward_loss(model, ids, labels), device,
                              warmup_steps=args.warmup) if graph else None

    def forward_backward():
        # the training loop's eager micro step: the model computes its summed loss (rla_ablate.models.fusion.lm_loss)
        if graphs is not None:
            return graphs.step([micro], loss_scale)
        loss = forward_loss(model, micro.input_ids, micro.labels)
        (loss * loss_scale).backward()
        return loss.detach().double()

    def step():
        loss_sum = forward_backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        # One host read per step, as the training loop makes (with the relative clip's hand-over)
        values = model.read_and_hand_over(loss_sum * loss_scale, norm)
        opt.step()
        opt.zero_grad(set_to_none=graphs is None)
        return values

    t_warm = time.perf_counter()
    for i in range(args.warmup):
        step()
        say(f"{family}: warm-up step {i + 1}/{args.warmup} at {time.perf_counter() - t_warm:.1f} s")
    if graphs is not None:
        graphs.capture()
        say(f"{family}: micro step captured in a CUDA graph at {time.perf_counter() - t_warm:.1f} s")
    warmup_s = time.perf_counter() - t_warm
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    seen = [step() for _ in range(args.steps)]  # (loss, gradient norm) of each timed step
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    tok_s = batch * seq_len * args.steps / seconds
    peak = device_peak(device)
    row = dict(family=family, scale=scale, preset=f"{scale}-{family}", glue=glue, glue_ran=model.glue_used, graph=graph,
               model=cfg.model_dump(mode="json"),
               batch=batch, seq_len=seq_len, params=count_params(cfg), tokens_per_s=tok_s,
               mfu=flops_per_token(cfg, seq_len) * tok_s / peak if peak else None, loss=seen[-1][0], steps_seen=seen,
               backend=model.backend_used, kernel=model.kernel_used, warmup_s=warmup_s,
               # the peak a job of this mode reports (a graphed one: the reserved peak)
               peak_mem_gib=peak_memory_bytes(device, graph) / 2**30 if device.type == "cuda" else None)
    if args.profile:
        row["profile"] = profile_steps(step, args.profile, device, args.top_ops)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", nargs="+", default=["1.5b"],
                        help=f"preset scales, models/<scale>-<family>.yaml; batch shapes: {SHAPES}")
    parser.add_argument("--families", nargs="+", default=["rla", "rdn", "sgla", "gdn", "transformer"])
    parser.add_argument("--batch", type=int, default=None, help="micro batch (default: the scale's, SHAPES)")
    parser.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the scale's)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--backend", default="auto", help="op backend of the linear families (auto, fla, triton)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", type=int, nargs="?", const=3, default=0, metavar="STEPS",
                        help="profile this many more steps per family (default 3) and split the step's time")
    parser.add_argument("--glue", nargs="+", default=["auto"], choices=["auto", "torch"],
                        help="the models' glue: auto (FLA's fused kernels on the GPU) and/or torch (the "
                             "plain-torch reference); both: each family twice, side by side")
    parser.add_argument("--inputs", nargs="+", default=["shared"], choices=["shared", "separate"],
                        help="with the fused glue, the readers of each layer input: shared (one backward, "
                             "fusion.SharedInput) and/or separate (a linear each); both: side by side")
    parser.add_argument("--graph", nargs="+", default=["off"], choices=["off", "on"],
                        help="on: capture each family's micro step in a CUDA graph and replay it, as train.cuda_graphs "
                             "does (GPU only); "
                             "off on: each family both ways, side by side")
    parser.add_argument("--rla-split", default=None, metavar="PROGRAMS:CHUNKS",
                        help="RLA's state passes split by this rule (rla.SplitRule: split when a pass has fewer "
                             "programs than PROGRAMS, into segments of CHUNKS chunks) instead of the default")
    parser.add_argument("--rla-read-own", action="store_true",
                        help="RLA's state passes each loading a chunk's reads in that chunk (rla.READ_AHEAD 0) "
                             "instead of reading ahead as rla.AheadRule() picks for each (the default)")
    parser.add_argument("--rdn-one-function", action="store_true",
                        help="RDN's two recurrences in one Function on our kernels (backend.RDN.one_function) instead "
                             "of the auxiliary pass apart on FLA's kernels (the default)")
    parser.add_argument("--rla-launch", nargs="+", default=[], metavar="KERNEL:KEY=VALUE,...",
                        help="RLA's kernels with these launch options changed (rla.LAUNCH; keys BK, BV, num_warps, "
                             "num_stages), e.g. state_pass:BK=64,BV=64")
    parser.add_argument("--no-autotune-seeds", action="store_true",
                        help="on a GPU, leave the Triton cache as it is (default: add the shipped autotune results, "
                             "benchmarks/gpu-tuning, that it lacks, as a sweep's launch does)")
    parser.add_argument("--top-ops", type=int, default=0, metavar="N",
                        help="with --profile: list the N costliest PyTorch ops per family with their input shapes")
    parser.add_argument("--calibrate", nargs="?", const=str(CALIBRATION), default=None, metavar="TABLE",
                        help="merge the rows into this calibration table (default: the package's H200 table)")
    args = parser.parse_args()
    if args.rla_split is not None or args.rla_launch or args.rla_read_own:
        from rla_ablate.ops.triton import rla

        try:
            if args.rla_split is not None:
                rla.SPLIT = rla.SplitRule.parse(args.rla_split)
            if args.rla_read_own:
                rla.READ_AHEAD = 0
            for setting, value in rla.launch_settings(rla.parse_launches(args.rla_launch)).items():
                setattr(rla, setting, value)
        except ValueError as exc:
            parser.error(str(exc))
        if args.calibrate is not None:
            parser.error("--calibrate takes rows of the kernels as they ship: not with --rla-split, --rla-launch or "
                         "--rla-read-own")
    if args.rdn_one_function:
        from dataclasses import replace

        from rla_ablate.ops.triton import backend

        if args.calibrate is not None:
            parser.error("--calibrate takes rows of the kernels as they ship: not with --rdn-one-function")
        backend.RDN = replace(backend.RDN, one_function=True)
    unknown = [scale for scale in args.scale if scale not in SHAPES and (args.batch is None or args.seq_len is None)]
    if unknown:
        parser.error(f"no batch shape for scale {', '.join(unknown)}: pass --batch and --seq-len (known: {SHAPES})")
    device = torch.device(args.device)
    if device.type == "cuda" and not args.no_autotune_seeds:
        # FLA's first call otherwise times every candidate configuration of its kernels: minutes on a fresh node
        from rla_ablate.sweep.launch import seed_this_process

        if line := seed_this_process():
            say(line)
    if "on" in args.graph and device.type != "cuda":
        parser.error(f"--graph on captures CUDA graphs: it needs a CUDA device, not {args.device}")
    if "on" in args.graph and args.warmup < 2:
        # the capture must not be a shape's first step: Triton compiles and autotunes, AdamW makes its state and the
        # kernels' layouts are copied to the device there, none of which a graph can hold
        parser.error(f"--graph on needs --warmup 2 or more eager steps before the capture; got {args.warmup}")
    rows = []
    for scale in args.scale:
        runs = [(f, g + ("" if i == "shared" else f"/{i}"), m == "on") for f in args.families for g in args.glue
                for i in args.inputs if g == "auto" or i == "shared" for m in args.graph]
        for family, glue, graph in runs:
            try:
                rows.append(measure(family, scale, args, device, glue, graph))
            except torch.OutOfMemoryError:
                rows.append(dict(family=family, scale=scale, preset=f"{scale}-{family}", glue=glue, graph=graph,
                                 error="out of memory"))
            except ValueError as e:
                rows.append(dict(family=family, scale=scale, preset=f"{scale}-{family}", glue=glue, graph=graph,
                                 error=str(e)))
            eager = next((r for r in rows[:-1] if "loss" in r and not r["graph"] and (r["family"], r["scale"],
                          r["glue"]) == (family, scale, glue)), None)
            if graph and eager is not None and "loss" in rows[-1]:
                rows[-1]["graph_vs_eager"] = max(abs(a - b) / max(abs(b), 1e-12) for got, ref in zip(
                    rows[-1]["steps_seen"], eager["steps_seen"]) for a, b in zip(got, ref))
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(json.dumps(rows[-1]), flush=True)
            if args.calibrate and glue == "auto":
                # row by row: a run stopped at a time limit keeps what it measured
                calibrate(args.calibrate, rows[-1:], args, torch.cuda.get_device_name(device))
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for scale in args.scale:
        print_table([r for r in rows if r["scale"] == scale], where, args)
    if len(args.scale) > 1:
        print_summary(rows, where)
    if args.profile:
        print_profile(rows, device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=where, args=vars(args), results=rows, summary=summary_rows(rows)), f, indent=1)


def print_table(rows: list[dict], where: str, args) -> None:
    base = {"rla": "sgla", "rdn": "gdn"}
    by_family = {(r["family"], r.get("glue", "auto"), r.get("graph", False)): r for r in rows}
    shape = next((f"batch {r['batch']} x {r['seq_len']} tokens" for r in rows if "batch" in r), "")
    graphs = any(r.get("graph") for r in rows)
    print(f"\n{where} | {shape} | {args.steps} timed steps")
    print(f"{'preset':>18} {'glue':>13} {'graph':>5} {'params':>8} {'tokens/s':>10} {'MFU':>6} {'vs base':>8} "
          f"{'vs torch glue (separate)':>24}" + (f" {'vs eager':>8} {'vs eager, rel':>13}" if graphs else "") + f" {'backend':>8}")
    for r in rows:
        glue, graph = r.get("glue", "auto"), r.get("graph", False)
        label = f"{r['preset']:>18} {glue:>13} {'on' if graph else 'off':>5}"
        if "error" in r:
            print(f"{label} {r['error']}")
            continue
        b = by_family.get((base.get(r["family"], ""), glue, graph), {})
        ratio = f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x" if "tokens_per_s" in b else ""
        t = by_family.get((r["family"], "torch", graph), {}) if glue != "torch" else {}
        vs_torch = f"{r['tokens_per_s'] / t['tokens_per_s']:.2f}x" if "tokens_per_s" in t else ""
        sep = by_family.get((r["family"], "auto/separate", graph), {}) if glue == "auto" else {}
        vs_torch += f" ({r['tokens_per_s'] / sep['tokens_per_s']:.2f}x sep.)" if "tokens_per_s" in sep else ""
        extra = ""
        if graphs:
            e = by_family.get((r["family"], glue, False), {}) if graph else {}
            vs_eager = f"{r['tokens_per_s'] / e['tokens_per_s']:.2f}x" if "tokens_per_s" in e else ""
            diff = f"{r['graph_vs_eager']:.1e}" if "graph_vs_eager" in r else ""
            extra = f" {vs_eager:>8} {diff:>13}"
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        print(f"{label} {r['params'] / 1e6:7.0f}M {r['tokens_per_s']:10.0f} {mfu:>6} {ratio:>8} {vs_torch:>24}{extra} "
              f"{str(r['backend']):>8}")


def summary_rows(rows: list[dict]) -> list[dict]:
    """One row per scale (and glue and graph mode that ran): RLA/sGLA and RDN/GDN tokens/s, the linear families'
    MFU range and the transformer's MFU: issue-style, every scale of one run in one table."""
    out = []
    keys = sorted({(r["scale"], r.get("glue", "auto"), r.get("graph", False)) for r in rows if "tokens_per_s" in r},
                  key=lambda k: (SCALE_ORDER.get(k[0], 99), k[1], k[2]))
    for scale, glue, graph in keys:
        got = {r["family"]: r for r in rows if "tokens_per_s" in r
               and (r["scale"], r.get("glue", "auto"), r.get("graph", False)) == (scale, glue, graph)}

        def ratio(a, b):
            return got[a]["tokens_per_s"] / got[b]["tokens_per_s"] if a in got and b in got else None

        linear = [got[f]["mfu"] for f in ("rla", "rdn", "sgla", "gdn") if f in got and got[f]["mfu"] is not None]
        transformer = got.get("transformer", {}).get("mfu")
        out.append(dict(scale=scale, glue=glue, graph=graph, rla_vs_sgla=ratio("rla", "sgla"),
                        rdn_vs_gdn=ratio("rdn", "gdn"), linear_mfu=(min(linear), max(linear)) if linear else None,
                        transformer_mfu=transformer))
    return out


SCALE_ORDER = {scale: i for i, scale in enumerate(SHAPES)}


def print_summary(rows: list[dict], where: str) -> None:
    def x(v):
        return f"{v:.2f}x" if v is not None else "-"

    def pct(v):
        return f"{v:.1%}" if v is not None else "-"

    print(f"\n{where} | every scale of this run")
    print(f"{'scale':>10} {'glue':>13} {'graph':>5} {'RLA/sGLA':>9} {'RDN/GDN':>8} {'linear MFU':>13} "
          f"{'transformer MFU':>15}")
    for r in summary_rows(rows):
        mfu = "-" if r["linear_mfu"] is None else f"{pct(r['linear_mfu'][0])}-{pct(r['linear_mfu'][1])}"
        print(f"{r['scale']:>10} {r['glue']:>13} {'on' if r['graph'] else 'off':>5} {x(r['rla_vs_sgla']):>9} "
              f"{x(r['rdn_vs_gdn']):>8} {mfu:>13} {pct(r['transformer_mfu']):>15}")


def print_profile(rows: list[dict], device: torch.device) -> None:
    """One line per preset: ms per step, the GPU's idle share, and each kind's ms (share of the step)."""
    busy = "GPU busy" if device.type == "cuda" else "ops' self time"
    print(f"\nwhere a step's time goes (ms per step; {busy} by kind"
          + ("; idle: the GPU waiting for the host)" if device.type == "cuda" else ")"))
    for r in rows:
        prof = r.get("profile")
        if not prof:
            continue
        wall = prof["wall_ms"]
        parts = [f"{kind} {ms:.1f} ({ms / wall:.0%})" for kind, ms in prof["kinds_ms"].items() if ms >= 0.05]
        idle = f", idle {prof['gpu_idle_ms']:.1f} ({prof['gpu_idle_ms'] / wall:.0%})" if "gpu_idle_ms" in prof else ""
        label = r["preset"] + (" (torch glue)" if r.get("glue") == "torch" else "") + (" (graph)" if r.get("graph") else "")
        print(f"{label:>18}: step {wall:.1f}{idle}: " + ", ".join(parts))
        for op in prof.get("top_ops", []):
            print(f"{'':>20}{op['ms']:7.2f} ms {op['calls']:5.0f}x {op['op']} {op['shapes']}")
        for kernel in prof.get("top_kernels", []):
            print(f"{'':>20}{kernel['ms']:7.2f} ms {kernel['calls']:5.0f}x [{kernel['kind']}] {kernel['kernel']}")


def calibrate(path: str, rows: list[dict], args, where: str) -> None:
    """Merge measured rows into the calibration table, replacing a row of the same preset, shape, backend, glue
    (the glue that ran: "fused" or "torch", rla_ablate.sweep.calibration) and graph (a graphed row gives graphed
    jobs their speed, never a memory coefficient)."""
    import datetime

    import fla
    import triton

    table = json.loads(Path(path).read_text())
    if table.get("device") not in where:
        say(f"not calibrating: the table is for {table.get('device')}, this is {where}")
        return
    stamp = (f"{datetime.date.today()}, torch {torch.__version__}, triton {triton.__version__}, "
             f"FLA {getattr(fla, '__version__', '?')}")

    def key(x):
        return x["preset"], x["micro_batch_size"], x["seq_len"], x["backend"], row_glue(x), bool(x.get("graph"))

    for r in rows:
        if "error" in r:
            continue
        command = f"python3 benchmarks/train_gpu.py --scale {r['scale']} --batch {r['batch']} " \
                  f"--seq-len {r['seq_len']} --glue {r['glue']} --graph {'on' if r['graph'] else 'off'} " \
                  f"--steps {args.steps} --warmup {args.warmup} --calibrate"
        new = {"preset": r["preset"], "model": r["model"], "micro_batch_size": r["batch"], "seq_len": r["seq_len"],
               "tokens_per_s": round(r["tokens_per_s"]), "peak_gib": round(r["peak_mem_gib"], 2),
               "backend": r["backend"], "glue": r["glue_ran"], "warmup_s": round(r["warmup_s"], 1),
               "measured": stamp, "command": command}
        if r["graph"]:
            new["graph"] = True
        if r["model"].get("family") == "rdn":
            new["rdn_states_kept"] = True  # its peak holds what the auxiliary pass keeps (calibration.row_a_f)
        if r["model"].get("family") == "rla":
            new["rla_x_slope"] = True  # its peak holds x's slope, not x (calibration.row_a_f)
        table["rows"] = [x for x in table["rows"] if key(x) != key(new)] + [new]
    Path(path).write_text(json.dumps(table, indent=1) + "\n")
    say(f"calibration: {len(rows)} rows merged into {path}")


if __name__ == "__main__":
    main()
