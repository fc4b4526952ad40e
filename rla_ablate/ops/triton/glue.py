"""The composition's elementwise glue as fused Triton kernels (the `triton` backend's `TRITON_GLUE`).

The `fla` composition's glue, about twenty fp32/bf16 passes over [B, T, H, V] between and after the recurrences in
PyTorch (docs/RESULTS.md), is two kernels here, each with its backward:

    residual:  w_t = gamma_t T(v_t - S_{t-1} k_t)   (or r_t alone for the delta rule, whose kernel takes gamma)
    output:    o_t = alpha_t S_{t-1} q_t + gamma_t R_t q_t   (or the ungated sum)

Both read the base reads where they lie (strided [B, T, H, V] views, no copies), compute in fp32 and write each
result once, in its input's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rla_ablate.ops.fla_backend import Glue
from rla_ablate.ops.spec import ResidualSpec
from rla_ablate.ops.triton.common import TARGET_CODES, _target, _target_slope

BLOCK_ROWS = 16


@triton.jit
def _row_offsets(rows, T, H, s_b, s_t, s_h):
    # rows enumerate (b, t, h) of a [B, T, H, V] tensor; strides in elements.
    b = rows // (T * H)
    t = (rows // H) % T
    h = rows % H
    return b.to(tl.int64) * s_b + t.to(tl.int64) * s_t + h.to(tl.int64) * s_h


@triton.jit
def _residual_fwd(v, pred, gamma, w, R, T, H, V, c,
                  sv_b, sv_t, sv_h, sp_b, sp_t, sp_h,
                  TARGET: tl.constexpr, SCALE: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BV)
    mask = (rows < R)[:, None] & (cols < V)[None, :]
    off_v = _row_offsets(rows, T, H, sv_b, sv_t, sv_h)[:, None] + cols[None, :]
    off_p = _row_offsets(rows, T, H, sp_b, sp_t, sp_h)[:, None] + cols[None, :]
    x = tl.load(v + off_v, mask=mask, other=0.0).to(tl.float32) - tl.load(pred + off_p, mask=mask, other=0.0).to(tl.float32)
    y = _target(x, c, TARGET)
    if SCALE:
        y = y * tl.load(gamma + rows, mask=rows < R, other=0.0).to(tl.float32)[:, None]
    off_w = rows.to(tl.int64)[:, None] * V + cols[None, :]
    tl.store(w + off_w, y.to(w.dtype.element_ty), mask=mask)


def residual_fwd(grid, *, v, pred, gamma, w, R, T, H, V, c, sv_b, sv_t, sv_h, sp_b, sp_t, sp_h, TARGET, SCALE, BR, BV,
                 **options):
    """`_residual_fwd` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _residual_fwd[grid](v, pred, gamma, w, R, T, H, V, c, sv_b, sv_t, sv_h, sp_b, sp_t, sp_h, TARGET=TARGET,
                        SCALE=SCALE, BR=BR, BV=BV, **options)


@triton.jit
def _residual_bwd(dw, v, pred, gamma, dv, dpred, dgamma, R, T, H, V, c,
                  sv_b, sv_t, sv_h, sp_b, sp_t, sp_h,
                  TARGET: tl.constexpr, SCALE: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BV)
    mask = (rows < R)[:, None] & (cols < V)[None, :]
    off_v = _row_offsets(rows, T, H, sv_b, sv_t, sv_h)[:, None] + cols[None, :]
    off_p = _row_offsets(rows, T, H, sp_b, sp_t, sp_h)[:, None] + cols[None, :]
    off_w = rows.to(tl.int64)[:, None] * V + cols[None, :]
    x = tl.load(v + off_v, mask=mask, other=0.0).to(tl.float32) - tl.load(pred + off_p, mask=mask, other=0.0).to(tl.float32)
    g_out = tl.load(dw + off_w, mask=mask, other=0.0).to(tl.float32)
    if SCALE:
        gam = tl.load(gamma + rows, mask=rows < R, other=0.0).to(tl.float32)
        tl.store(dgamma + rows, tl.sum(g_out * _target(x, c, TARGET), axis=1), mask=rows < R)
        g_out = g_out * gam[:, None]
    dx = g_out * _target_slope(x, c, TARGET)
    tl.store(dv + off_w, dx.to(dv.dtype.element_ty), mask=mask)
    tl.store(dpred + off_w, (-dx).to(dpred.dtype.element_ty), mask=mask)


