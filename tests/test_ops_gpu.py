"""Every backend on CUDA against the naive contract: outputs, final states and every gradient (initial states too).

Fresh random inputs, seed 42, H=16, K=V=128 (the benchmark heads: FLA autotunes per H, K, V and dtype, so
tests and benchmark share one tuning), random upstream gradients, lengths 100 and 37 (not multiples of the chunk
size 64), every rule x fit x target x output_gates combination, fp32 and bf16. The reference is `naive` in float64 on the
same inputs rounded to the tested dtype. Skipped without CUDA.

Tolerances (relative RMS error, absolute floor; `rla_ablate.ops.testing.assert_close`), a written decision:
- fp32: 5e-3. FLA's dots run fp32 operands as tf32 (about 3e-4 per product) through up to three
  chained recurrences. With the clip target, 1e-2 for dv: the residuals that tf32 moves across +-c take the other
  branch, and the gradient of v through them differs by the whole upstream value. Measured on the H200
  (2026-12-03, fla and triton backends, bit-identical): dv of the delta rule's clip cases 2.9e-3 to 6.9e-3 (T=37),
  while with the identity and tanh targets every tensor stays under 1.6e-3; in float64 on CPU, the same relative
  3e-4 noise on k moves dv by 1.2e-3 with the clip and 3.1e-4 without.
- bf16: 3e-2 for everything. Operands and the base reads are bf16 (about 4e-3 each); on top, a clipped residual
  that sits within rounding of +-c takes the other branch in a few elements, and their gradients differ by the whole
  upstream value. Measured on an H200 (2026-12-02, fla backend, all 32 bf16 cases): the worst tensor of each
  case 3.1e-3 to 1.27e-2, the largest dv of additive-residual-clip at T=37 (docs/RESULTS.md).
The measured errors of every case are appended to $RLA_GPU_ERRORS (JSON lines) when it is set.
"""

from __future__ import annotations

import functools
import itertools
import json
import os

import pytest
import torch
import torch.nn.functional as F

from rla_ablate.ops import BACKENDS, VARLEN_NATIVE, _load_gpu_backends, _per_sequence, residual_attention
from rla_ablate.ops.testing import assert_close, rel_rms_error
from op_combos import COMBOS, combo_id

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TOLERANCE = {torch.float32: dict(ratio=5e-3, atol=1e-4), torch.bfloat16: dict(ratio=3e-2, atol=1e-3)}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
NAMES = ("q", "k", "v", "g", "beta", "gamma", "S0", "R0")


def gpu_backends() -> list[str]:
    _load_gpu_backends()
    return [name for name in BACKENDS if name != "naive"]


