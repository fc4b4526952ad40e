"""Chunked PyTorch form of the residual recurrences: matmuls within a chunk, states carried between chunks.

Both update rules share one shape, which is what makes the chunked form simple:
    S_t = alpha_t S_{t-1} + u_t k_t^T
with u_t = beta_t v_t (additive) or u_t = beta_t (v_t - alpha_t S_{t-1} k_t) (delta rule), and the same for R
with w_t = gamma_t r_t or gamma_t (r_t - alpha_t R_{t-1} k_t). Inside a chunk, with b_t the cumulative log decay
from the chunk start (b_t = g_1 + ... + g_t) and X_0 the state entering the chunk:
    X_t x      = e^{b_t} X_0 x     + sum_{i<=t} e^{b_t - b_i} u_i (k_i . x)      (inclusive read)
    X_{t-1} x  = e^{b_{t-1}} X_0 x + sum_{i<t}  e^{b_{t-1} - b_i} u_i (k_i . x)  (old read, b_0 = 0)
For the delta rule, u solves the unit lower-triangular system
    u_t + beta_t sum_{i<t} e^{b_t - b_i} (k_t . k_i) u_i = beta_t (v_t - e^{b_t} X_0 k_t)
(the WY/UT form used by DeltaNet kernels), solved per chunk with `torch.linalg.solve_triangular`.
Everything is differentiable by autograd; the reference for every number here is `naive.py`.
"""

from __future__ import annotations

import torch

from rla_ablate.ops.spec import ResidualSpec

DEFAULT_CHUNK = 64


def _decays(g_BHC: torch.Tensor):
    """Cumulative log decays and the masked decay matrices of one chunk.

    The pairwise log decays b_t - b_i are summed per segment (seg[t, i] = g_{i+1} + ... + g_t, Mamba2's segsum),
    never formed as a difference of two chunk-long cumulative sums: with very negative gates |b| grows to
    ~|g|*C and the difference would lose ~ulp(|b|) (float32: 1e-4 relative at |b| = 1e3, O(1) at 1e7).
    """
    C = g_BHC.shape[-1]
    idx = torch.arange(C, device=g_BHC.device)
    incl = idx[:, None] >= idx[None, :]
    strict = idx[:, None] > idx[None, :]
    b = g_BHC.cumsum(-1)  # b_t, inclusive; only ever exponentiated (start-state decay), never differenced
    b_prev = torch.nn.functional.pad(b[..., :-1], (1, 0))  # exactly b_{t-1}, b_0 = 0 (not b_t - g_t)
    # seg[t, i] = sum_{i < j <= t} g_j: row i of a masked copy of g, cumulated along j, then transposed
    zero = torch.zeros((), dtype=g_BHC.dtype, device=g_BHC.device)
    seg = torch.where(strict.T, g_BHC[..., None, :], zero).cumsum(-1).transpose(-1, -2)
    seg_prev = torch.nn.functional.pad(seg[..., :-1, :], (0, 0, 1, 0))  # seg[t-1, i] = b_{t-1} - b_i
    neg_inf = torch.full((), float("-inf"), dtype=b.dtype, device=b.device)  # a fill: no host-to-device copy
    # Mask before exp so that entries above the diagonal never overflow.
    D_incl = torch.where(incl, seg, neg_inf).exp()  # [B, H, C, C]
    D_prev = torch.where(strict, seg_prev, neg_inf).exp()
    return b, b_prev, D_incl, D_prev


def _write_values(rule: str, rate_BHC, target_BHCV, X0k_BHCV, b_BHC, D_incl, kk_BHCC):
    """u (or w): the vectors written with k_t^T, given the chunk's start state read X0 k_t."""
    if rule == "additive":
        return rate_BHC[..., None] * target_BHCV
    C = rate_BHC.shape[-1]
    eye = torch.eye(C, dtype=kk_BHCC.dtype, device=kk_BHCC.device)
    strict = torch.tril(torch.ones(C, C, dtype=torch.bool, device=kk_BHCC.device), -1)
    A = torch.where(strict, rate_BHC[..., :, None] * D_incl * kk_BHCC, torch.zeros((), dtype=kk_BHCC.dtype,
                                                                                     device=kk_BHCC.device))
    rhs = rate_BHC[..., None] * (target_BHCV - b_BHC.exp()[..., None] * X0k_BHCV)
    return torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)


def _carry(X0_BHVK, b_BHC, u_BHCV, k_BHCK, D_incl):
    """State at the end of the chunk: e^{b_C} X_0 + sum_i e^{b_C - b_i} u_i k_i^T (last row of D_incl)."""
    decay_to_end = D_incl[..., -1, :]  # [B, H, C]
    decayed_u_BHCV = u_BHCV * decay_to_end[..., None]
    return b_BHC[..., -1:].exp()[..., None] * X0_BHVK + torch.einsum("bhcv,bhck->bhvk", decayed_u_BHCV, k_BHCK)


