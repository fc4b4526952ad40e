"""RLA / RDN kernels on one GPU against their FLA baselines and SDPA: forward and forward+backward, bf16.

    python benchmarks/kernels.py [--tokens 65536] [--seq-lens 2048 8192 32768] [--long 131072] [--json out.json]
    python benchmarks/kernels.py --profile [--seq-lens 2048]     # GPU time per kernel, fwd+bwd, from torch.profiler
    python benchmarks/kernels.py --tune [additive delta] [--seq-lens 2048]   # RLA's / RDN's fwd+bwd, each kernel's
                                                                          # tiles and warps
    python benchmarks/kernels.py --backends triton --rla-residual-apart   # adds RLA's forward with its residuals in a
                                                                          # kernel of their own, as it was
    python benchmarks/kernels.py --backends triton --rla-end-term-in-dqk  # adds RLA with dg's chunk end terms made
                                                                          # in the dq/dk kernel, as it was
    python benchmarks/kernels.py --backends triton --rla-gates-in-pass --rla-wide-tiles --heads 16 --tokens 16384 \
        --seq-lens 4096 --long 0         # adds RLA with its state passes making their gates, and at their wide tiles
    python benchmarks/kernels.py --backends triton --rdn-one-function     # adds RDN with both recurrences in one
                                                                          # Function on our kernels (rdn.ResidualDelta)
    python benchmarks/kernels.py --backends triton --rdn-residual-apart   # adds RDN with its prediction handed to
                                                                          # the glue's residual kernels, as it was
    python benchmarks/kernels.py --backends triton --rdn-wy-fla           # adds RDN with FLA's WY backward and
                                                                          # PyTorch's additions around it, as it was
    python benchmarks/kernels.py --backends triton --rdn-gates-in-pass --heads 6 --tokens 32768 --seq-lens 2048 \
        --long 0                         # adds RDN with its state passes making their gates in their loop, as it was
    python benchmarks/kernels.py --backends triton --rla-chunk 128 --rla-warps 8   # adds RLA at another chunk size
    python benchmarks/kernels.py --backends triton --rla-split 1024:8 512:16 --heads 6 --seq-lens 2048
                                          # adds RLA whose state passes split sequences by other rules (programs:chunks
                                          # of `rla.SplitRule`), here at a 100M layer's shape (6 heads)
    python benchmarks/kernels.py --backends triton --rla-launch state_pass:BK=64,BV=64 --heads 16 --seq-lens 4096
                                          # adds RLA with some kernels' launch options changed (rla.LAUNCH)
    python benchmarks/kernels.py --tune additive --tune-kernels state_pass state_pass_2   # only those kernels' options

Each T runs B = tokens / T sequences of H=16 heads (--heads) of dimension 128; --long adds one forward-only row set at B=1.
Baselines: FLA chunk_simple_gla (sGLA, the additive base) and chunk_gated_delta_rule (Gated DeltaNet, the delta
base), and causal SDPA (flash). RLA and RDN run through every GPU backend of `residual_attention` with the paper
defaults (fit=residual, target=clip, output gates). Median milliseconds by `triton.testing.do_bench`; the ratio
column divides by the FLA baseline of the same rule. The table prints last.

do_bench times each call from the host, launches included. At the training shapes (a 100M layer: 16 x 2048 tokens,
6 heads) a call takes under 2 ms and the host's share varies: two identical configurations of RLA once measured
1.62 and 1.92 ms in one process (docs/RESULTS.md). Compare variants there by their GPU time, `--profile` (each run's
total over its kernels), or the passes alone, benchmarks/state_pass.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
from functools import partial
from unittest import mock

import torch
import torch.nn.functional as F

from rla_ablate.ops import BACKENDS, _load_gpu_backends, residual_attention

H, D = 16, 128


def make_inputs(B, T, grad):
    dev, bf = "cuda", torch.bfloat16
    x = lambda *s: torch.randn(*s, device=dev, dtype=bf)  # noqa: E731
    q, v = x(B, T, H, D), x(B, T, H, D)
    k = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1).to(bf)
    g = F.logsigmoid(torch.randn(B, T, H, device=dev) + 3.0)
    beta = torch.rand(B, T, H, device=dev).to(bf)
    gamma = torch.rand(B, T, H, device=dev).to(bf)
    tensors = dict(q=q, k=k, v=v, g=g, beta=beta, gamma=gamma)
    if grad:
        for t in tensors.values():
            t.requires_grad_(True)
    return tensors


def candidates(backends, variants=(), rla_chunk=None, rla_warps=None, rla_splits=(), rla_launch=None):
    """The timed ops by name: (rule, fn). variants: keys of `VARIANTS`, RLA or RDN with one design switch off;
    rla_splits: `rla.SplitRule`s for RLA's state passes; rla_launch: (label, kernel -> options), RLA with those
    kernels' launch options changed (`rla.launch_settings`)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.simple_gla import chunk_simple_gla

    def sdpa(x):
        q, k, v = (x[n].transpose(1, 2) for n in ("q", "k", "v"))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    runs = {
        "sGLA (FLA)": ("additive", lambda x: chunk_simple_gla(x["q"], x["k"], x["v"], g=x["g"])[0]),
        "GDN (FLA)": ("delta", lambda x: chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])[0]),
        "SDPA causal": (None, sdpa),
    }
    for backend in backends:
        for name, rule in (("RLA", "additive"), ("RDN", "delta")):
            runs[f"{name} [{backend}]"] = (rule, lambda x, rule=rule, backend=backend: residual_attention(
                x["q"], x["k"], x["v"], x["g"], x["beta"], x["gamma"], rule=rule, backend=backend)[0])
    for option in variants if "triton" in backends else ():
        name, rule, fn, _ = VARIANTS[option]
        runs[name] = (rule, fn)
    if rla_chunk and "triton" in backends:
        warps = f", {rla_warps} warps" if rla_warps else ""
        runs[f"RLA [triton, chunk {rla_chunk}{warps}]"] = ("additive", partial(rla_other_chunk, chunk=rla_chunk,
                                                                                   warps=rla_warps))
    for rule in rla_splits if "triton" in backends else ():
        runs[f"RLA [triton, split {rule.programs}:{rule.chunks}]"] = ("additive", partial(rla_with, SPLIT=rule))
    if rla_launch and "triton" in backends:
        from rla_ablate.ops.triton import rla

        label, changed = rla_launch
        runs[f"RLA [triton, {label}]"] = ("additive", partial(rla_with, **rla.launch_settings(changed)))
    return runs


