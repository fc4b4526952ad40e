"""Shared by the interpreter checks of our Triton kernels (test_ops_triton_rla.py, test_ops_triton_rdn.py): float64
master inputs, one fwd+bwd with a fixed random upstream gradient, the packed-sequence cases, and the comparison
against the naive contract.

Those files (and test_ops_gpu_triton_glue.py) run themselves as scripts under TRITON_INTERPRET=1 (the interpreter
must be chosen before any kernel is defined; `run_interpreted`), with this folder on sys.path."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

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


def run_interpreted(script: str, checks: int, timeout: int) -> None:
    """Run `script` in a fresh process under TRITON_INTERPRET=1 and assert it passed all `checks` ("ok <case>")."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == checks, proc.stdout


def check_packed(compare, rule: str, fn, prefix: str = "", **kw) -> None:
    """fn on packed sequences of uneven lengths (one of a single token, one empty; K=24, V=20, gates of -1e5 and
    -300) against naive on each sequence alone: fit residual with and without output gates, and fit none."""
    from rla_ablate.ops.spec import ResidualSpec

    lengths = [20, 1, 35, 16, 0, 9]
    cu = torch.tensor([0, *itertools.accumulate(lengths)])
    for fit, og in (("residual", True), ("residual", False), ("none", True)):
        spec = ResidualSpec(rule=rule, fit=fit, output_gates=og, clip=0.7)
        master = make(B=1, T=sum(lengths), K=24, V=20, N=len(lengths))
        master["g"][0, 5, 0], master["g"][0, 40, 1] = -1e5, -300.0
        ref = per_sequence_reference(master, spec, cu)
        compare(f"{prefix}packed-{fit}-{'gates' if og else 'nogates'}", ref,
                run(fn, master, spec, torch.float32, cu_seqlens=cu, **kw))


def per_sequence_reference(master: dict, spec, cu: torch.Tensor) -> dict:
    """The float64 naive contract on each packed sequence alone (`master` as `make(B=1, ...)` with N sequences)."""
    from rla_ablate.ops import _per_sequence
    from rla_ablate.ops.naive import naive_residual_attention

    return run(lambda *a: _per_sequence(naive_residual_attention, *a, cu), master, spec, torch.float64)


class Comparer:
    """compare(case, ref, got) asserts every tensor close, prints "ok <case>" and keeps the worst error seen."""

    def __init__(self, ratio: float, atol: float):
        self.ratio, self.atol, self.worst = ratio, atol, 0.0

    def __call__(self, case: str, ref: dict, got: dict) -> None:
        for name in ref:
            assert_close(f"{case} {name}", ref[name], got[name], ratio=self.ratio, atol=self.atol)
            self.worst = max(self.worst, rel_rms_error(ref[name], got[name]))
        print(f"ok {case}", flush=True)


def first_config_autotune() -> None:
    """Let FLA's autotuned kernels run under the interpreter: it has no device to time configurations on, so each
    kernel takes its first configuration (every configuration computes the same result)."""
    import triton.runtime.autotuner as autotuner

    autotuner.Autotuner._bench = lambda self, *args, config=None, **kwargs: [1.0, 1.0, 1.0]
