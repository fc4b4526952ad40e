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
from rla_ablate.ops.spec import FITS, RULES, TARGETS, ResidualSpec, check_packed_batch

BackendFn = Callable[..., tuple]

# name -> (function, predicate telling whether it can run on these inputs)
BACKENDS: dict[str, tuple[BackendFn, Callable[[torch.Tensor], bool]]] = {
    "naive": (naive_residual_attention, lambda x: True),
    "chunk": (chunk_residual_attention, lambda x: True),
}
# Order in which "auto" tries backends on CUDA; GPU backends add themselves in front when importable.
CUDA_PREFERENCE: list[str] = ["chunk"]
# Backends whose function takes `cu_seqlens=` (packed sequences) itself; the others run sequence by sequence.
VARLEN_NATIVE: set[str] = set()
# Backends that "auto" picks only for some rules (those whose GPU test set has passed), by name.
AUTO_RULES: dict[str, frozenset[str]] = {}
# Backends with several implementations behind one name: name -> fn(q, v, spec, cu_seqlens) -> the one that runs.
IMPLEMENTATIONS: dict[str, Callable[..., str]] = {}


def register_backend(name: str, fn: BackendFn, available: Callable[[torch.Tensor], bool], *, cuda_rank: int | None = None,
                     varlen: bool = False, auto_rules: tuple[str, ...] | None = None,
                     implementation: Callable[..., str] | None = None):
    BACKENDS[name] = (fn, available)
    if implementation is not None:
        IMPLEMENTATIONS[name] = implementation
    if varlen:
        VARLEN_NATIVE.add(name)
    if auto_rules is not None:
        AUTO_RULES[name] = frozenset(auto_rules)
    if cuda_rank is not None and name not in CUDA_PREFERENCE:
        CUDA_PREFERENCE.insert(cuda_rank, name)


def auto_order(rule: str | None = None) -> list[str]:
    """The backends "auto" tries on CUDA for `rule`, best first (a rule-restricted one only for its rules)."""
    return [name for name in CUDA_PREFERENCE if name not in AUTO_RULES or rule in AUTO_RULES[name]]


def _load_gpu_backends() -> None:
    # GPU backends live in modules that need triton/FLA; they register themselves on import.
    for module in ("rla_ablate.ops.fla_backend", "rla_ablate.ops.triton.backend"):
        try:
            __import__(module)
        except ImportError:
            pass


def select_backend(x: torch.Tensor, requested: str = "auto", rule: str | None = None) -> str:
    """The backend that will actually run for tensors like `x` and `rule` (layers log this name)."""
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
        for name in auto_order(rule):
            if BACKENDS[name][1](x):
                return name
    return "chunk"


def kernel_tag(backend: str, q: torch.Tensor, v: torch.Tensor, spec: ResidualSpec,
               cu_seqlens: torch.Tensor | None = None) -> str:
    """What `residual_attention(..., backend=backend)` runs on inputs like q, v: the backend's name, or
    'name/implementation' for a backend with several (e.g. 'triton/rla-fused', 'triton/rdn-reads+fla',
    'triton/fla+glue'). Runs log this tag, so two runs of one backend name that took different kernels differ."""
    pick = IMPLEMENTATIONS.get(backend)
    return f"{backend}/{pick(q, v, spec, cu_seqlens)}" if pick is not None else backend


def _check_cu_seqlens(cu_seqlens, q) -> int:
    """Packed sequences as in FLA: B = 1 and cu_seqlens [N + 1] = 0, end_1, ..., T. Returns N."""
    check_packed_batch(q.shape[0], cu_seqlens)
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
        raise ValueError("cu_seqlens must be a 1-D integer tensor [N + 1] of sequence boundaries")
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or bounds[-1] != q.shape[1] or any(a > b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to T = {q.shape[1]}; got {bounds}")
    return len(bounds) - 1


def _check_inputs(q, k, v, g, beta, gamma, fit, initial_state, num_seqs=None):
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
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must share one dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise ValueError("initial_state must be a pair (S0, R0), each [B, H, V, K] or None")
        want = (num_seqs if num_seqs is not None else B, H, v.shape[-1], q.shape[-1])
        for name, x in zip(("S0", "R0"), initial_state):
            if x is not None and tuple(x.shape) != want:
                raise ValueError(f"initial_state {name} must be [B, H, V, K] = {list(want)}; got {tuple(x.shape)}")


def _per_sequence(fn, q, k, v, g, beta, gamma, spec, scale, initial_state, cu_seqlens):
    """Packed sequences on a backend without native varlen: each sequence alone, states stacked [N, H, V, K]."""
    S0, R0 = initial_state if initial_state is not None else (None, None)
    outputs, S_list, R_list = [], [], []
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds, bounds[1:])):
        part = [x[:, start:end] if x is not None else None for x in (q, k, v, g, beta, gamma)]
        state = (S0[n:n + 1] if S0 is not None else None, R0[n:n + 1] if R0 is not None else None)
        o, (S, R) = fn(*part, spec, scale, state)
        outputs.append(o)
        S_list.append(S)
        R_list.append(R)
    R_T = None if spec.fit == "off" else torch.cat(R_list)
    return torch.cat(outputs, dim=1), (torch.cat(S_list), R_T)


def residual_attention(q, k, v, g, beta, gamma=None, *, rule: str = "additive", fit: str = "residual",
                       target: str = "clip", clip: float = 1.0, output_gates: bool = True, scale: float | None = None,
                       initial_state=None, backend: str = "auto", cu_seqlens: torch.Tensor | None = None):
    """RLA (rule="additive") / RDN (rule="delta") and their ablations; returns (o [B,T,H,V], (S_T, R_T)).

    With `cu_seqlens` ([N + 1] boundaries, B = 1, as in FLA) the batch holds N packed sequences, each starting
    from its own initial state ([N, H, V, K]) and returning its own final state.
    """
    spec = ResidualSpec(rule=rule, fit=fit, target=target, clip=clip, output_gates=output_gates)
    num_seqs = _check_cu_seqlens(cu_seqlens, q) if cu_seqlens is not None else None
    _check_inputs(q, k, v, g, beta, gamma, fit, initial_state, num_seqs)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    name = select_backend(q, backend, rule)
    fn = BACKENDS[name][0]
    gamma = gamma if fit != "off" else None
    if cu_seqlens is None:
        return fn(q, k, v, g, beta, gamma, spec, float(scale), initial_state)
    if name in VARLEN_NATIVE:
        return fn(q, k, v, g, beta, gamma, spec, float(scale), initial_state, cu_seqlens=cu_seqlens)
    return _per_sequence(fn, q, k, v, g, beta, gamma, spec, float(scale), initial_state, cu_seqlens)


__all__ = ["residual_attention", "select_backend", "register_backend", "kernel_tag", "ResidualSpec", "RULES", "FITS",
           "TARGETS"]