def rla_with(x, **settings):
    """RLA on the `triton` backend with module settings of `rla_ablate.ops.triton.rla` changed: a design switch off
    (`VARIANTS`), SPLIT, the rule by which the state passes cut a sequence into segments, or LAUNCH, the kernels'
    launch options. The backward reads SPLIT, LAUNCH and NARROW_BELOW when it runs, after this call has returned:
    `bench` and `profile` hold the settings over it too (`settings_of`)."""
    with settings_of(partial(rla_with, **settings)):
        return residual_attention(x["q"], x["k"], x["v"], x["g"], x["beta"], x["gamma"], backend="triton")[0]


def rla_other_chunk(x, chunk, warps=None):
    """RLA's fused kernels at another chunk size (its states kept every `chunk` tokens), every kernel at `warps`
    warps if given: the op the `triton` backend runs, but for the chunk (and launch options)."""
    from rla_ablate.ops.spec import ResidualSpec
    from rla_ablate.ops.triton import rla

    with settings_of(partial(rla_other_chunk, chunk=chunk, warps=warps)):
        return rla.rla_triton(x["q"], x["k"], x["v"], x["g"], x["beta"], x["gamma"], ResidualSpec(), D ** -0.5, None,
                              chunk=chunk)[0]


def settings_of(fn):
    """The module settings of `rla_ablate.ops.triton.rla` a timed op runs with (a variant of `rla_with`, or
    `rla_other_chunk`'s warps), as one context for its forward and its backward; nothing for the others."""
    from rla_ablate.ops.triton import rla

    if isinstance(fn, partial) and fn.func is rla_with:
        return mock.patch.multiple(rla, **fn.keywords)
    if isinstance(fn, partial) and fn.func is rla_other_chunk and fn.keywords.get("warps"):
        table = {k: dict(v, num_warps=fn.keywords["warps"]) for k, v in rla.LAUNCH.items()}
        return mock.patch.multiple(rla, LAUNCH=table)
    return contextlib.nullcontext()


