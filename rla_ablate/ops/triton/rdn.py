"""RDN's base recurrence (the gated delta rule) read twice at the old state, in one pass: our kernels + FLA's WY step.

RDN needs, per token, two reads of the *old* base state: the prediction p_t = S_{t-1} k_t (the residual's) and the
base output scale * S_{t-1} q_t. The `fla` composition gets them by running FLA's whole delta-rule kernel over 2B
sequences ([q; k] as queries on a one-slot-shifted copy), so the base recurrence, its WY step and its backward run
twice. Here the recurrence runs once and both reads come out of it (docs/MATH.md "RDN's base pass"):

    WY step   (FLA's fused kkt + solve_tril + recompute_w_u on the GPU; `TORCH_WY` for tests): per chunk of BT
              tokens, A = (I + strict_lower(beta_t exp(b_t - b_s) k_t . k_s))^-1, w = A (beta exp(b) k), u = A (beta v),
              so that the delta rule's effective writes are u_t - w_t S_c^T (S_c: the state where the chunk starts)
    gates     b for every token, once (`made_gates`): the two state passes read it instead of making it per chunk
    forward   S pass (sequential over chunks; one BV x K fp32 tile per program, as FLA's chunk_fwd_h):
                  n = u - w S_c^T (stored: the writes),   S_{c+1} = exp(b_L) S_c + (n * exp(b_L - b))^T k
              reads (parallel): with D = exp(b'_t - b_s)[s < t] (b' = b - g: the decay to S_{t-1}),
                  p = exp(b') k S_c^T + (k k^T * D) n           (fp32: it defines the residual)
                  B = scale (exp(b') q S_c^T + (q k^T * D) n)   (the inputs' dtype)
              and, with fit residual, the residual r = T(v - p) itself in v's dtype (the prediction stays here;
              kept for the backward: the clip's slope as a byte, tanh's x = v - p in fp32, nothing for the identity)
    backward  local (parallel): the writes' gradient from the later reads of their own chunk,
                  dn_loc = (k q^T * D^T) scale dB + (k k^T * D^T) dp
              (with the residual made here, first dv = dr T'(x) and dp = -dv, stored for the kernels below in the
              inputs' dtype)
              dS pass (sequential, reverse): dn = dn_loc + exp(b_L - b) k dS_{c+1}^T (stored), and
                  dS_c = exp(b_L) dS_{c+1} + (exp(b') scale dB)^T q + (exp(b') dp)^T k - dn^T w
              gradients (parallel, K tiles): dq, dk (as the reads' queries, as the keys of the reads and of the
                  chunk-end write), dw = -dn S_c, and per token the d/db terms of reads and writes
              WY step backward (`_wy_bwd`, one program a chunk): from dw, du = dn to dk, dv, dbeta and dg, adding the
                  dk above (fp32) and the residual's dv before the one store of each.

dg: the reads and writes follow docs/MATH.md's identity (reads at b' minus writes, a reverse cumsum over the
sequence); the WY step's own dependence on the gates comes back from it already as a gradient of g.
Chunk states, writes and gradients of writes are kept in the inputs' dtype (as FLA does), running states and
accumulations in fp32. The auxiliary recurrence (R) needs only the ordinary inclusive read R_t q_t: it stays FLA's
chunk_gated_delta_rule, called by the composition in `fla_backend`; or, with the backend's `RDN.one_function`, it
runs on these kernels in one Function with the base pass (`ResidualDelta`: one dq/dk kernel for both; slower on an
H100, docs/RESULTS.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from rla_ablate.ops.triton.common import (CHUNK, G_FLOOR, MAX_HEAD_DIM, MIN_TILE, TARGET_CODES, Layout, _chunk_gates,
                                          _chunk_rows, _chunk_tile, _decay, _keep_for_slope, _pass_chunk,
                                          _pass_program, _pass_tokens, _target, _times_kept_slope, gate_gradient,
                                          launch_options, made_gates)

LAUNCH = {
    "pass": dict(BV=64, num_warps=4),  # the two state passes hold a BV x K fp32 tile
    # the dS pass loads seven chunk tiles: three pipeline stages need 238 KB of shared memory (H200: 232 KB)
    "bwd_pass": dict(BV=64, num_warps=4, num_stages=2),
    "reads": dict(BV=64, num_warps=4),
    "local": dict(BV=64, num_warps=4),
    "dqk": dict(BK=64, num_warps=4),  # its V tile is the whole V
    # the same kernel for both recurrences (`ResidualDelta`): at 4 warps it spills (H100, the 100M layer: 1.41 ms)
    "dqk_both": dict(BK=64, num_warps=8),
    "wy_bwd": dict(BK=64, BV=64, num_warps=4),  # one program a chunk and head, looping over K and V tiles
}
FLOOR = float(G_FLOOR.value)
# The two state passes read the gates' chunk-local cumsum made once by a small kernel (`made_gates`), as RLA's do,
# instead of a scan and a sum (a barrier each) per chunk on their sequential path; False: each pass makes them in its
# loop (benchmarks/kernels.py --rdn-gates-in-pass times the two). Read by the forward, kept for its backward.
GATES_MADE_ONCE = True
# What the two state passes' chunks read is loaded one chunk ahead (`_delta_fwd_pass`, AHEAD), as RLA's
# `READ_AHEAD`: 0 none (each chunk loads its own), 1 all but the key tiles that feed a dot as loaded, 2 all
# (benchmarks/kernels.py --rdn-read-ahead times 1). Read by the forward, kept for its backward.
READ_AHEAD = 0


@triton.jit
def _fwd_reads(k, w, u, g, bos, eos, c, h, rk, rv, mk, mv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BT: tl.constexpr, MADE: tl.constexpr):
    """What chunk c of S's pass reads besides the state: the gates (`_pass_chunk`), u's tile (fp32), w's and k's."""
    mt, tok, m_tk, m_tv, b, bp, b_L = _pass_chunk(g, bos, eos, c, h, mk, mv, H, BT, MADE)
    b_u = tl.load(u + tok[:, None] * V + rv[None, :], mask=m_tv, other=0.0).to(tl.float32)
    b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    b_w = tl.load(w + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0).to(b_k.dtype)
    return b, b_L, b_u, b_k, b_w


@triton.jit
def _delta_fwd_pass(k, w, u, g, S0, hS, N_, ST, cu, coff,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, HAS_S0: tl.constexpr, MADE: tl.constexpr, AHEAD: tl.constexpr):
    """S over the chunks of one sequence and head (grid V tiles x sequences*heads): stores S_c where each chunk
    starts (hS), the writes n = u - w S_c^T (N_) and the final state (ST, fp32). MADE: g holds the gates made once
    (`made_gates`: b, read by `_pass_chunk`), not the raw g. AHEAD (`READ_AHEAD`): a chunk's reads (`_fwd_reads`)
    one chunk ahead, while the chunk before is multiplied; 1 all but the k and w tiles (which feed a dot as they
    are loaded), 2 all, 0 none."""
    h, bos, eos, c0, rk, rv, mk, mv, m_state, o_state, o_seq, S = _pass_program(
        cu, coff, S0, 0, tl.program_id(0), tl.program_id(1), H, K, V, BK, BV, HAS_S0)
    NC = tl.cdiv(eos - bos, BT)
    if AHEAD > 0:
        n_b, n_bL, n_u, n_k, n_w = _fwd_reads(k, w, u, g, bos, eos, 0, h, rk, rv, mk, mv, H, K, V, BT, MADE)
    for c in range(NC):
        tl.store(hS + ((c0 + c) * H + h) * V * K + o_state, S.to(hS.dtype.element_ty), mask=m_state)
        _, tok, m_tk, m_tv = _pass_tokens(bos, eos, c, h, mk, mv, H, BT)
        if AHEAD > 0:
            b, b_L, b_u, b_k, b_w = n_b, n_bL, n_u, n_k, n_w
            n_b, n_bL, n_u, n_k, n_w = _fwd_reads(k, w, u, g, bos, eos, tl.minimum(c + 1, NC - 1), h, rk, rv, mk, mv,
                                                  H, K, V, BT, MADE)  # the last chunk reads itself again
            if AHEAD == 1:
                b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
                b_w = tl.load(w + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0).to(b_k.dtype)
        else:
            b, b_L, b_u, b_k, b_w = _fwd_reads(k, w, u, g, bos, eos, c, h, rk, rv, mk, mv, H, K, V, BT, MADE)
        dt = b_k.dtype
        b_n = b_u - tl.dot(b_w, tl.trans(S.to(dt)))
        tl.store(N_ + tok[:, None] * V + rv[None, :], b_n.to(N_.dtype.element_ty), mask=m_tv)
        S = tl.dot(tl.trans((b_n * tl.exp(b_L - b)[:, None]).to(dt)), b_k, S * tl.exp(b_L))  # accumulates in S
    tl.store(ST + o_seq + o_state, S, mask=m_state)


def delta_fwd_pass(grid, *, k, w, u, g, S0, hS, N_, ST, cu, coff, H, K, V, BT, BK, BV, HAS_S0, MADE=False, AHEAD=0,
                   **options):
    """`_delta_fwd_pass` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _delta_fwd_pass[grid](k, w, u, g, S0, hS, N_, ST, cu, coff, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, HAS_S0=HAS_S0,
                          MADE=MADE, AHEAD=AHEAD, **options)


