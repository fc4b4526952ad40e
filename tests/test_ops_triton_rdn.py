"""RDN's one-pass base recurrence (rla_ablate/ops/triton/rdn.py) on CPU, through Triton's interpreter.

Our kernels (S pass, the two old reads, the local write gradients, the dS pass, dq/dk/dw, the WY step's backward)
run in the interpreter in fp32; the WY step's forward is the PyTorch one (FLA's fused WY kernels do not run in the
interpreter; the GPU tests run them), its backward our kernel (`TORCH_WY_OUR_BWD`; once PyTorch's, `TORCH_WY`).
With fit residual both recurrences run in one Function as the backend runs them with `RDN.one_function`
(`rdn.ResidualDelta`: the auxiliary recurrence on the same kernels, one dq/dk kernel for both); apart (the default) the
auxiliary recurrence is the naive delta rule, its q and k gradients posted to the base pass's backward through a
`GradientMail` as the backend does (dk split in two shares, as FLA's dq/dk kernel and WY step give it), and once
added by autograd instead; with fit residual the read kernel makes the
residual (as the backend runs it), and twice the prediction goes out to the glue's residual step instead; a graph kept for a second backward whose first
needed the auxiliary pass alone (its mail must not reach the second), apart and in one Function. Against the float64 naive
contract: outputs, final states and all eight gradients for every fit x target x gates, chunks of 16 (T=37: three
chunks, the last partial), clip=0.7; packed sequences of uneven lengths (one of a single token, one empty) with
gates of -1e5 and -300, heads that are not powers of two (K=24, V=20), K=80 (two K tiles in dq/dk, a masked K row
in the passes) and V=72 (two V tiles in the passes), and a call without initial states; the state passes once with
the gates made in their loop (batched and packed) instead of read from `made_gates`. Measured: every error <= 1e-6
(relative RMS), tolerance 1e-5.
"""

from __future__ import annotations

import itertools
from functools import partial

import pytest

pytest.importorskip("triton")

RATIO, ATOL = 1e-5, 1e-6


