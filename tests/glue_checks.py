"""FLA's fused glue in the linear layers' tests: the three functions with FLA's semantics written in torch (the CPU
wiring test runs the fused branch with them), and a wrapper that records which of a glue's functions ran (the CPU
and the GPU test alike)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rla_ablate.models.layers import FusedGlue

NAMES = ("conv", "l2norm", "norm_gate")


def glue_with_flas_semantics() -> FusedGlue:
    """FLA's `causal_conv1d`, `l2norm` and `rms_norm_gated` as their docstrings and kernels define them."""

    def conv(x, weight, activation=None):
        D, W = weight.shape
        y = F.conv1d(F.pad(x.transpose(1, 2), (W - 1, 0)), weight[:, None], groups=D).transpose(1, 2)
        return (F.silu(y) if activation == "silu" else y), None

    def l2norm(x, eps=1e-6):
        return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)

    def norm_gate(x, g, weight, bias, activation="swish", eps=1e-5):
        assert bias is None and activation == "swish"
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight * F.silu(g)

    return FusedGlue(conv=conv, l2norm=l2norm, norm_gate=norm_gate)


def counting(glue: FusedGlue, calls: list[str]) -> FusedGlue:
    """`glue` with each function's name appended to `calls` when it runs."""

    def wrap(name):
        def call(*args, **kwargs):
            calls.append(name)
            return getattr(glue, name)(*args, **kwargs)
        return call

    return FusedGlue(**{name: wrap(name) for name in NAMES})