def residual_bwd(grid, *, dw, v, pred, gamma, dv, dpred, dgamma, R, T, H, V, c, sv_b, sv_t, sv_h, sp_b, sp_t, sp_h,
                 TARGET, SCALE, BR, BV, **options):
    """`_residual_bwd` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _residual_bwd[grid](dw, v, pred, gamma, dv, dpred, dgamma, R, T, H, V, c, sv_b, sv_t, sv_h, sp_b, sp_t, sp_h,
                        TARGET=TARGET, SCALE=SCALE, BR=BR, BV=BV, **options)


@triton.jit
def _output_fwd(base, corr, g, gamma, o, R, T, H, V,
                sb_b, sb_t, sb_h, sc_b, sc_t, sc_h,
                GATES: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BV)
    mask = (rows < R)[:, None] & (cols < V)[None, :]
    x = tl.load(base + _row_offsets(rows, T, H, sb_b, sb_t, sb_h)[:, None] + cols[None, :], mask=mask, other=0.0)
    y = tl.load(corr + _row_offsets(rows, T, H, sc_b, sc_t, sc_h)[:, None] + cols[None, :], mask=mask, other=0.0)
    x, y = x.to(tl.float32), y.to(tl.float32)
    if GATES:
        alpha = tl.exp(tl.load(g + rows, mask=rows < R, other=0.0).to(tl.float32))
        gam = tl.load(gamma + rows, mask=rows < R, other=0.0).to(tl.float32)
        out = alpha[:, None] * x + gam[:, None] * y
    else:
        out = x + y
    tl.store(o + rows.to(tl.int64)[:, None] * V + cols[None, :], out.to(o.dtype.element_ty), mask=mask)


def output_fwd(grid, *, base, corr, g, gamma, o, R, T, H, V, sb_b, sb_t, sb_h, sc_b, sc_t, sc_h, GATES, BR, BV,
               **options):
    """`_output_fwd` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _output_fwd[grid](base, corr, g, gamma, o, R, T, H, V, sb_b, sb_t, sb_h, sc_b, sc_t, sc_h, GATES=GATES, BR=BR,
                      BV=BV, **options)


@triton.jit
def _output_bwd(do, base, corr, g, gamma, dbase, dcorr, dg, dgamma, R, T, H, V,
                sb_b, sb_t, sb_h, sc_b, sc_t, sc_h,
                GATES: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BV)
    mask = (rows < R)[:, None] & (cols < V)[None, :]
    off = rows.to(tl.int64)[:, None] * V + cols[None, :]
    d = tl.load(do + off, mask=mask, other=0.0).to(tl.float32)
    if GATES:
        x = tl.load(base + _row_offsets(rows, T, H, sb_b, sb_t, sb_h)[:, None] + cols[None, :], mask=mask, other=0.0)
        y = tl.load(corr + _row_offsets(rows, T, H, sc_b, sc_t, sc_h)[:, None] + cols[None, :], mask=mask, other=0.0)
        alpha = tl.exp(tl.load(g + rows, mask=rows < R, other=0.0).to(tl.float32))
        gam = tl.load(gamma + rows, mask=rows < R, other=0.0).to(tl.float32)
        tl.store(dg + rows, alpha * tl.sum(d * x.to(tl.float32), axis=1), mask=rows < R)
        tl.store(dgamma + rows, tl.sum(d * y.to(tl.float32), axis=1), mask=rows < R)
        tl.store(dbase + off, (d * alpha[:, None]).to(dbase.dtype.element_ty), mask=mask)
        tl.store(dcorr + off, (d * gam[:, None]).to(dcorr.dtype.element_ty), mask=mask)
    else:
        tl.store(dbase + off, d.to(dbase.dtype.element_ty), mask=mask)
        tl.store(dcorr + off, d.to(dcorr.dtype.element_ty), mask=mask)


def output_bwd(grid, *, do, base, corr, g, gamma, dbase, dcorr, dg, dgamma, R, T, H, V, sb_b, sb_t, sb_h, sc_b, sc_t,
               sc_h, GATES, BR, BV, **options):
    """`_output_bwd` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _output_bwd[grid](do, base, corr, g, gamma, dbase, dcorr, dg, dgamma, R, T, H, V, sb_b, sb_t, sb_h, sc_b, sc_t,
                      sc_h, GATES=GATES, BR=BR, BV=BV, **options)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dimension is contiguous (the kernels take any other strides), else a contiguous copy:
    a model's short convolution, for one, hands over v as a transposed [B, D, T] buffer."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides(x: torch.Tensor, name: str) -> dict[str, int]:
    """The kernels' stride parameters of x, `name`_b, `name`_t, `name`_h (in elements)."""
    assert x.stride(-1) == 1, "pass the tensor through _rows first"
    return {f"{name}_b": x.stride(0), f"{name}_t": x.stride(1), f"{name}_h": x.stride(2)}


def _row_blocks(R: int, V: int) -> tuple[tuple[int], dict[str, int]]:
    """Grid and tiles of a glue kernel: BLOCK_ROWS of the R rows (b, t, h) per program, the whole V in one tile."""
    return (triton.cdiv(R, BLOCK_ROWS),), dict(BR=BLOCK_ROWS, BV=triton.next_power_of_2(V))


