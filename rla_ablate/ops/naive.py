"""The contract: the per-timestep recurrence, written straight from the equations of docs/MATH.md.

Column vectors; S, R are [V, K] per head. Per token t (alpha_t = exp(g_t)):
    r_t = T(v_t - S_{t-1} k_t)                         (reads the old, undecayed S_{t-1})
    additive: R_t = a R_{t-1} + c r_t k_t^T             S_t = a S_{t-1} + b v_t k_t^T
    delta:    R_t = a R_{t-1}(I - c k_t k_t^T) + c r_t k_t^T
              S_t = a S_{t-1}(I - b k_t k_t^T) + b v_t k_t^T
    fit=none: R_t = r_t k_t^T
    o_t = a S_{t-1} q_t + c R_t q_t   (output_gates)   or   S_{t-1} q_t + R_t q_t
    fit=off:  o_t = S_t q_t
with a = alpha_t, b = beta_t, c = gamma_t and q already multiplied by the query scale.
"""

from __future__ import annotations

import torch

from rla_ablate.ops.spec import ResidualSpec


def _accum_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _mv(M: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # [B, H, V, K] x [B, H, K] -> [B, H, V]
    return torch.einsum("bhvk,bhk->bhv", M, x)


def _outer(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # [B, H, V] x [B, H, K] -> [B, H, V, K]
    return x.unsqueeze(-1) * y.unsqueeze(-2)


def naive_residual_attention(q, k, v, g, beta, gamma, spec: ResidualSpec, scale: float, initial_state):
    acc = _accum_dtype(q)
    q_BTHK, k_BTHK, v_BTHV, g_BTH, beta_BTH = (x.to(acc) for x in (q, k, v, g, beta))
    gamma_BTH = gamma.to(acc) if gamma is not None else None
    B, T, H, K = q_BTHK.shape
    V = v_BTHV.shape[-1]
    S0, R0 = initial_state if initial_state is not None else (None, None)
    S = S0.to(acc) if S0 is not None else q_BTHK.new_zeros(B, H, V, K)
    R = R0.to(acc) if R0 is not None else q_BTHK.new_zeros(B, H, V, K)

    outputs = []
    for t in range(T):
        a = g_BTH[:, t].exp()  # [B, H]
        b = beta_BTH[:, t]
        k_t, v_t, q_t = k_BTHK[:, t], v_BTHV[:, t], q_BTHK[:, t] * scale
        a4, b4 = a[..., None, None], b[..., None, None]

        if spec.rule == "additive":
            S_new = a4 * S + b4 * _outer(v_t, k_t)
        else:
            S_new = a4 * (S - b4 * _outer(_mv(S, k_t), k_t)) + b4 * _outer(v_t, k_t)

        if spec.fit == "off":
            outputs.append(_mv(S_new, q_t))
            S = S_new
            continue

        c = gamma_BTH[:, t]
        c4 = c[..., None, None]
        r_t = spec.apply_target(v_t - _mv(S, k_t))
        if spec.fit == "none":
            R = _outer(r_t, k_t)
        elif spec.rule == "additive":
            R = a4 * R + c4 * _outer(r_t, k_t)
        else:
            R = a4 * (R - c4 * _outer(_mv(R, k_t), k_t)) + c4 * _outer(r_t, k_t)

        base_read, corr_read = _mv(S, q_t), _mv(R, q_t)
        if spec.output_gates:
            outputs.append(a[..., None] * base_read + c[..., None] * corr_read)
        else:
            outputs.append(base_read + corr_read)
        S = S_new

    o = torch.stack(outputs, dim=1) if outputs else v_BTHV.new_zeros(B, 0, H, V)
    return o.to(q.dtype), (S, None if spec.fit == "off" else R)
