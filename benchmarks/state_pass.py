"""RLA's state passes alone on one GPU, timed by CUDA-graph replay: launch options and design switches side by side.

    python benchmarks/state_pass.py                       # the 100M and 1.5B layers' shapes, every case below
    python benchmarks/state_pass.py --scales 100m --repeats 200
    python benchmarks/state_pass.py --match ahead "no end term"   # the plans and the cases named so

A state pass is sequential over a sequence's chunks and runs on few programs at the training shapes (192 at a 100M
layer, 16 x 2048 tokens x 6 heads; 128 at a 1.5B layer, 4 x 4096 x 16), so its time is a chain of per-chunk
latencies. Timed eagerly, a pass of 0.1 ms is mostly the host's launch; here each case is captured once in a CUDA
graph and replayed (`triton.testing.do_bench_cudagraph`), so the table holds GPU time alone. The three kinds of pass
that `rla_ablate.ops.triton.rla` runs, on random bf16 inputs with head dims 128:

    fwd    R's pass: one term, sa = gamma, every chunk state stored (S's pass, which makes the residuals, is apart)
    rev    dR's pass: one term, reverse, with dg's chunk end terms (STORE_Z) unless the case says otherwise
    rev2   dS's pass: two terms, reverse, with the end terms
    s      S's pass with the residuals made in it (`_s_pass_residual`: the whole K, clip target), at its launch

Each kind is timed at its plan (the tiles `_pass_plan` picks on this GPU) and at other tiles, warps and stages.
Every case reads ahead as the op does unless it says otherwise (`rla.READ_AHEAD`, an `AheadRule`: 1 for R's and
dR's passes, 2 for dS's, 0 for S's, where a pass has at most two programs per SM): `own` loads each chunk's reads in
that chunk, `ahead 1` one chunk ahead but for ka's and kb's tiles, `ahead 2` all of them; `rows` stores dg's end
terms a row per row of each tile (`rla.END_TERM_ROWS`: no sum across the warps in the pass). `no sa`, `no store` and
`no end term` take a part away to show what it costs (those are not RLA's passes). The ratio column divides by the
kind's plan in the same run.
"""

from __future__ import annotations

import argparse

import torch

SHAPES = {"100m": (6, 16, 2048), "1.5b": (16, 4, 4096)}  # heads, sequences, tokens each
D = 128
CHUNK = 64

# (kind, BK, BV, warps, stages or None, changes); BK x BV None: the plan's tiles
CASES = [
    ("fwd", None, None, None, None, {}),
    ("fwd", None, None, None, None, {"own": dict(AHEAD=0)}),
    ("fwd", None, None, None, None, {"ahead 1": dict(AHEAD=1)}),
    ("fwd", None, None, None, None, {"ahead 2": dict(AHEAD=2)}),
    ("fwd", 64, 128, 4, None, {}),
    ("fwd", 64, 64, 4, None, {}),
    ("fwd", 64, 64, 4, 3, {}),
    ("fwd", 64, 64, 4, 4, {}),
    ("fwd", 64, 64, 8, 3, {}),
    ("fwd", 64, 64, 2, 3, {}),
    ("fwd", 128, 64, 4, None, {}),
    ("fwd", 64, 128, 8, None, {}),
    ("fwd", 64, 128, 4, None, {"no sa": dict(HAS_SA=False)}),
    ("fwd", 64, 128, 4, None, {"no store": dict(STORE_H=False)}),
    ("fwd", 64, 64, 4, None, {"no store": dict(STORE_H=False)}),
    ("rev", None, None, None, None, {}),
    ("rev", None, None, None, None, {"own": dict(AHEAD=0)}),
    ("rev", None, None, None, None, {"ahead 1": dict(AHEAD=1)}),
    ("rev", None, None, None, None, {"ahead 2": dict(AHEAD=2)}),
    ("rev", None, None, None, None, {"rows": dict(rows=True)}),
    ("rev", None, None, None, None, {"ahead 1": dict(AHEAD=1), "rows": dict(rows=True)}),
    ("rev", 64, 64, 8, None, {}),
    ("rev", 64, 128, 4, None, {}),
    ("rev", 64, 64, 4, None, {}),
    ("rev", 64, 64, 4, 3, {}),
    ("rev", 64, 128, 4, None, {"no end term": dict(end_term=None)}),
    ("rev", 64, 64, 4, None, {"no end term": dict(end_term=None)}),
    ("rev2", None, None, None, None, {}),
    ("rev2", None, None, None, None, {"own": dict(AHEAD=0)}),
    ("rev2", None, None, None, None, {"ahead 1": dict(AHEAD=1)}),
    ("rev2", None, None, None, None, {"ahead 2": dict(AHEAD=2)}),
    ("rev2", None, None, None, None, {"rows": dict(rows=True)}),
    ("rev2", None, None, None, None, {"ahead 1": dict(AHEAD=1), "rows": dict(rows=True)}),
    ("rev2", 64, 64, 8, None, {}),
    ("rev2", 128, 64, 4, None, {}),
    ("rev2", 64, 64, 4, None, {}),
    ("s", None, None, None, None, {}),
    ("s", None, None, None, None, {"ahead 1": dict(AHEAD=1)}),
    ("s", None, None, None, None, {"ahead 2": dict(AHEAD=2)}),
]


