"""RLA (the additive rule) in Triton kernels of our own (nine launches), one autograd Function.

The `fla` composition runs the base recurrence twice over (once per query, [q; k]) and the auxiliary one after it,
with PyTorch glue in between. Here, per head and chunk of BT tokens (b = the chunk-local cumsum of g, b' = b - g,
b_L the chunk's total, S_c, R_c the states when the chunk starts; docs/MATH.md "chunked RLA"):

    forward
      gates     b for every token, once (`made_gates`): the state passes read it, where making it in their sequential
                loop costs a scan and a sum (a barrier each) per chunk
      S pass    (sequential over chunks; grid V tiles x sequences x heads, one BV x K state tile each):
                S_{c+1} = exp(b_L) S_c + (beta v * exp(b_L - b))^T k, storing every S_c, and from S_c, before the
                update, each chunk's residuals (`_s_pass_residual`):
                p = exp(b') k S_c^T + (k k^T * exp(b'_t - b_s)[s<t]) (beta v)   the old read
                x = v - p,  w = gamma T(x)  (fit="none": w = T(x)); stores x (fp32) and w.
                A long sequence on few programs is cut into segments that run side by side (`run_state_pass`)
      R pass    a plain state pass over w (grid K tiles x V tiles x sequences x heads, one state tile each, as
                FLA's chunk_fwd_h: `LAUNCH`, or 64 x 64 where the pass has fewer than two programs per SM of the
                GPU, `NARROW_BELOW`): R_{c+1} = exp(b_L) R_c + (w * exp(b_L - b))^T k
      output    (parallel): o = scale (exp(b) q S_c^T + (q k^T * exp(b_t - b_s)[s<t]) (beta v))
                              + gamma scale (exp(b) q R_c^T + (q k^T * exp(b_t - b_s)[s<=t]) w)
                (no output gates: b' replaces b in the base read and gamma goes).
    backward
      dR pass   (sequential, reverse): dR needs nothing from dS, so it runs first, alone
      residual  (parallel): dw = dR_t k_t, dx = gamma T'(x) dw (the residual's gradient; stored in the inputs'
                dtype), and dgamma's share T(x) . dw
      dS pass   (sequential, reverse): dS collects dx through dp = -dx (two dots per chunk); dR's and dS's passes
                also store their tiles' shares of dg's chunk end terms, exp(b_L) <dS_end, S_c> (+ R's)
      dv        (parallel over V tiles x chunks): dv = beta dS_t k_t + dx, each tile's share of dbeta and of the
                output gates' dgamma
      dq, dk    (parallel over K tiles x chunks): dq, dk (with output gates, both reads by q through one matrix),
                and for dg each tile's share of the per-token terms of d/db (reads minus writes) and of the end
                terms' writes; dg is their reverse cumulative sum per chunk plus the chunk's end term.
The residual couples the recurrences only through x (forward) and dx (backward), both per token: each direction
runs two state passes, and every sequential kernel holds one fp32 state tile (carrying S and R, or dS and dR,
together at full K spills registers, and gives a B = 1 sequence only 32 programs). Making the residuals in S's pass
spares a reading of the chunk states and of k and v (`RESIDUAL_IN_S_PASS`; `_fwd_residual` does it after a plain
pass); the backward's parallel kernels stay apart from their passes, where the same fusion was slower
(docs/RESULTS.md).

Every input is flattened to packed sequences (B sequences of T tokens are cu_seqlens = 0, T, 2T, ...), so varlen
and batched inputs share one code path. Chunk states are kept in the input dtype (as FLA does), the running states
and every accumulation in fp32. The backward keeps S_c and R_c from the forward.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rla_ablate.ops.spec import ResidualSpec, check_packed_batch
from rla_ablate.ops.triton.common import (CHUNK, COEF_B, COEF_B_PRIME, COEF_TO_END, MAX_HEAD_DIM, MIN_TILE,
                                          TARGET_CODES, Layout, _chunk_gates, _chunk_rows, _chunk_tile, _decay,
                                          _keep_for_slope, _pass_chunk, _pass_program, _pass_tokens, _target,
                                          _times_kept_slope, gate_gradient, launch_options, made_gates, parse_launch)

# Tile of the value dimension and warps per kernel (benchmarks/kernels.py --tune measures alternatives; tiles at
# least MIN_TILE wide). Four warps everywhere: measured on the H200 (`--tune`, 4 x 4K), each kernel at 4 warps beat
# 8 (the dq/dk kernel by 13% of the whole fwd+bwd, though ptxas reports it spilling more): at ~250 registers a
# thread, 8 warps leave one block per SM and nothing to overlap one program's loads with another's dots; two blocks
# of 4 warps can.
LAUNCH = {
    # the state passes, one BV x BK fp32 tile per program (as FLA's chunk_fwd_h): one term (S, R, dR) or two (dS);
    # 64 x 128 tiles since the reverse passes also make dg's end terms (`benchmarks/kernels.py --tune additive`)
    "state_pass": dict(BK=64, BV=128, num_warps=4),
    "state_pass_2": dict(BK=128, BV=64, num_warps=4),
    "fwd_residual": dict(BV=64, num_warps=4),
    # S's pass making the residuals (`_s_pass_residual`): one BV x K fp32 tile a program
    "s_pass_residual": dict(BV=64, num_warps=4),
    "fwd_output": dict(BV=64, num_warps=4),
    "bwd_residual": dict(BV=64, num_warps=4),
    "bwd_dv": dict(BV=64, num_warps=4),
    "bwd_dqk": dict(BK=64, num_warps=4),  # its V tile is the whole V
}


@triton.jit
def _pass_coef(b, bp, b_L, CODE: tl.constexpr):
    """The per-token weight of a state pass's term: COEF_TO_END exp(b_L - b) (a write, to the chunk end), COEF_B
    exp(b), COEF_B_PRIME exp(b')."""
    if CODE == COEF_TO_END:
        c = tl.exp(b_L - b)
    elif CODE == COEF_B:
        c = tl.exp(b)
    else:
        c = tl.exp(bp)
    return c


@triton.jit
def _pass_reads(ka, ua, sa, kb, ub, g, hF, bos, eos, c, c0, h, rk, rv, mk, mv, m_state, o_state,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, HAS_SA: tl.constexpr,
                HAS_B: tl.constexpr, STORE_Z: tl.constexpr, MADE: tl.constexpr):
    """What chunk c of a state pass reads besides the state it carries, loaded a chunk ahead (`_state_pass`, AHEAD):
    the gates b, b', b_L (`_pass_chunk`), sa's vector, the forward's chunk state (STORE_Z) and the four input tiles
    (ua, ub in fp32). A term or part the pass does not have gives a stand-in that is never used."""
    mt, tok, m_tk, m_tv, b, bp, b_L = _pass_chunk(g, bos, eos, c, h, mk, mv, H, BT, MADE)
    s = b
    if HAS_SA:
        s = tl.load(sa + tok, mask=mt, other=0.0).to(tl.float32)
    f = b_L
    if STORE_Z:  # nothing for a chunk past the end (the first read ahead of an empty sequence); the condition
        # as a vector over the rows, which Triton's interpreter takes in a tile's mask where it refuses a scalar
        has = bos + c * BT + 0 * rv < eos
        f = tl.load(hF + ((c0 + c) * H + h) * V * K + o_state, mask=m_state & has[:, None],
                    other=0.0).to(tl.float32)
    k_a = tl.load(ka + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    u_a = tl.load(ua + tok[:, None] * V + rv[None, :], mask=m_tv, other=0.0).to(tl.float32)
    k_b, u_b = k_a, u_a
    if HAS_B:
        k_b = tl.load(kb + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
        u_b = tl.load(ub + tok[:, None] * V + rv[None, :], mask=m_tv, other=0.0).to(tl.float32)
    return b, bp, b_L, s, f, k_a, u_a, k_b, u_b


@triton.jit
def _state_pass(ka, ua, sa, kb, ub, g, D0, hD, DT, LD, hF, Z_P, NCH, cu, coff, scale_a, sign_b,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, REVERSE: tl.constexpr, CA: tl.constexpr, CB: tl.constexpr, HAS_SA: tl.constexpr,
                HAS_B: tl.constexpr, HAS_D0: tl.constexpr, STORE_H: tl.constexpr, STORE_L: tl.constexpr,
                STORE_Z: tl.constexpr, Z_ROWS: tl.constexpr, MADE: tl.constexpr, AHEAD: tl.constexpr):
    """One chunked state recurrence, sequential over chunks (grid K tiles x V tiles x sequences x heads).

        D <- exp(b_L) D + ((ua * sa * scale_a * c_A(b)) ^T ka) [+ sign_b (ub * c_B(b)) ^T kb]     per chunk

    forward (REVERSE=False) it is a state (S with ua = v, sa = beta; R with ua = w) and hD[c] holds it where chunk c
    starts; reverse it is a state gradient (dR with ua = do, sa = gamma, ka = q; dS adds ub = dx, kb = k,
    sign_b = -1) and hD[c] holds it where chunk c ends. c_X: CA, CB, the codes of `_pass_coef`.
    Holds one BV x BK fp32 tile and two dots per chunk: no spills, and K tiles multiply the programs of long
    sequences (a B = 1 sequence of 128K tokens ran on 32 programs when the passes also made the residual).
    STORE_H=False keeps only the end state, STORE_L also stores the sum of the chunks' b_L (the log of the pass's
    whole decay) in LD[sequence * H + head] (the first pass of a split pass, `run_state_pass`).
    STORE_Z (reverse, a state gradient): with hF the forward's chunk states (S_c or R_c where chunk c starts), this
    tile's share of dg's chunk end term from the states, exp(b_L) <D_end, hF[c]>, D in fp32 as it is carried, in
    Z_P[tile, c * H + head] (tiles K-major, NCH = chunks x heads); the dq/dk kernel then adds only the writes'.
    Z_ROWS (`END_TERM_ROWS`): the share of each of the tile's BV rows, in Z_P[tile * BV + row, c * H + head].
    MADE: g holds the gates made once (`made_gates`: b, read by `_pass_chunk`), not the raw g.
    AHEAD (`READ_AHEAD`): what a chunk reads (`_pass_reads`) is loaded one chunk ahead, while the chunk before is
    multiplied, so no load waits on the chain of chunks; 1 all but ka's and kb's tiles (which feed a dot as they are
    loaded), 2 all, 0 none (each chunk loads its own).
    """
    h, bos, eos, c0, rk, rv, mk, mv, m_state, o_state, o_seq, D = _pass_program(
        cu, coff, D0, tl.program_id(0), tl.program_id(1), tl.program_id(2), H, K, V, BK, BV, HAS_D0)
    NC = tl.cdiv(eos - bos, BT)
    log_decay = tl.zeros([1], dtype=tl.float32)
    if AHEAD > 0:
        n_b, n_bp, n_bL, n_s, n_f, n_ka, n_ua, n_kb, n_ub = _pass_reads(
            ka, ua, sa, kb, ub, g, hF, bos, eos, tl.maximum(NC - 1, 0) if REVERSE else 0, c0, h, rk, rv, mk, mv,
            m_state, o_state, H, K, V, BT, HAS_SA, HAS_B, STORE_Z, MADE)
    for i in range(NC):
        c = NC - 1 - i if REVERSE else i
        if STORE_H:
            tl.store(hD + ((c0 + c) * H + h) * V * K + o_state, D.to(hD.dtype.element_ty), mask=m_state)
        if AHEAD > 0:
            b, bp, b_L, s, f, b_ka, b_ua, b_kb, b_ub = n_b, n_bp, n_bL, n_s, n_f, n_ka, n_ua, n_kb, n_ub
            cn = tl.maximum(c - 1, 0) if REVERSE else tl.minimum(c + 1, NC - 1)  # the last chunk reads itself again
            n_b, n_bp, n_bL, n_s, n_f, n_ka, n_ua, n_kb, n_ub = _pass_reads(
                ka, ua, sa, kb, ub, g, hF, bos, eos, cn, c0, h, rk, rv, mk, mv, m_state, o_state,
                H, K, V, BT, HAS_SA, HAS_B, STORE_Z, MADE)
            if AHEAD == 1:
                _, tok, m_tk, _ = _pass_tokens(bos, eos, c, h, mk, mv, H, BT)
                b_ka = tl.load(ka + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
                if HAS_B:
                    b_kb = tl.load(kb + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
        else:  # each chunk loads its own, each tile where the products come to need it
            mt, tok, m_tk, m_tv, b, bp, b_L = _pass_chunk(g, bos, eos, c, h, mk, mv, H, BT, MADE)
            if STORE_Z:
                f = tl.load(hF + ((c0 + c) * H + h) * V * K + o_state, mask=m_state, other=0.0).to(tl.float32)
        if STORE_Z:
            z = tl.sum(D * f, axis=1)
            tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
            if Z_ROWS:  # a row each, summed by the gate-gradient kernel: no sum across the warps on the chain
                tl.store(Z_P + (tile * BV + tl.arange(0, BV)).to(tl.int64) * NCH + (c0 + c) * H + h, tl.exp(b_L) * z)
            else:
                tl.store(Z_P + tile.to(tl.int64) * NCH + (c0 + c) * H + h, tl.exp(b_L) * tl.sum(z, axis=0))
        if AHEAD == 0:
            b_ka = tl.load(ka + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
            if HAS_SA:
                s = tl.load(sa + tok, mask=mt, other=0.0).to(tl.float32)
            b_ua = tl.load(ua + tok[:, None] * V + rv[None, :], mask=m_tv, other=0.0).to(tl.float32)
        dt = b_ka.dtype
        coef = _pass_coef(b, bp, b_L, CA)
        if HAS_SA:
            coef = coef * s
        D = tl.dot(tl.trans((b_ua * (coef * scale_a)[:, None]).to(dt)), b_ka, D * tl.exp(b_L))  # accumulates in D
        if STORE_L:
            log_decay += b_L
        if HAS_B:
            if AHEAD == 0:
                b_kb = tl.load(kb + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
                b_ub = tl.load(ub + tok[:, None] * V + rv[None, :], mask=m_tv, other=0.0).to(tl.float32)
            coef_b = _pass_coef(b, bp, b_L, CB)
            D = tl.dot(tl.trans((b_ub * (coef_b * sign_b)[:, None]).to(dt)), b_kb, D)
    tl.store(DT + o_seq + o_state, D, mask=m_state)
    if STORE_L:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(LD + tl.program_id(2) + tl.arange(0, 1), log_decay)


def state_pass(grid, *, ka, ua, sa, kb, ub, g, D0, hD, DT, cu, coff, scale_a, sign_b, H, K, V, BT, BK, BV, REVERSE, CA,
               CB, HAS_SA, HAS_B, HAS_D0, STORE_H=True, LD=None, end_term=None, MADE=False, AHEAD=None, **options):
    """`_state_pass` over `grid`, every parameter by name; `options`: num_warps, num_stages. LD: where the pass
    stores each program row's log decay (STORE_L), or None. end_term: (hF, Z_P, Z_ROWS) for STORE_Z, or None (Z_P's
    rows: `_end_term_rows`). AHEAD: None, `READ_AHEAD`; 0, 1, 2, or an `AheadRule` that picks one for this pass."""
    hF, Z_P, rows = end_term if end_term is not None else (DT, DT, False)
    setting = _ahead(AHEAD, "rev2" if HAS_B else "rev" if REVERSE else "fwd", grid[0] * grid[1] * grid[2], g.device,
                     BK * BV)
    _state_pass[grid](ka, ua, sa, kb, ub, g, D0, hD, DT, LD if LD is not None else DT, hF, Z_P,
                      Z_P.shape[-1] if end_term is not None else 0, cu, coff, scale_a, sign_b, H=H, K=K, V=V, BT=BT,
                      BK=BK, BV=BV, REVERSE=REVERSE, CA=CA, CB=CB, HAS_SA=HAS_SA, HAS_B=HAS_B, HAS_D0=HAS_D0,
                      STORE_H=STORE_H, STORE_L=LD is not None, STORE_Z=end_term is not None, Z_ROWS=rows,
                      MADE=MADE, AHEAD=setting, **options)


@triton.jit
def _segment_carry(E, LD, D0, STARTS, DT, first, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, REVERSE: tl.constexpr, HAS_D0: tl.constexpr):
    """The state each segment of a split pass starts from, and each sequence's end state (grid K tiles x V tiles x
    sequences*heads): over a sequence's segments in pass order (last to first when REVERSE), STARTS[s] = D, then
    D <- exp(LD[s]) D + E[s], from D0 (or zeros); DT = the final D. E: each segment's pass from zero."""
    n, h = tl.program_id(2) // H, tl.program_id(2) % H
    f0, f1 = tl.load(first + n), tl.load(first + n + 1)
    rk, rv = tl.program_id(0) * BK + tl.arange(0, BK), tl.program_id(1) * BV + tl.arange(0, BV)
    m_state = (rv < V)[:, None] & (rk < K)[None, :]
    o_state = rv[:, None] * K + rk[None, :]
    o_seq = (n * H + h).to(tl.int64) * V * K
    D = tl.zeros([BV, BK], dtype=tl.float32)
    if HAS_D0:
        D += tl.load(D0 + o_seq + o_state, mask=m_state, other=0.0).to(tl.float32)
    for i in range(f1 - f0):
        s = f1 - 1 - i if REVERSE else f0 + i
        o = (s * H + h).to(tl.int64) * V * K + o_state
        tl.store(STARTS + o, D, mask=m_state)
        D = D * tl.exp(tl.load(LD + s * H + h)) + tl.load(E + o, mask=m_state, other=0.0)
    tl.store(DT + o_seq + o_state, D, mask=m_state)


def segment_carry(grid, *, E, LD, D0, STARTS, DT, first, H, K, V, BK, BV, REVERSE, HAS_D0, **options):
    """`_segment_carry` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _segment_carry[grid](E, LD, D0, STARTS, DT, first, H=H, K=K, V=V, BK=BK, BV=BV, REVERSE=REVERSE, HAS_D0=HAS_D0,
                         **options)


@triton.jit
def _residual(b_k, b_v, bv, b_S, b, bp, X, W, o_tv, m_tv, c_clip, BT: tl.constexpr, TARGET: tl.constexpr):
    """One chunk's old reads and residuals from S_c's tile b_S (in the inputs' dtype), v's tile b_v (fp32) and
    bv = beta v: p = exp(b') k S_c^T + (k k^T * exp(b'_t - b_s)[s<t]) (beta v), x = v - p, r = T(x); stores r (W's
    dtype) and what the backward needs of x for the target's slope (X): the clip's slope itself (0 or 1, a byte),
    tanh's x (fp32), nothing for the identity. gamma is applied where r is read (w = gamma r)."""
    rt = tl.arange(0, BT)
    dt = b_k.dtype
    M = tl.dot(b_k, tl.trans(b_k)) * _decay(bp, b, rt[:, None] > rt[None, :])
    p = tl.exp(bp)[:, None] * tl.dot(b_k, tl.trans(b_S)) + tl.dot(M.to(dt), bv.to(dt))
    x = b_v - p
    _keep_for_slope(X, o_tv, m_tv, x, c_clip, TARGET)
    tl.store(W + o_tv, _target(x, c_clip, TARGET).to(W.dtype.element_ty), mask=m_tv)


@triton.jit
def _fwd_residual(k, v, g, beta, hS, X, W, cu, cidx, c_clip,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, TARGET: tl.constexpr):
    """The old reads and the residuals, parallel over chunks (grid V tiles x chunks x heads), once S_c is known:

        p = exp(b') k S_c^T + (k k^T * exp(b'_t - b_s)[s<t]) (beta v),   x = v - p,   r = T(x)
    stores r (input dtype, what R's pass and the output read) and what the backward needs of x (`_residual`).
    """
    i_v, i_c, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n, eos, t, mt, tok, rk, rv, mk, mv, m_tk, m_tv = _chunk_tile(cu, cidx, i_c, h, i_v, H, K, V, BT, BK, BV)
    o_tv = tok[:, None] * V + rv[None, :]
    b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    dt = b_k.dtype
    b_v = tl.load(v + o_tv, mask=m_tv, other=0.0).to(tl.float32)
    bv = b_v * tl.load(beta + tok, mask=mt, other=0.0).to(tl.float32)[:, None]
    b, bp, b_L = _chunk_gates(g, tok, mt)
    b_hS = tl.load(hS + (i_c * H + h).to(tl.int64) * V * K + rv[:, None] * K + rk[None, :],
                   mask=mv[:, None] & mk[None, :], other=0.0).to(dt)
    _residual(b_k, b_v, bv, b_hS, b, bp, X, W, o_tv, m_tv, c_clip, BT, TARGET)


@triton.jit
def _s_reads(k, v, g, beta, bos, eos, c, h, rk, rv, mk, mv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
             BT: tl.constexpr, MADE: tl.constexpr):
    """What chunk c of S's pass reads besides the state: the gates (`_pass_chunk`), beta (fp32), v's tile (fp32) and
    k's tile."""
    mt, tok, m_tk, m_tv, b, bp, b_L = _pass_chunk(g, bos, eos, c, h, mk, mv, H, BT, MADE)
    b_beta = tl.load(beta + tok, mask=mt, other=0.0).to(tl.float32)
    b_v = tl.load(v + tok[:, None] * V + rv[None, :], mask=m_tv, other=0.0).to(tl.float32)
    b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    return b, bp, b_L, b_beta, b_v, b_k


@triton.jit
def _s_pass_residual(k, v, g, beta, D0, hS, ST, X, W, cu, coff, c_clip,
                     H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                     BV: tl.constexpr, HAS_D0: tl.constexpr, TARGET: tl.constexpr, MADE: tl.constexpr,
                     AHEAD: tl.constexpr):
    """S's pass with the old reads and residuals of each chunk made from the state it holds (grid V tiles x
    sequences*heads; one BV x K fp32 tile, the whole K, as RDN's passes): per chunk, stores S_c (hS), then

        p = exp(b') k S_c^T + (k k^T * exp(b'_t - b_s)[s<t]) (beta v),   x = v - p,   r = T(x)
        S_{c+1} = exp(b_L) S_c + (beta v * exp(b_L - b))^T k

    storing r and what the backward needs of x (`_residual`), what `_fwd_residual` computes from the stored S_c in a
    kernel of its own. The same numbers: S_c enters the read rounded to the inputs' dtype, as stored. Spares the
    residual's reading of hS and a second reading of k and v (over a fifth of RLA's forward traffic at head_dim
    128). MADE: g holds the gates made once, as `_state_pass` takes them. AHEAD: a chunk's reads (`_s_reads`) one
    chunk ahead, as `_state_pass` loads them (1: all but k's tile, 2: all, 0: none)."""
    h, bos, eos, c0, rk, rv, mk, mv, m_state, o_state, o_seq, S = _pass_program(
        cu, coff, D0, 0, tl.program_id(0), tl.program_id(1), H, K, V, BK, BV, HAS_D0)
    NC = tl.cdiv(eos - bos, BT)
    if AHEAD > 0:
        n_b, n_bp, n_bL, n_beta, n_v, n_k = _s_reads(k, v, g, beta, bos, eos, 0, h, rk, rv, mk, mv, H, K, V, BT, MADE)
    for c in range(NC):
        tl.store(hS + ((c0 + c) * H + h) * V * K + o_state, S.to(hS.dtype.element_ty), mask=m_state)
        _, tok, m_tk, m_tv = _pass_tokens(bos, eos, c, h, mk, mv, H, BT)
        o_tv = tok[:, None] * V + rv[None, :]
        if AHEAD > 0:
            b, bp, b_L, b_beta, b_v, b_k = n_b, n_bp, n_bL, n_beta, n_v, n_k
            n_b, n_bp, n_bL, n_beta, n_v, n_k = _s_reads(k, v, g, beta, bos, eos, tl.minimum(c + 1, NC - 1), h, rk, rv,
                                                         mk, mv, H, K, V, BT, MADE)  # the last chunk reads itself
            if AHEAD == 1:
                b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
        else:
            b, bp, b_L, b_beta, b_v, b_k = _s_reads(k, v, g, beta, bos, eos, c, h, rk, rv, mk, mv, H, K, V, BT, MADE)
        dt = b_k.dtype
        bv = b_v * b_beta[:, None]
        _residual(b_k, b_v, bv, S.to(dt), b, bp, X, W, o_tv, m_tv, c_clip, BT, TARGET)
        coef = tl.exp(b_L - b) * b_beta  # as `_state_pass` (CA = COEF_TO_END, sa = beta): the same rounding
        S = tl.dot(tl.trans((b_v * coef[:, None]).to(dt)), b_k, S * tl.exp(b_L))
    tl.store(ST + o_seq + o_state, S, mask=m_state)


def s_pass_residual(grid, *, k, v, g, beta, D0, hS, ST, X, W, cu, coff, c_clip, H, K, V, BT, BK, BV, HAS_D0, TARGET,
                    MADE=False, AHEAD=None, **options):
    """`_s_pass_residual` over `grid`, every parameter by name; `options`: num_warps, num_stages. AHEAD: None,
    `READ_AHEAD`; 0, 1, 2, or an `AheadRule`."""
    setting = _ahead(AHEAD, "s", grid[0] * grid[1], g.device, BK * BV)
    _s_pass_residual[grid](k, v, g, beta, D0, hS, ST, X, W, cu, coff, c_clip, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                           HAS_D0=HAS_D0, TARGET=TARGET, MADE=MADE, AHEAD=setting, **options)


def fwd_residual(grid, *, k, v, g, beta, hS, X, W, cu, cidx, c_clip, H, K, V, BT, BK, BV, TARGET, **options):
    """`_fwd_residual` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _fwd_residual[grid](k, v, g, beta, hS, X, W, cu, cidx, c_clip, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, TARGET=TARGET,
                        **options)


@triton.jit
def _fwd_output(q, k, v, g, beta, gamma, W, hS, hR, O, CORR, cu, cidx, scale,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, FIT_RES: tl.constexpr, GATES: tl.constexpr):
    i_v, i_c, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n, eos, t, mt, tok, rk, rv, mk, mv, m_tk, m_tv = _chunk_tile(cu, cidx, i_c, h, i_v, H, K, V, BT, BK, BV)
    rt = tl.arange(0, BT)
    b_q = tl.load(q + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    dt = b_k.dtype
    b_v = tl.load(v + tok[:, None] * V + rv[None, :], mask=m_tv, other=0.0).to(tl.float32)
    b_r = tl.load(W + tok[:, None] * V + rv[None, :], mask=m_tv, other=0.0).to(dt)  # r = T(x); w = gamma r
    b_beta = tl.load(beta + tok, mask=mt, other=0.0).to(tl.float32)
    b, bp, b_L = _chunk_gates(g, tok, mt)
    o_chunk = (i_c * H + h).to(tl.int64) * V * K + rv[:, None] * K + rk[None, :]
    m_state = mv[:, None] & mk[None, :]
    QK = tl.dot(b_q, tl.trans(b_k))
    eq = b if GATES else bp  # the base read is alpha_t S_{t-1} q_t (gates) or S_{t-1} q_t
    b_hS = tl.load(hS + o_chunk, mask=m_state, other=0.0).to(dt)
    base = tl.exp(eq)[:, None] * tl.dot(b_q, tl.trans(b_hS)) \
        + tl.dot((QK * _decay(eq, b, rt[:, None] > rt[None, :])).to(dt), (b_v * b_beta[:, None]).to(dt))
    if FIT_RES:
        b_hR = tl.load(hR + o_chunk, mask=m_state, other=0.0).to(dt)
        b_gamma_w = tl.load(gamma + tok, mask=mt, other=0.0).to(tl.float32)  # the writes' gamma, on the columns
        corr = tl.exp(b)[:, None] * tl.dot(b_q, tl.trans(b_hR)) \
            + tl.dot((QK * (_decay(b, b, rt[:, None] >= rt[None, :]) * b_gamma_w[None, :])).to(dt), b_r)
    else:
        corr = tl.sum(b_q.to(tl.float32) * b_k.to(tl.float32), axis=1)[:, None] * b_r.to(tl.float32)
    corr = corr * scale
    if GATES:
        b_gamma = tl.load(gamma + tok, mask=mt, other=0.0).to(tl.float32)
        o = base * scale + b_gamma[:, None] * corr
        tl.store(CORR + tok[:, None] * V + rv[None, :], corr.to(CORR.dtype.element_ty), mask=m_tv)
    else:
        o = base * scale + corr
    tl.store(O + tok[:, None] * V + rv[None, :], o.to(O.dtype.element_ty), mask=m_tv)


def fwd_output(grid, *, q, k, v, g, beta, gamma, W, hS, hR, O, CORR, cu, cidx, scale, H, K, V, BT, BK, BV, FIT_RES,
               GATES, **options):
    """`_fwd_output` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _fwd_output[grid](q, k, v, g, beta, gamma, W, hS, hR, O, CORR, cu, cidx, scale, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                      FIT_RES=FIT_RES, GATES=GATES, **options)


@triton.jit
def _bwd_residual(q, k, g, gamma, dO, X, W, hdR, dRT, DX, dGR_P, cu, cidx, NTH, scale, c_clip,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, TARGET: tl.constexpr, FIT_RES: tl.constexpr, GATES: tl.constexpr,
                  HAS_DRT: tl.constexpr):
    """The residual's gradient dw and dx = (gamma) T'(x) dw, parallel over chunks (grid V tiles x chunks x heads).

    fit residual: dw_t = dR_t k_t = exp(b_L - b_t) dR_end k_t + scale sum_{s >= t, chunk} exp(b_s - b_t) (k_t . q_s) o_R,s
                  (o_R = gamma do with output gates, else do; dR_end from the dR pass)
    fit none:     dw_t = scale (q_t . k_t) o_R,t, plus dR_T k_T at each sequence's last token
    Stores dx in the inputs' dtype (the dot operand of dS's pass and _bwd_dqk, and added to dv in _bwd_dv) and this
    V tile's share of dgamma from the residual (fit residual: r . dw, r = T(x) as the forward stored it in W), so
    that dw goes no further. T'(x) comes from what the forward kept of x (X, `_residual`).
    """
    i_v, i_c, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n, eos, t, mt, tok, rk, rv, mk, mv, m_tk, m_tv = _chunk_tile(cu, cidx, i_c, h, i_v, H, K, V, BT, BK, BV)
    rt = tl.arange(0, BT)
    o_tv = tok[:, None] * V + rv[None, :]
    m_state = mv[:, None] & mk[None, :]
    b_q = tl.load(q + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    dt = b_k.dtype
    b_gamma = tl.load(gamma + tok, mask=mt, other=0.0).to(tl.float32)
    o_R = tl.load(dO + o_tv, mask=m_tv, other=0.0).to(tl.float32)
    if GATES:
        o_R = o_R * b_gamma[:, None]
    b, bp, b_L = _chunk_gates(g, tok, mt)
    if FIT_RES:
        b_dR = tl.load(hdR + (i_c * H + h).to(tl.int64) * V * K + rv[:, None] * K + rk[None, :],
                       mask=m_state, other=0.0).to(dt)
        M = tl.dot(b_k, tl.trans(b_q)) * _decay(-b, -b, rt[:, None] <= rt[None, :]) * scale
        dw = tl.exp(b_L - b)[:, None] * tl.dot(b_k, tl.trans(b_dR)) + tl.dot(M.to(dt), o_R.to(dt))
    else:
        dw = (tl.sum(b_q.to(tl.float32) * b_k.to(tl.float32), axis=1) * scale)[:, None] * o_R
        if HAS_DRT:
            b_dRT = tl.load(dRT + (n * H + h) * V * K + rv[:, None] * K + rk[None, :], mask=m_state, other=0.0)
            dw += tl.where((t == eos - 1)[:, None], tl.dot(b_k, tl.trans(b_dRT.to(dt))), 0.0)
    dx = _times_kept_slope(dw, X, o_tv, m_tv, c_clip, TARGET)
    if FIT_RES:
        dx = dx * b_gamma[:, None]
        b_r = tl.load(W + o_tv, mask=m_tv, other=0.0).to(tl.float32)
        tl.store(dGR_P + i_v.to(tl.int64) * NTH + tok, tl.sum(b_r * dw, axis=1), mask=mt)
    tl.store(DX + o_tv, dx.to(DX.dtype.element_ty), mask=m_tv)


def bwd_residual(grid, *, q, k, g, gamma, dO, X, W, hdR, dRT, DX, dGR_P, cu, cidx, NTH, scale, c_clip, H, K, V, BT, BK,
                 BV, TARGET, FIT_RES, GATES, HAS_DRT, **options):
    """`_bwd_residual` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _bwd_residual[grid](q, k, g, gamma, dO, X, W, hdR, dRT, DX, dGR_P, cu, cidx, NTH, scale, c_clip, H=H, K=K, V=V,
                        BT=BT, BK=BK, BV=BV, TARGET=TARGET, FIT_RES=FIT_RES, GATES=GATES, HAS_DRT=HAS_DRT, **options)


@triton.jit
def _bwd_dv(q, k, v, g, beta, DX, CORR, dO, dhS, dV, dBETA_P, dGAMMA_P, cu, cidx, NTH, scale,
            H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
            GATES: tl.constexpr):
    """dv = beta dS_t k_t + dx, this V tile's share of dbeta and, with output gates, the gates' share of dgamma
    (grid V tiles x chunks x heads)."""
    i_v, i_c, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n, eos, t, mt, tok, rk, rv, mk, mv, m_tk, m_tv = _chunk_tile(cu, cidx, i_c, h, i_v, H, K, V, BT, BK, BV)
    rt = tl.arange(0, BT)
    o_tv = tok[:, None] * V + rv[None, :]
    b_q = tl.load(q + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    b_k = tl.load(k + tok[:, None] * K + rk[None, :], mask=m_tk, other=0.0)
    dt = b_k.dtype
    b, bp, b_L = _chunk_gates(g, tok, mt)
    strict = rt[:, None] > rt[None, :]
    Dq = _decay(b if GATES else bp, b, strict)
    Dp = _decay(bp, b, strict)
    b_do = tl.load(dO + o_tv, mask=m_tv, other=0.0).to(dt)
    b_dx = tl.load(DX + o_tv, mask=m_tv, other=0.0)
    b_dhS = tl.load(dhS + (i_c * H + h).to(tl.int64) * V * K + rv[:, None] * K + rk[None, :],
                    mask=mv[:, None] & mk[None, :], other=0.0).to(dt)
    # dS_t k_t: through the chunk's end state, the later base reads by q, the later old reads by k
    Uk = tl.exp(b_L - b)[:, None] * tl.dot(b_k, tl.trans(b_dhS)) \
        + scale * tl.dot(tl.trans(Dq * tl.dot(b_q, tl.trans(b_k))).to(dt), b_do) \
        - tl.dot(tl.trans(Dp * tl.dot(b_k, tl.trans(b_k))).to(dt), b_dx)
    b_beta = tl.load(beta + tok, mask=mt, other=0.0).to(tl.float32)
    tl.store(dV + o_tv, (b_beta[:, None] * Uk + b_dx.to(tl.float32)).to(dV.dtype.element_ty), mask=m_tv)
    o_part = i_v.to(tl.int64) * NTH + tok
    tl.store(dBETA_P + o_part, tl.sum(tl.load(v + o_tv, mask=m_tv, other=0.0).to(tl.float32) * Uk, axis=1), mask=mt)
    if GATES:
        tl.store(dGAMMA_P + o_part,
                 tl.sum(b_do.to(tl.float32) * tl.load(CORR + o_tv, mask=m_tv, other=0.0).to(tl.float32), axis=1),
                 mask=mt)


def bwd_dv(grid, *, q, k, v, g, beta, DX, CORR, dO, dhS, dV, dBETA_P, dGAMMA_P, cu, cidx, NTH, scale, H, K, V, BT, BK,
           BV, GATES, **options):
    """`_bwd_dv` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _bwd_dv[grid](q, k, v, g, beta, DX, CORR, dO, dhS, dV, dBETA_P, dGAMMA_P, cu, cidx, NTH, scale, H=H, K=K, V=V,
                  BT=BT, BK=BK, BV=BV, GATES=GATES, **options)


@triton.jit
def _bwd_dqk(q, k, v, g, beta, gamma, W, DX, dO, hS, hR, dhS, dhR, dRT, dQ, dK, EQ_P, EE_P, EK_P, Z_P,
             cu, cidx, NTH, NCH, scale,
             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
             FIT_RES: tl.constexpr, GATES: tl.constexpr, HAS_DRT: tl.constexpr, Z_STATES: tl.constexpr):
    """dq, dk on one K tile, and its shares of the per-token d/db terms (grid K tiles x chunks x heads).

    The whole V is one tile (BV >= V): straight-line code in which every V contraction is consumed as soon as it is
    made (the base read by q, the old read by k, the residual read, the writes), so that few BT x BT and BT x BK
    fp32 tiles are alive at once. Holding all seven at the end of a loop over V tiles spilled registers.
    """
    i_k, i_c, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n, eos, t, mt, tok = _chunk_rows(cu, cidx, i_c, h, H, BT)
    rt, rk, rv = tl.arange(0, BT), i_k * BK + tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = rk < K, rv < V
    m_tk, m_tv, m_state = mt[:, None] & mk[None, :], mt[:, None] & mv[None, :], mv[:, None] & mk[None, :]
    o_tk, o_tv = tok[:, None] * K + rk[None, :], tok[:, None] * V + rv[None, :]
    o_state = (i_c * H + h).to(tl.int64) * V * K + rv[:, None] * K + rk[None, :]
    b_q = tl.load(q + o_tk, mask=m_tk, other=0.0)
    b_k = tl.load(k + o_tk, mask=m_tk, other=0.0)
    dt = b_k.dtype
    q32, k32 = b_q.to(tl.float32), b_k.to(tl.float32)
    b, bp, b_L = _chunk_gates(g, tok, mt)
    b_beta = tl.load(beta + tok, mask=mt, other=0.0).to(tl.float32)
    b_gamma = tl.load(gamma + tok, mask=mt, other=0.0).to(tl.float32)
    eq = b if GATES else bp
    strict = rt[:, None] > rt[None, :]
    b_do = tl.load(dO + o_tv, mask=m_tv, other=0.0).to(dt)
    bv = (tl.load(v + o_tv, mask=m_tv, other=0.0).to(tl.float32) * b_beta[:, None]).to(dt)
    b_hS = tl.load(hS + o_state, mask=m_state, other=0.0).to(dt)
    if FIT_RES:
        # the residual r; its writes w = gamma r enter below through gamma on the BT x BT matrices' columns and on
        # the rows of r's product with dR (no fp32 [BT, V] tile of w in this kernel at the register limit)
        b_r = tl.load(W + o_tv, mask=m_tv, other=0.0).to(dt)
        o_R = (b_do.to(tl.float32) * (b_gamma if GATES else tl.full([BT], 1.0, tl.float32))[:, None]).to(dt)
        b_hR = tl.load(hR + o_state, mask=m_state, other=0.0).to(dt)
    # the base read by q: o += scale (exp(eq) q S_c^T + (q k^T * decay) beta v)
    A = tl.dot(b_do, tl.trans(bv)) * _decay(eq, b, strict)
    if GATES and FIT_RES:
        # and the residual read, o += gamma scale (exp(b) q R_c^T + (q k^T * decay incl. the diagonal) w): with
        # output gates both decay from b, so their gradients in q and k come from one matrix (its diagonal the
        # residual read's alone) and one chained product with the states
        A += tl.dot(o_R, tl.trans(b_r)) * (_decay(b, b, rt[:, None] >= rt[None, :]) * b_gamma[None, :])
        A = A.to(dt)
        dqS = tl.exp(b)[:, None] * tl.dot(o_R, b_hR, tl.dot(b_do, b_hS)) + tl.dot(A, b_k)
    else:
        A = A.to(dt)
        dqS = tl.exp(eq)[:, None] * tl.dot(b_do, b_hS) + tl.dot(A, b_k)
    dq = scale * dqS
    s_qS = scale * tl.sum(q32 * dqS, axis=1)
    dkW = scale * tl.dot(tl.trans(A), b_q)
    # the old read by k: p = exp(b') k S_c^T + (k k^T * decay) beta v, with dp = -dx (from _bwd_residual)
    dp = -tl.load(DX + o_tv, mask=m_tv, other=0.0)
    P = (tl.dot(dp, tl.trans(bv)) * _decay(bp, b, strict)).to(dt)
    dk = tl.exp(bp)[:, None] * tl.dot(dp, b_hS) + tl.dot(P, b_k)
    e_e = tl.sum(k32 * dk, axis=1)
    dkW += tl.dot(tl.trans(P), b_k)
    # the writes of the chunk through its end state: dS_end^T beta v (+ dR_end^T w)
    b_dhS = tl.load(dhS + o_state, mask=m_state, other=0.0).to(dt)
    sw = tl.dot(bv, b_dhS)
    e_q = tl.zeros([BT], dtype=tl.float32)
    if GATES:
        e_q += s_qS
    else:
        e_e += s_qS
    if FIT_RES:
        if not GATES:
            # without output gates the base read decays from b', the residual read from b: products of its own
            Rm = (tl.dot(o_R, tl.trans(b_r)) * (_decay(b, b, rt[:, None] >= rt[None, :]) * b_gamma[None, :])).to(dt)
            dqR = tl.exp(b)[:, None] * tl.dot(o_R, b_hR) + tl.dot(Rm, b_k)
            dq += scale * dqR
            e_q += scale * tl.sum(q32 * dqR, axis=1)
            dkW += scale * tl.dot(tl.trans(Rm), b_q)
        b_dhR = tl.load(dhR + o_state, mask=m_state, other=0.0).to(dt)
        sw += b_gamma[:, None] * tl.dot(b_r, b_dhR)
    sw = tl.exp(b_L - b)[:, None] * sw
    dkW += sw
    # dg's chunk end term <dS_end, S_end> (+ <dR_end, R_end>) = exp(b_L) <dS_end, S_c> (+ R's) + the writes' k . dk;
    # the states' share only with Z_STATES (else the reverse state passes store it: END_TERM_IN_PASS)
    z = tl.sum(tl.sum(k32 * sw, axis=1))
    if Z_STATES:
        z += tl.exp(b_L) * tl.sum(b_hS.to(tl.float32) * b_dhS.to(tl.float32))
        if FIT_RES:
            z += tl.exp(b_L) * tl.sum(b_hR.to(tl.float32) * b_dhR.to(tl.float32))
    tl.store(Z_P + i_k.to(tl.int64) * NCH + i_c * H + h, z)
    if not FIT_RES:
        # corr_t = c_t r_t (k_t . q~_t) and R_T = r_T k_T^T: no decays, outside d/db (r as the forward stored it)
        b_r = tl.load(W + o_tv, mask=m_tv, other=0.0).to(tl.float32)
        s_n = tl.sum(b_r * b_do.to(tl.float32), axis=1) * scale
        if GATES:
            s_n = s_n * b_gamma
        dq += s_n[:, None] * k32
        dk += s_n[:, None] * q32
        if HAS_DRT:
            b_dRT = tl.load(dRT + (n * H + h) * V * K + rv[:, None] * K + rk[None, :], mask=m_state, other=0.0)
            # dR_T arrives in whatever dtype autograd materialized (bf16 under autocast, fp32 from a loss on R_T);
            # b_r is fp32: tl.dot needs one dtype, and this once-per-sequence term takes fp32
            dk += tl.where((t == eos - 1)[:, None], tl.dot(b_r.to(tl.float32), b_dRT.to(tl.float32)), 0.0)
    tl.store(dQ + o_tk, dq.to(dQ.dtype.element_ty), mask=m_tk)
    tl.store(dK + o_tk, (dk + dkW).to(dK.dtype.element_ty), mask=m_tk)
    o_part = i_k.to(tl.int64) * NTH + tok
    tl.store(EQ_P + o_part, e_q, mask=mt)
    tl.store(EE_P + o_part, e_e, mask=mt)
    tl.store(EK_P + o_part, tl.sum(k32 * dkW, axis=1), mask=mt)


def bwd_dqk(grid, *, q, k, v, g, beta, gamma, W, DX, dO, hS, hR, dhS, dhR, dRT, dQ, dK, EQ_P, EE_P, EK_P, Z_P, cu, cidx,
            NTH, NCH, scale, H, K, V, BT, BK, BV, FIT_RES, GATES, HAS_DRT, Z_STATES=True, **options):
    """`_bwd_dqk` over `grid`, every parameter by name; `options`: num_warps, num_stages."""
    _bwd_dqk[grid](q, k, v, g, beta, gamma, W, DX, dO, hS, hR, dhS, dhR, dRT, dQ, dK, EQ_P, EE_P, EK_P, Z_P, cu, cidx,
                   NTH, NCH, scale, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, FIT_RES=FIT_RES, GATES=GATES, HAS_DRT=HAS_DRT,
                   Z_STATES=Z_STATES, **options)


def _state_launch(two_terms: bool, H: int, K: int, V: int, chunk: int, NH: int,
                  narrow: bool = False) -> tuple[tuple, dict]:
    """Grid and options of a state pass: K tiles x V tiles x sequences*heads (narrow: MIN_TILE x MIN_TILE tiles)."""
    opts = dict(LAUNCH["state_pass_2" if two_terms else "state_pass"])
    if narrow:
        opts.update(BK=MIN_TILE, BV=MIN_TILE)
    opts["BK"] = max(MIN_TILE, min(opts["BK"], triton.next_power_of_2(K)))
    opts["BV"] = max(MIN_TILE, min(opts["BV"], triton.next_power_of_2(V)))
    return (triton.cdiv(K, opts["BK"]), triton.cdiv(V, opts["BV"]), NH), dict(H=H, K=K, V=V, BT=chunk, **opts)


def _narrow_below(device: torch.device) -> int:
    """`NARROW_BELOW`, or where it is None twice the device's SM count (`_two_per_sm`)."""
    return NARROW_BELOW if NARROW_BELOW is not None else _two_per_sm(device)


def _two_per_sm(device: torch.device) -> int:
    """Twice the device's SM count: 0 off CUDA (the interpreter has none)."""
    if device.type != "cuda":
        return 0
    return 2 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _pass_plan(layout: Layout, two_terms: bool, H: int, K: int, V: int, chunk: int,
               device: torch.device) -> tuple[tuple, dict, "Segments | None"]:
    """Grid, launch options and segments of a state pass over the layout: its sequences cut into segments when
    they are long and its programs few (`SPLIT`); else, when its programs are fewer than two per SM
    (`NARROW_BELOW`), MIN_TILE x MIN_TILE state tiles, which give a sequence and head twice the programs at
    head_dim 128 (a 1.5B layer, 4 x 4096 x 16 heads: 128 programs at 64 x 128 become 256; a 100M layer, 16 x 2048 x
    6 heads: 192 become 384, on 132 SMs). A pass is a chain of per-chunk latencies there, which more and smaller
    tiles shorten (benchmarks/state_pass.py: 0.82-0.88x a pass at the 100M shape, 0.79-0.86x at 1.5B)."""
    grid, state = _state_launch(two_terms, H, K, V, chunk, layout.N * H)
    programs = grid[0] * grid[1] * grid[2]
    segs = _segments(layout, programs, chunk, device)
    if segs is None and programs < _narrow_below(device):
        grid, state = _state_launch(two_terms, H, K, V, chunk, layout.N * H, narrow=True)
    return grid, state, segs


def parse_launches(texts: list[str]) -> dict[str, dict]:
    """The launch options the benchmarks' --rla-launch KERNEL:KEY=VALUE,... texts change (kernel -> its options),
    each text read against LAUNCH with the earlier ones applied (`common.parse_launch`; ValueError)."""
    changed: dict[str, dict] = {}
    for text in texts:
        name, options = parse_launch(text, {**LAUNCH, **changed})
        changed[name] = options
    return changed


def launch_settings(changed: dict[str, dict]) -> dict:
    """The module settings that run the kernels with `changed` launch options (kernel -> its options, as
    `common.parse_launch` gives them): LAUNCH with those entries, and where a state pass is named NARROW_BELOW = 0,
    so that the pass runs at the options named rather than narrowed."""
    settings: dict = {"LAUNCH": {**{k: dict(v) for k, v in LAUNCH.items()}, **changed}}
    if {"state_pass", "state_pass_2"} & set(changed):
        settings["NARROW_BELOW"] = 0
    return settings


def _end_term_rows(layout: Layout, two_terms: bool, H: int, K: int, V: int, chunk: int, device: torch.device,
                   rows: bool) -> int:
    """How many rows of dg's end-term partials the state pass that stores the chunk states writes: one per state
    tile (programs per sequence and head), or with `rows` (`END_TERM_ROWS`) one per row of each tile."""
    grid, state, _ = _pass_plan(layout, two_terms, H, K, V, chunk, device)
    return grid[0] * grid[1] * (state["BV"] if rows else 1)


@dataclass(frozen=True)
class SplitRule:
    """When a state pass splits its sequences into segments that run side by side (`run_state_pass`): when the
    unsplit pass has fewer than `programs` programs and a sequence more than twice `chunks` chunks."""

    programs: int = 256
    chunks: int = 128  # 8,192 tokens a segment at 64-token chunks

    @classmethod
    def parse(cls, text: str) -> "SplitRule":
        """'PROGRAMS:CHUNKS', as the benchmarks' --rla-split takes it; ValueError saying what is allowed."""
        try:
            programs, chunks = (int(n) for n in text.split(":"))
            if programs < 0 or chunks < 1:
                raise ValueError
        except ValueError:
            raise ValueError(f"--rla-split takes PROGRAMS:CHUNKS, two integers (PROGRAMS >= 0, CHUNKS >= 1); "
                             f"got {text!r}") from None
        return cls(programs=programs, chunks=chunks)


SPLIT = SplitRule()


@dataclass(frozen=True)
class AheadRule:
    """`READ_AHEAD` chosen per state pass: a pass with at most `most` programs (None: twice the device's SM count;
    0 off CUDA) and state tiles of at most `tile` elements reads ahead by its kind's setting, any other pass reads
    each chunk's own. The kinds: R's pass (and S's plain pass of a split forward) `fwd`, dR's `rev`, dS's two-term
    pass `rev2`, S's pass with the residuals `s`. The defaults are the fastest setting of each kind alone at two
    programs per SM of 64 x 64 tiles on an H100 (benchmarks/state_pass.py at the 1.5B layer); with more programs
    dR's and S's passes were slower reading ahead (docs/RESULTS.md, "The passes' read-ahead and end-term rows
    timed"), and so were the split passes of 2 x 32K tokens, 256 programs of 64 x 128 tiles, whose wider tiles
    leave no registers for a chunk held ahead (docs/RESULTS.md, "Read-ahead only at the narrow tiles")."""

    most: int | None = None
    tile: int = MIN_TILE * MIN_TILE
    fwd: int = 1
    rev: int = 1
    rev2: int = 2
    s: int = 0

    def pick(self, kind: str, programs: int, device: torch.device, tile: int = MIN_TILE * MIN_TILE) -> int:
        """The AHEAD of a pass of this kind ("fwd", "rev", "rev2", "s") launched with `programs` programs of state
        tiles of `tile` elements (BK x BV)."""
        most = self.most if self.most is not None else _two_per_sm(device)
        return getattr(self, kind) if programs <= most and tile <= self.tile else 0


def _ahead(AHEAD: "int | AheadRule | None", kind: str, programs: int, device: torch.device, tile: int) -> int:
    """The AHEAD a launcher gives its pass: the caller's setting, else `READ_AHEAD`; a rule picks for the pass."""
    setting = READ_AHEAD if AHEAD is None else AHEAD
    return setting.pick(kind, programs, device, tile) if isinstance(setting, AheadRule) else setting
# A state pass that is not split and would have fewer programs than this runs at MIN_TILE x MIN_TILE tiles
# (`_pass_plan`): None, twice the device's SM count; 0, never (benchmarks/kernels.py --rla-wide-tiles).
NARROW_BELOW: int | None = None
# The state passes read the gates' chunk-local cumsum made once by a small kernel (`made_gates`) rather than making
# it in their sequential loop (benchmarks/kernels.py --rla-gates-in-pass). Read by the forward: a call's backward
# follows the switch as it was when the call ran.
GATES_MADE_ONCE = True
# What a state pass's chunk reads is loaded one chunk ahead (`_state_pass`, AHEAD): 0 none (each chunk loads its
# own), 1 all but the key tiles that feed a dot as they are loaded, 2 all (benchmarks/state_pass.py, and
# benchmarks/kernels.py --rla-read-ahead, time them). One setting for every pass loses: on an H100 reading ahead
# takes 11-22% off the passes at two programs per SM (the 1.5B layer) but makes dR's pass 1.2-1.3x and S's 1.1-1.4x
# slower at the 100M layer, the op 1.04x there. So an `AheadRule` picks per pass, by its kind, programs and tiles:
# the 1.5B layer's op 0.97x (its passes 0.88x), the 100M layer unchanged (docs/RESULTS.md, "The passes' read-ahead
# rule timed"), the split passes of long sequences (64 x 128 tiles) never; benchmarks/kernels.py --rla-read-own
# times the passes each loading its own chunk (0).
READ_AHEAD: "int | AheadRule" = AheadRule()
# The forward makes the residuals inside S's pass (`_s_pass_residual`) rather than in a parallel kernel after it
# (`_fwd_residual`); benchmarks/kernels.py --rla-residual-apart times both.
RESIDUAL_IN_S_PASS = True
# The backward's reverse state passes store the states' share of dg's chunk end terms, exp(b_L) <dS_end, S_c> and
# R's, from the fp32 state they carry (`_state_pass`, STORE_Z), rather than the dq/dk kernel from the stored tiles
# (which then only adds the writes'); benchmarks/kernels.py --rla-end-term-in-dqk times both. Read by the forward:
# a call's backward follows the switch as it was when the call ran.
END_TERM_IN_PASS = True
# Those passes store each chunk's end term summed over a state tile's columns only, a value per row, and the
# gate-gradient kernel adds the rows (`_state_pass`, Z_ROWS), rather than the whole tile's sum: the sum across the
# tile's rows is a sum across warps, a round trip through shared memory on the pass's sequential path
# (benchmarks/state_pass.py and benchmarks/kernels.py --rla-end-term-rows time it). Read by the backward. Off: dR's
# pass is no faster with it on an H100 at either training shape.
END_TERM_ROWS = False


class Segments:
    """Each sequence of a layout cut into segments of `per` chunks (the last one shorter): the pseudo-sequences of a
    split state pass, in the kernels' terms (token offsets `cu`, first chunks `coff`); sequence n's segments are
    `first[n]` to `first[n + 1] - 1`, in order."""

    def __init__(self, layout: Layout, per: int, chunk: int, device):
        cu: list[int] = [0]
        coff: list[int] = []
        first: list[int] = [0]
        first_chunk = tok = 0
        for length in layout.lengths:
            chunks = -(-length // chunk)
            for j in range(0, chunks, per):
                coff.append(first_chunk + j)
                cu.append(tok + min((j + per) * chunk, length))
            first.append(len(coff))
            first_chunk += chunks
            tok += length
        self.count = len(coff)
        self.cu = torch.tensor(cu, dtype=torch.int32, device=device)
        self.coff = torch.tensor(coff, dtype=torch.int32, device=device)
        self.first = torch.tensor(first, dtype=torch.int32, device=device)


def _segments(layout: Layout, programs: int, chunk: int, device) -> Segments | None:
    """The segments a state pass of `programs` programs splits the layout's sequences into, or None (no split)."""
    rule = SPLIT
    if programs >= rule.programs or min(layout.lengths) == 0 or max(layout.lengths) <= 2 * rule.chunks * chunk:
        return None
    key = (rule.chunks, chunk)
    cache = layout.__dict__.setdefault("_segments", {})
    if key not in cache:  # a batched layout is built once per shape (Layout.batched), and so are its segments
        cache[key] = Segments(layout, rule.chunks, chunk, device)
    return cache[key]


def run_state_pass(layout: Layout, two_terms: bool, *, g, D0, hD, DT, HAS_D0: bool, REVERSE: bool, H: int, K: int,
                   V: int, chunk: int, end_term=None, **terms) -> None:
    """A state pass over the layout's sequences (`state_pass`; `terms`: ka, ua, sa, kb, ub, scale_a, sign_b, CA, CB,
    HAS_SA, HAS_B). A pass is sequential over a sequence's chunks: a long sequence on few programs (B = 1 and 128K
    tokens: 2 K tiles x 2 V tiles x 16 heads = 64 programs, for 2,048 chunks in a row, on 132 SMs) is cut into
    segments (`SPLIT`) that run side by side, as FLA's chunk_h_split does: a first pass gives each segment's end
    state from zero and its log decay, one small kernel carries the states from segment to segment (the state is
    linear: end = decay * start + that end state; `_segment_carry`), and a second pass from those starts stores the
    chunk states the unsplit pass would (to fp32 rounding). Three launches and no PyTorch operation: an eager
    caller's host time stays near the unsplit pass's. end_term: (hF, Z_P, Z_ROWS), the pass that stores the chunk
    states also stores dg's end-term partials (`_state_pass`, STORE_Z)."""
    grid, state, segs = _pass_plan(layout, two_terms, H, K, V, chunk, g.device)
    if segs is None:
        state_pass(grid, g=g, D0=D0, hD=hD, DT=DT, cu=layout.cu, coff=layout.coff, REVERSE=REVERSE, HAS_D0=HAS_D0,
                   end_term=end_term, **terms, **state)
        return
    E, starts = _segment_starts(segs, two_terms, g=g, D0=D0, hD=hD, DT=DT, HAS_D0=HAS_D0, REVERSE=REVERSE, H=H, K=K,
                                V=V, chunk=chunk, **terms)
    state_pass((grid[0], grid[1], segs.count * H), g=g, D0=starts, hD=hD, DT=E, cu=segs.cu, coff=segs.coff,
               REVERSE=REVERSE, HAS_D0=True, end_term=end_term, **terms, **state)


def _segment_starts(segs: Segments, two_terms: bool, *, g, D0, hD, DT, HAS_D0: bool, REVERSE: bool, H: int, K: int,
                    V: int, chunk: int, **terms) -> tuple[torch.Tensor, torch.Tensor]:
    """The first two launches of a split pass (`run_state_pass`): each segment's end state from zero and its log
    decay, then the carry, which writes the sequences' end states to DT. Returns (scratch for the second pass's
    end states, the state each segment starts from)."""
    grid, state = _state_launch(two_terms, H, K, V, chunk, segs.count * H)
    E = torch.empty(segs.count, H, V, K, dtype=torch.float32, device=g.device)
    LD = torch.empty(segs.count, H, dtype=torch.float32, device=g.device)
    state_pass(grid, g=g, D0=E, hD=hD, DT=E, LD=LD, cu=segs.cu, coff=segs.coff, REVERSE=REVERSE, HAS_D0=False,
               STORE_H=False, **terms, **state)
    starts = torch.empty_like(E)
    N = (segs.first.numel() - 1)
    segment_carry((grid[0], grid[1], N * H), E=E, LD=LD, D0=D0, STARTS=starts, DT=DT, first=segs.first,
                  REVERSE=REVERSE, HAS_D0=HAS_D0, H=H, K=K, V=V, BK=state["BK"], BV=state["BV"],
                  num_warps=state["num_warps"])
    return E, starts


def run_s_pass_residual(layout: Layout, *, k, v, g, beta, D0, hS, ST, X, W, HAS_D0: bool, c_clip: float, TARGET: int,
                        H: int, K: int, V: int, chunk: int, MADE: bool = False) -> None:
    """S's pass with the residuals made in it (`_s_pass_residual`): hS, ST, X and W as S's pass and
    `_fwd_residual` give them. A long sequence on few programs is split as `run_state_pass` splits it: the plain
    pass and the carry give each segment's start, then the fused pass runs from those."""
    opts = launch_options("s_pass_residual", V, LAUNCH)
    nv = triton.cdiv(V, opts["BV"])
    fused = dict(k=k, v=v, g=g, beta=beta, hS=hS, X=X, W=W, c_clip=c_clip, H=H, K=K, V=V, BT=chunk,
                 BK=max(MIN_TILE, triton.next_power_of_2(K)), TARGET=TARGET, MADE=MADE, **opts)
    segs = _segments(layout, nv * layout.N * H, chunk, g.device)
    if segs is None:
        s_pass_residual((nv, layout.N * H), D0=D0, ST=ST, cu=layout.cu, coff=layout.coff, HAS_D0=HAS_D0, **fused)
        return
    E, starts = _segment_starts(segs, False, g=g, D0=D0, hD=hS, DT=ST, HAS_D0=HAS_D0, REVERSE=False, H=H, K=K, V=V,
                                chunk=chunk, ka=k, ua=v, sa=beta, kb=k, ub=v, scale_a=1.0, sign_b=0.0,
                                CA=COEF_TO_END.value, CB=COEF_TO_END.value, HAS_SA=True, HAS_B=False, MADE=MADE)
    s_pass_residual((nv, segs.count * H), D0=starts, ST=E, cu=segs.cu, coff=segs.coff, HAS_D0=True, **fused)


class RLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, gamma, S0, R0, layout: Layout, spec: ResidualSpec, scale: float, chunk: int):
        B, T, H, K = q.shape
        V = v.shape[-1]
        dev = q.device
        fit_res = spec.fit == "residual"
        q, k, v = (x.reshape(B * T, H, x.shape[-1]).contiguous() for x in (q, k, v))
        g32 = g.reshape(B * T, H).float().contiguous()
        beta_c = beta.reshape(B * T, H).contiguous()
        gamma_c = gamma.reshape(B * T, H).contiguous()
        NT, N = layout.chunks, layout.N
        hS = torch.empty(NT, H, V, K, dtype=q.dtype, device=dev)
        hR = torch.empty_like(hS) if fit_res else hS.new_empty(1)
        # the residual r = T(x) (gamma is applied where it is read), and what the backward needs of x = v - p for
        # the target's slope: the clip's slope (a byte), tanh's x (fp32), nothing for the identity
        keeps_x = spec.target != "identity"
        X = torch.empty(B * T, H, V, dtype=torch.uint8 if spec.target == "clip" else torch.float32,
                        device=dev) if keeps_x else q.new_empty(1)
        W = torch.empty(B * T, H, V, dtype=v.dtype, device=dev)
        ST = torch.empty(N, H, V, K, dtype=torch.float32, device=dev)
        RT = torch.empty_like(ST) if fit_res else ST.new_empty(1)
        BK = max(MIN_TILE, triton.next_power_of_2(K))
        consts = dict(H=H, K=K, V=V, BT=chunk, BK=BK)
        C = max(NT, 1)
        # the state passes' gates: their chunk-local cumsum made once, or g (each pass makes them)
        made = GATES_MADE_ONCE
        gates = made_gates(layout, g32, H, chunk) if made else g32
        dims = dict(H=H, K=K, V=V, chunk=chunk)
        # S's pass; the old reads and residuals from its chunk states; R's pass over the residuals
        if RESIDUAL_IN_S_PASS:
            run_s_pass_residual(layout, k=k, v=v, g=gates, MADE=made, beta=beta_c, D0=S0 if S0 is not None else ST,
                                hS=hS, ST=ST, X=X, W=W, HAS_D0=S0 is not None, c_clip=float(spec.clip),
                                TARGET=TARGET_CODES[spec.target], **dims)
        else:
            run_state_pass(layout, False, ka=k, ua=v, sa=beta_c, kb=k, ub=v, g=gates, MADE=made,
                           D0=S0 if S0 is not None else ST,
                           hD=hS, DT=ST, scale_a=1.0, sign_b=0.0, REVERSE=False, CA=COEF_TO_END.value,
                           CB=COEF_TO_END.value, HAS_SA=True, HAS_B=False, HAS_D0=S0 is not None, **dims)
            opts = launch_options("fwd_residual", V, LAUNCH)
            fwd_residual((triton.cdiv(V, opts["BV"]), C, H), k=k, v=v, g=g32, beta=beta_c, hS=hS, X=X, W=W,
                         cu=layout.cu, cidx=layout.cidx, c_clip=float(spec.clip), TARGET=TARGET_CODES[spec.target],
                         **consts, **opts)
        if fit_res:
            # R's writes w = gamma r, gamma applied as S's pass applies beta
            run_state_pass(layout, False, ka=k, ua=W, sa=gamma_c, kb=k, ub=W, g=gates, MADE=made,
                           D0=R0 if R0 is not None else RT,
                           hD=hR, DT=RT, scale_a=1.0, sign_b=0.0, REVERSE=False, CA=COEF_TO_END.value,
                           CB=COEF_TO_END.value, HAS_SA=True, HAS_B=False, HAS_D0=R0 is not None, **dims)
        O = torch.empty(B * T, H, V, dtype=q.dtype, device=dev)
        # the residual read before its gate, for dgamma = do . corr: in the inputs' dtype, as the output
        CORR = torch.empty(B * T, H, V, dtype=q.dtype, device=dev) if spec.output_gates else X.new_empty(1)
        opts = launch_options("fwd_output", V, LAUNCH)
        fwd_output((triton.cdiv(V, opts["BV"]), C, H), q=q, k=k, v=v, g=g32, beta=beta_c, gamma=gamma_c, W=W, hS=hS,
                   hR=hR, O=O, CORR=CORR, cu=layout.cu, cidx=layout.cidx, scale=float(scale), FIT_RES=fit_res,
                   GATES=spec.output_gates, **consts, **opts)
        if fit_res:
            R_T = RT
        else:
            last = (layout.cu[1:] - 1).long()
            # empty sequences (no last token) get zeros here; `rla_triton` gives them R0
            R_T = torch.einsum("nhv,nhk->nhvk", W[last].float(), k[last].float())
            if min(layout.lengths) == 0:
                empty = torch.tensor([n == 0 for n in layout.lengths], device=dev)[:, None, None, None]
                R_T = torch.where(empty, 0.0, R_T)
        ctx.save_for_backward(q, k, v, g32, gates, beta_c, gamma_c, hS, hR, X, W, CORR)
        ctx.layout, ctx.spec, ctx.scale, ctx.chunk = layout, spec, float(scale), chunk
        ctx.shape, ctx.has_S0, ctx.has_R0 = (B, T, H, K, V), S0 is not None, R0 is not None
        ctx.end_term_in_pass, ctx.made = END_TERM_IN_PASS, made
        ctx.dtypes = (g.dtype, beta.dtype, gamma.dtype)
        return O.view(B, T, H, V), ST, R_T

    @staticmethod
    def backward(ctx, dO, dST, dRT):
        q, k, v, g32, gates, beta_c, gamma_c, hS, hR, X, W, CORR = ctx.saved_tensors
        layout, spec, scale, chunk = ctx.layout, ctx.spec, ctx.scale, ctx.chunk
        B, T, H, K, V = ctx.shape
        dev = q.device
        fit_res = spec.fit == "residual"
        NT, N = layout.chunks, layout.N
        dO = dO.reshape(B * T, H, V).contiguous()
        dST = dST.contiguous() if dST is not None else None
        dRT = dRT.contiguous() if dRT is not None else None
        BK = max(MIN_TILE, triton.next_power_of_2(K))
        consts = dict(H=H, K=K, V=V, BT=chunk, BK=BK, FIT_RES=fit_res, GATES=spec.output_gates)
        dhS = torch.empty(NT, H, V, K, dtype=q.dtype, device=dev)
        dhR = torch.empty_like(dhS) if fit_res else dhS.new_empty(1)
        dS0 = torch.empty(N, H, V, K, dtype=torch.float32, device=dev)
        dR0 = torch.empty_like(dS0) if fit_res else dS0.new_empty(1)
        DX = torch.empty(B * T, H, V, dtype=v.dtype, device=dev)
        NTH = B * T * H
        C = max(NT, 1)
        dims = dict(H=H, K=K, V=V, chunk=chunk)
        # dg's chunk end terms: a row per K tile of the dq/dk kernel (the writes'; the states' too unless the passes
        # make them), then a row per state tile of dS's pass and of dR's (a row per row of each tile: END_TERM_ROWS)
        opts_dqk = launch_options("bwd_dqk", V, LAUNCH)
        BKt = opts_dqk.pop("BK")
        NK = triton.cdiv(K, BKt)
        in_pass = ctx.end_term_in_pass
        rows = END_TERM_ROWS
        tiles_S = _end_term_rows(layout, True, H, K, V, chunk, dev, rows) if in_pass else 0
        tiles_R = _end_term_rows(layout, False, H, K, V, chunk, dev, rows) if in_pass and fit_res else 0
        Z_P = torch.empty(NK + tiles_S + tiles_R, C * H, dtype=torch.float32, device=dev)
        end_S = (hS, Z_P[NK:NK + tiles_S], rows) if in_pass else None
        end_R = (hR, Z_P[NK + tiles_S:], rows) if tiles_R else None
        if fit_res:
            # dR's pass (it does not depend on dS); then dw, dx in parallel; then dS's pass, which needs dx
            run_state_pass(layout, False, ka=q, ua=dO, sa=gamma_c, kb=q, ub=dO, g=gates, MADE=ctx.made,
                           D0=dRT if dRT is not None else dS0, hD=dhR, DT=dR0, scale_a=scale, sign_b=0.0, REVERSE=True,
                           CA=COEF_B.value, CB=COEF_TO_END.value, HAS_SA=spec.output_gates, HAS_B=False,
                           HAS_D0=dRT is not None, end_term=end_R, **dims)
        opts = launch_options("bwd_residual", V, LAUNCH)
        NVr = triton.cdiv(V, opts["BV"])
        dGR_P = torch.empty(NVr, NTH, dtype=torch.float32, device=dev) if fit_res else DX.new_empty(1)
        bwd_residual((NVr, C, H), q=q, k=k, g=g32, gamma=gamma_c, dO=dO, X=X, W=W, hdR=dhR,
                     dRT=dRT if dRT is not None else dS0, DX=DX, dGR_P=dGR_P, cu=layout.cu, cidx=layout.cidx, NTH=NTH,
                     scale=scale, c_clip=float(spec.clip), TARGET=TARGET_CODES[spec.target], HAS_DRT=dRT is not None,
                     **consts, **opts)
        run_state_pass(layout, True, ka=q, ua=dO, sa=gamma_c, kb=k, ub=DX, g=gates, MADE=ctx.made,
                       D0=dST if dST is not None else dS0,
                       hD=dhS, DT=dS0, scale_a=scale, sign_b=-1.0, REVERSE=True,
                       CA=(COEF_B if spec.output_gates else COEF_B_PRIME).value, CB=COEF_B_PRIME.value, HAS_SA=False,
                       HAS_B=True, HAS_D0=dST is not None, end_term=end_S, **dims)
        # every element of dq, dk, dv is written once, by one program: stored in the inputs' dtype straight away
        dQ = torch.empty(B * T, H, K, dtype=q.dtype, device=dev)
        dK = torch.empty(B * T, H, K, dtype=k.dtype, device=dev)
        dV = torch.empty(B * T, H, V, dtype=v.dtype, device=dev)
        opts = launch_options("bwd_dv", V, LAUNCH)
        NV = triton.cdiv(V, opts["BV"])
        dBETA_P = torch.empty(NV, NTH, dtype=torch.float32, device=dev)
        dGAMMA_P = torch.empty_like(dBETA_P) if spec.output_gates else dBETA_P.new_empty(1)
        bwd_dv((NV, C, H), q=q, k=k, v=v, g=g32, beta=beta_c, DX=DX, CORR=CORR, dO=dO, dhS=dhS, dV=dV,
               dBETA_P=dBETA_P, dGAMMA_P=dGAMMA_P, cu=layout.cu, cidx=layout.cidx, NTH=NTH, scale=scale, H=H, K=K, V=V,
               BT=chunk, BK=BK, GATES=spec.output_gates, **opts)
        EQ_P = torch.empty(NK, NTH, dtype=torch.float32, device=dev)
        EE_P, EK_P = torch.empty_like(EQ_P), torch.empty_like(EQ_P)
        bwd_dqk((NK, C, H), q=q, k=k, v=v, g=g32, beta=beta_c, gamma=gamma_c, W=W, DX=DX, dO=dO, hS=hS, hR=hR,
                dhS=dhS, dhR=dhR, dRT=dRT if dRT is not None else dS0, dQ=dQ, dK=dK, EQ_P=EQ_P, EE_P=EE_P, EK_P=EK_P,
                Z_P=Z_P, cu=layout.cu, cidx=layout.cidx, NTH=NTH, NCH=C * H, scale=scale,
                HAS_DRT=dRT is not None and not fit_res, Z_STATES=not in_pass, **(consts | dict(BK=BKt)), **opts_dqk)
        dBETA = dBETA_P.sum(0).view(B * T, H)
        dGAMMA = torch.zeros(B * T, H, dtype=torch.float32, device=dev)
        if spec.output_gates:
            dGAMMA += dGAMMA_P.sum(0).view(B * T, H)
        if fit_res:
            dGAMMA += dGR_P.sum(0).view(B * T, H)
        dg = gate_gradient(layout, EE_P, EK_P, Z_P, H, chunk, plus=EQ_P)
        g_dtype, beta_dtype, gamma_dtype = ctx.dtypes
        shape_k, shape_v, shape_g = (B, T, H, K), (B, T, H, V), (B, T, H)
        uses_gamma = fit_res or spec.output_gates
        return (dQ.view(shape_k), dK.view(shape_k), dV.view(shape_v),
                dg.view(shape_g).to(g_dtype), dBETA.view(shape_g).to(beta_dtype),
                dGAMMA.view(shape_g).to(gamma_dtype) if uses_gamma else None,
                dS0 if ctx.has_S0 else None, dR0 if (ctx.has_R0 and fit_res) else None,
                None, None, None, None)




def covers(q: torch.Tensor, v: torch.Tensor, spec: ResidualSpec) -> bool:
    """Whether the fused kernels take these inputs on a GPU: RLA (fit residual or none) in bf16/fp16 with K, V <= 128.

    fp32 tiles do not fit a block's shared memory; heads over 128 would loop the dq/dk kernel over V tiles, the
    pattern that Triton 3.7 miscompiles on the H200 (docs/RESULTS.md). Those inputs take the FLA composition.
    """
    return (spec.rule == "additive" and spec.fit != "off" and q.dtype in (torch.bfloat16, torch.float16)
            and q.shape[-1] <= MAX_HEAD_DIM and v.shape[-1] <= MAX_HEAD_DIM)


# CUDA grids allow at most 65,535 blocks along their second and third axes: the parallel kernels put the chunks
# there, the state passes the sequences x heads
MAX_CHUNKS = 65535


def chunks_fit_grid(tokens: int, sequences: int, heads: int, chunk: int = CHUNK) -> bool:
    """Whether a call's chunk list (at most tokens / chunk + one partial chunk per sequence, about 4.2M tokens) and
    its sequences x heads fit a grid axis. Larger calls take the FLA composition, whose kernels flatten their grids
    onto the first axis."""
    return tokens // chunk + sequences <= MAX_CHUNKS and sequences * heads <= MAX_CHUNKS


def rla_triton(q, k, v, g, beta, gamma, spec: ResidualSpec, scale: float, initial_state,
               cu_seqlens: torch.Tensor | None = None, chunk: int = CHUNK):
    """RLA / its fit="none" ablation on the fused kernels (signature of the backends, plus `chunk` for tests)."""
    if spec.rule != "additive" or spec.fit == "off":
        raise ValueError("the fused RLA kernels cover rule='additive' with fit 'residual' or 'none'")
    B, T, H, K = q.shape
    check_packed_batch(B, cu_seqlens)
    S0, R0 = initial_state if initial_state is not None else (None, None)
    S0 = S0.float().contiguous() if S0 is not None else None
    R0 = R0.float().contiguous() if R0 is not None else None
    layout = Layout.batched(B, T, chunk, q.device) if cu_seqlens is None else Layout(B, T, cu_seqlens, chunk, q.device)
    o, S_T, R_T = RLAFunction.apply(q, k, v, g, beta, gamma, S0, R0, layout, spec, scale, chunk)
    if spec.fit == "none" and R0 is not None and min(layout.lengths) == 0:
        empty = torch.tensor([n == 0 for n in layout.lengths], device=q.device)[:, None, None, None]
        R_T = torch.where(empty, R0, R_T)
    return o, (S_T, R_T)
