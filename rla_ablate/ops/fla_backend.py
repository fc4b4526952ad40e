"""The `fla` backend: RLA / RDN composed from FLA 0.6.0's public chunk kernels, autograd through all of them.

Both rules share S_t = alpha_t S_{t-1} + u_t k_t^T, and FLA's chunk kernels return inclusive reads S_t x_t. The
residual needs the old read S_{t-1} x_t for two queries at once (x = k_t for the prediction, x = q_t for the base
output), so the base recurrence runs once over a sequence with its writes shifted one slot later:

    slot:    0        1        2      ...   L
    write:   none     token 0  token 1 ...  token L-1      (g = 0, beta = 0, k = v = 0 in slot 0)
    read:    token 0  token 1  token 2 ...  nothing

Slot s holds S_{s-1}, so the inclusive read at slot t is the old read S_{t-1} x_t, and the state after the last slot
is S_L. The two queries ride as two copies of the batch, [q * scale; k], with scale 1 in the kernel (packed
sequences: the packed sequences twice along time). Then

    r_t = T(v_t - S_{t-1} k_t)
    fit="residual": R by FLA again on (q, k, gamma r, g) (additive) or (q, k, r, g, beta=gamma) (delta)
    fit="none":     R_t q_t = r_t (k_t . q_t)
    fit="off":      one plain FLA call, the baseline itself.

Cost: the base pass runs 2B sequences plus one auxiliary pass, about three baseline calls, plus PyTorch glue
between them (most of the measured time, docs/RESULTS.md). The `triton` backend fuses that glue and, for RDN, passes
`base_reads` (`triton.rdn`: the base run once, both old reads from it); RLA runs on its own kernels there. This one
is the readable, FLA-checked composition.
FLA's conventions: g = log alpha (fp32), additive kernel has no beta (folded into v), states as [N, H, V, K]
through `state_v_first=True`, initial states in fp32. Varlen: `cu_seqlens` [N + 1] with B = 1, as in FLA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rla_ablate.ops import register_backend
from rla_ablate.ops.spec import ResidualSpec, check_packed_batch

# (q, k, v, g, scale, h0 [N,H,V,K] | None, cu_seqlens) -> (o [B,T,H,V], h_T [N,H,V,K])
AdditiveKernel = Callable[..., tuple[torch.Tensor, torch.Tensor]]
# (q, k, v, g, beta, scale, h0, cu_seqlens) -> (o, h_T)
DeltaKernel = Callable[..., tuple[torch.Tensor, torch.Tensor]]

# FLA 0.6.0 computes a wrong dk on Hopper with triton in [3.4, 3.7.1) and refuses the gated backward there (#640).
MIN_TRITON_HOPPER = (3, 7, 1)


@dataclass(frozen=True)
class BaseKernels:
    """The two chunk kernels the composition is written against (FLA on CUDA; any exact recurrence in tests)."""

    additive: AdditiveKernel
    delta: DeltaKernel


def _fla_additive(q, k, v, g, scale, h0, cu_seqlens):
    from fla.ops.simple_gla import chunk_simple_gla

    return chunk_simple_gla(q, k, v, g=g, scale=scale, initial_state=h0, output_final_state=True,
                            state_v_first=True, cu_seqlens=cu_seqlens)


def _fla_delta(q, k, v, g, beta, scale, h0, cu_seqlens):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True,
                                  state_v_first=True, cu_seqlens=cu_seqlens)


FLA_KERNELS = BaseKernels(additive=_fla_additive, delta=_fla_delta)


def shift_slots(B: int, T: int, cu_seqlens: torch.Tensor | None, device) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor | None]:
    """Slots of the shifted base pass: (write slot of each token, read slot of each token, length, its cu_seqlens).

    Each sequence gets one extra slot in front; token t of sequence n is written at t + n + 1 and read at t + n.
    """
    t = torch.arange(T, device=device)
    if cu_seqlens is None:
        return t + 1, t, T + 1, None
    seq_of_token = torch.searchsorted(cu_seqlens, t, right=True) - 1
    shifted_cu = cu_seqlens + torch.arange(cu_seqlens.numel(), device=device, dtype=cu_seqlens.dtype)
    return t + seq_of_token + 1, t + seq_of_token, T + cu_seqlens.numel() - 1, shifted_cu


def _place(x: torch.Tensor, slots: torch.Tensor, length: int) -> torch.Tensor:
    """x [B, T, ...] scattered along time into zeros [B, length, ...] at `slots` (differentiable)."""
    out = x.new_zeros(x.shape[0], length, *x.shape[2:])
    return out.index_copy(1, slots, x)


class _StackShifted(torch.autograd.Function):
    """a, b [B, T, ...] -> [2B, T + 1, ...]: a over b along the batch, each with one zero slot along time, in front
    (writes: token t at slot t + 1) or behind (reads: token t at slot t). One allocation and two copies forward, two
    views backward; stacking padded copies (pad, pad, cat) would take four copies and, backward, two zero-filled
    full-size gradients and their sum."""

    @staticmethod
    def forward(ctx, a, b, front: bool):
        B, T = a.shape[:2]
        out = a.new_empty(2 * B, T + 1, *a.shape[2:])
        ctx.rows, ctx.B = slice(1, T + 1) if front else slice(0, T), B
        out[:, 0 if front else T].zero_()
        out[:B, ctx.rows] = a
        out[B:, ctx.rows] = b
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad[:ctx.B, ctx.rows], grad[ctx.B:, ctx.rows], None


class _Halves(torch.autograd.Function):
    """o [2B, T + 1, ...] -> (o[:B, :T], o[B:, :T]); backward writes both gradients into one buffer (slicing twice
    would zero-fill two full-size gradients and add them)."""

    @staticmethod
    def forward(ctx, o, B: int, T: int):
        ctx.B, ctx.T = B, T
        return o[:B, :T], o[B:, :T]

    @staticmethod
    def backward(ctx, g1, g2):
        B, T = ctx.B, ctx.T
        like = g1 if g1 is not None else g2
        grad = like.new_empty(2 * B, T + 1, *like.shape[2:])
        grad[:, T].zero_()
        for half, g in ((slice(0, B), g1), (slice(B, 2 * B), g2)):
            if g is None:
                grad[half, :T].zero_()
            else:
                grad[half, :T] = g
        return grad, None, None


def _last_tokens(T: int, cu_seqlens: torch.Tensor | None, device) -> torch.Tensor:
    if cu_seqlens is None:
        return torch.full((1,), T - 1, dtype=torch.long, device=device)  # a fill, not a host copy: no sync
    return cu_seqlens[1:] - 1


def _torch_residual(v, pred, gamma, spec: ResidualSpec):
    r = spec.apply_target(v.float() - pred.float())
    return (r if gamma is None else gamma.float()[..., None] * r).to(v.dtype)


def _torch_output(base_read, corr, g32, gamma, output_gates: bool, dtype):
    if output_gates:
        o = g32.exp()[..., None] * base_read.float() + gamma.float()[..., None] * corr.float()
    else:
        o = base_read.float() + corr.float()
    return o.to(dtype)


@dataclass(frozen=True)
class Glue:
    """The elementwise steps between the recurrences (PyTorch here; fused Triton kernels in `triton.glue`).

    residual(v, pred, gamma | None, spec) -> gamma * T(v - pred) (or T(v - pred)) in v's dtype, computed in fp32;
    output(base_read, corr, g, gamma, output_gates, dtype) -> alpha * base + gamma * corr (or base + corr).
    """

    residual: Callable[..., torch.Tensor]
    output: Callable[..., torch.Tensor]


TORCH_GLUE = Glue(residual=_torch_residual, output=_torch_output)


def shifted_base_reads(kernels: BaseKernels, rule: str, q, k, v, g32, beta, S0, scale: float,
                       cu_seqlens: torch.Tensor | None):
    """(scale S_{t-1} q_t, S_{t-1} k_t, S_T) from one exact chunk recurrence run over a one-slot-shifted copy with
    the two queries [q * scale; k] (module docstring): the reads in the kernel's dtype, S_T [N, H, V, K] fp32."""
    B, T = q.shape[:2]
    dtype = q.dtype
    write, read, length, shifted_cu = shift_slots(B, T, cu_seqlens, q.device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if cu_seqlens is None:
        # The two query copies ride as two batch halves (FLA's autotune keys on H, not B: the baseline's tuning holds).
        writes = lambda x: _StackShifted.apply(x, x, True)  # noqa: E731
        reads = lambda a, b: _StackShifted.apply(a, b, False)  # noqa: E731
        halves = lambda o: _Halves.apply(o, B, T)  # noqa: E731
        cu2 = None
    else:
        # Packed: the second copy is the same packed sequences again, appended along time.
        place = lambda x, slots: _place(x, slots, length)  # noqa: E731
        writes = lambda x: torch.cat([place(x, write)] * 2, dim=1)  # noqa: E731
        reads = lambda a, b: torch.cat([place(a, read), place(b, read)], dim=1)  # noqa: E731
        halves = lambda o: (o.index_select(1, read), o.index_select(1, read + length))  # noqa: E731
        cu2 = torch.cat([shifted_cu, shifted_cu[1:] + length])
    queries = reads(q * scale, k)
    k_w, g_w = writes(k), writes(g32)
    h0 = torch.cat([S0, S0], dim=0) if S0 is not None else None
    if rule == "additive":
        v_w = writes(v * beta.to(v.dtype)[..., None])
        o2, S2 = kernels.additive(queries, k_w, v_w, g_w, 1.0, h0, cu2)
    else:
        v_w, beta_w = writes(v), writes(beta.to(dtype))
        o2, S2 = kernels.delta(queries, k_w, v_w, g_w, beta_w, 1.0, h0, cu2)
    base_read, pred = halves(o2)  # S_{t-1} q_t (scaled), S_{t-1} k_t, in the kernel's dtype
    return base_read, pred, S2[:N]


def compose_residual_attention(kernels: BaseKernels, q, k, v, g, beta, gamma, spec: ResidualSpec, scale: float,
                               initial_state, cu_seqlens: torch.Tensor | None = None, glue: Glue = TORCH_GLUE,
                               base_reads: Callable | None = None, reads_residual: bool = False):
    """RLA / RDN from two exact chunk recurrences (see the module docstring). States are [N, H, V, K] fp32.

    base_reads(q, k, v, g32, beta, S0, scale, cu_seqlens) -> (scale S_{t-1} q_t, S_{t-1} k_t, S_T) replaces the
    shifted double pass of `shifted_base_reads` (the `triton` backend's one-pass delta rule, `triton.rdn`).
    reads_residual (the delta rule with fit "residual"): base_reads gives the residual T(v_t - S_{t-1} k_t) in v's
    dtype in place of S_{t-1} k_t, and the glue's residual step is skipped."""
    B, T, H, K = q.shape
    check_packed_batch(B, cu_seqlens)
    S0, R0 = initial_state if initial_state is not None else (None, None)
    S0 = S0.float() if S0 is not None else None
    R0 = R0.float() if R0 is not None else None
    g32 = g.float()
    dtype = q.dtype

    if spec.fit == "off":
        if spec.rule == "additive":
            o, S_T = kernels.additive(q, k, v * beta.to(v.dtype)[..., None], g32, scale, S0, cu_seqlens)
        else:
            o, S_T = kernels.delta(q, k, v, g32, beta.to(dtype), scale, S0, cu_seqlens)
        return o, (S_T, None)

    if reads_residual and (base_reads is None or spec.rule != "delta" or spec.fit != "residual"):
        raise ValueError("reads_residual: base_reads of the delta rule with fit 'residual' only")
    if base_reads is None:
        base_read, pred, S_T = shifted_base_reads(kernels, spec.rule, q, k, v, g32, beta, S0, scale, cu_seqlens)
    else:
        base_read, pred, S_T = base_reads(q, k, v, g32, beta, S0, scale, cu_seqlens)

    if spec.fit == "none":
        r = spec.apply_target(v.float() - pred.float())
        corr = r * ((q.float() * k.float()).sum(-1, keepdim=True) * scale)
        last = _last_tokens(T, cu_seqlens, q.device)
        R_T = torch.einsum("nhv,nhk->nhvk", r[:, last].flatten(0, 1) if cu_seqlens is None else r[0, last],
                           k.float()[:, last].flatten(0, 1) if cu_seqlens is None else k.float()[0, last])
        if cu_seqlens is not None:  # an empty packed sequence has no last token: it keeps R0 (or zeros)
            empty = (cu_seqlens.diff() == 0)[:, None, None, None]
            R_T = torch.where(empty, R0 if R0 is not None else 0.0, R_T)
    elif spec.rule == "additive":
        w = glue.residual(v, pred, gamma, spec)  # gamma_t r_t
        corr, R_T = kernels.additive(q, k, w, g32, scale, R0, cu_seqlens)
    else:
        r = pred if reads_residual else glue.residual(v, pred, None, spec)
        corr, R_T = kernels.delta(q, k, r, g32, gamma.to(dtype), scale, R0, cu_seqlens)
    return glue.output(base_read, corr, g32, gamma, spec.output_gates, dtype), (S_T, R_T)


def fla_residual_attention(q, k, v, g, beta, gamma, spec: ResidualSpec, scale: float, initial_state,
                           cu_seqlens: torch.Tensor | None = None):
    """The `fla` backend (signature of `naive_residual_attention`, plus FLA-style `cu_seqlens`)."""
    return compose_residual_attention(FLA_KERNELS, q, k, v, g, beta, gamma, spec, scale, initial_state, cu_seqlens)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in text.split("+")[0].split(".")[:3])


def fla_available(x: torch.Tensor) -> bool:
    """FLA runs on CUDA tensors of bf16/fp16/fp32, on Hopper only with triton >= 3.7.1 (see MIN_TRITON_HOPPER)."""
    if not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    try:
        import triton

        import fla.ops  # noqa: F401
    except ImportError:
        return False
    if torch.cuda.get_device_capability(x.device)[0] == 9 and _version(triton.__version__) < MIN_TRITON_HOPPER:
        return False
    return True


register_backend("fla", fla_residual_attention, fla_available, cuda_rank=0, varlen=True)