def label(case) -> str:
    kind, BK, BV, warps, stages, changes = case
    if BK is None:
        return " ".join([kind, "plan", *changes])
    return " ".join([kind, f"{BK}x{BV}", f"w{warps}", *([f"s{stages}"] if stages else []), *changes])


def make(heads: int, B: int, T: int, dev: torch.device):
    """Inputs of the three kinds of pass, token-major as the op holds them, and the layout's gates made once."""
    from rla_ablate.ops.triton.common import Layout, made_gates

    layout = Layout.batched(B, T, CHUNK, dev)
    x = {n: torch.randn(B * T, heads, D, device=dev, dtype=torch.bfloat16) for n in ("q", "k", "w", "do", "dx")}
    g = -torch.rand(B * T, heads, device=dev) * 0.1
    x["gamma"] = torch.rand(B * T, heads, device=dev, dtype=torch.bfloat16)
    x["gates"] = made_gates(layout, g, heads, CHUNK)
    states = (layout.chunks, heads, D, D)
    x["hD"] = torch.empty(states, dtype=torch.bfloat16, device=dev)
    x["hF"] = torch.randn(states, dtype=torch.bfloat16, device=dev)  # the forward's states, for the end terms
    x["DT"] = torch.empty(layout.N, heads, D, D, dtype=torch.float32, device=dev)
    x["Z_P"] = torch.empty(8 * 128, layout.chunks * heads, dtype=torch.float32, device=dev)  # up to 8 tiles' rows
    x["v"], x["beta"] = x["w"], x["gamma"]
    x["X"] = torch.empty(B * T, heads, D, dtype=torch.uint8, device=dev)  # the clip's slope
    x["W"] = torch.empty(B * T, heads, D, dtype=torch.bfloat16, device=dev)
    return layout, x