@triton.jit
def _delta_reads(q, k, v, g, hS, N_, P, BQ, RES, cu, cidx, scale, c,
                 H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                 BV: tl.constexpr, RESIDUAL: tl.constexpr, TARGET: tl.constexpr, TWO: tl.constexpr = True):
    """The two old reads p = S_{t-1} k_t and scale S_{t-1} q_t (grid V tiles x chunks x heads). RESIDUAL: RES holds
    the residual T(x), x = v - p, in v's dtype (the glue's residual step, made here) and P what the backward needs
    of x for the target's slope: the clip's slope itself (0 or 1, one byte), x for tanh (fp32), nothing for the
    identity. TWO False: the one ordinary read scale S_t q_t (the auxiliary recurrence's, at b, s <= t) into BQ."""
    i_v, i_c, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n, eos, t, mt, tok, rk, rv, mk, mv, m_tk, m_tv = _chunk_tile(cu, cidx, i_c, h, i_v, H, K, V, BT, BK, BV)
    rt = tl.arange(0, BT)
    o_tv = tok[:, None] * V + rv[None, :]
    b_q = tl.load(q + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    dt = b_k.dtype
    b_n = tl.load(N_ + o_tv, mask=m_tv, other=0.0).to(dt)
    b_hS = tl.load(hS + (i_c * H + h).to(tl.int64) * V * K + rv[:, None] * K + rk[None, :],
                   mask=mv[:, None] & mk[None, :], other=0.0).to(dt)
    b, bp, b_L = _chunk_gates(g, tok, mt)
    if TWO:
        D = _decay(bp, b, rt[:, None] > rt[None, :])
        e = tl.exp(bp)[:, None]
        p = e * tl.dot(b_k, tl.trans(b_hS)) + tl.dot((tl.dot(b_k, tl.trans(b_k)) * D).to(dt), b_n)
        if RESIDUAL:
            x = tl.load(v + o_tv, mask=m_tv, other=0.0).to(tl.float32) - p
            _keep_for_slope(P, o_tv, m_tv, x, c, TARGET)
            tl.store(RES + o_tv, _target(x, c, TARGET).to(RES.dtype.element_ty), mask=m_tv)
        else:
            tl.store(P + o_tv, p.to(P.dtype.element_ty), mask=m_tv)
    else:
        D = _decay(b, b, rt[:, None] >= rt[None, :])
        e = tl.exp(b)[:, None]
    bq = e * tl.dot(b_q, tl.trans(b_hS)) + tl.dot((tl.dot(b_q, tl.trans(b_k)) * D).to(dt), b_n)
    tl.store(BQ + o_tv, (bq * scale).to(BQ.dtype.element_ty), mask=m_tv)


def delta_reads(grid, *, q, k, v, g, hS, N_, P, BQ, RES, cu, cidx, scale, c, H, K, V, BT, BK, BV, RESIDUAL, TARGET,
                TWO=True, **options):
    """`_delta_reads` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _delta_reads[grid](q, k, v, g, hS, N_, P, BQ, RES, cu, cidx, scale, c, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                       RESIDUAL=RESIDUAL, TARGET=TARGET, TWO=TWO, **options)


@triton.jit
def _delta_bwd_local(q, k, g, dBQ, dP, DNL, dRES, X, dV, A_R, GAMMA, cu, cidx, scale, c,
                     H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                     BV: tl.constexpr, RESIDUAL: tl.constexpr, TARGET: tl.constexpr, TWO: tl.constexpr = True,
                     AUX_DV: tl.constexpr = False):
    """dn_loc_s = sum_{t > s, chunk} exp(b'_t - b_s) (scale (k_s . q_t) dB_t + (k_s . k_t) dp_t), in the inputs'
    dtype (grid V tiles x chunks x heads): what the writes of a chunk get from the later reads inside it. RESIDUAL:
    dp first, from the residual's gradient dRES and what the forward kept of x = v - p (X: the clip's slope, or x):
    dv = dRES T'(x) (stored in dV) and dp = -dv (stored in dP, the inputs' dtype, for the dS pass and the dq/dk
    kernel). AUX_DV: the residual's gradient is made here from the auxiliary pass's, gamma (A_R^T du_R) (the
    auxiliary WY step's u = A_R (gamma r); dRES holds du_R, A_R that step's A, GAMMA its gamma). TWO False: the one
    ordinary read of the auxiliary recurrence, dn_loc_s = sum_{t >= s} exp(b_t - b_s) scale (k_s . q_t) dB_t."""
    i_v, i_c, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n, eos, t, mt, tok, rk, rv, mk, mv, m_tk, m_tv = _chunk_tile(cu, cidx, i_c, h, i_v, H, K, V, BT, BK, BV)
    rt = tl.arange(0, BT)
    o_tv = tok[:, None] * V + rv[None, :]
    b_q = tl.load(q + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    dt = b_k.dtype
    b, bp, b_L = _chunk_gates(g, tok, mt)
    b_dB = tl.load(dBQ + o_tv, mask=m_tv, other=0.0).to(dt)
    if TWO:
        Dst = _decay(-b, -bp, rt[:, None] < rt[None, :])  # [s, t]: exp(b'_t - b_s) for s < t
        if RESIDUAL:
            if AUX_DV:
                AT = tl.load(A_R + tok[None, :] * BT + rt[:, None], mask=mt[None, :], other=0.0).to(dt)
                du = tl.load(dRES + o_tv, mask=m_tv, other=0.0).to(dt)
                dr = tl.dot(AT, du) * tl.load(GAMMA + tok, mask=mt, other=0.0).to(tl.float32)[:, None]
            else:
                dr = tl.load(dRES + o_tv, mask=m_tv, other=0.0).to(tl.float32)
            dx = _times_kept_slope(dr, X, o_tv, m_tv, c, TARGET)
            tl.store(dV + o_tv, dx.to(dV.dtype.element_ty), mask=m_tv)
            b_dP = (-dx).to(dt)
            tl.store(dP + o_tv, b_dP, mask=m_tv)
        else:
            b_dP = tl.load(dP + o_tv, mask=m_tv, other=0.0).to(dt)
        dn = tl.dot((tl.dot(b_k, tl.trans(b_q)) * Dst * scale).to(dt), b_dB) \
            + tl.dot((tl.dot(b_k, tl.trans(b_k)) * Dst).to(dt), b_dP)
    else:
        Dst = _decay(-b, -b, rt[:, None] <= rt[None, :])  # [s, t]: exp(b_t - b_s) for s <= t
        dn = tl.dot((tl.dot(b_k, tl.trans(b_q)) * Dst * scale).to(dt), b_dB)
    tl.store(DNL + o_tv, dn.to(DNL.dtype.element_ty), mask=m_tv)


def delta_bwd_local(grid, *, q, k, g, dBQ, dP, DNL, dRES, X, dV, cu, cidx, scale, c, H, K, V, BT, BK, BV, RESIDUAL,
                    TARGET, TWO=True, aux_dv=None, **options):
    """`_delta_bwd_local` over `grid`, every parameter by name; `options`: num_warps, num_stages. aux_dv: (A_R,
    gamma) of the auxiliary WY step, whose du dRES then is (AUX_DV), or None."""
    A_R, GAMMA = aux_dv if aux_dv is not None else (dRES, dRES)
    _delta_bwd_local[grid](q, k, g, dBQ, dP, DNL, dRES, X, dV, A_R, GAMMA, cu, cidx, scale, c, H=H, K=K, V=V, BT=BT,
                           BK=BK, BV=BV, RESIDUAL=RESIDUAL, TARGET=TARGET, TWO=TWO, AUX_DV=aux_dv is not None,
                           **options)


@triton.jit
def _bwd_reads(q, k, w, g, dBQ, dP, DNL, bos, eos, c, h, rk, rv, mk, mv, H: tl.constexpr, K: tl.constexpr,
               V: tl.constexpr, BT: tl.constexpr, MADE: tl.constexpr):
    """What chunk c of dS's pass reads besides the state, loaded a chunk ahead (`_delta_bwd_pass`, AHEAD): the gates
    (`_pass_chunk`), the dBQ, dP and DNL tiles (fp32) and the k, q and w tiles."""
    mt, tok, m_tk, m_tv, b, bp, b_L = _pass_chunk(g, bos, eos, c, h, mk, mv, H, BT, MADE)
    o_tv = tok[:, None] * V + rv[None, :]
    b_dB = tl.load(dBQ + o_tv, mask=m_tv, other=0.0).to(tl.float32)
    b_dP = tl.load(dP + o_tv, mask=m_tv, other=0.0).to(tl.float32)
    b_dnl = tl.load(DNL + o_tv, mask=m_tv, other=0.0).to(tl.float32)
    b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    b_q = tl.load(q + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    b_w = tl.load(w + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0).to(b_k.dtype)
    return b, bp, b_L, b_dB, b_dP, b_dnl, b_k, b_q, b_w


@triton.jit
def _delta_bwd_pass(q, k, w, g, dBQ, dP, DNL, dST, dhS, DN, dS0, cu, coff, scale,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, HAS_DST: tl.constexpr, MADE: tl.constexpr, AHEAD: tl.constexpr,
                    TWO: tl.constexpr = True):
    """dS over the chunks in reverse (grid V tiles x sequences*heads): stores dS where each chunk ends (dhS), the
    writes' whole gradient dn (DN) and dS0 (fp32). MADE: g holds the gates made once, as `_delta_fwd_pass` takes
    them; AHEAD: a chunk's reads (`_bwd_reads`) one chunk ahead, as `_delta_fwd_pass` (1: all but the key tiles).
    TWO False: the auxiliary recurrence's one read scale R_t q_t (at b; dP unused)."""
    h, bos, eos, c0, rk, rv, mk, mv, m_state, o_state, o_seq, D = _pass_program(
        cu, coff, dST, 0, tl.program_id(0), tl.program_id(1), H, K, V, BK, BV, HAS_DST)
    NC = tl.cdiv(eos - bos, BT)
    if AHEAD > 0:
        n_b, n_bp, n_bL, n_dB, n_dP, n_dnl, n_k, n_q, n_w = _bwd_reads(
            q, k, w, g, dBQ, dP, DNL, bos, eos, tl.maximum(NC - 1, 0), h, rk, rv, mk, mv, H, K, V, BT, MADE)
    for i in range(NC):
        c = NC - 1 - i
        tl.store(dhS + ((c0 + c) * H + h) * V * K + o_state, D.to(dhS.dtype.element_ty), mask=m_state)
        _, tok, m_tk, m_tv = _pass_tokens(bos, eos, c, h, mk, mv, H, BT)
        if AHEAD > 0:
            b, bp, b_L, b_dB, b_dP, b_dnl, b_k, b_q, b_w = n_b, n_bp, n_bL, n_dB, n_dP, n_dnl, n_k, n_q, n_w
            n_b, n_bp, n_bL, n_dB, n_dP, n_dnl, n_k, n_q, n_w = _bwd_reads(
                q, k, w, g, dBQ, dP, DNL, bos, eos, tl.maximum(c - 1, 0), h, rk, rv, mk, mv, H, K, V, BT, MADE)
            if AHEAD == 1:
                b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
                b_q = tl.load(q + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
                b_w = tl.load(w + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0).to(b_k.dtype)
        else:  # each chunk loads its own, each tile where the products come to need it
            _, _, _, _, b, bp, b_L = _pass_chunk(g, bos, eos, c, h, mk, mv, H, BT, MADE)
            b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
            b_q = tl.load(q + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
            b_w = tl.load(w + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0).to(b_k.dtype)
        o_tv = tok[:, None] * V + rv[None, :]
        dt = b_k.dtype
        if AHEAD == 0:
            b_dnl = tl.load(DNL + o_tv, mask=m_tv, other=0.0).to(tl.float32)
        dn = b_dnl + tl.exp(b_L - b)[:, None] * tl.dot(b_k, tl.trans(D.to(dt)))
        tl.store(DN + o_tv, dn.to(DN.dtype.element_ty), mask=m_tv)
        e = tl.exp(bp) if TWO else tl.exp(b)
        if AHEAD == 0:
            b_dB = tl.load(dBQ + o_tv, mask=m_tv, other=0.0).to(tl.float32)
        b_dB = b_dB * (e * scale)[:, None]
        # the three products (two with TWO False) accumulate in D
        D = tl.dot(tl.trans(b_dB.to(dt)), b_q, D * tl.exp(b_L))
        if TWO:
            if AHEAD == 0:
                b_dP = tl.load(dP + o_tv, mask=m_tv, other=0.0).to(tl.float32)
            b_dP = b_dP * e[:, None]
            D = tl.dot(tl.trans(b_dP.to(dt)), b_k, D)
        D = tl.dot(tl.trans((-dn).to(dt)), b_w, D)
    tl.store(dS0 + o_seq + o_state, D, mask=m_state)


def delta_bwd_pass(grid, *, q, k, w, g, dBQ, dP, DNL, dST, dhS, DN, dS0, cu, coff, scale, H, K, V, BT, BK, BV, HAS_DST,
                   MADE=False, AHEAD=0, TWO=True, **options):
    """`_delta_bwd_pass` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _delta_bwd_pass[grid](q, k, w, g, dBQ, dP, DNL, dST, dhS, DN, dS0, cu, coff, scale, H=H, K=K, V=V, BT=BT, BK=BK,
                          BV=BV, HAS_DST=HAS_DST, MADE=MADE, AHEAD=AHEAD, TWO=TWO, **options)


@triton.jit
def _delta_bwd_dqk(q, k, g, dBQ, dP, N_, DN, hS, dhS, dQ, dK, dW, E_P, K_P, Z_P, dQA, dKA, dKB,
                   dO_R, N_R, DN_R, hR, dhR, dW_R, Q_P, cu, cidx, NTH, NCH,
                   scale, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                   BV: tl.constexpr, HAS_MAIL: tl.constexpr, AUX: tl.constexpr = False):
    """dq, dk (fp32, before the WY step's share), dw = -dn S_c and this K tile's shares of the per-token d/db terms
    E (reads, at b') and K (writes) (grid K tiles x chunks x heads; the whole V is one tile). HAS_MAIL: the stored
    dq, dk also add the auxiliary pass's dQA and dKA + dKB (`GradientMail`), outside the d/db terms (which are this
    pass's own). AUX: the auxiliary recurrence's share too, from its read scale R_t q_t (gradient dO_R), writes N_R
    and their gradient DN_R, states hR and dhR: its dq, dk added to the stored ones, dw_R = -dn_R R_c (dW_R), its
    reads' terms (at b) in Q_P, its writes' in K_P and its chunk end in Z_P (`ResidualDelta`)."""
    i_k, i_c, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n, eos, t, mt, tok, rk, rv, mk, mv, m_tk, m_tv = _chunk_tile(cu, cidx, i_c, h, 0, H, K, V, BT, BK, BV)
    rk = i_k * BK + tl.arange(0, BK)
    mk = rk < K
    m_tk, m_state = mt[:, None] & mk[None, :], mv[:, None] & mk[None, :]
    rt = tl.arange(0, BT)
    o_tk, o_tv = tok[:, None] * K + rk[None, :], tok[:, None] * V + rv[None, :]
    o_state = (i_c * H + h).to(tl.int64) * V * K + rv[:, None] * K + rk[None, :]
    b_q = tl.load(q + o_tk, mask=m_tk, other=0.0)
    b_k = tl.load(k + o_tk, mask=m_tk, other=0.0)
    dt = b_k.dtype
    q32, k32 = b_q.to(tl.float32), b_k.to(tl.float32)
    b, bp, b_L = _chunk_gates(g, tok, mt)
    D = _decay(bp, b, rt[:, None] > rt[None, :])
    e = tl.exp(bp)[:, None]
    b_n = tl.load(N_ + o_tv, mask=m_tv, other=0.0).to(dt)
    b_hS = tl.load(hS + o_state, mask=m_state, other=0.0).to(dt)
    # the read by q (its gradient dB already carries the scale's share through the product below)
    b_dB = tl.load(dBQ + o_tv, mask=m_tv, other=0.0).to(dt)
    A = (tl.dot(b_dB, tl.trans(b_n)) * D * scale).to(dt)
    dq = scale * e * tl.dot(b_dB, b_hS) + tl.dot(A, b_k)
    dkw = tl.dot(tl.trans(A), b_q)
    # the read by k, with dp from the residual
    b_dP = tl.load(dP + o_tv, mask=m_tv, other=0.0).to(dt)
    A = (tl.dot(b_dP, tl.trans(b_n)) * D).to(dt)
    dk = e * tl.dot(b_dP, b_hS) + tl.dot(A, b_k)
    dkw += tl.dot(tl.trans(A), b_k)
    # the chunk-end write: S_{c+1} = ... + (n exp(b_L - b))^T k
    b_dhS = tl.load(dhS + o_state, mask=m_state, other=0.0).to(dt)
    dke = tl.exp(b_L - b)[:, None] * tl.dot(b_n, b_dhS)
    dkw += dke
    # dg's end term of the chunk, <dS_{c+1}, S_{c+1}> = exp(b_L) <dS_{c+1}, S_c> + the writes' k . dk
    z = tl.exp(b_L) * tl.sum(b_hS.to(tl.float32) * b_dhS.to(tl.float32)) + tl.sum(tl.sum(k32 * dke, axis=1))
    dw = -tl.dot(tl.load(DN + o_tv, mask=m_tv, other=0.0).to(dt), b_hS)
    tl.store(dW + o_tk, dw.to(dW.dtype.element_ty), mask=m_tk)
    o_part = i_k.to(tl.int64) * NTH + tok
    tl.store(E_P + o_part, tl.sum(q32 * dq, axis=1) + tl.sum(k32 * dk, axis=1), mask=mt)
    dk += dkw
    if AUX:  # R's read scale (exp(b) q R_c^T + (q k^T * exp(b_t - b_s)[s <= t]) n_R) and its writes
        Di = _decay(b, b, rt[:, None] >= rt[None, :])
        b_n = tl.load(N_R + o_tv, mask=m_tv, other=0.0).to(dt)
        b_hS = tl.load(hR + o_state, mask=m_state, other=0.0).to(dt)
        b_dB = tl.load(dO_R + o_tv, mask=m_tv, other=0.0).to(dt)
        A = (tl.dot(b_dB, tl.trans(b_n)) * Di * scale).to(dt)
        dqr = scale * tl.exp(b)[:, None] * tl.dot(b_dB, b_hS) + tl.dot(A, b_k)
        dkr = tl.dot(tl.trans(A), b_q)
        b_dhS = tl.load(dhR + o_state, mask=m_state, other=0.0).to(dt)
        dke = tl.exp(b_L - b)[:, None] * tl.dot(b_n, b_dhS)
        dkr += dke
        z += tl.exp(b_L) * tl.sum(b_hS.to(tl.float32) * b_dhS.to(tl.float32)) + tl.sum(tl.sum(k32 * dke, axis=1))
        dwr = -tl.dot(tl.load(DN_R + o_tv, mask=m_tv, other=0.0).to(dt), b_hS)
        tl.store(dW_R + o_tk, dwr.to(dW_R.dtype.element_ty), mask=m_tk)
        tl.store(Q_P + o_part, tl.sum(q32 * dqr, axis=1), mask=mt)
        dq += dqr
        dk += dkr
        dkw += dkr
    tl.store(Z_P + i_k.to(tl.int64) * NCH + i_c * H + h, z)
    tl.store(K_P + o_part, tl.sum(k32 * dkw, axis=1), mask=mt)
    if HAS_MAIL:
        dq += tl.load(dQA + o_tk, mask=m_tk, other=0.0).to(tl.float32)
        dk += tl.load(dKA + o_tk, mask=m_tk, other=0.0).to(tl.float32) \
            + tl.load(dKB + o_tk, mask=m_tk, other=0.0).to(tl.float32)
    tl.store(dQ + o_tk, dq.to(dQ.dtype.element_ty), mask=m_tk)
    tl.store(dK + o_tk, dk, mask=m_tk)


def delta_bwd_dqk(grid, *, q, k, g, dBQ, dP, N_, DN, hS, dhS, dQ, dK, dW, E_P, K_P, Z_P, cu, cidx, NTH, NCH, scale, H,
                  K, V, BT, BK, BV, mailed=None, aux=None, **options):
    """`_delta_bwd_dqk` over `grid`, every parameter by name; `options`: num_warps, num_stages. mailed: the
    auxiliary pass's (dq, dk, dk') to add (`GradientMail`), or None. aux: the auxiliary recurrence's (dO_R, N_R,
    DN_R, hR, dhR, dW_R, Q_P) for its share (AUX), or None."""
    dQA, dKA, dKB = mailed if mailed is not None else (dQ, dK, dK)
    dO_R, N_R, DN_R, hR, dhR, dW_R, Q_P = aux if aux is not None else (dBQ, N_, DN, hS, dhS, dW, E_P)
    _delta_bwd_dqk[grid](q, k, g, dBQ, dP, N_, DN, hS, dhS, dQ, dK, dW, E_P, K_P, Z_P, dQA, dKA, dKB,
                         dO_R, N_R, DN_R, hR, dhR, dW_R, Q_P, cu, cidx, NTH, NCH,
                         scale, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, HAS_MAIL=mailed is not None, AUX=aux is not None,
                         **options)


@dataclass(frozen=True)
class WY:
    """The delta rule's WY step for chunks of CHUNK tokens, and its backward.

    fwd(k, v, beta, g, layout, cu_seqlens, chunk) -> (w, u, saved), tensors [B, T, H, *], g already floored, fp32;
    saved ends with A [B, T, H, chunk] (each token's row of its chunk's A, FLA's layout) where `wy_bwd` is to read it.
    bwd(k, v, beta, g, saved, dw, du, layout, cu_seqlens, chunk, dk_in, dv_in) -> (dk, dv, dbeta, db): dk and dv
    with dk_in (fp32, the base pass's) and dv_in (or None) added, in k's and v's dtypes; db [B, T, H] the gradient
    of the chunk-local cumsum b_t of g (what it reads from S_c at b_t belongs in the sequence-wide reverse cumsum).
    """

    fwd: Callable
    bwd: Callable


@triton.jit
def _wy_bwd(k, v, beta, g, A, dW, dU, dK_IN, dV_IN, dK, dV, dBETA, dB, cu, cidx,
            H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
            HAS_DV_IN: tl.constexpr, HAS_DV: tl.constexpr = True):
    """The WY step's backward for one chunk and head (grid chunks x heads), with the base pass's dk (fp32) and the
    residual's dv added before the single store in the inputs' dtype. With M = beta exp(b) k, N = beta v,
    L = strict_lower(beta_t exp(b_t - b_s) k_t . k_s) and A = (I + L)^-1 (w = A M, u = A N):

        dM = A^T dw,  dN = A^T du,  dA = dw M^T + du N^T,  dL = -(A^T dA A^T) on the strict lower triangle
        dk = beta exp(b) dM + beta (G k) + G^T (beta k) + dk_in          G = dL * exp(b_t - b_s)
        dv = beta dN + dv_in,   dbeta = exp(b) (dM . k) + dN . v + (G k) . k
        db = M . dM + rowsum(G * L') - colsum(G * L'),   L'_ts = beta_t k_t . k_s

    Two passes over K tiles (the first for dA, the second for dk, dM made again rather than stored), one over V.
    HAS_DV False: dv is not stored (the auxiliary step's, which the base pass's local kernel made already)."""
    i_c, h = tl.program_id(0), tl.program_id(1)
    _, _, _, mt, tok = _chunk_rows(cu, cidx, i_c, h, H, BT)
    rt = tl.arange(0, BT)
    dt = k.dtype.element_ty
    b, _, _ = _chunk_gates(g, tok, mt)
    e = tl.exp(b)
    b_beta = tl.load(beta + tok, mask=mt, other=0.0).to(tl.float32)
    AT = tl.load(A + tok[None, :] * BT + rt[:, None], mask=mt[None, :], other=0.0).to(dt)  # AT[i, j] = A[j, i]
    dA = tl.zeros([BT, BT], dtype=tl.float32)
    KK = tl.zeros([BT, BT], dtype=tl.float32)
    dbeta = tl.zeros([BT], dtype=tl.float32)
    db = tl.zeros([BT], dtype=tl.float32)
    for i in range(tl.cdiv(K, BK)):
        rk = i * BK + tl.arange(0, BK)
        m_tk = mt[:, None] & (rk < K)[None, :]
        o_tk = tok[:, None] * K + rk[None, :]
        b_k = tl.load(k + o_tk, mask=m_tk, other=0.0)
        b_dw = tl.load(dW + o_tk, mask=m_tk, other=0.0).to(dt)
        M = b_k.to(tl.float32) * (b_beta * e)[:, None]
        dA = tl.dot(b_dw, tl.trans(M.to(dt)), dA)
        dM = tl.dot(AT, b_dw)
        dbeta += e * tl.sum(dM * b_k.to(tl.float32), axis=1)
        db += tl.sum(dM * M, axis=1)
        KK = tl.dot(b_k, tl.trans(b_k), KK)
    for i in range(tl.cdiv(V, BV)):
        rv = i * BV + tl.arange(0, BV)
        m_tv = mt[:, None] & (rv < V)[None, :]
        o_tv = tok[:, None] * V + rv[None, :]
        b_v = tl.load(v + o_tv, mask=m_tv, other=0.0).to(tl.float32)
        b_du = tl.load(dU + o_tv, mask=m_tv, other=0.0).to(dt)
        dA = tl.dot(b_du, tl.trans((b_v * b_beta[:, None]).to(dt)), dA)
        dN = tl.dot(AT, b_du)
        dbeta += tl.sum(dN * b_v, axis=1)
        if HAS_DV:
            dv = dN * b_beta[:, None]
            if HAS_DV_IN:
                dv += tl.load(dV_IN + o_tv, mask=m_tv, other=0.0).to(tl.float32)
            tl.store(dV + o_tv, dv.to(dV.dtype.element_ty), mask=m_tv)
    strict = rt[:, None] > rt[None, :]
    dA = tl.where(strict, dA, 0.0).to(dt)
    G = -tl.dot(AT, tl.dot(dA, AT).to(dt)) * _decay(b, b, strict)
    GL = G * KK * b_beta[:, None]
    db += tl.sum(GL, axis=1) - tl.sum(GL, axis=0)
    G = G.to(dt)
    for i in range(tl.cdiv(K, BK)):
        rk = i * BK + tl.arange(0, BK)
        m_tk = mt[:, None] & (rk < K)[None, :]
        o_tk = tok[:, None] * K + rk[None, :]
        b_k = tl.load(k + o_tk, mask=m_tk, other=0.0)
        k32 = b_k.to(tl.float32)
        Gk = tl.dot(G, b_k)
        dbeta += tl.sum(Gk * k32, axis=1)
        dk = tl.dot(AT, tl.load(dW + o_tk, mask=m_tk, other=0.0).to(dt)) * (b_beta * e)[:, None] \
            + Gk * b_beta[:, None] + tl.dot(tl.trans(G), (k32 * b_beta[:, None]).to(dt)) \
            + tl.load(dK_IN + o_tk, mask=m_tk, other=0.0).to(tl.float32)
        tl.store(dK + o_tk, dk.to(dK.dtype.element_ty), mask=m_tk)
    tl.store(dBETA + tok, dbeta, mask=mt)
    tl.store(dB + tok, db, mask=mt)


def wy_bwd(k, v, beta, g, saved, dw, du, layout, cu, chunk, dk_in, dv_in, dk_dtype=None, want_dv=True):
    """`WY.bwd` on our kernel (`_wy_bwd`), from the A that the forward saved last: dk + dk_in in k's dtype (or
    dk_dtype), dv (+ dv_in) in v's (None where not want_dv), dbeta and db in fp32. One kernel where FLA's
    prepare_wy_repr_bwd and two PyTorch additions ran."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    A = saved[-1]
    dk = torch.empty_like(k, dtype=dk_dtype or k.dtype)
    dv = torch.empty_like(v) if want_dv else None
    dbeta = torch.empty(B, T, H, dtype=torch.float32, device=k.device)
    db = torch.empty_like(dbeta)
    opts = dict(LAUNCH["wy_bwd"])
    _wy_bwd[(max(layout.chunks, 1), H)](k, v, beta, g, A.contiguous(), dw.contiguous(), du.contiguous(),
                                        dk_in.contiguous(), dv_in.contiguous() if dv_in is not None else dk,
                                        dk, dv if want_dv else dk, dbeta, db, layout.cu, layout.cidx, H=H, K=K, V=V,
                                        BT=chunk, HAS_DV_IN=dv_in is not None, HAS_DV=want_dv, **opts)
    return dk, dv, dbeta, db


def _fla_wy_fwd(k, v, beta, g, layout, cu, chunk):
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    # FLA's kernels take the chunk-local cumsum of g in log2 units (they use exp2)
    g_cs = chunk_local_cumsum(g, chunk_size=chunk, scale=RCP_LN2, cu_seqlens=cu)
    w, u, A = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g_cs, beta=beta, cu_seqlens=cu, chunk_size=chunk)
    return w, u, (g_cs, A)


def _fla_wy_bwd(k, v, beta, g, saved, dw, du, layout, cu, chunk, dk_in, dv_in, dk_dtype=None, want_dv=True):
    from fla.ops.gated_delta_rule.wy_fast import prepare_wy_repr_bwd

    g_cs, A = saved
    # its dg is the gradient of the chunk-local cumsum (FLA sums it from each chunk's end to get that of g)
    dk, dv, dbeta, db = prepare_wy_repr_bwd(k=k, v=v, beta=beta, A=A, dw=dw, du=du, g=g_cs, cu_seqlens=cu)
    return _add_shares(dk, dv, dk_in, dv_in, dk_dtype) + (dbeta, db)


def _add_shares(dk, dv, dk_in, dv_in, dk_dtype=None):
    """dk + dk_in (summed in fp32) in k's dtype (or dk_dtype), dv + dv_in in v's, by PyTorch (the WY backwards that do
    not add)."""
    dk = torch.add(dk_in, dk, out=torch.empty_like(dk, dtype=dk_dtype or dk.dtype))
    return dk, (torch.add(dv_in, dv, out=torch.empty_like(dv)) if dv_in is not None else dv)


# FLA's WY forward (fused kkt + solve + recompute), our backward; FLA_WY_FLA_BWD: FLA's backward too and the two
# additions in PyTorch (benchmarks/kernels.py --rdn-wy-fla)
FLA_WY = WY(fwd=_fla_wy_fwd, bwd=wy_bwd)
FLA_WY_FLA_BWD = WY(fwd=_fla_wy_fwd, bwd=_fla_wy_bwd)


def _chunk_tokens(layout: Layout, chunk: int, device) -> torch.Tensor:
    """[chunks, chunk] token indices of each chunk, the number of tokens where a chunk ends early."""
    total = layout.tokens
    pairs = layout.cidx.view(-1, 2).long()[:layout.chunks]
    start = layout.cu.long()[pairs[:, 0]] + pairs[:, 1] * chunk
    idx = start[:, None] + torch.arange(chunk, device=device)
    return torch.where(idx < layout.cu.long()[pairs[:, 0] + 1][:, None], idx, total)


def _torch_wy_forward(k, v, beta, g, layout, chunk, b_of=None):
    """w, u of the WY step in PyTorch (float64-exact when given float64): the reference for tests and CPU.

    b_of(b) may replace the chunk-local cumsum b [chunks, chunk, H] (the backward differentiates through it)."""
    B, T, H, K = k.shape
    idx = _chunk_tokens(layout, chunk, k.device)

    def gather(x):  # [B, T, H, ...] -> [chunks, chunk, H, ...], zeros past a sequence's end
        flat = x.reshape(B * T, *x.shape[2:])
        return torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])])[idx]

    kc, vc, bc = gather(k), gather(v), gather(beta)
    b = gather(g).cumsum(1)  # [C, BT, H]
    if b_of is not None:
        b = b_of(b)
    t = torch.arange(chunk, device=k.device)
    strict = (t[:, None] > t[None, :])[None, :, :, None]
    decay = torch.exp(torch.where(strict, b[:, :, None] - b[:, None, :], float("-inf")))  # [C, t, s, H]
    L = torch.einsum("cthk,cshk->ctsh", kc, kc) * decay * bc[:, :, None]
    M = (torch.eye(chunk, dtype=k.dtype, device=k.device)[None, :, :, None] + L).permute(0, 3, 1, 2)  # [C,H,t,s]
    rhs_w = (kc * (bc * b.exp())[..., None]).permute(0, 2, 1, 3)
    rhs_u = (vc * bc[..., None]).permute(0, 2, 1, 3)
    w = torch.linalg.solve_triangular(M, rhs_w, upper=False, unitriangular=True).permute(0, 2, 1, 3)
    u = torch.linalg.solve_triangular(M, rhs_u, upper=False, unitriangular=True).permute(0, 2, 1, 3)
    A = torch.linalg.solve_triangular(M, torch.eye(chunk, dtype=M.dtype, device=M.device).expand_as(M), upper=False,
                                      unitriangular=True).permute(0, 2, 1, 3)  # [C, t, H, s]: FLA's rows
    return _scatter(w, idx, B, T), _scatter(u, idx, B, T), (b, idx, _scatter(A, idx, B, T))


