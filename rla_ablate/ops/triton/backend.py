"""The `triton` backend: RLA on our fused kernels (`rla`), RDN on our one-pass base (`rdn`) + FLA.

rule="additive" with fit "residual" or "none" runs `rla` (our own kernels: plain state passes plus parallel
residual, output and gradient kernels) for bf16/fp16 heads up to 128 wide (`rla.covers`); fit="off" is the
baseline itself (FLA's chunk_simple_gla / chunk_gated_delta_rule). rule="delta" with a residual path (bf16/fp16,
heads up to 128: `rdn.covers`) takes the `fla` composition with its base pass replaced by `rdn`'s (the delta rule
run once and read twice, instead of FLA's kernel over a shifted [q; k] double batch); the auxiliary recurrence stays
on FLA's kernels, its chunk states kept for the backward (`rdn.DeltaKeepStates`), its q and k gradients added by the
base pass's backward kernel (`rdn.GradientMail`). With `RDN.one_function` (off: slower on an H100,
docs/RESULTS.md) fit residual runs both recurrences on `rdn`'s kernels in one Function instead (`rdn.ResidualDelta`:
one dq/dk kernel for both passes). Everything else (fp32, wider heads) takes the composition as it is, with the glue
fused (`glue`).

"auto" picks it first for both rules: on the H200 every fit x target x gates case of each rule has passed, bf16 on
our kernels and fp32 on the composition, and the models' GPU tests with it (docs/RESULTS.md, "Correctness on the
H200").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from rla_ablate.ops import _per_sequence, register_backend
from rla_ablate.ops.chunk import chunk_residual_attention
from rla_ablate.ops.fla_backend import FLA_KERNELS, BaseKernels, DeltaKernel, compose_residual_attention, fla_available
from rla_ablate.ops.spec import ResidualSpec, check_packed_batch
from rla_ablate.ops.triton import rdn
from rla_ablate.ops.triton.glue import TRITON_GLUE
from rla_ablate.ops.triton.rla import chunks_fit_grid, covers, rla_triton

# The implementations behind the `triton` backend, each for the inputs it covers.
NO_TOKENS = "chunk"              # no tokens: no chunk for a kernel to read (their chunk lists are empty)
RLA_FUSED = "rla-fused"          # RLA: every pass on the fused kernels of triton.rla
RDN_FUSED = "rdn-fused"          # RDN, fit residual: both recurrences on triton.rdn, in one Function
RDN_READS = "rdn-reads+fla"      # RDN: the base pass's two reads on triton.rdn, the auxiliary pass on FLA's kernels
FLA_GLUE = "fla+glue"            # everything else: FLA's kernels composed with the fused Triton glue


@dataclass(frozen=True)
class RDNPasses:
    """How RDN_READS runs the auxiliary recurrence: its delta kernel (`rdn.delta_keep_states`, or FLA's own Function,
    which recomputes the chunk states in its backward) and whether its q, k gradients go to the base pass's backward
    through a `rdn.GradientMail` (the auxiliary kernel must then take `mail=`); and whether the base pass's read
    kernel makes the residual (`rdn.DeltaTwoReads`, residual) or hands the prediction to the glue; and the base
    pass's WY step (`rdn.FLA_WY`: FLA's forward, our backward). benchmarks/rdn_aux.py and benchmarks/kernels.py swap
    `RDN`."""

    auxiliary: DeltaKernel = rdn.delta_keep_states
    mail: bool = True
    residual_in_reads: bool = True  # False: the prediction out, the residual by the glue (benchmarks/kernels.py)
    wy: rdn.WY = rdn.FLA_WY  # rdn.FLA_WY_FLA_BWD: FLA's WY backward and PyTorch's additions (benchmarks/kernels.py)
    # fit residual: both recurrences in one Function on our kernels (`rdn.ResidualDelta`: one dq/dk kernel and the
    # WY backwards chained for both); False: the auxiliary pass apart, on FLA's kernels (the fields above)
    one_function: bool = False


RDN = RDNPasses()


def implementation(q: torch.Tensor, v: torch.Tensor, spec: ResidualSpec, cu_seqlens: torch.Tensor | None = None) -> str:
    """Which implementation the `triton` backend runs for these inputs (one of the constants above)."""
    if q.shape[0] * q.shape[1] == 0:
        return NO_TOKENS
    B, T, H = q.shape[:3]
    fits = chunks_fit_grid(B * T, B if cu_seqlens is None else cu_seqlens.numel() - 1, H)
    if fits and covers(q, v, spec):
        return RLA_FUSED
    if not (fits and rdn.covers(q, v, spec)):
        return FLA_GLUE
    return RDN_FUSED if RDN.one_function and spec.fit == "residual" else RDN_READS


def triton_residual_attention(q, k, v, g, beta, gamma, spec: ResidualSpec, scale: float, initial_state,
                              cu_seqlens: torch.Tensor | None = None):
    """The `triton` backend (signature of `naive_residual_attention`, plus FLA-style `cu_seqlens`)."""
    impl = implementation(q, v, spec, cu_seqlens)
    if impl == NO_TOKENS:
        if cu_seqlens is None:
            return chunk_residual_attention(q, k, v, g, beta, gamma, spec, scale, initial_state)
        return _per_sequence(chunk_residual_attention, q, k, v, g, beta, gamma, spec, scale, initial_state, cu_seqlens)
    if impl == RLA_FUSED:
        return rla_triton(q, k, v, g, beta, gamma, spec, scale, initial_state, cu_seqlens)
    if impl == RDN_FUSED:
        return rdn_one_function(q, k, v, g, beta, gamma, spec, scale, initial_state, cu_seqlens)
    if impl == RDN_READS:
        # one mail per call: the auxiliary pass's q, k gradients go to the base pass's dq/dk kernel (rdn.GradientMail)
        mail = rdn.GradientMail() if RDN.mail and spec.fit == "residual" else None  # fit none: no auxiliary pass
        auxiliary = partial(RDN.auxiliary, mail=mail) if mail is not None else RDN.auxiliary
        # fit residual: the read kernel makes the residual itself (the prediction stays inside the base pass)
        residual = (spec.target, spec.clip) if RDN.residual_in_reads and spec.fit == "residual" else None
        return compose_residual_attention(BaseKernels(additive=FLA_KERNELS.additive, delta=auxiliary), q, k, v, g, beta,
                                          gamma, spec, scale, initial_state, cu_seqlens, glue=TRITON_GLUE,
                                          base_reads=partial(rdn.delta_two_reads, mail=mail, residual=residual,
                                                             wy=RDN.wy),
                                          reads_residual=residual is not None)
    return compose_residual_attention(FLA_KERNELS, q, k, v, g, beta, gamma, spec, scale, initial_state, cu_seqlens,
                                      glue=TRITON_GLUE)


def rdn_one_function(q, k, v, g, beta, gamma, spec: ResidualSpec, scale: float, initial_state,
                     cu_seqlens: torch.Tensor | None = None, wy: rdn.WY | None = None, chunk: int = rdn.CHUNK):
    """RDN with fit residual, both recurrences in `rdn.ResidualDelta`, the output gate's sum by the fused glue.
    wy: the WY step (`RDN.wy` when None; the interpreter's tests pass the PyTorch forward)."""
    check_packed_batch(q.shape[0], cu_seqlens)
    S0, R0 = initial_state if initial_state is not None else (None, None)
    g32 = g.float()
    base, corr, S_T, R_T = rdn.residual_delta(q, k, v, g32, beta, gamma.to(q.dtype), S0, R0, scale,
                                              (spec.target, spec.clip), cu_seqlens, wy=wy or RDN.wy, chunk=chunk)
    return TRITON_GLUE.output(base, corr, g32, gamma, spec.output_gates, q.dtype), (S_T, R_T)


register_backend("triton", triton_residual_attention, fla_available, cuda_rank=0, varlen=True,
                 auto_rules=("additive", "delta"), implementation=implementation)