def launcher(case, layout, x, heads: int):
    """The case's pass as a no-argument launch."""
    from rla_ablate.ops.triton import rla
    from rla_ablate.ops.triton.common import COEF_B, COEF_B_PRIME, COEF_TO_END

    kind, BK, BV, warps, stages, changes = case
    if kind == "s":
        opts = rla.launch_options("s_pass_residual", D, rla.LAUNCH)
        grid = (D // opts["BV"], layout.N * heads)
        extra = {k: v for change in changes.values() for k, v in change.items()}
        return lambda: rla.s_pass_residual(grid, k=x["k"], v=x["v"], g=x["gates"], beta=x["beta"], D0=x["DT"],
                                           hS=x["hD"], ST=x["DT"], X=x["X"], W=x["W"], cu=layout.cu,
                                           coff=layout.coff, c_clip=1.0, H=heads, K=D, V=D, BT=CHUNK, BK=D,
                                           HAS_D0=False, TARGET=0, MADE=True, **extra, **opts)
    two = kind == "rev2"
    if BK is None:
        grid, state, _ = rla._pass_plan(layout, two, heads, D, D, CHUNK, x["q"].device)
    else:
        grid = (D // BK, D // BV, layout.N * heads)
        state = dict(H=heads, K=D, V=D, BT=CHUNK, BK=BK, BV=BV, num_warps=warps)
        if stages:
            state["num_stages"] = stages
    tiles = grid[0] * grid[1]
    if kind == "fwd":
        terms = dict(ka=x["k"], ua=x["w"], sa=x["gamma"], kb=x["k"], ub=x["w"], scale_a=1.0, sign_b=0.0,
                     REVERSE=False, CA=COEF_TO_END.value, CB=COEF_TO_END.value, HAS_SA=True, HAS_B=False)
    elif kind == "rev":
        terms = dict(ka=x["q"], ua=x["do"], sa=x["gamma"], kb=x["q"], ub=x["do"], scale_a=0.1, sign_b=0.0,
                     REVERSE=True, CA=COEF_B.value, CB=COEF_TO_END.value, HAS_SA=True, HAS_B=False,
                     end_term=(x["hF"], x["Z_P"][:tiles], False))
    else:
        terms = dict(ka=x["q"], ua=x["do"], sa=x["gamma"], kb=x["k"], ub=x["dx"], scale_a=0.1, sign_b=-1.0,
                     REVERSE=True, CA=COEF_B.value, CB=COEF_B_PRIME.value, HAS_SA=False, HAS_B=True,
                     end_term=(x["hF"], x["Z_P"][:tiles], False))
    for change in changes.values():
        terms.update(change)
    if terms.pop("rows", False):  # the end terms a row per row of each tile (rla.END_TERM_ROWS)
        terms["end_term"] = (x["hF"], x["Z_P"][:tiles * state["BV"]], True)
    return lambda: rla.state_pass(grid, g=x["gates"], D0=x["DT"], hD=x["hD"], DT=x["DT"], cu=layout.cu,
                                  coff=layout.coff, HAS_D0=False, MADE=True, **terms, **state)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", nargs="+", choices=sorted(SHAPES), default=["100m", "1.5b"])
    parser.add_argument("--repeats", type=int, default=100, help="ms of replays per case (do_bench_cudagraph rep)")
    parser.add_argument("--match", nargs="+", default=None, metavar="WORDS",
                        help="only the cases whose label contains one of these (each kind's plan is always timed)")
    args = parser.parse_args()
    cases = [c for c in CASES if c[1] is None and not c[5]
             or args.match is None or any(m in label(c) for m in args.match)]
    for m in args.match or []:
        if not any(m in label(c) for c in CASES):
            parser.error(f"--match {m!r} is in no case's label; the labels: " + ", ".join(label(c) for c in CASES))
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (Triton kernels, CUDA graphs)")
    from triton.testing import do_bench_cudagraph

    rows = []
    for scale in args.scales:
        heads, B, T = SHAPES[scale]
        torch.manual_seed(0)
        layout, x = make(heads, B, T, torch.device("cuda"))
        plan = {}
        for case in cases:
            fn = launcher(case, layout, x, heads)
            fn()  # compiles outside the graph
            torch.cuda.synchronize()
            us = do_bench_cudagraph(fn, rep=args.repeats, return_mode="median") * 1000
            plan.setdefault(case[0], us)  # each kind's plan is its first case
            rows.append((scale, label(case), f"{us:.1f}", f"{us / plan[case[0]]:.3f}x"))
            print(f"{scale} {label(case):28s} {us:8.1f} us", flush=True)
    header = ("shape", "pass", "us", "/ plan")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    print(f"\n{torch.cuda.get_device_name()} | torch {torch.__version__} | bf16, head dims {D} | "
          f"median of CUDA-graph replays")
    for r in [header] + rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