def make_inputs(B=2, T=100, H=16, K=128, V=128, N=None, seed=42):
    """float64 master copies on CUDA; N states when packing sequences (B = 1)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device="cuda", dtype=torch.float64)  # noqa: E731
    uni = lambda *s: torch.rand(*s, generator=gen, device="cuda", dtype=torch.float64)  # noqa: E731
    N = B if N is None else N
    return {
        "q": rnd(B, T, H, K), "k": F.normalize(rnd(B, T, H, K), dim=-1), "v": rnd(B, T, H, V),
        "g": F.logsigmoid(rnd(B, T, H) + 2.0), "beta": uni(B, T, H), "gamma": uni(B, T, H),
        "S0": rnd(N, H, V, K) * 0.5, "R0": rnd(N, H, V, K) * 0.5,
    }


def leaves(master, dtype):
    """Inputs in `dtype` (states stay fp32, as the backends keep them) as fresh leaves requiring grad."""
    return {n: x.to(torch.float32 if n in ("S0", "R0") and dtype != torch.float64 else dtype).requires_grad_(True)
            for n, x in master.items()}


def run_case(x, backend, combo, cu_seqlens=None):
    rule, fit, target, og = combo
    fn = None
    if cu_seqlens is not None:
        fn = BACKENDS[backend][0]
        if backend not in VARLEN_NATIVE:  # the naive reference: each packed sequence alone
            fn = functools.partial(_per_sequence, fn)
    gamma = None if fit == "off" else x["gamma"]
    if fn is None:
        o, (S, R) = residual_attention(x["q"], x["k"], x["v"], x["g"], x["beta"], gamma, rule=rule, fit=fit,
                                       target=target, output_gates=og, initial_state=(x["S0"], x["R0"]),
                                       backend=backend)
    else:
        from rla_ablate.ops.spec import ResidualSpec

        spec = ResidualSpec(rule=rule, fit=fit, target=target, output_gates=og)
        o, (S, R) = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], gamma, spec, x["q"].shape[-1] ** -0.5,
                       (x["S0"], x["R0"]), cu_seqlens=cu_seqlens)
    outs = {"o": o, "S_T": S} | ({"R_T": R} if R is not None else {})
    gen = torch.Generator(device="cuda").manual_seed(7)
    upstream = {n: torch.randn(t.shape, generator=gen, device="cuda", dtype=torch.float64) for n, t in outs.items()}
    loss = sum((t.double() * upstream[n]).sum() for n, t in outs.items())
    grads = torch.autograd.grad(loss, [x[n] for n in NAMES], allow_unused=True)
    return outs | {f"d{n}": (torch.zeros_like(x[n]) if gr is None else gr) for n, gr in zip(NAMES, grads)}


def rounded(master, dtype):
    """The float64 copies of exactly what the backend under test receives."""
    return {n: x.detach().double() for n, x in leaves(master, dtype).items()}


@functools.lru_cache(maxsize=None)
def reference(combo, T, dtype):
    return run_case(leaves(rounded(make_inputs(T=T), DTYPES[dtype]), torch.float64), "naive", combo)


def tolerance(name: str, dtype, target: str) -> dict:
    if dtype == torch.float32 and target == "clip" and name == "dv":
        return dict(ratio=1e-2, atol=1e-4)
    return TOLERANCE[dtype]


def check(case: str, ref: dict, got: dict, dtype, target: str = "clip"):
    log = os.environ.get("RLA_GPU_ERRORS")
    if log:
        with open(log, "a") as f:
            errors = {n: rel_rms_error(ref[n], got[n].to(ref[n].dtype)) for n in ref}
            f.write(json.dumps({"case": case, "errors": errors}) + "\n")
    for name in ref:
        assert got[name].dtype in (torch.float32, torch.bfloat16, torch.float64), name
        assert_close(f"{case} {name}", ref[name], got[name], **tolerance(name, dtype, target))


# Every combination at T=100; the paper-default switches (clip, output gates) also at T=37, shorter than a chunk.
CASES = [(c, 100) for c in COMBOS] + [(c, 37) for c in COMBOS if c[2] == "clip" and c[3]]


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("combo, T", CASES, ids=[f"{combo_id(c)}-T{T}" for c, T in CASES])
@pytest.mark.parametrize("backend", gpu_backends())
def test_backend_matches_naive(backend, combo, T, dtype):
    got = run_case(leaves(make_inputs(T=T), DTYPES[dtype]), backend, combo)
    check(f"{backend}-{combo_id(combo)}-{dtype}-T{T}", reference(combo, T, dtype), got, DTYPES[dtype], combo[2])


@pytest.mark.parametrize("combo", [c for c in COMBOS if c[2] == "clip" and c[3]], ids=combo_id)
@pytest.mark.parametrize("backend", [b for b in gpu_backends() if b in ("fla", "triton")])
def test_packed_sequences_match_naive_per_sequence(backend, combo):
    """Packed sequences (one of a single token, one longer than two chunks): outputs, final states and every
    gradient against the naive recurrence run on each sequence alone."""
    lengths = [70, 1, 129, 33]
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda")
    master = make_inputs(B=1, T=sum(lengths), N=len(lengths))
    got = run_case(leaves(master, torch.bfloat16), backend, combo, cu_seqlens=cu)
    ref = run_case(leaves(rounded(master, torch.bfloat16), torch.float64), "naive", combo, cu_seqlens=cu)
    check(f"{backend}-{combo_id(combo)}-packed", ref, got, torch.bfloat16)


def test_auto_picks_a_gpu_backend_and_names_it():
    from rla_ablate.ops import select_backend

    x = torch.zeros(1, 8, 1, 16, device="cuda", dtype=torch.bfloat16)
    name = select_backend(x, "auto")
    assert name in ("triton", "fla"), name


@pytest.mark.parametrize("fit", ["residual", "none"])
def test_triton_splits_a_long_sequence_over_segments_as_the_unsplit_pass(fit, monkeypatch):
    """B = 1 and 20,000 tokens on the triton backend: 64 programs per state pass, so every pass (S, R, dR, dS) cuts
    the sequence into segments of 8,192 tokens that run side by side (`run_state_pass`); outputs, final states and
    every gradient agree with the one sequential pass (the unsplit path, tested against naive above) to bf16
    rounding: the carries between segments are summed in fp32 in another order."""
    import rla_ablate.ops.triton.rla as fused

    master = make_inputs(B=1, T=20_000)
    combo = ("additive", fit, "clip", True)
    layout = fused.Layout.batched(1, 20_000, fused.CHUNK, torch.device("cuda"))
    assert fused._segments(layout, 64, fused.CHUNK, "cuda") is not None  # the default rule splits this call
    split = run_case(leaves(master, torch.bfloat16), "triton", combo)
    monkeypatch.setattr(fused, "SPLIT", fused.SplitRule(programs=0))
    whole = run_case(leaves(master, torch.bfloat16), "triton", combo)
    for name, want in whole.items():  # tighter than bf16's 3e-2 against naive: the same kernels on both sides
        assert torch.isfinite(split[name]).all(), name
        assert_close(f"triton-split-{fit} {name}", want.double(), split[name], ratio=1e-2, atol=1e-3)


@pytest.mark.parametrize("T", [2048, 20_000], ids=["T2048", "T20000-split"])
@pytest.mark.parametrize("switch,other", [("RESIDUAL_IN_S_PASS", False), ("END_TERM_IN_PASS", False),
                                          ("GATES_MADE_ONCE", False), ("NARROW_BELOW", 0), ("READ_AHEAD", 1),
                                          ("READ_AHEAD", 2), ("READ_AHEAD", 0), ("END_TERM_ROWS", True)])
def test_triton_rla_design_switches_give_the_same_numbers(switch, other, T, monkeypatch):
    """RLA's design switches as they run and at their other setting (what benchmarks/kernels.py times): the forward's
    residuals made inside S's pass (`_s_pass_residual`) or in a kernel of their own (`_fwd_residual`); dg's chunk end
    terms stored by the reverse state passes from their fp32 states or made by the dq/dk kernel from the stored
    bf16 tiles; the passes' gates made once or in each pass's loop; the passes at 64 x 64 tiles where they have
    fewer than two programs per SM (at T=2048: 2 x 16 heads) or at their default tiles; the passes' reads in each
    chunk, or one chunk ahead (as `AheadRule` picks for each pass, or in every pass all but the dots' key tiles, or
    all); dg's end
    terms a value per state tile or per row of one. Outputs, final states and every gradient agree to bf16 rounding
    (a split pass too)."""
    import rla_ablate.ops.triton.rla as fused

    master = make_inputs(B=2 if T == 2048 else 1, T=T)
    combo = ("additive", "residual", "clip", True)
    on = run_case(leaves(master, torch.bfloat16), "triton", combo)
    monkeypatch.setattr(fused, switch, other)
    changed = run_case(leaves(master, torch.bfloat16), "triton", combo)
    for name, want in changed.items():
        assert torch.isfinite(on[name]).all(), name
        assert_close(f"triton-{switch}-T{T} {name}", want.double(), on[name], ratio=1e-2, atol=1e-3)


@pytest.mark.parametrize("change,fit,target", [
    ("one_function", "residual", "clip"), ("one_function", "residual", "tanh"),
    ("one_function", "residual", "identity"), ("residual_in_reads", "residual", "clip"), ("residual_in_reads", "residual", "tanh"),
    ("residual_in_reads", "residual", "identity"), ("wy", "residual", "clip"), ("wy", "residual", "identity"),
    ("wy", "none", "clip"), ("GATES_MADE_ONCE", "residual", "clip"), ("GATES_MADE_ONCE", "none", "clip"),
    ("READ_AHEAD", "residual", "clip"), ("READ_AHEAD", "none", "clip")])
def test_triton_rdn_design_switches_give_the_same_numbers(change, fit, target, monkeypatch):
    """RDN's design switches, as they run and as benchmarks/kernels.py times them against: both recurrences in one
    Function on our kernels (`rdn.ResidualDelta`) or the auxiliary pass apart on FLA's (`one_function`); the residual
    made by the base pass's read kernel (its gradient turned into dv and dp by the local kernel) or by the glue's kernels from
    the prediction (`residual_in_reads`; dp is now rounded to bf16 once more); the WY step's backward on our kernel,
    which adds the base pass's fp32 dk and the residual's dv before its stores, or FLA's prepare_wy_repr_bwd with
    PyTorch's additions after it (`wy`); the state passes' gates made once or in each pass's loop
    (`rdn.GATES_MADE_ONCE`); the passes' reads in each chunk or one chunk ahead (`rdn.READ_AHEAD` 1). Outputs, final
    states and every gradient agree to bf16 rounding."""
    from dataclasses import replace

    from rla_ablate.ops.triton import backend, rdn

    master = make_inputs(B=2, T=1000)
    combo = ("delta", fit, target, True)
    on = run_case(leaves(master, torch.bfloat16), "triton", combo)
    if change == "GATES_MADE_ONCE":
        monkeypatch.setattr(rdn, change, False)
    elif change == "READ_AHEAD":
        monkeypatch.setattr(rdn, change, 1)
    else:
        # residual_in_reads is a switch of the passes apart (the one Function always makes the residual in its reads)
        changes = {"one_function": dict(one_function=not backend.RDN.one_function),
                   "residual_in_reads": dict(residual_in_reads=False, one_function=False)}
        monkeypatch.setattr(backend, "RDN", replace(backend.RDN, **changes.get(change, {change: rdn.FLA_WY_FLA_BWD})))
    off = run_case(leaves(master, torch.bfloat16), "triton", combo)
    for name, want in off.items():
        assert torch.isfinite(on[name]).all(), name
        assert_close(f"triton-rdn-{change}-{fit}-{target} {name}", want.double(), on[name], ratio=1e-2, atol=1e-3)


@pytest.mark.parametrize("packed", [False, True], ids=["batched", "packed"])
def test_rdn_auxiliary_pass_keeping_its_states_matches_fla_recomputing_them(packed):
    """RDN's auxiliary recurrence on the triton backend (`rdn.DeltaKeepStates`: FLA's kernels, w, h and v_new kept
    from the forward) against FLA's chunk_gated_delta_rule (which recomputes them in its backward) on the same bf16
    inputs: output, final state and every gradient, initial state included, to bf16 rounding (FLA's backward
    recomputes w from A by another kernel than the forward's fused one, so the two may differ in the last bits)."""
    from rla_ablate.ops.fla_backend import FLA_KERNELS
    from rla_ablate.ops.triton import rdn

    lengths = [70, 1, 129, 33] if packed else None
    B, T = (1, sum(lengths)) if packed else (2, 100)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda") if packed else None
    master = make_inputs(B=B, T=T, N=len(lengths) if packed else None)
    results = []
    for kernel in (FLA_KERNELS.delta, rdn.delta_keep_states):
        x = leaves(master, torch.bfloat16)
        g32 = x["g"].float()
        o, R_T = kernel(x["q"], x["k"], x["v"], g32, x["gamma"], 128 ** -0.5, x["R0"], cu)
        gen = torch.Generator(device="cuda").manual_seed(7)
        up_o = torch.randn(o.shape, generator=gen, device="cuda")
        up_R = torch.randn(R_T.shape, generator=gen, device="cuda")
        loss = (o.float() * up_o).sum() + (R_T.float() * up_R).sum()
        names = ("q", "k", "v", "g", "gamma", "R0")
        grads = torch.autograd.grad(loss, [x[n] for n in names])
        results.append({"o": o, "R_T": R_T} | {f"d{n}": gr for n, gr in zip(names, grads)})
    fla, kept = results
    for name, want in fla.items():
        assert torch.isfinite(kept[name]).all(), name
        assert kept[name].dtype == want.dtype, name
        assert_close(f"rdn-aux-{'packed' if packed else 'batched'} {name}", want.double(), kept[name], ratio=1e-2,
                     atol=1e-3)
