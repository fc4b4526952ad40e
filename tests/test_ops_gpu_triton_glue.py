"""The `triton` backend's fused kernels on CPU, through Triton's interpreter (TRITON_INTERPRET=1).

The interpreter must be chosen before the kernels are defined, so the checks run in a fresh interpreter process
(this file run as a script). FLA's naive recurrences stand in for its chunk kernels (as in test_ops_gpu_scheme.py);
the base and auxiliary reads reach the kernels as strided views, and v with a strided last dimension (as a
short convolution leaves it), V = 6 exercises the masked columns, and clip=0.7
puts many residuals outside the clip. Every fit="residual" combination: outputs, states and every gradient.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def check_all() -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from op_combos import COMBOS
    from test_ops_gpu_scheme import NAIVE_FLA, compare, make_inputs, outputs_and_grads

    from rla_ablate.ops.fla_backend import compose_residual_attention
    from rla_ablate.ops.naive import naive_residual_attention
    from rla_ablate.ops.spec import ResidualSpec
    from rla_ablate.ops.triton.glue import TRITON_GLUE

    torch.manual_seed(0)
    for rule, fit, target, og in COMBOS:
        if fit != "residual":
            continue
        spec = ResidualSpec(rule=rule, fit=fit, target=target, output_gates=og, clip=0.7)
        x = make_inputs(T=21)

        def run(fn, **kw):
            return outputs_and_grads(lambda x: fn(x["q"], x["k"], x["v"], x["g"], x["beta"], x["gamma"], spec, 0.3,
                                                  (x["S0"], x["R0"]), **kw), x)

        def channels_first(q, k, v, *rest, **kw):
            # v laid out as a model's short convolution leaves it (a transposed [B, H*V, T] buffer)
            v = v.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
            assert v.stride(-1) != 1
            return compose_residual_attention(NAIVE_FLA, q, k, v, *rest, **kw)

        ref = run(naive_residual_attention)
        got = run(channels_first, glue=TRITON_GLUE)
        compare(ref, got, ratio=2e-5, atol=1e-5)
        print(f"ok {rule}-{target}-{'gates' if og else 'nogates'}", flush=True)


def test_fused_glue_matches_naive_under_the_interpreter():
    from interpreter_checks import run_interpreted

    run_interpreted(__file__, checks=12, timeout=600)


if __name__ == "__main__":
    check_all()


@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_a_call_without_tokens_returns_the_initial_states(rule):
    """B * T = 0 never reaches a kernel (their chunk lists would be empty; the chunk-state loads have no token mask)."""
    import torch

    from rla_ablate.ops.spec import ResidualSpec
    from rla_ablate.ops.triton.backend import triton_residual_attention

    q = torch.zeros(1, 0, 2, 8, dtype=torch.bfloat16)
    v = torch.zeros(1, 0, 2, 6, dtype=torch.bfloat16)
    gates = torch.zeros(1, 0, 2)
    S0, R0 = torch.randn(3, 2, 6, 8), torch.randn(3, 2, 6, 8)
    spec = ResidualSpec(rule=rule)
    o, (S, R) = triton_residual_attention(q, q, v, gates, gates, gates, spec, 0.3, (S0, R0),
                                          cu_seqlens=torch.tensor([0, 0, 0, 0]))
    assert o.shape == (1, 0, 2, 6) and torch.equal(S, S0) and torch.equal(R, R0)
    o, (S, R) = triton_residual_attention(q.expand(3, 0, 2, 8), q.expand(3, 0, 2, 8), v.expand(3, 0, 2, 6),
                                          gates.expand(3, 0, 2), gates.expand(3, 0, 2), gates.expand(3, 0, 2), spec,
                                          0.3, None)
    assert o.shape == (3, 0, 2, 6) and S.abs().sum() == 0 and R.abs().sum() == 0