def _scatter(xc, idx, B, T):
    """[chunks, chunk, H, ...] back to [B, T, H, ...] (the padded slots all land on a dropped dummy row)."""
    out = xc.new_zeros(B * T + 1, *xc.shape[2:]).index_copy(0, idx.flatten(), xc.flatten(0, 1))
    return out[:-1].reshape(B, T, *xc.shape[2:])


def _torch_wy_fwd(k, v, beta, g, layout, cu, chunk):
    w, u, (_, _, A) = _torch_wy_forward(k, v, beta, g, layout, chunk)
    return w.to(k.dtype), u.to(v.dtype), (A.to(k.dtype),)


def _torch_wy_bwd(k, v, beta, g, saved, dw, du, layout, cu, chunk, dk_in, dv_in, dk_dtype=None, want_dv=True):
    leaf = []

    def as_leaf(b):
        leaf.append(b.detach().requires_grad_(True))
        return leaf[0]

    with torch.enable_grad():
        inputs = [x.detach().requires_grad_(True) for x in (k, v, beta)]
        w, u, (_, idx, _) = _torch_wy_forward(*inputs, g, layout, chunk, b_of=as_leaf)
        dk, dv, dbeta, db = torch.autograd.grad((w, u), inputs + leaf, (dw.to(w.dtype), du.to(u.dtype)))
    B, T = k.shape[:2]
    return _add_shares(dk, dv, dk_in, dv_in, dk_dtype) + (dbeta, _scatter(db, idx, B, T))