def rdn_changed(x, **changes):
    """RDN on the `triton` backend with `backend.RDN` changed: one_function=True (both recurrences in one Function on
    our kernels), residual_in_reads=False (the prediction out of its base pass and the residual made by the glue's
    kernels), wy=FLA_WY_FLA_BWD (FLA's WY backward)."""
    from dataclasses import replace

    from rla_ablate.ops.triton import backend

    if "wy" in changes:
        changes["wy"] = getattr(backend.rdn, changes["wy"])
    saved, backend.RDN = backend.RDN, replace(backend.RDN, **changes)
    try:
        return residual_attention(x["q"], x["k"], x["v"], x["g"], x["beta"], x["gamma"], rule="delta",
                                  backend="triton")[0]
    finally:
        backend.RDN = saved


def rdn_with(x, **settings):
    """RDN on the `triton` backend with module settings of `rla_ablate.ops.triton.rdn` changed (a design switch off,
    `VARIANTS`): its forward reads them and keeps what its backward needs."""
    from rla_ablate.ops.triton import rdn

    with mock.patch.multiple(rdn, **settings):
        return residual_attention(x["q"], x["k"], x["v"], x["g"], x["beta"], x["gamma"], rule="delta",
                                  backend="triton")[0]


# RLA or RDN with one design switch of `rla_ablate.ops.triton.rla` / `.rdn` turned off or on, each read by the op's
# forward; each is a flag of its own (`--` and the name with dashes) that adds the variant to the table.
# name -> (label, rule, op, the flag's help).
VARIANTS = {
    "rla_residual_apart": ("RLA [triton, res. apart]", "additive", partial(rla_with, RESIDUAL_IN_S_PASS=False),
                           "add RLA [triton] with its forward's residuals in a kernel of their own"),
    "rla_end_term_in_dqk": ("RLA [triton, end term in dq/dk]", "additive", partial(rla_with, END_TERM_IN_PASS=False),
                            "add RLA [triton] with dg's chunk end terms made in the dq/dk kernel"),
    "rla_gates_in_pass": ("RLA [triton, gates in passes]", "additive", partial(rla_with, GATES_MADE_ONCE=False),
                          "add RLA [triton] with each state pass making the gates' chunk cumsum in its loop"),
    "rla_wide_tiles": ("RLA [triton, wide pass tiles]", "additive", partial(rla_with, NARROW_BELOW=0),
                       "add RLA [triton] with its state passes at their default tiles where they have fewer than two "
                       "programs per SM"),
    "rla_read_ahead": ("RLA [triton, pass reads ahead]", "additive", partial(rla_with, READ_AHEAD=1),
                       "add RLA [triton] with every state pass loading a chunk's reads, but for the key tiles, one "
                       "chunk ahead"),
    "rla_read_own": ("RLA [triton, passes read own chunk]", "additive", partial(rla_with, READ_AHEAD=0),
                     "add RLA [triton] with every state pass loading each chunk's reads in that chunk, instead of "
                     "reading ahead as rla.AheadRule() picks (by the pass's kind, where it has at most two programs "
                     "per SM)"),
    "rla_end_term_rows": ("RLA [triton, end terms by rows]", "additive", partial(rla_with, END_TERM_ROWS=True),
                          "add RLA [triton] with its reverse state passes storing dg's chunk end terms a value per row "
                          "of each state tile, added by the gate-gradient kernel"),
    "rdn_one_function": ("RDN [triton, one Function]", "delta", partial(rdn_changed, one_function=True),
                         "add RDN [triton] with both recurrences in one Function on our kernels (rdn.ResidualDelta: "
                         "one dq/dk kernel for both), instead of the auxiliary pass apart on FLA's kernels"),
    "rdn_residual_apart": ("RDN [triton, res. by glue]", "delta",
                           partial(rdn_changed, residual_in_reads=False, one_function=False),
                           "add RDN [triton] with its auxiliary pass apart and the residual made by the glue's kernels "
                           "from the prediction"),
    "rdn_wy_fla": ("RDN [triton, FLA's WY bwd]", "delta", partial(rdn_changed, wy="FLA_WY_FLA_BWD"),
                   "add RDN [triton] with FLA's WY backward and the additions around it in PyTorch"),
    "rdn_gates_in_pass": ("RDN [triton, gates in passes]", "delta", partial(rdn_with, GATES_MADE_ONCE=False),
                          "add RDN [triton] with its two state passes making the gates' chunk cumsum in their loop"),
    "rdn_read_ahead": ("RDN [triton, pass reads ahead]", "delta", partial(rdn_with, READ_AHEAD=1),
                       "add RDN [triton] with its two state passes loading a chunk's reads, but for the key tiles, one "
                       "chunk ahead"),
}


