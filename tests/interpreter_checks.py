"""Shared by the interpreter checks of our Triton kernels (test_ops_triton_rla.py, test_ops_triton_rdn.py): float64
master inputs, one fwd+bwd with a fixed random upstream gradient, and the comparison against the naive contract.

Those files run themselves as scripts under TRITON_INTERPRET=1 (the interpreter must be chosen before any kernel is
defined), with this folder on sys.path."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rla_ablate.ops.testing import assert_close, rel_rms_error

NAMES = ("q", "k", "v", "g", "beta", "gamma", "S0", "R0")


def make(B=2, T=37, H=2, K=16, V=16, N=None, seed=0) -> dict:
    """float64 inputs: L2-normalized keys, gates log sigmoid(x + 2), beta and gamma in (0, 1), N states."""
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    uni = lambda *s: torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    N = B if N is None else N
    return {"q": rnd(B, T, H, K), "k": F.normalize(rnd(B, T, H, K), dim=-1), "v": rnd(B, T, H, V),
            "g": F.logsigmoid(rnd(B, T, H) + 2.0), "beta": uni(B, T, H), "gamma": uni(B, T, H),
            "S0": rnd(N, H, V, K) * 0.5, "R0": rnd(N, H, V, K) * 0.5}


def run(fn, master, spec, dtype, with_state=True, **kw) -> dict:
    """o, S_T, R_T and the gradients of all eight inputs (zeros where unused) of fn on master cast to dtype."""
    x = {n: t.to(dtype).requires_grad_(True) for n, t in master.items()}
    state = (x["S0"], x["R0"]) if with_state else None
    o, (S, R) = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], x["gamma"], spec, 0.3, state, **kw)
    outs = {"o": o, "S_T": S, "R_T": R}
    gen = torch.Generator().manual_seed(7)
    loss = sum((t.double() * torch.randn(t.shape, generator=gen, dtype=torch.float64)).sum() for t in outs.values())
    grads = torch.autograd.grad(loss, [x[n] for n in NAMES], allow_unused=True)
    return outs | {f"d{n}": torch.zeros_like(x[n]) if gr is None else gr for n, gr in zip(NAMES, grads)}


class Comparer:
    """compare(case, ref, got) asserts every tensor close, prints "ok <case>" and keeps the worst error seen."""

    def __init__(self, ratio: float, atol: float):
        self.ratio, self.atol, self.worst = ratio, atol, 0.0

    def __call__(self, case: str, ref: dict, got: dict) -> None:
        for name in ref:
            assert_close(f"{case} {name}", ref[name], got[name], ratio=self.ratio, atol=self.atol)
            self.worst = max(self.worst, rel_rms_error(ref[name], got[name]))
        print(f"ok {case}", flush=True)