# the WY step in PyTorch, forward and backward: the reference; TORCH_WY_OUR_BWD: with our backward kernel (tests,
# under the interpreter: FLA's forward kernels do not run there)
TORCH_WY = WY(fwd=_torch_wy_fwd, bwd=_torch_wy_bwd)
TORCH_WY_OUR_BWD = WY(fwd=_torch_wy_fwd, bwd=wy_bwd)


class GradientMail:
    """Where RDN's auxiliary pass leaves its q and k gradients for the base pass's backward to add in its dq/dk kernel.

    Both passes read the same q and k (`compose_residual_attention`), so autograd would add their gradients with an
    elementwise pass over each [tokens, H, K] tensor, and the auxiliary pass sums its own two shares of dk (FLA's
    dq/dk kernel's and its WY step's) with a third. Instead the auxiliary backward posts (dq, dk, dk') here and returns
    no gradient for q and k, and `_delta_bwd_dqk` adds them to what it stores. The order is certain: the base pass's
    backward needs dp, the gradient of its prediction, which comes through the residual from the auxiliary pass's
    gradient; a backward that does not reach the auxiliary pass posts nothing and the base pass adds nothing. One
    mail per call: the base forward names its q and k (`expect`), and the auxiliary forward posts only when it was
    given those very tensors (`takes`). A mail is collected only by the backward that posted it: a graph kept with
    retain_graph whose first backward needed the auxiliary pass alone (a gradient of gamma) must not hand those
    gradients to a later backward that reaches the base pass without it."""

    def __init__(self):
        self._expected: tuple[torch.Tensor, torch.Tensor] | None = None
        self._grads: tuple[torch.Tensor, ...] | None = None
        self._task = -1

    def expect(self, q: torch.Tensor, k: torch.Tensor) -> None:
        self._expected = (q, k)

    def takes(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether the auxiliary pass of these q, k posts its gradients here (they are the base pass's own)."""
        expected, self._expected = self._expected, None
        return expected is not None and expected[0] is q and expected[1] is k

    def post(self, dq: torch.Tensor, dk: torch.Tensor, dk_extra: torch.Tensor) -> None:
        self._grads = tuple(x.contiguous() for x in (dq, dk, dk_extra))
        self._task = torch._C._current_graph_task_id()

    def collect(self) -> tuple[torch.Tensor, ...] | None:
        grads, self._grads = self._grads, None
        return grads if grads is not None and self._task == torch._C._current_graph_task_id() else None


def _grid_v(name: str, V: int) -> tuple[int, dict]:
    """The number of V tiles and the launch options of one of this module's kernels."""
    opts = launch_options(name, V, LAUNCH)
    return triton.cdiv(V, opts["BV"]), opts


def _consts(H: int, K: int, V: int, chunk: int) -> dict:
    """The shape constants every kernel of the passes takes (the whole K in one tile)."""
    return dict(H=H, K=K, V=V, BT=chunk, BK=max(MIN_TILE, triton.next_power_of_2(K)))


def _pass_buffers(k, layout: Layout, consts: dict):
    """What a state pass writes: a state where each chunk starts or ends [chunks, H, V, K] and one [B, T, H, V] tile a
    token, in k's dtype, and a state at the sequences' start or end [N, H, V, K] fp32."""
    H, K, V = consts["H"], consts["K"], consts["V"]
    return (k.new_empty(layout.chunks, H, V, K), k.new_empty(*k.shape[:3], V),
            torch.empty(layout.N, H, V, K, dtype=torch.float32, device=k.device))


def _state_pass(k, w, u, gates, S0, layout: Layout, consts: dict, made: bool, ahead: int):
    """One forward state pass of the delta rule (`_delta_fwd_pass`): (chunk states [chunks, H, V, K] and writes
    [B, T, H, V] in k's dtype, the final state [N, H, V, K] fp32)."""
    H, V = consts["H"], consts["V"]
    hS, N_, ST = _pass_buffers(k, layout, consts)
    nv, opts = _grid_v("pass", V)
    delta_fwd_pass((nv, layout.N * H), k=k, w=w.contiguous(), u=u.contiguous(), g=gates,
                   S0=S0 if S0 is not None else ST, hS=hS, N_=N_, ST=ST, cu=layout.cu, coff=layout.coff,
                   HAS_S0=S0 is not None, MADE=made, AHEAD=ahead, **consts, **opts)
    return hS, N_, ST


def _reverse_pass(q, k, w, gates, dB, dP, DNL, dST, layout: Layout, scale: float, consts: dict, made: bool,
                  ahead: int, two: bool = True):
    """One reverse state pass (`_delta_bwd_pass`): (dS where each chunk ends and the writes' gradients, in k's
    dtype; dS0 [N, H, V, K] fp32). two False: the auxiliary recurrence's one read (dP unused)."""
    H, V = consts["H"], consts["V"]
    dhS, DN, dS0 = _pass_buffers(k, layout, consts)
    nv, opts = _grid_v("bwd_pass", V)
    delta_bwd_pass((nv, layout.N * H), q=q, k=k, w=w, g=gates, dBQ=dB, dP=dP, DNL=DNL,
                   dST=dST.contiguous() if dST is not None else dS0, dhS=dhS, DN=DN, dS0=dS0, cu=layout.cu,
                   coff=layout.coff, scale=scale, HAS_DST=dST is not None, MADE=made, AHEAD=ahead, TWO=two,
                   **consts, **opts)
    return dhS, DN, dS0


def _old_reads(q, k, v, g32, hS, N_, layout: Layout, consts: dict, scale: float, residual: tuple[str, float] | None):
    """The base pass's two reads of the old state (`_delta_reads`): (scale S_{t-1} q_t in q's dtype; the residual
    T(v - p) in v's dtype, or None without `residual`; P: without `residual` the prediction p (fp32), with it what
    the backward needs of x = v - p: the clip's slope (a byte), tanh's x (fp32), None for the identity)."""
    B, T, H, _ = q.shape
    V = v.shape[-1]
    target, clip = residual if residual is not None else ("identity", 0.0)
    P = None if residual is not None and target == "identity" else torch.empty(
        B, T, H, V, dtype=torch.uint8 if residual is not None and target == "clip" else torch.float32, device=q.device)
    BQ = torch.empty(B, T, H, V, dtype=q.dtype, device=q.device)
    RES = torch.empty_like(v) if residual is not None else None
    nv, opts = _grid_v("reads", V)
    delta_reads((nv, max(layout.chunks, 1), H), q=q, k=k, v=v, g=g32, hS=hS, N_=N_, P=BQ if P is None else P, BQ=BQ,
                RES=BQ if RES is None else RES, cu=layout.cu, cidx=layout.cidx, scale=float(scale), c=float(clip),
                RESIDUAL=residual is not None, TARGET=TARGET_CODES[target], **consts, **opts)
    return BQ, RES, P


def _dqk_buffers(q, layout: Layout, name: str = "dqk"):
    """What `_delta_bwd_dqk` writes (dq in q's dtype, dk fp32, dw in q's dtype, the d/db partials E and K
    [K tiles, tokens * H], Z [K tiles, chunks * H]), its grid and launch options (BK included; LAUNCH[name])."""
    B, T, H, K = q.shape
    dev = q.device
    opts = dict(LAUNCH[name])
    opts["BK"] = max(MIN_TILE, min(opts["BK"], triton.next_power_of_2(K)))
    NK, C = triton.cdiv(K, opts["BK"]), max(layout.chunks, 1)
    E_P = torch.empty(NK, B * T * H, dtype=torch.float32, device=dev)
    return (torch.empty_like(q), torch.empty(B, T, H, K, dtype=torch.float32, device=dev), torch.empty_like(q), E_P,
            torch.empty_like(E_P), torch.empty(NK, C * H, dtype=torch.float32, device=dev), (NK, C, H), opts)


class DeltaTwoReads(torch.autograd.Function):
    """(q, k, v, g, beta, S0) -> (scale S_{t-1} q_t [inputs' dtype], S_{t-1} k_t [fp32], S_T [fp32]) of the gated
    delta rule S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T (module docstring).

    residual (target, clip): the second output is the residual T(v_t - S_{t-1} k_t) instead, in v's dtype, made by
    the read kernel; the backward turns its gradient into dv and dp in the local kernel. The prediction never
    leaves the Function: its fp32 store and the glue's pass over it are saved, and dp is kept in the inputs' dtype
    (autograd would cast a gradient to its input's fp32)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, S0, layout: Layout, scale: float, chunk: int, wy: WY, cu,
                mail: GradientMail | None, residual: tuple[str, float] | None):
        H, K = q.shape[2:]
        V = v.shape[-1]
        if mail is not None:
            mail.expect(q, k)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        g32 = g.float().clamp_min(FLOOR).contiguous()  # the kernels' floor (docs/MATH.md), here for the WY step too
        beta_c = beta.contiguous()
        w, u, saved = wy.fwd(k, v, beta_c, g32, layout, cu, chunk)
        consts = _consts(H, K, V, chunk)
        made, ctx.ahead = GATES_MADE_ONCE, READ_AHEAD
        gates = made_gates(layout, g32, H, chunk) if made else g32
        hS, N_, ST = _state_pass(k, w, u, gates, S0, layout, consts, made, ctx.ahead)
        BQ, RES, P = _old_reads(q, k, v, g32, hS, N_, layout, consts, scale, residual)
        ctx.save_for_backward(q, k, v, g32, beta_c, w, hS, N_, P if residual is not None else None,
                              gates if made else None)
        ctx.residual = (residual[0], float(residual[1])) if residual is not None else None
        ctx.saved, ctx.layout, ctx.scale, ctx.chunk, ctx.wy, ctx.cu = saved, layout, float(scale), chunk, wy, cu
        ctx.mail = mail
        ctx.has_S0, ctx.dtypes = S0 is not None, (g.dtype, beta.dtype)
        return BQ, (RES if residual is not None else P), ST

    @staticmethod
    def backward(ctx, dBQ, dP, dST):
        q, k, v, g32, beta_c, w, hS, N_, X, made = ctx.saved_tensors
        layout, scale, chunk = ctx.layout, ctx.scale, ctx.chunk
        B, T, H, K = q.shape
        V = v.shape[-1]
        dev, dt = q.device, q.dtype
        NTH, C = B * T * H, max(layout.chunks, 1)
        dBQ, dP = dBQ.contiguous(), dP.contiguous()  # never None: autograd materializes unused outputs' gradients
        consts = _consts(H, K, V, chunk)
        # the local share of dn in the inputs' dtype, as FLA's chunk_bwd_dv_local keeps the delta rule's
        DNL = torch.empty(B, T, H, V, dtype=dt, device=dev)
        target, clip = ctx.residual if ctx.residual is not None else ("identity", 0.0)
        dRES = dV_res = dP
        if ctx.residual is not None:  # dP is the residual's gradient: the local kernel makes dv and dp from it
            dP = torch.empty(B, T, H, V, dtype=dt, device=dev)
            dV_res = torch.empty_like(v)
        nv, opts = _grid_v("local", V)
        delta_bwd_local((nv, C, H), q=q, k=k, g=g32, dBQ=dBQ, dP=dP, DNL=DNL, dRES=dRES,
                        X=X if X is not None else dRES, dV=dV_res, cu=layout.cu, cidx=layout.cidx, scale=scale,
                        c=clip, RESIDUAL=ctx.residual is not None, TARGET=TARGET_CODES[target], **consts, **opts)
        dhS, DN, dS0 = _reverse_pass(q, k, w, made if made is not None else g32, dBQ, dP, DNL, dST, layout, scale,
                                     consts, made is not None, ctx.ahead)
        dQ, dK, dW, E_P, K_P, Z_P, grid, opts = _dqk_buffers(q, layout)
        delta_bwd_dqk(grid, q=q, k=k, g=g32, dBQ=dBQ, dP=dP, N_=N_, DN=DN, hS=hS, dhS=dhS, dQ=dQ, dK=dK, dW=dW,
                      E_P=E_P, K_P=K_P, Z_P=Z_P, cu=layout.cu, cidx=layout.cidx, NTH=NTH, NCH=C * H, scale=scale, H=H,
                      K=K, V=V, BT=chunk, BV=max(MIN_TILE, triton.next_power_of_2(V)),
                      mailed=ctx.mail.collect() if ctx.mail is not None else None, **opts)
        # the WY step's backward adds our fp32 dk and, with the residual made here, v's share from it (autograd's sum
        # before) to its own before storing them in the inputs' dtypes
        dK, dv, dbeta, db_wy = ctx.wy.bwd(k, v, beta_c, g32, ctx.saved, dW, DN, layout, ctx.cu, chunk, dK,
                                          dV_res if ctx.residual is not None else None)
        dg = gate_gradient(layout, E_P, K_P, Z_P, H, chunk, extra=db_wy.contiguous()).view(B, T, H)
        g_dtype, beta_dtype = ctx.dtypes
        return (dQ, dK, dv.to(v.dtype), dg.to(g_dtype), dbeta.to(beta_dtype), dS0 if ctx.has_S0 else None,
                None, None, None, None, None, None, None)


class ResidualDelta(torch.autograd.Function):
    """RDN's two recurrences in one Function, every pass on this module's kernels (fit residual):
    (q, k, v, g, beta, gamma, S0, R0) -> (scale S_{t-1} q_t, scale R_t q_t [inputs' dtype], S_T, R_T [fp32]) with
    S the gated delta rule of (k, v, beta) read twice at the old state (`DeltaTwoReads`) and R that of (k, r, gamma),
    r = T(v_t - S_{t-1} k_t), read once, S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,
    R_t = alpha_t R_{t-1} (I - gamma_t k_t k_t^T) + gamma_t r_t k_t^T. The output gate's sum stays in the glue.

    Apart, R's backward had to finish before S's began (its dr feeds S's residual), so each pass ran its own dq/dk
    kernel and WY backward and the two sums of q's and k's gradients crossed memory. In one Function, R's backward
    only gets as far as its writes' gradient du_R (its local and reverse passes); S's local kernel makes dr =
    gamma (A_R^T du_R) itself, and then one dq/dk kernel serves both recurrences (`_delta_bwd_dqk`, AUX: q, k and
    the gates loaded once, dq and dk stored once), R's WY backward hands its fp32 dk on to S's, and one
    `gate_gradient` sums both passes' d/db terms (R's reads start at b: `plus`)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, gamma, S0, R0, layout: Layout, scale: float, chunk: int, wy: WY, cu,
                residual: tuple[str, float]):
        B, T, H, K = q.shape
        V = v.shape[-1]
        dev, dt = q.device, q.dtype
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        g32 = g.float().clamp_min(FLOOR).contiguous()
        beta_c, gamma_c = beta.contiguous(), gamma.contiguous()
        consts = _consts(H, K, V, chunk)
        made, ctx.ahead = GATES_MADE_ONCE, READ_AHEAD
        gates = made_gates(layout, g32, H, chunk) if made else g32
        w, u, saved = wy.fwd(k, v, beta_c, g32, layout, cu, chunk)
        hS, N_, ST = _state_pass(k, w, u, gates, S0, layout, consts, made, ctx.ahead)
        target, clip = residual
        BQ, RES, X = _old_reads(q, k, v, g32, hS, N_, layout, consts, scale, residual)
        # R on the residual, read once by q
        w_R, u_R, saved_R = wy.fwd(k, RES, gamma_c, g32, layout, cu, chunk)
        hR, N_R, RT = _state_pass(k, w_R, u_R, gates, R0, layout, consts, made, ctx.ahead)
        CORR = torch.empty(B, T, H, V, dtype=dt, device=dev)
        nv, opts = _grid_v("reads", V)
        delta_reads((nv, max(layout.chunks, 1), H), q=q, k=k, v=RES, g=g32, hS=hR, N_=N_R, P=CORR, BQ=CORR,
                    RES=CORR, cu=layout.cu, cidx=layout.cidx, scale=float(scale), c=0.0, RESIDUAL=False, TARGET=0,
                    TWO=False, **consts, **opts)
        ctx.save_for_backward(q, k, v, g32, beta_c, gamma_c, w, hS, N_, X, gates if made else None, RES, w_R, hR,
                              N_R)
        ctx.residual, ctx.layout, ctx.scale, ctx.chunk = (target, float(clip)), layout, float(scale), chunk
        ctx.saved, ctx.saved_R, ctx.wy, ctx.cu = saved, saved_R, wy, cu
        ctx.has_states, ctx.dtypes = (S0 is not None, R0 is not None), (g.dtype, beta.dtype, gamma.dtype)
        return BQ, CORR, ST, RT

    @staticmethod
    def backward(ctx, dBQ, dCORR, dST, dRT):
        q, k, v, g32, beta_c, gamma_c, w, hS, N_, X, made, RES, w_R, hR, N_R = ctx.saved_tensors
        layout, scale, chunk, wy = ctx.layout, ctx.scale, ctx.chunk, ctx.wy
        B, T, H, K = q.shape
        V = v.shape[-1]
        dev, dt = q.device, q.dtype
        NTH, C = B * T * H, max(layout.chunks, 1)
        dBQ, dCORR = dBQ.contiguous(), dCORR.contiguous()
        consts = _consts(H, K, V, chunk)
        gates = made if made is not None else g32
        target, clip = ctx.residual
        nv, opts = _grid_v("local", V)
        # R as far as its writes' gradient du_R = DN_R
        DNL_R = torch.empty(B, T, H, V, dtype=dt, device=dev)
        delta_bwd_local((nv, C, H), q=q, k=k, g=g32, dBQ=dCORR, dP=dCORR, DNL=DNL_R, dRES=dCORR, X=dCORR, dV=dCORR,
                        cu=layout.cu, cidx=layout.cidx, scale=scale, c=0.0, RESIDUAL=False, TARGET=0, TWO=False,
                        **consts, **opts)
        dhR, DN_R, dR0 = _reverse_pass(q, k, w_R, gates, dCORR, dCORR, DNL_R, dRT, layout, scale, consts,
                                       made is not None, ctx.ahead, two=False)
        # S: its local kernel makes dr from du_R, then dv and dp from dr
        DNL = torch.empty(B, T, H, V, dtype=dt, device=dev)
        dP = torch.empty(B, T, H, V, dtype=dt, device=dev)
        dV_res = torch.empty_like(v)
        delta_bwd_local((nv, C, H), q=q, k=k, g=g32, dBQ=dBQ, dP=dP, DNL=DNL, dRES=DN_R,
                        X=X if X is not None else DN_R, dV=dV_res, cu=layout.cu, cidx=layout.cidx, scale=scale,
                        c=clip, RESIDUAL=True, TARGET=TARGET_CODES[target], aux_dv=(ctx.saved_R[-1].contiguous(),
                                                                                  gamma_c), **consts, **opts)
        dhS, DN, dS0 = _reverse_pass(q, k, w, gates, dBQ, dP, DNL, dST, layout, scale, consts, made is not None,
                                     ctx.ahead)
        # one dq/dk kernel for both recurrences
        dQ, dK, dW, E_P, K_P, Z_P, grid, opts = _dqk_buffers(q, layout, "dqk_both")
        dW_R, Q_P = torch.empty_like(dW), torch.empty_like(E_P)
        delta_bwd_dqk(grid, q=q, k=k, g=g32, dBQ=dBQ, dP=dP, N_=N_, DN=DN, hS=hS, dhS=dhS, dQ=dQ, dK=dK, dW=dW,
                      E_P=E_P, K_P=K_P, Z_P=Z_P, cu=layout.cu, cidx=layout.cidx, NTH=NTH, NCH=C * H, scale=scale, H=H,
                      K=K, V=V, BT=chunk, BV=max(MIN_TILE, triton.next_power_of_2(V)),
                      aux=(dCORR, N_R, DN_R, hR, dhR, dW_R, Q_P), **opts)
        # the two WY steps: R's dk (fp32, no dv: dr was made above) into S's, which stores dk in k's dtype
        dK, _, dgamma, db_R = wy.bwd(k, RES, gamma_c, g32, ctx.saved_R, dW_R, DN_R, layout, ctx.cu, chunk, dK, None,
                                     dk_dtype=torch.float32, want_dv=False)
        dK, dv, dbeta, db = wy.bwd(k, v, beta_c, g32, ctx.saved, dW, DN, layout, ctx.cu, chunk, dK, dV_res)
        dg = gate_gradient(layout, E_P, K_P, Z_P, H, chunk, plus=Q_P, extra=(db + db_R).contiguous()).view(B, T, H)
        g_dtype, beta_dtype, gamma_dtype = ctx.dtypes
        has_S0, has_R0 = ctx.has_states
        return (dQ, dK, dv.to(v.dtype), dg.to(g_dtype), dbeta.to(beta_dtype), dgamma.to(gamma_dtype),
                dS0 if has_S0 else None, dR0 if has_R0 else None, None, None, None, None, None, None)


class DeltaKeepStates(torch.autograd.Function):
    """FLA's gated delta rule (chunk_gated_delta_rule, FLA 0.6.0) with its chunk states kept for the backward: RDN's
    auxiliary recurrence, R_t = alpha_t R_{t-1} (I - gamma_t k_t k_t^T) + gamma_t r_t k_t^T, read by q.

    FLA's own Function saves only the WY matrix A and recomputes w, u and every chunk state h (a whole state pass)
    in its backward, to spare memory. Here the forward's w, h and the pass's writes v_new are kept, so the backward
    starts at dh: per layer 8 bytes a token per unit of mixer width more (h at chunk 64 and K = 128 is 4 of them),
    for one state pass and one WY recomputation less. The kernels and their order are FLA's
    (`chunk_gated_delta_rule_fwd` / `_bwd`); states are [N, H, V, K] (state_v_first). With a mail, its q and k
    gradients go to the base pass's backward (`GradientMail`) instead of autograd."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale: float, h0, cu_seqlens, chunk: int, mail: GradientMail | None):
        from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
        from fla.ops.common.chunk_o import chunk_fwd_o
        from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
        from fla.ops.utils import chunk_local_cumsum
        from fla.ops.utils.constant import RCP_LN2
        from fla.ops.utils.index import prepare_chunk_indices

        q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
        ci = prepare_chunk_indices(cu_seqlens, chunk) if cu_seqlens is not None else None
        seq = dict(cu_seqlens=cu_seqlens, chunk_indices=ci)
        # FLA's kernels take the chunk-local cumsum of g in log2 units (they use exp2)
        g_cs = chunk_local_cumsum(g.contiguous(), chunk_size=chunk, scale=RCP_LN2, **seq)
        w, u, A = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g_cs, beta=beta, chunk_size=chunk, **seq)
        h, v_new, h_T = chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=g_cs, initial_state=h0, output_final_state=True,
                                                     state_v_first=True, chunk_size=chunk, **seq)
        o = chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=g_cs, scale=scale, state_v_first=True, chunk_size=chunk, **seq)
        ctx.save_for_backward(q, k, v, g_cs, beta, A, w, h, v_new, h0)
        ctx.scale, ctx.chunk, ctx.cu, ctx.ci, ctx.dtype, ctx.mail = scale, chunk, cu_seqlens, ci, g.dtype, mail
        return o.to(q.dtype), h_T

    @staticmethod
    def backward(ctx, do, dht):
        from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_bwd_dhu
        from fla.ops.common.chunk_o import chunk_bwd_dqkwg, chunk_bwd_dv_local
        from fla.ops.gated_delta_rule.wy_fast import prepare_wy_repr_bwd
        from fla.ops.utils import chunk_local_cumsum

        q, k, v, g_cs, beta, A, w, h, v_new, h0 = ctx.saved_tensors
        scale, chunk = ctx.scale, ctx.chunk
        seq = dict(cu_seqlens=ctx.cu, chunk_indices=ctx.ci)
        do = do.contiguous()
        dht = dht.contiguous() if dht is not None else None
        dv = chunk_bwd_dv_local(q=q, k=k, g=g_cs, do=do, scale=scale, chunk_size=chunk, **seq)
        dh, dh0, dv = chunk_gated_delta_rule_bwd_dhu(q=q, k=k, w=w, g=g_cs, h0=h0, dht=dht, do=do, dv=dv, scale=scale,
                                                     state_v_first=True, chunk_size=chunk, **seq)
        dq, dk, dw, dg = chunk_bwd_dqkwg(q=q, k=k, v=v_new, w=w, g=g_cs, h=h, dv=dv, do=do, dh=dh, scale=scale,
                                         state_v_first=True, chunk_size=chunk, **seq)
        dk2, dv, db, dg2 = prepare_wy_repr_bwd(k=k, v=v, beta=beta, g=g_cs, A=A, dw=dw, du=dv, **seq)
        dg.add_(dg2)
        dg = chunk_local_cumsum(dg, chunk_size=chunk, reverse=True, **seq)
        if ctx.mail is not None:
            ctx.mail.post(dq, dk, dk2)
            dq = dk = None
        else:
            dq, dk = dq.to(q.dtype), dk.add_(dk2).to(k.dtype)
        return (dq, dk, dv.to(v.dtype), dg.to(ctx.dtype), db.to(beta.dtype), None,
                dh0 if ctx.needs_input_grad[6] else None, None, None, None)


def delta_keep_states(q, k, v, g, beta, scale, h0, cu_seqlens, mail: GradientMail | None = None):
    """`DeltaKeepStates` with the signature of the composition's delta kernel (fla_backend.DeltaKernel): (o, h_T).
    mail: the base pass's `GradientMail`; q and k's gradients go there if these are the base pass's q and k."""
    posts = mail is not None and mail.takes(q, k)
    return DeltaKeepStates.apply(q, k, v, g, beta, scale, h0, cu_seqlens, CHUNK, mail if posts else None)


def covers(q: torch.Tensor, v: torch.Tensor, spec) -> bool:
    """Whether RDN's base pass runs here: the delta rule with a residual path, bf16/fp16, heads up to 128 wide (the
    state passes hold a whole K row of the state: K <= 128 keeps that tile in registers)."""
    return (spec.rule == "delta" and spec.fit != "off" and q.dtype in (torch.bfloat16, torch.float16)
            and q.shape[-1] <= MAX_HEAD_DIM and v.shape[-1] <= MAX_HEAD_DIM)


def _layout(q: torch.Tensor, cu_seqlens: torch.Tensor | None, chunk: int) -> tuple[Layout, torch.Tensor | None]:
    """The chunk layout of batched or packed sequences, and cu_seqlens as FLA's WY kernels take them (int64)."""
    B, T = q.shape[:2]
    layout = Layout.batched(B, T, chunk, q.device) if cu_seqlens is None else Layout(B, T, cu_seqlens, chunk, q.device)
    return layout, cu_seqlens.long() if cu_seqlens is not None else None


def delta_two_reads(q, k, v, g, beta, S0, scale: float, cu_seqlens: torch.Tensor | None = None,
                    wy: WY = FLA_WY, chunk: int = CHUNK, mail: GradientMail | None = None,
                    residual: tuple[str, float] | None = None):
    """(scale S_{t-1} q_t, S_{t-1} k_t, S_T) of the gated delta rule; q, k [B, T, H, K], S0 [N, H, V, K] fp32 or None.

    Packed sequences as in FLA: B = 1 and cu_seqlens [N + 1]. mail: where the auxiliary pass of the same q and k
    leaves its gradients for this backward to add (`GradientMail`). residual (target, clip): the residual
    T(v_t - S_{t-1} k_t) in v's dtype in place of the prediction (`DeltaTwoReads`)."""
    layout, cu = _layout(q, cu_seqlens, chunk)
    return DeltaTwoReads.apply(q, k, v, g, beta, S0.float().contiguous() if S0 is not None else None, layout,
                               scale, chunk, wy, cu, mail, residual)


def residual_delta(q, k, v, g, beta, gamma, S0, R0, scale: float, residual: tuple[str, float],
                   cu_seqlens: torch.Tensor | None = None, wy: WY = FLA_WY, chunk: int = CHUNK):
    """(scale S_{t-1} q_t, scale R_t q_t, S_T, R_T) of RDN's two recurrences (`ResidualDelta`); q, k [B, T, H, K],
    S0, R0 [N, H, V, K] fp32 or None, residual (target, clip). Packed sequences as in FLA: B = 1 and cu_seqlens
    [N + 1]."""
    layout, cu = _layout(q, cu_seqlens, chunk)
    states = [x.float().contiguous() if x is not None else None for x in (S0, R0)]
    return ResidualDelta.apply(q, k, v, g, beta, gamma, *states, layout, scale, chunk, wy, cu, residual)