def bench(fn, x, mode):
    from triton.testing import do_bench

    with settings_of(fn):
        if mode == "fwd":
            with torch.no_grad():
                return do_bench(lambda: fn(x), warmup=50, rep=200, return_mode="median")
        leaves = list(x.values())
        do = torch.randn_like(fn(x))

        def step():
            fn(x).backward(do)

        return do_bench(step, warmup=50, rep=200, grad_to_none=leaves, return_mode="median")


def profile(runs, T, tokens, names):
    """One fwd+bwd of each named run under torch.profiler: GPU microseconds per kernel, biggest first."""
    for name in names:
        _, fn = runs[name]
        with settings_of(fn):
            _profile_one(name, fn, T, tokens)


def kernel_times(fn, x, calls: int = 1):
    """The CUDA kernels of `calls` fwd+bwd calls of `fn` under torch.profiler (after three unprofiled ones), biggest
    first, and their GPU time in microseconds per call."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    do = torch.randn_like(fn(x))
    for _ in range(3):
        fn(x).backward(do)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            for t in x.values():
                t.grad = None  # else the gradients accumulate over the calls, which do_bench avoids
            fn(x).backward(do)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.device_time_total > 0]
    kernels.sort(key=lambda e: -e.device_time_total)
    return kernels, sum(e.device_time_total for e in kernels) / calls


def bench_gpu(fn, x) -> float:
    """GPU milliseconds of one fwd+bwd: the sum of its kernels' times (no host time, no gaps between launches),
    over five profiled calls. Where an eager call is bound by the host (a 100M layer: FLA's sGLA takes 2.00 ms of
    wall time for 1.13 of GPU time), this ranks launch options as a graphed training step sees them."""
    with settings_of(fn):
        return kernel_times(fn, x, calls=5)[1] / 1000


def _profile_one(name, fn, T, tokens):
    """`profile` of one run, inside its settings."""
    kernels, total = kernel_times(fn, make_inputs(tokens // T, T, grad=True))
    print(f"\n{name}, {tokens // T}x{T}, fwd+bwd: {total / 1000:.2f} ms of GPU time in {len(kernels)} kernels")
    for e in kernels[:14]:
        print(f"  {e.device_time_total / 1000:8.3f} ms  x{e.count:<3d} {e.key[:90]}")


def tune_variants(name, default):
    """Launch options to try for one kernel: each tile width 64 or 128 (narrower tiles fault on Hopper with Triton
    3.7, docs/RESULTS.md) at 4 or 8 warps, less the default (pipeline stages moved nothing, docs/RESULTS.md)."""
    import itertools

    from rla_ablate.ops.triton.common import TILE_KEYS

    keys = TILE_KEYS.get(name, ("BV",))
    options = [dict(default, num_warps=w, **dict(zip(keys, tiles)))
               for tiles in itertools.product((64, 128), repeat=len(keys)) for w in (4, 8)]
    return [o for o in options if o != default]


def tune(T, tokens, rule, only=(), by="gpu"):
    """RLA's or RDN's `triton` fwd+bwd with each of its kernels at other tile widths or warp counts (the others at
    their defaults), each checked against the defaults' output and gradients; then every kernel at its fastest
    option together, beside the FLA base (sGLA, GDN). only: the kernels to vary (default every one). by: "gpu"
    times the kernels alone (`bench_gpu`), "wall" the eager call (`bench`), host included."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.simple_gla import chunk_simple_gla

    from rla_ablate.ops.triton import rdn, rla

    module = rla if rule == "additive" else rdn
    name, base_name = ("RLA", "sGLA") if rule == "additive" else ("RDN", "GDN")
    # the state passes at the tiles each option names: never narrowed (`rla.NARROW_BELOW`)
    narrow, rla.NARROW_BELOW = rla.NARROW_BELOW, 0
    baseline = ((lambda y: chunk_simple_gla(y["q"], y["k"], y["v"], g=y["g"])[0]) if rule == "additive" else
                (lambda y: chunk_gated_delta_rule(y["q"], y["k"], y["v"], y["g"], y["beta"])[0]))
    defaults = {k: dict(v) for k, v in module.LAUNCH.items()}
    fn = lambda x: residual_attention(x["q"], x["k"], x["v"], x["g"], x["beta"], x["gamma"], rule=rule,  # noqa: E731
                                      backend="triton")[0]
    x = make_inputs(tokens // T, T, grad=True)
    do = torch.randn(tokens // T, T, H, D, device="cuda", dtype=torch.bfloat16)

    def outputs():
        for t in x.values():
            t.grad = None
        o = fn(x)
        o.backward(do)
        # copies: .float() of an fp32 gradient is the gradient itself, which a later backward adds to
        return [t.detach().to(torch.float32, copy=True) for t in [o] + [t.grad for t in x.values()]]

    def worst_error(reference):
        return max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(outputs(), reference))

    reference = outputs()
    timed = bench_gpu if by == "gpu" else (lambda f, y: bench(f, y, "fwd+bwd"))
    fla_ms = timed(baseline, x)
    base = timed(fn, x)
    print(f"\n{name} [triton] fwd+bwd, {tokens // T}x{T}, launch options (state passes at the tiles named, not "
          f"narrowed), {'GPU' if by == 'gpu' else 'wall'} time; {base_name} (FLA) {fla_ms:.2f} ms")
    print(f"  {'defaults':50s} {base:8.2f} ms  {base / fla_ms:5.2f}x {base_name}", flush=True)
    best = {}
    skip = set() if module is rdn else {"fwd_residual"} if rla.RESIDUAL_IN_S_PASS else {"s_pass_residual"}
    for kernel in defaults:
        if kernel in skip or (only and kernel not in only):
            continue
        best[kernel] = (base, defaults[kernel])
        for option in tune_variants(kernel, defaults[kernel]):
            module.LAUNCH[kernel] = option
            try:
                error = worst_error(reference)
                ms = timed(fn, x)
                line = f"{ms:8.2f} ms  {ms / fla_ms:5.2f}x {base_name}  error {error:.1e}"
                if error > 1e-2:
                    line += "  WRONG"
                elif ms < 0.99 * best[kernel][0]:  # a gain under 1% is noise
                    best[kernel] = (ms, option)
            except Exception as exc:  # an option the kernel cannot compile or launch with
                line = f"failed: {type(exc).__name__}: {str(exc)[:60]}"
            tiles = " ".join(f"{k}={v}" for k, v in option.items())
            print(f"  {kernel:16s} {tiles:33s} {line}", flush=True)
        module.LAUNCH[kernel] = defaults[kernel]
    for kernel, (_, option) in best.items():
        module.LAUNCH[kernel] = option
    error = worst_error(reference)
    ms = timed(fn, x)
    print(f"  {'each kernel at its fastest':50s} {ms:8.2f} ms  {ms / fla_ms:5.2f}x {base_name}  error {error:.1e}")
    fastest = {k: dict(v) for k, v in module.LAUNCH.items() if k in best}
    print(f"  LAUNCH = {fastest}", flush=True)
    module.LAUNCH.update({k: dict(v) for k, v in defaults.items()})
    rla.NARROW_BELOW = narrow
    return dict(rule=rule, T=T, tokens=tokens, fla_base_ms=fla_ms, defaults_ms=base, fastest_ms=ms, fastest_error=error,
                launch=fastest)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=65536, help="tokens per call (B = tokens / T)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--long", type=int, default=131072, help="forward-only length at B=1 (0 to skip)")
    parser.add_argument("--backends", nargs="+", default=None, help="residual_attention backends (default: all GPU)")
    parser.add_argument("--json", default=None, help="write every measurement here")
    parser.add_argument("--profile", action="store_true", help="per-kernel GPU time instead of the table")
    parser.add_argument("--tune", nargs="*", choices=["additive", "delta"], default=None,
                        help="time the launch options of RLA's (additive) and/or RDN's (delta) kernels (default both)")
    for name, (*_, text) in VARIANTS.items():
        parser.add_argument("--" + name.replace("_", "-"), action="store_true", help=text)
    parser.add_argument("--rla-chunk", type=int, default=None,
                        help="add RLA [triton] at this chunk size (64 is the backend's)")
    parser.add_argument("--rla-warps", type=int, default=None, help="with --rla-chunk: every RLA kernel at these warps")
    parser.add_argument("--rla-split", nargs="+", default=[], metavar="PROGRAMS:CHUNKS",
                        help="add RLA [triton] with its state passes split by these rules (rla.SplitRule: split when a "
                             "pass has fewer programs than PROGRAMS, into segments of CHUNKS chunks)")
    parser.add_argument("--tune-kernels", nargs="+", default=[], metavar="KERNEL",
                        help="with --tune: vary only these kernels (names of the LAUNCH tables)")
    parser.add_argument("--tune-by", choices=["gpu", "wall"], default="gpu",
                        help="with --tune: rank by the kernels' GPU time (default: what a graphed training step "
                             "sees; an eager call at a 100M layer is bound by the host) or the eager call's wall time")
    parser.add_argument("--rla-launch", nargs="+", default=[], metavar="KERNEL:KEY=VALUE,...",
                        help="add RLA [triton] with these kernels' launch options changed (rla.LAUNCH; keys BK, BV, "
                             "num_warps, num_stages), e.g. state_pass:BK=64,BV=64")
    parser.add_argument("--no-autotune-seeds", action="store_true",
                        help="leave the Triton cache as it is (default: add the shipped autotune results, "
                             "benchmarks/gpu-tuning, that it lacks, as a sweep's launch does)")
    parser.add_argument("--heads", type=int, default=16, help="heads of every call (a 100M layer has 6, 1.5B 16)")
    args = parser.parse_args()
    from rla_ablate.ops.triton import rdn, rla

    try:
        splits = [rla.SplitRule.parse(text) for text in args.rla_split]
        changed = rla.parse_launches(args.rla_launch)
    except ValueError as exc:
        parser.error(str(exc))
    known = set(rla.LAUNCH) | set(rdn.LAUNCH)
    if [k for k in args.tune_kernels if k not in known]:
        parser.error(f"--tune-kernels: no kernel {[k for k in args.tune_kernels if k not in known][0]!r}; kernels: "
                     f"{', '.join(sorted(known))}")
    launch = (" ".join(args.rla_launch), changed) if args.rla_launch else None
    if args.heads < 1:
        parser.error(f"--heads takes a positive integer; got {args.heads}")
    global H
    H = args.heads
    if not args.no_autotune_seeds:
        # FLA's first call otherwise times every candidate configuration of its kernels: minutes on a fresh node
        from rla_ablate.sweep.launch import seed_this_process

        if line := seed_this_process():
            print(line, flush=True)
    _load_gpu_backends()
    backends = args.backends or [b for b in BACKENDS if b not in ("naive", "chunk")]
    runs = candidates(backends, [v for v in VARIANTS if getattr(args, v)], args.rla_chunk, args.rla_warps, splits,
                      launch)
    if args.profile:
        for T in args.seq_lens:
            profile(runs, T, args.tokens, [n for n in runs if n != "SDPA causal"])
        return
    if args.tune is not None:
        found = [tune(T, args.tokens, rule, args.tune_kernels, args.tune_by) for rule in args.tune or ["additive", "delta"]
                 for T in args.seq_lens]
        if args.json:
            with open(args.json, "w") as f:
                json.dump(found, f, indent=1)
        return
    base_of = {"additive": "sGLA (FLA)", "delta": "GDN (FLA)"}
    shapes = [(args.tokens // T, T, mode) for T in args.seq_lens for mode in ("fwd", "fwd+bwd")]
    if args.long:
        shapes.append((1, args.long, "fwd"))

    rows, records = [], []
    for B, T, mode in shapes:
        times = {}
        for name, (rule, fn) in runs.items():
            torch.manual_seed(0)
            x = make_inputs(B, T, grad=mode != "fwd")
            try:
                times[name] = bench(fn, x, mode)
            except torch.OutOfMemoryError:
                times[name] = float("nan")
            del x
            torch.cuda.empty_cache()
            base = times.get(base_of.get(rule)) if rule else None
            ratio = times[name] / base if base and name != base_of.get(rule) else None
            sdpa = times.get("SDPA causal")
            records.append(dict(B=B, T=T, mode=mode, kernel=name, ms=times[name], ratio_to_fla_base=ratio,
                                ratio_to_sdpa=times[name] / sdpa if sdpa else None))
            rows.append((f"{B}x{T}", mode, name, f"{times[name]:.2f}", f"{ratio:.2f}x" if ratio else ""))
            print(f"{B}x{T} {mode:8s} {name:18s} {times[name]:9.2f} ms", flush=True)

    header = ("B x T", "pass", "kernel", "ms", "/ FLA base")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print(f"\n{torch.cuda.get_device_name()} | torch {torch.__version__} | H={H} D={D} bf16 | median of do_bench")
    for r in [header] + rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
    if args.json:
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, python=platform.python_version())
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=records), f, indent=1)


if __name__ == "__main__":
    main()
