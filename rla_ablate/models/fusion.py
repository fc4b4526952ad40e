"""FLA's fused kernels for the glue of the models: the elementwise work around the token mixers and in the blocks.

On the GPU a 100M linear model spent most of its training step in PyTorch's elementwise kernels, casts and layout
copies, not in the mixers or the GEMMs (docs/RESULTS.md, "Where a 100M training step's time goes"). Where FLA is
installed, the models run that glue on FLA's fused kernels, as FLA's own models do, one kernel each way instead of a
chain of ops:

    in the linear mixers (where the op runs on a GPU backend)     in every block, all families (on CUDA)
    short conv + SiLU          causal_conv1d                      residual add + RMSNorm    rms_norm(prenorm=True)
    q/k L2 norm                l2norm                             SiLU(gate) * up           swiglu
    output RMSNorm * SiLU(g)   rms_norm_gated                   the training loss (on CUDA)
                                                                  head + cross-entropy      fused_linear_cross_entropy

The loss takes the head's bf16 logits and turns them into their own gradient in place (one Triton kernel), with the
head's input and weight gradients computed in the forward: no fp32 copy of the logits, no log-softmax kept for the
backward (at 100M, 32K tokens x 32K vocabulary: 2 GiB held where the plain loss holds about 12). One chunk: the
weight's gradient is one bf16 GEMM, rounded once as the plain loss's is.

Same equations, fp32 inside, every family the same glue (the transformer baseline's blocks too). The plain-torch
glue is the reference and runs everywhere else: on the CPU, with the `chunk` and `naive` backends, for the conv of
decoding and packed forwards, and wherever `CausalLM.set_glue("torch")` asks for it, or the environment does
(`RLA_GLUE=torch`, rla_ablate.environment: every model built in the process, e.g. every job of a launch; runs
record the glue they ran as the tag `glue`). tests/test_models.py checks the wiring,
tests/test_fused_glue_interpreted.py FLA's kernels themselves on the CPU, tests/test_models_gpu.py a bf16 training
step on the GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from rla_ablate import environment

# The op backends that run on the GPU: the linear mixers around them take the fused glue.
GPU_BACKENDS = ("triton", "fla")
# The devices on which the blocks take it.
DEVICES = ("cuda",)
GLUE_MODES = environment.GLUE_MODES
# Labels that are not scored (padding, the positions before a document's first token), as torch's cross_entropy.
IGNORE_INDEX = -100


@dataclass(frozen=True)
class FusedGlue:
    """FLA's fused kernels (fla.modules), each with its own backward."""

    conv: Callable[..., Any]        # causal_conv1d(x [B, T, D], weight [D, W], activation="silu") -> (y, final state)
    l2norm: Callable[..., Any]      # l2norm(x, eps) -> x / sqrt(sum x^2 + eps) over the last dim, fp32 inside
    norm_gate: Callable[..., Any]   # rms_norm_gated(x, g, weight, bias, activation="swish", eps=) -> RMSNorm(x) * SiLU(g)
    rms_norm: Callable[..., Any]    # rms_norm(x, weight, bias, residual=, eps=, prenorm=True) -> (RMSNorm(s), s), s = x + residual
    swiglu: Callable[..., Any]      # swiglu(x, y) -> SiLU(x) * y
    linear_cross_entropy: Callable[..., Any]  # (x [N, D], target [N], weight [V, D], bias, ignore_index=,
    #                                           reduction=, num_chunks=, accumulate_grad_in_fp32=) -> loss


@functools.cache
def fused_glue() -> FusedGlue | None:
    """FLA's glue kernels, or None where FLA is not installed (imported once)."""
    try:
        from fla.modules.activations import swiglu
        from fla.modules.causal_conv1d import causal_conv1d
        from fla.modules.fused_linear_cross_entropy import fused_linear_cross_entropy_loss
        from fla.modules.norm.fused_norm_gate import rms_norm_gated
        from fla.modules.norm.l2norm import l2norm
        from fla.modules.norm.layernorm import rms_norm
    except ImportError:
        return None
    return FusedGlue(conv=causal_conv1d, l2norm=l2norm, norm_gate=rms_norm_gated, rms_norm=rms_norm, swiglu=swiglu,
                     linear_cross_entropy=fused_linear_cross_entropy_loss)


def block_glue(x: torch.Tensor, mode: str) -> FusedGlue | None:
    """The fused glue a block runs on tensors like x with glue `mode`, or None for the torch glue."""
    return fused_glue() if mode == "auto" and x.device.type in DEVICES else None


def add_and_norm(norm: nn.RMSNorm, h: torch.Tensor, residual: torch.Tensor | None,
                 glue: FusedGlue | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(s), s) with s = residual + h, the residual stream after a sublayer; residual None: s = h."""
    if glue is None:
        stream = h if residual is None else residual + h
        return norm(stream), stream
    return glue.rms_norm(h, norm.weight, None, residual=residual, eps=norm.eps, prenorm=True)


def swiglu(gate: torch.Tensor, up: torch.Tensor, glue: FusedGlue | None) -> torch.Tensor:
    """SiLU(gate) * up."""
    return F.silu(gate) * up if glue is None else glue.swiglu(gate, up)


def lm_loss(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, glue: FusedGlue | None) -> torch.Tensor:
    """The summed cross-entropy of the logits x W^T against `labels` (IGNORE_INDEX not scored): an fp32 scalar.

    x [..., D], weight [V, D], labels [...] of x's leading shape. The plain loss takes the logits in at least fp32,
    as the reference; the fused one takes them in the autocast dtype (the dtype the head's GEMM gives the plain loss)."""
    x_ND, labels_N = x.reshape(-1, x.shape[-1]), labels.reshape(-1)
    if glue is None:
        logits = F.linear(x_ND, weight)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.cross_entropy(logits, labels_N, ignore_index=IGNORE_INDEX, reduction="sum")
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    return glue.linear_cross_entropy(x_ND.to(dtype), labels_N, weight.to(dtype), None, ignore_index=IGNORE_INDEX,
                                     reduction="sum", num_chunks=1, accumulate_grad_in_fp32=False)