def check_all() -> None:
    import torch
    from interpreter_checks import Comparer, check_packed, make, run

    from rla_ablate.ops import _per_sequence
    from rla_ablate.ops.fla_backend import BaseKernels, compose_residual_attention
    from rla_ablate.ops.naive import naive_residual_attention
    from rla_ablate.ops.spec import ResidualSpec
    from rla_ablate.ops.triton.backend import rdn_one_function
    from rla_ablate.ops.triton.rdn import TORCH_WY, TORCH_WY_OUR_BWD, GradientMail, delta_two_reads

    compare = Comparer(RATIO, ATOL)
    off = ResidualSpec(rule="delta", fit="off")

    def exact_delta(q, k, v, g, beta, scale, h0, cu):  # the auxiliary recurrence: o_t = R_t q_t, naive
        state = (h0, None) if h0 is not None else None
        if cu is None:
            o, (S, _) = naive_residual_attention(q, k, v, g, beta, None, off, scale, state)
        else:
            o, (S, _) = _per_sequence(naive_residual_attention, q, k, v, g, beta, None, off, scale, state, cu)
        return o.to(q.dtype), S

    class PostQK(torch.autograd.Function):
        """Identity on the auxiliary pass's q, k and step size, one node as DeltaKeepStates is: its backward runs
        for any of their gradients, and posts q's and k's to the mail."""

        @staticmethod
        def forward(ctx, q, k, beta, mail):
            ctx.mail = mail
            return q.view_as(q), k.view_as(k), beta.view_as(beta)

        @staticmethod
        def backward(ctx, dq, dk, dbeta):
            ctx.mail.post(dq, 0.25 * dk, 0.75 * dk)
            return None, None, dbeta, None

    def rdn(q, k, v, g, beta, gamma, spec, scale, state, cu_seqlens=None, mailed=True, residual_in_reads=True,
            wy=TORCH_WY_OUR_BWD, apart=False):
        if spec.fit == "residual" and not apart:  # both recurrences in one Function (the backend's one_function)
            return rdn_one_function(q, k, v, g, beta, gamma, spec, scale, state, cu_seqlens, wy=wy, chunk=16)
        mail = GradientMail() if mailed else None
        # as the backend runs it: with fit residual the read kernel makes the residual
        residual = (spec.target, spec.clip) if residual_in_reads and spec.fit == "residual" else None

        def auxiliary(q, k, v, g, beta, scale, h0, cu):
            if mail is not None:
                assert mail.takes(q, k), "the auxiliary pass was not given the base pass's q and k"
                q, k, beta = PostQK.apply(q, k, beta, mail)
            return exact_delta(q, k, v, g, beta, scale, h0, cu)

        reads = lambda q, k, v, g, beta, S0, scale, cu: delta_two_reads(  # noqa: E731
            q, k, v, g, beta, S0, scale, cu, wy=wy, chunk=16, mail=mail, residual=residual)
        return compose_residual_attention(BaseKernels(additive=None, delta=auxiliary), q, k, v, g, beta, gamma, spec,
                                          scale, state, cu_seqlens, base_reads=reads,
                                          reads_residual=residual is not None)

    for fit, target, og in itertools.product(["residual", "none"], ["clip", "tanh", "identity"], [True, False]):
        spec = ResidualSpec(rule="delta", fit=fit, target=target, output_gates=og, clip=0.7)
        master = make()
        compare(f"{fit}-{target}-{'gates' if og else 'nogates'}",
                run(naive_residual_attention, master, spec, torch.float64), run(rdn, master, spec, torch.float32))

    for target in ("clip", "tanh", "identity"):  # the auxiliary pass apart, on its own Function (the naive rule here)
        spec = ResidualSpec(rule="delta", target=target, clip=0.7)
        master = make()
        compare(f"apart-{target}", run(naive_residual_attention, master, spec, torch.float64),
                run(rdn, master, spec, torch.float32, apart=True))

    check_packed(compare, "delta", rdn)
    check_packed(compare, "delta", rdn, prefix="apart-", apart=True)

    spec = ResidualSpec(rule="delta", clip=0.7)
    for K, V in ((80, 24), (24, 72)):  # two K tiles in dq/dk; two V tiles in the passes and reads
        master = make(B=1, T=37, H=1, K=K, V=V)
        compare(f"wide-K{K}-V{V}", run(naive_residual_attention, master, spec, torch.float64),
                run(rdn, master, spec, torch.float32))

    master = make()
    # the WY step's backward in PyTorch (autograd through solve_triangular) instead of our kernel
    compare("torch-wy-backward", run(naive_residual_attention, master, spec, torch.float64),
            run(rdn, master, spec, torch.float32, wy=TORCH_WY))
    compare("autograd-adds-qk", run(naive_residual_attention, master, spec, torch.float64),
            run(rdn, master, spec, torch.float32, mailed=False, apart=True))
    for target in ("clip", "identity"):  # the prediction out of the base pass and the residual made by the glue
        spec_t = ResidualSpec(rule="delta", target=target, clip=0.7)
        compare(f"prediction-out-{target}", run(naive_residual_attention, master, spec_t, torch.float64),
                run(rdn, master, spec_t, torch.float32, residual_in_reads=False, apart=True))

    # a graph kept for a second backward: the first needs the auxiliary pass alone (gamma), the second the base pass
    # alone (S_T by q and k); the first's mail must not reach the second
    # (in one Function too: each backward of the kept graph runs it whole)
    for apart in (True, False):
        x = {n: t.to(torch.float32).requires_grad_(True) for n, t in make().items()}
        ref = {n: t.detach().double().requires_grad_(True) for n, t in x.items()}
        grads = []
        for fn, inp in ((partial(rdn, apart=apart), x), (naive_residual_attention, ref)):
            o, (S, _) = fn(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], inp["gamma"], spec, 0.3,
                           (inp["S0"], inp["R0"]))
            dgamma, = torch.autograd.grad(o.sum(), [inp["gamma"]], retain_graph=True)
            dq, dk = torch.autograd.grad(S.sum(), [inp["q"], inp["k"]], allow_unused=True)  # S_T does not read q
            grads.append({"dgamma": dgamma, "dq": torch.zeros_like(inp["q"]) if dq is None else dq, "dk": dk})
        compare(f"retained-graph{'-apart' if apart else ''}", grads[1], grads[0])

    # the state passes making their gates in their loop (`GATES_MADE_ONCE` off), which benchmarks/kernels.py times
    # against the gates made once: batched, and packed with an empty sequence and huge gates
    import rla_ablate.ops.triton.rdn as rdn_module

    rdn_module.GATES_MADE_ONCE = False
    compare("gates-in-pass", run(naive_residual_attention, master, spec, torch.float64),
            run(rdn, master, spec, torch.float32))
    check_packed(compare, "delta", rdn, prefix="gates-in-pass-")
    rdn_module.GATES_MADE_ONCE = True
    # the state passes' reads one chunk ahead (`READ_AHEAD`): all but the key tiles, and all
    for ahead in (1, 2):
        rdn_module.READ_AHEAD = ahead
        compare(f"ahead{ahead}", run(naive_residual_attention, master, spec, torch.float64),
                run(rdn, master, spec, torch.float32))
        check_packed(compare, "delta", rdn, prefix=f"ahead{ahead}-")
        # empty sequences first and last: a pass reads ahead of a sequence that has no chunk, at the buffers' ends
        cu = torch.tensor([0, 0, 21, 21])
        packed = make(B=1, T=21, N=3)
        compare(f"ahead{ahead}-empty-ends",
                run(lambda *a: _per_sequence(naive_residual_attention, *a, cu), packed, spec, torch.float64),
                run(rdn, packed, spec, torch.float32, cu_seqlens=cu))
    rdn_module.READ_AHEAD = 0

    master = make(T=50)
    compare("no-initial-state", run(naive_residual_attention, master, spec, torch.float64, with_state=False),
            run(rdn, master, spec, torch.float32, with_state=False))
    print(f"worst relative RMS error {compare.worst:.2e}", flush=True)


