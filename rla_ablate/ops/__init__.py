"""The residual attention op: one functional contract, several backends that must agree with `naive`.

    o, (S, R) = residual_attention(q, k, v, g, beta, gamma, rule=..., fit=..., target=..., clip=1.0,
                                   output_gates=True, scale=None, initial_state=None, backend="auto")

q, k: [B, T, H, K]; v: [B, T, H, V]; g = log(alpha) <= 0, beta, gamma: [B, T, H]; states [B, H, V, K].
With fit="off", gamma may be None and R is returned as None.
"""

from __future__ import annotations

from typing import Callable

import torch

from rla_ablate.ops.chunk import chunk_residual_attention
from rla_ablate.ops.naive import naive_residual_attention
from rla_ablate.ops.spec import FITS, RULES, TARGETS, ResidualSpec

BackendFn = Callable[..., tuple]

# name -> (function, predicate telling whether it can run on these inputs)
BACKENDS: dict[str, tuple[BackendFn, Callable[[torch.Tensor], bool]]] = {
    "naive": (naive_residual_attention, lambda x: True),
    "chunk": (chunk_residual_attention, lambda x: True),
}
# Order in which "auto" tries backends on CUDA; GPU backends add themselves in front when importable.
CUDA_PREFERENCE: list[str] = ["chunk"]


def register_backend(name: str, fn: BackendFn, available: Callable[[torch.Tensor], bool], *, cuda_rank: int | None = None):
    BACKENDS[name] = (fn, available)
    if cuda_rank is not None and name not in CUDA_PREFERENCE:
        CUDA_PREFERENCE.insert(cuda_rank, name)


def _load_gpu_backends() -> None:
    # GPU backends live in modules that need triton/FLA; they register themselves on import.
    for module in ("rla_ablate.ops.fla_backend", "rla_ablate.ops.triton_backend"):
        try:
            __import__(module)
        except ImportError:
            pass


def select_backend(x: torch.Tensor, requested: str = "auto") -> str:
    """The backend that will actually run for tensors like `x` (layers log this name)."""
    if requested != "auto":
        if requested not in BACKENDS:
            _load_gpu_backends()
        if requested not in BACKENDS:
            raise ValueError(f"unknown backend {requested!r}; available: {sorted(BACKENDS)} or 'auto'")
        if not BACKENDS[requested][1](x):
            raise ValueError(f"backend {requested!r} cannot run on {x.device.type} tensors of dtype {x.dtype}")
        return requested
    if x.is_cuda:
        _load_gpu_backends()
        for name in CUDA_PREFERENCE:
            if BACKENDS[name][1](x):
                return name
    return "chunk"


def _check_inputs(q, k, v, g, beta, gamma, fit, initial_state):
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, T, H, K]; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    B, T, H, _ = q.shape
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] = [{B}, {T}, {H}, V]; got {tuple(v.shape)}")
    gates = {"g": g, "beta": beta} | ({"gamma": gamma} if (fit != "off" or gamma is not None) else {})
    for name, x in gates.items():
        if x is None:
            raise ValueError(f"{name} is required with fit={fit!r}")
        if tuple(x.shape) != (B, T, H):
            raise ValueError(f"{name} must be [B, T, H] = [{B}, {T}, {H}]; got {tuple(x.shape)}")
    for name, x in {"q": q, "k": k, "v": v, **gates}.items():
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor; got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}")
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise ValueError("initial_state must be a pair (S0, R0), each [B, H, V, K] or None")
        want = (B, H, v.shape[-1], q.shape[-1])
        for name, x in zip(("S0", "R0"), initial_state):
            if x is not None and tuple(x.shape) != want:
                raise ValueError(f"initial_state {name} must be [B, H, V, K] = {list(want)}; got {tuple(x.shape)}")


def residual_attention(q, k, v, g, beta, gamma=None, *, rule: str = "additive", fit: str = "residual",
                       target: str = "clip", clip: float = 1.0, output_gates: bool = True, scale: float | None = None,
                       initial_state=None, backend: str = "auto"):
    """RLA (rule="additive") / RDN (rule="delta") and their ablations; returns (o [B,T,H,V], (S_T, R_T))."""
    spec = ResidualSpec(rule=rule, fit=fit, target=target, clip=clip, output_gates=output_gates)
    _check_inputs(q, k, v, g, beta, gamma, fit, initial_state)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    name = select_backend(q, backend)
    fn = BACKENDS[name][0]
    return fn(q, k, v, g, beta, gamma if fit != "off" else None, spec, float(scale), initial_state)


__all__ = ["residual_attention", "select_backend", "register_backend", "ResidualSpec", "RULES", "FITS", "TARGETS"]
