"""The one comparison helper every numerics test uses (FLA's `assert_close` in spirit).

error = RMS(got - ref) / RMS(ref); passes when error <= ratio, or when the absolute max error is below `atol`
(for tensors that are almost zero, where a relative error means nothing). NaN or Inf never passes.
"""

from __future__ import annotations

import torch


def rel_rms_error(ref: torch.Tensor, got: torch.Tensor) -> float:
    ref64, got64 = ref.detach().double(), got.detach().double()
    denom = ref64.pow(2).mean().sqrt().clamp_min(1e-30)
    return ((got64 - ref64).pow(2).mean().sqrt() / denom).item()


def assert_close(name: str, ref: torch.Tensor, got: torch.Tensor, ratio: float, atol: float = 0.0) -> None:
    assert ref.shape == got.shape, f"{name}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    if not torch.isfinite(got).all():
        raise AssertionError(f"{name}: contains NaN/Inf")
    if not torch.isfinite(ref).all():
        raise AssertionError(f"{name}: the reference contains NaN/Inf")
    abs_err = (got.detach().double() - ref.detach().double()).abs().max().item() if ref.numel() else 0.0
    err = rel_rms_error(ref, got) if ref.numel() else 0.0
    if err > ratio and abs_err > atol:
        raise AssertionError(f"{name}: relative RMS error {err:.3e} > {ratio:.1e} and max abs error {abs_err:.3e} > {atol:.1e}")
