"""The `fla` backend's composition checked on CPU: FLA's own naive recurrences stand in for its chunk kernels.

The GPU kernels themselves are tested in test_ops_gpu.py; here the scheme around them (the one-slot shift, the
stacked [q; k] queries, varlen slots, state layouts, gates and scales) must reproduce the naive contract exactly,
outputs, final states and every gradient, for every rule x fit x target x output_gates combination.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from rla_ablate.ops import residual_attention, select_backend
from rla_ablate.ops.fla_backend import BaseKernels, compose_residual_attention, shift_slots
from rla_ablate.ops.naive import naive_residual_attention
from rla_ablate.ops.spec import ResidualSpec
from rla_ablate.ops.testing import assert_close
from op_combos import COMBOS, combo_id

fla_naive_sgla = pytest.importorskip("fla.ops.simple_gla.naive")
fla_naive_gdn = pytest.importorskip("fla.ops.gated_delta_rule.naive")


def _per_sequence(run, tensors, h0, cu_seqlens):
    """Run an FLA naive recurrence (no varlen, [K, V] states) per packed sequence; states back as [N, H, V, K]."""
    h0_kv = h0.transpose(-1, -2) if h0 is not None else None
    if cu_seqlens is None:
        o, h = run(*tensors, h0_kv)
        return o, h.transpose(-1, -2)
    outs, finals = [], []
    for n in range(cu_seqlens.numel() - 1):
        sl = slice(int(cu_seqlens[n]), int(cu_seqlens[n + 1]))
        o, h = run(*(x[:, sl] for x in tensors), h0_kv[n:n + 1] if h0_kv is not None else None)
        outs.append(o)
        finals.append(h)
    return torch.cat(outs, 1), torch.cat(finals, 0).transpose(-1, -2)


def _additive(q, k, v, g, scale, h0, cu):
    run = lambda q, k, v, g, h: fla_naive_sgla.naive_recurrent_simple_gla(  # noqa: E731
        q, k, v, g, scale=scale, initial_state=h, output_final_state=True)
    return _per_sequence(run, (q, k, v, g), h0, cu)


def _delta(q, k, v, g, beta, scale, h0, cu):
    run = lambda q, k, v, g, beta, h: fla_naive_gdn.naive_recurrent_gated_delta_rule(  # noqa: E731
        q, k, v, beta, g, scale=scale, initial_state=h, output_final_state=True)
    return _per_sequence(run, (q, k, v, g, beta), h0, cu)


NAIVE_FLA = BaseKernels(additive=_additive, delta=_delta)
NAMES = ("q", "k", "v", "g", "beta", "gamma", "S0", "R0")


def make_inputs(B=2, T=37, H=2, K=8, V=6, N=None, seed=42):
    """N states when packing (B = 1, N sequences); every tensor requires grad."""
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    N = B if N is None else N
    x = {
        "q": rnd(B, T, H, K), "k": F.normalize(rnd(B, T, H, K), dim=-1), "v": rnd(B, T, H, V),
        "g": F.logsigmoid(rnd(B, T, H) + 2.0), "beta": torch.rand(B, T, H, generator=gen),
        "gamma": torch.rand(B, T, H, generator=gen), "S0": rnd(N, H, V, K) * 0.5, "R0": rnd(N, H, V, K) * 0.5,
    }
    return {n: t.requires_grad_(True) for n, t in x.items()}


def outputs_and_grads(fn, x, seed=7):
    o, (S, R) = fn(x)
    outs = {"o": o, "S_T": S} | ({"R_T": R} if R is not None else {})
    gen = torch.Generator().manual_seed(seed)
    loss = sum((t * torch.randn(t.shape, generator=gen, dtype=t.dtype)).sum() for t in outs.values())
    grads = torch.autograd.grad(loss, [x[n] for n in NAMES], allow_unused=True)
    return outs, {f"d{n}": (torch.zeros_like(x[n]) if gr is None else gr) for n, gr in zip(NAMES, grads)}


def compare(ref, got, ratio, atol):
    for name in ref[0]:
        assert_close(name, ref[0][name], got[0][name], ratio=ratio, atol=atol)
    for name in ref[1]:
        assert_close(name, ref[1][name], got[1][name], ratio=ratio, atol=atol)


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_composition_matches_naive(combo):
    rule, fit, target, og = combo
    spec = ResidualSpec(rule=rule, fit=fit, target=target, output_gates=og)
    x = make_inputs()
    state = lambda x: (x["S0"], x["R0"])  # noqa: E731
    gamma = lambda x: None if fit == "off" else x["gamma"]  # noqa: E731
    ref = outputs_and_grads(lambda x: naive_residual_attention(
        x["q"], x["k"], x["v"], x["g"], x["beta"], gamma(x), spec, 0.3, state(x)), x)
    got = outputs_and_grads(lambda x: compose_residual_attention(
        NAIVE_FLA, x["q"], x["k"], x["v"], x["g"], x["beta"], gamma(x), spec, 0.3, state(x)), x)
    compare(ref, got, ratio=2e-5, atol=1e-5)


@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_composition_without_initial_state(rule):
    spec = ResidualSpec(rule=rule)
    x = make_inputs(T=20)
    args = lambda x: (x["q"], x["k"], x["v"], x["g"], x["beta"], x["gamma"], spec, 0.3, None)  # noqa: E731
    o_ref, (S_ref, R_ref) = naive_residual_attention(*args(x))
    o, (S, R) = compose_residual_attention(NAIVE_FLA, *args(x))
    for name, a, b in (("o", o_ref, o), ("S_T", S_ref, S), ("R_T", R_ref, R)):
        assert_close(name, a, b, ratio=2e-5, atol=1e-6)


@pytest.mark.parametrize("combo", [c for c in COMBOS if c[2] == "clip"], ids=combo_id)
def test_packed_sequences_match_each_sequence_alone(combo):
    """cu_seqlens: the shift slots restart per sequence, and states are per sequence (an empty one keeps its own)."""
    rule, fit, target, og = combo
    spec = ResidualSpec(rule=rule, fit=fit, target=target, output_gates=og)
    lengths = [5, 17, 0, 1, 9]
    cu = torch.tensor([0, *itertools.accumulate(lengths)])
    x = make_inputs(B=1, T=sum(lengths), N=len(lengths))
    gamma = None if fit == "off" else x["gamma"]
    o, (S, R) = compose_residual_attention(NAIVE_FLA, x["q"], x["k"], x["v"], x["g"], x["beta"], gamma, spec, 0.3,
                                           (x["S0"], x["R0"]), cu_seqlens=cu)
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        part = {name: x[name][:, a:b] for name in ("q", "k", "v", "g", "beta", "gamma")}
        o_n, (S_n, R_n) = naive_residual_attention(
            part["q"], part["k"], part["v"], part["g"], part["beta"], None if fit == "off" else part["gamma"], spec,
            0.3, (x["S0"][n:n + 1], x["R0"][n:n + 1]))
        assert_close(f"o[seq {n}]", o_n, o[:, a:b], ratio=2e-5, atol=1e-6)
        assert_close(f"S_T[seq {n}]", S_n, S[n:n + 1], ratio=2e-5, atol=1e-6)
        if fit != "off":
            assert_close(f"R_T[seq {n}]", R_n, R[n:n + 1], ratio=2e-5, atol=1e-6)


def test_shift_slots_put_one_empty_slot_before_each_sequence():
    write, read, length, cu = shift_slots(1, 6, torch.tensor([0, 2, 6]), "cpu")
    assert length == 8 and cu.tolist() == [0, 3, 8]
    assert read.tolist() == [0, 1, 3, 4, 5, 6]
    assert write.tolist() == [1, 2, 4, 5, 6, 7]
    write, read, length, cu = shift_slots(3, 4, None, "cpu")
    assert (write.tolist(), read.tolist(), length, cu) == ([1, 2, 3, 4], [0, 1, 2, 3], 5, None)


def test_gpu_backends_are_not_chosen_or_allowed_on_cpu():
    x = torch.zeros(1, 4, 1, 8)
    assert select_backend(x, "auto") == "chunk"
    with pytest.raises(ValueError, match="cannot run on cpu"):
        residual_attention(x, x, x[..., :4], x[..., 0], x[..., 0], x[..., 0], backend="fla")