def test_one_pass_delta_rule_matches_naive_under_the_interpreter():
    from interpreter_checks import run_interpreted

    run_interpreted(__file__, checks=44, timeout=900)


def test_torch_wy_step_solves_the_chunk_recurrence_of_the_delta_rule():
    """u_t - w_t S_c^T are the delta rule's writes: S_t = exp(b_t) S_c + sum_{s<=t} exp(b_t - b_s) n_s k_s^T."""
    import torch
    import torch.nn.functional as F

    from rla_ablate.ops.triton.rdn import _torch_wy_forward
    from rla_ablate.ops.triton.common import Layout

    gen = torch.Generator().manual_seed(3)
    B, T, H, K, V, C = 1, 11, 2, 5, 3, 4
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    g = -torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    S0 = torch.randn(H, V, K, generator=gen, dtype=torch.float64)
    layout = Layout(B, T, None, C, "cpu")
    w, u, _ = _torch_wy_forward(k, v, beta, g, layout, C)
    S = S0.clone()
    for c0 in range(0, T, C):  # the chunk's writes from its start state, against the token-by-token recurrence
        S_c = S.clone()
        for t in range(c0, min(c0 + C, T)):
            a, b = g[0, t].exp()[:, None, None], beta[0, t][:, None, None]
            kt, vt = k[0, t], v[0, t]
            write = b[..., 0] * (vt - a[..., 0] * torch.einsum("hvk,hk->hv", S, kt))
            n = u[0, t] - torch.einsum("hk,hvk->hv", w[0, t], S_c)
            torch.testing.assert_close(n, write, rtol=1e-10, atol=1e-12)
            S = a * S + write[..., None] * kt[:, None, :]


if __name__ == "__main__":
    check_all()