class FusedResidual(torch.autograd.Function):
    """w = gamma * T(v - pred) (gamma may be None), fp32 inside, v's dtype out; v, pred [B, T, H, V] (strided)."""

    @staticmethod
    def forward(ctx, v, pred, gamma, target: str, clip: float):
        B, T, H, V = v.shape
        R = B * T * H
        v, pred = _rows(v), _rows(pred)
        gamma_c = gamma.contiguous() if gamma is not None else v.new_empty(1)
        w = torch.empty(B, T, H, V, dtype=v.dtype, device=v.device)
        grid, tiles = _row_blocks(R, V)
        residual_fwd(grid, v=v, pred=pred, gamma=gamma_c, w=w, R=R, T=T, H=H, V=V, c=float(clip), **_strides(v, "sv"),
                     **_strides(pred, "sp"), TARGET=TARGET_CODES[target], SCALE=gamma is not None, **tiles)
        ctx.save_for_backward(v, pred, gamma_c)
        ctx.has_gamma, ctx.target, ctx.clip = gamma is not None, target, float(clip)
        return w

    @staticmethod
    def backward(ctx, dw):
        v, pred, gamma_c = ctx.saved_tensors
        B, T, H, V = v.shape
        R = B * T * H
        # each gradient written once, in its input's dtype (computed in fp32)
        dv = torch.empty(B, T, H, V, dtype=v.dtype, device=v.device)
        dpred = torch.empty(B, T, H, V, dtype=pred.dtype, device=v.device)
        dgamma = torch.empty(B, T, H, dtype=torch.float32, device=v.device) if ctx.has_gamma else dv.new_empty(1)
        grid, tiles = _row_blocks(R, V)
        residual_bwd(grid, dw=dw.contiguous(), v=v, pred=pred, gamma=gamma_c, dv=dv, dpred=dpred, dgamma=dgamma, R=R,
                     T=T, H=H, V=V, c=ctx.clip, **_strides(v, "sv"), **_strides(pred, "sp"),
                     TARGET=TARGET_CODES[ctx.target], SCALE=ctx.has_gamma, **tiles)
        return dv, dpred, dgamma.to(gamma_c.dtype) if ctx.has_gamma else None, None, None


class FusedOutput(torch.autograd.Function):
    """o = exp(g) * base + gamma * corr (gates) or base + corr; base, corr [B, T, H, V] (strided), g, gamma [B, T, H]."""

    @staticmethod
    def forward(ctx, base, corr, g, gamma, gates: bool, dtype):
        B, T, H, V = base.shape
        R = B * T * H
        base, corr = _rows(base), _rows(corr)
        g_c, gamma_c = g.contiguous(), gamma.contiguous()
        o = torch.empty(B, T, H, V, dtype=dtype, device=base.device)
        grid, tiles = _row_blocks(R, V)
        output_fwd(grid, base=base, corr=corr, g=g_c, gamma=gamma_c, o=o, R=R, T=T, H=H, V=V, **_strides(base, "sb"),
                   **_strides(corr, "sc"), GATES=bool(gates), **tiles)
        ctx.save_for_backward(base, corr, g_c, gamma_c)
        ctx.gates = bool(gates)
        return o

    @staticmethod
    def backward(ctx, do):
        base, corr, g_c, gamma_c = ctx.saved_tensors
        B, T, H, V = base.shape
        R = B * T * H
        dbase = torch.empty(B, T, H, V, dtype=base.dtype, device=base.device)
        dcorr = torch.empty(B, T, H, V, dtype=corr.dtype, device=base.device)
        dg = torch.zeros(B, T, H, dtype=torch.float32, device=base.device)
        dgamma = torch.zeros_like(dg)
        grid, tiles = _row_blocks(R, V)
        output_bwd(grid, do=do.contiguous(), base=base, corr=corr, g=g_c, gamma=gamma_c, dbase=dbase, dcorr=dcorr,
                   dg=dg, dgamma=dgamma, R=R, T=T, H=H, V=V, **_strides(base, "sb"), **_strides(corr, "sc"),
                   GATES=ctx.gates, **tiles)
        return (dbase, dcorr, dg.to(g_c.dtype) if ctx.gates else None,
                dgamma.to(gamma_c.dtype) if ctx.gates else None, None, None)


def _fused_residual(v, pred, gamma, spec: ResidualSpec):
    return FusedResidual.apply(v, pred, gamma, spec.target, spec.clip)


def _fused_output(base_read, corr, g32, gamma, output_gates: bool, dtype):
    return FusedOutput.apply(base_read, corr, g32, gamma, output_gates, dtype)


TRITON_GLUE = Glue(residual=_fused_residual, output=_fused_output)