def chunk_residual_attention(q, k, v, g, beta, gamma, spec: ResidualSpec, scale: float, initial_state,
                             chunk_size: int = DEFAULT_CHUNK):
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    # Head-first layout for batched matmuls: [B, H, T, *].
    q_BHTK = q.to(acc).transpose(1, 2) * scale
    k_BHTK = k.to(acc).transpose(1, 2)
    v_BHTV = v.to(acc).transpose(1, 2)
    g_BHT = g.to(acc).transpose(1, 2)
    beta_BHT = beta.to(acc).transpose(1, 2)
    gamma_BHT = gamma.to(acc).transpose(1, 2) if gamma is not None else None
    B, H, T, K = q_BHTK.shape
    V = v_BHTV.shape[-1]
    S0, R0 = initial_state if initial_state is not None else (None, None)
    S = S0.to(acc) if S0 is not None else q_BHTK.new_zeros(B, H, V, K)
    R = R0.to(acc) if R0 is not None else q_BHTK.new_zeros(B, H, V, K)

    outputs = []
    for start in range(0, T, chunk_size):
        sl = slice(start, min(start + chunk_size, T))
        q_c, k_c, v_c, g_c, beta_c = q_BHTK[:, :, sl], k_BHTK[:, :, sl], v_BHTV[:, :, sl], g_BHT[:, :, sl], beta_BHT[:, :, sl]
        b, b_prev, D_incl, D_prev = _decays(g_c)
        kk = k_c @ k_c.transpose(-1, -2)  # (t, i): k_t . k_i
        qk = q_c @ k_c.transpose(-1, -2)  # (t, i): q_t . k_i
        S0k = k_c @ S.transpose(-1, -2)  # row t: S_0 k_t, [B, H, C, V]
        S0q = q_c @ S.transpose(-1, -2)
        u = _write_values(spec.rule, beta_c, v_c, S0k, b, D_incl, kk)

        if spec.fit == "off":
            outputs.append(b.exp()[..., None] * S0q + (D_incl * qk) @ u)  # S_t q_t
            S = _carry(S, b, u, k_c, D_incl)
            continue

        gamma_c = gamma_BHT[:, :, sl]
        pred = b_prev.exp()[..., None] * S0k + (D_prev * kk) @ u  # S_{t-1} k_t
        base_read = b_prev.exp()[..., None] * S0q + (D_prev * qk) @ u  # S_{t-1} q_t
        r = spec.apply_target(v_c - pred)
        if spec.fit == "none":
            corr_read = r * torch.diagonal(qk, dim1=-2, dim2=-1)[..., None]  # r_t (k_t . q_t)
            R = r[:, :, -1, :, None] * k_c[:, :, -1, None, :]
        else:
            R0k = k_c @ R.transpose(-1, -2)
            w = _write_values(spec.rule, gamma_c, r, R0k, b, D_incl, kk)
            corr_read = b.exp()[..., None] * (q_c @ R.transpose(-1, -2)) + (D_incl * qk) @ w  # R_t q_t
            R = _carry(R, b, w, k_c, D_incl)
        if spec.output_gates:
            outputs.append(g_c.exp()[..., None] * base_read + gamma_c[..., None] * corr_read)
        else:
            outputs.append(base_read + corr_read)
        S = _carry(S, b, u, k_c, D_incl)

    o_BHTV = torch.cat(outputs, dim=2) if outputs else v_BHTV
    return o_BHTV.transpose(1, 2).to(q.dtype), (S, None if spec.fit == "off" else R)


def chunk_base_reads(k, v, g, beta, rule: str, S0=None, chunk_size: int = DEFAULT_CHUNK,
                     cu_seqlens: torch.Tensor | None = None):
    """The old reads S_{t-1} k_t of the base state for every token, [B, T, H, V], in float32 (float64 inputs: 64).

    The base stage of `chunk_residual_attention` alone (S does not depend on R or q), for the diagnostics:
    the fast backends keep S_{t-1} k_t inside their kernels. S0 [B, H, V, K] or None (zeros). With `cu_seqlens`
    (B = 1, packed sequences as in the op) each sequence starts from its own S0 row, or zeros.
    """
    if cu_seqlens is not None:
        bounds = cu_seqlens.tolist()
        parts = [chunk_base_reads(k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], rule,
                                  None if S0 is None else S0[n:n + 1], chunk_size)
                 for n, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        return torch.cat(parts, dim=1)
    acc = torch.float64 if k.dtype == torch.float64 else torch.float32
    k_BHTK = k.to(acc).transpose(1, 2)
    v_BHTV = v.to(acc).transpose(1, 2)
    g_BHT = g.to(acc).transpose(1, 2)
    beta_BHT = beta.to(acc).transpose(1, 2)
    B, H, T, K = k_BHTK.shape
    V = v_BHTV.shape[-1]
    S = S0.to(acc) if S0 is not None else k_BHTK.new_zeros(B, H, V, K)
    reads = []
    for start in range(0, T, chunk_size):
        sl = slice(start, min(start + chunk_size, T))
        k_c, v_c, g_c, beta_c = k_BHTK[:, :, sl], v_BHTV[:, :, sl], g_BHT[:, :, sl], beta_BHT[:, :, sl]
        b, b_prev, D_incl, D_prev = _decays(g_c)
        kk = k_c @ k_c.transpose(-1, -2)
        S0k = k_c @ S.transpose(-1, -2)
        u = _write_values(rule, beta_c, v_c, S0k, b, D_incl, kk)
        reads.append(b_prev.exp()[..., None] * S0k + (D_prev * kk) @ u)
        S = _carry(S, b, u, k_c, D_incl)
    pred_BHTV = torch.cat(reads, dim=2) if reads else v_BHTV
    return pred_BHTV.transpose(1, 2)
