"""RDN's auxiliary pass on the `triton` backend four ways: in one Function with the base pass on our kernels
(`rdn.ResidualDelta`), and apart on FLA's kernels keeping its chunk states with its q, k gradients added by the base
pass's backward kernel (the backend's default), keeping its states with autograd adding the gradients, and
FLA's Function recomputing the states; Gated DeltaNet for the ratio. Forward+backward time, memory held between
forward and backward, and how far each variant's outputs and gradients are from the recomputing one's.

    python benchmarks/rdn_aux.py [--batch 32] [--seq-len 2048]

Paper-default RDN (fit=residual, clip target, output gates) on the `triton` backend, bf16, H=16 heads of dimension
128. The variants differ only in `rla_ablate.ops.triton.backend.RDN` (`RDNPasses`): one_function, or apart
`rdn.delta_keep_states` (w, h
and v_new kept from the forward) with or without `rdn.GradientMail`, or FLA's chunk_gated_delta_rule (its backward
recomputes them). Median of 10 timed calls after 3 warm-up calls, by CUDA events; the variants and GDN alternate
over two rounds. The table prints last.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

import rla_ablate.ops.triton.backend as tb
from rla_ablate.ops import residual_attention
from rla_ablate.ops.fla_backend import FLA_KERNELS

H, D = 16, 128


def make_inputs(B: int, T: int) -> dict:
    x = dict(q=torch.randn(B, T, H, D), k=F.normalize(torch.randn(B, T, H, D), dim=-1), v=torch.randn(B, T, H, D),
             g=F.logsigmoid(torch.randn(B, T, H) + 2.0), beta=torch.rand(B, T, H), gamma=torch.rand(B, T, H))
    return {n: t.to("cuda", torch.bfloat16).requires_grad_(True) for n, t in x.items()}


def forward(x: dict, fit: str) -> torch.Tensor:
    return residual_attention(x["q"], x["k"], x["v"], x["g"], x["beta"], x["gamma"] if fit != "off" else None,
                              rule="delta", fit=fit, target="clip", output_gates=True, backend="triton")[0]


def fwd_bwd(x: dict, up: torch.Tensor, fit: str) -> list[torch.Tensor]:
    o = forward(x, fit)
    names = ["q", "k", "v", "g", "beta"] + (["gamma"] if fit != "off" else [])
    return [o, *torch.autograd.grad(o, [x[n] for n in names], up)]


def median_ms(x: dict, up: torch.Tensor, fit: str, n: int = 10) -> float:
    for _ in range(3):
        fwd_bwd(x, up, fit)
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fwd_bwd(x, up, fit)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def held_after_forward_mib(x: dict) -> float:
    """Memory the forward leaves allocated for the backward (its output included)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    o = forward(x, "residual")
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    del o
    return held / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/rdn_aux.py needs a CUDA GPU")
    torch.manual_seed(0)
    x = make_inputs(args.batch, args.seq_len)
    up = torch.randn_like(x["v"])
    default = tb.RDN
    variants = {"one Function": tb.RDNPasses(one_function=True), "kept+mail": tb.RDNPasses(one_function=False),
                "kept": tb.RDNPasses(mail=False, one_function=False),
                "recompute": tb.RDNPasses(auxiliary=FLA_KERNELS.delta, mail=False, one_function=False)}
    outs = {}
    for name, passes in variants.items():
        tb.RDN = passes
        outs[name] = [t.detach().double() for t in fwd_bwd(x, up, "residual")]
    labels = ["o", "dq", "dk", "dv", "dg", "dbeta", "dgamma"]
    diffs = {name: {label: ((a - b).norm() / a.norm().clamp_min(1e-30)).item()
                    for label, a, b in zip(labels, outs["recompute"], outs[name])} for name in variants
             if name != "recompute"}
    finite = all(bool(torch.isfinite(t).all()) for out in outs.values() for t in out)
    times: dict[str, list[float]] = {name: [] for name in (*variants, "GDN")}
    held = {}
    for rnd in range(2):
        for name, passes in variants.items():
            tb.RDN = passes
            times[name].append(median_ms(x, up, "residual"))
            held[name] = held_after_forward_mib(x)
            print(f"round {rnd} RDN {name}: fwd+bwd {times[name][-1]:.2f} ms, held after fwd {held[name]:.0f} MiB",
                  flush=True)
        times["GDN"].append(median_ms(x, up, "off"))
        print(f"round {rnd} GDN: fwd+bwd {times['GDN'][-1]:.2f} ms", flush=True)
    tb.RDN = default

    gdn = statistics.mean(times["GDN"])
    print(f"\n{torch.cuda.get_device_name()} | {args.batch} x {args.seq_len}, H={H}, D={D}, bf16")
    print(f"{'':>16} {'fwd+bwd ms':>11} {'vs GDN':>7} {'vs recompute':>13} {'held MiB':>9}")
    for name in variants:
        ms = statistics.mean(times[name])
        ratio = ms / statistics.mean(times["recompute"])
        print(f"{'RDN ' + name:>16} {ms:11.2f} {ms / gdn:6.2f}x {ratio:12.3f}x {held[name]:9.0f}")
    print(f"{'GDN (FLA)':>16} {gdn:11.2f} {1.0:6.2f}x")
    for name, diff in diffs.items():
        print(f"{name} vs recompute, relative difference: " + ", ".join(f"{k} {v:.1e}" for k, v in diff.items()))
    if not finite:
        print("NON-FINITE VALUES")


if __name__ == "__main__":
    main()
