"""FLA's fused kernels for the glue of the models: the elementwise work around the token mixers and in the blocks.

On the GPU a 100M linear model spent most of its training step in PyTorch's elementwise kernels, casts and layout
copies, not in the mixers or the GEMMs (docs/RESULTS.md, "Where a 100M training step's time goes"). Where FLA is
installed, the models run that glue on FLA's fused kernels, as FLA's own models do, one kernel each way instead of a
chain of ops:

    in the linear mixers (where the op runs on a GPU backend)     in every block, all families (on CUDA)
    short conv + SiLU          causal_conv1d                      residual add + RMSNorm    layer_norm_fwd/_bwd
    q/k L2 norm                l2norm                             SiLU(gate) * up           swiglu
    output RMSNorm * SiLU(g)   rms_norm_gated                   the training loss (on CUDA)
                                                                  head + cross-entropy      fused_linear_cross_entropy

and, in every family's mixers and MLPs on CUDA, one backward for all the projections of one input (`SharedInput`,
ours): the input's gradient summed by the GEMMs' epilogues instead of an elementwise addition per extra reader,
the narrow gate projections one GEMM each way.

The loss takes the head's bf16 logits and turns them into their own gradient in place (one Triton kernel), with the
head's input and weight gradients computed in the forward: no fp32 copy of the logits, no log-softmax kept for the
backward (at 100M, 32K tokens x 32K vocabulary: 2 GiB held where the plain loss holds about 12). One chunk: the
weight's gradient is one bf16 GEMM, as the plain loss's, then scaled in bf16 by the loss's own gradient (a second
rounding the plain loss does not make). It runs where gradients will be taken; elsewhere the plain loss does.

Same equations, fp32 inside, every family the same glue (the transformer baseline's blocks too). The plain-torch
glue is the reference and runs everywhere else: on the CPU, in the mixers whose op runs on the `chunk` or `naive`
backend (their blocks and loss on CUDA take the fused glue still), for the conv of decoding and packed forwards,
and wherever `CausalLM.set_glue("torch")` asks for it, or the environment does (`RLA_GLUE=torch`,
rla_ablate.environment: every model built in the process, e.g. every job of a launch; runs record the glue they ran
as the tag `glue`). tests/test_models.py checks the wiring,
tests/test_fused_glue_interpreted.py FLA's kernels themselves on the CPU, tests/test_models_gpu.py a bf16 training
step on the GPU.
"""

from __future__ import annotations

import contextlib
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
    add_rms_norm: Callable[..., Any]  # add_rms_norm(h, weight, residual, eps) -> (RMSNorm(s), s), s = h + residual
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
        from fla.modules.norm.layernorm import layer_norm_bwd, layer_norm_fwd
    except ImportError:
        return None

    def add_rms_norm(h, weight, residual, eps):
        return AddRMSNorm.apply(h, weight, residual, eps, layer_norm_fwd, layer_norm_bwd)

    return FusedGlue(conv=causal_conv1d, l2norm=l2norm, norm_gate=rms_norm_gated, add_rms_norm=add_rms_norm,
                     swiglu=swiglu, linear_cross_entropy=fused_linear_cross_entropy_loss)


class AddRMSNorm(torch.autograd.Function):
    """(RMSNorm(s), s) with s = residual + h, on FLA's fused kernels (`layer_norm_fwd` / `layer_norm_bwd` of
    fla.modules.norm.layernorm), the stream's gradient kept in the stream's dtype.

    FLA's own autograd function (`rms_norm(..., prenorm=True)`) takes the gradient in h's dtype, and at hidden
    sizes over 512 its row kernel rounds the stream's fp32 gradient to that dtype as well (bf16 under autocast): at
    every norm, where the plain-torch glue keeps it fp32. Here the backward runs in the stream's dtype and only h's
    own gradient is cast to h's dtype."""

    @staticmethod
    def forward(ctx, h, weight, residual, eps, fwd, bwd):
        shape, D = h.shape, h.shape[-1]
        with _on(h):
            y, _, rstd, stream = fwd(x=h.reshape(-1, D).contiguous(), weight=weight, bias=None, eps=eps,
                                     residual=residual.reshape(-1, D).contiguous(), is_rms_norm=True)
        ctx.save_for_backward(stream, weight, rstd)
        ctx.h_dtype, ctx.shape, ctx.bwd = h.dtype, shape, bwd
        ctx.set_materialize_grads(False)  # the final norm's stream goes unused: no zero gradient to read
        return y.view(shape), stream.view(shape)

    @staticmethod
    def backward(ctx, dy, dstream):
        stream, weight, rstd = ctx.saved_tensors
        D = stream.shape[-1]
        if dy is None:
            dy = torch.zeros_like(stream, dtype=weight.dtype)
        with _on(stream):
            ds, dw, _, _ = ctx.bwd(dy=dy.reshape(-1, D).contiguous(), x=stream, weight=weight, bias=None, rstd=rstd,
                                   dres=None if dstream is None else dstream.reshape(-1, D).contiguous(),
                                   has_residual=True, is_rms_norm=True, x_dtype=stream.dtype)
        ds = ds.view(ctx.shape)
        return ds.to(ctx.h_dtype), dw, ds, None, None, None


def _on(t: torch.Tensor):
    """The CUDA device of t as the current one while FLA launches kernels on it (as FLA's input_guard)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


# A reader of a shared input this narrow (a gate's projection to one value a head) shares one GEMM with the other
# narrow readers: a GEMM this thin costs its launch and a pass over the input, not its arithmetic.
NARROW = 64


class SharedInput(torch.autograd.Function):
    """y_i = x W_i^T + b_i for every reader of one input x, with one backward for all of them.

    Autograd would give x one gradient per reader and add them up with an elementwise pass over x's shape each
    (six such additions of a [tokens, hidden] tensor per RLA mixer, which has seven readers). Here the GEMMs sum
    them: dx = dy_0 W_0, then dx += dy_i W_i in each GEMM's epilogue (addmm with beta 1, in fp32 before the one
    rounding), and the narrow readers (NARROW) are one GEMM each way. Outputs are the plain linears' (the wide ones
    contiguous, the narrow ones strided views of one [tokens, sum of widths] result); x, W_i, b_i in one dtype."""

    @staticmethod
    def forward(ctx, x, n: int, *params):
        weights, biases = params[:n], params[n:]
        x2 = x.reshape(-1, x.shape[-1])
        wide = [i for i in range(n) if weights[i].shape[0] > NARROW]
        narrow = [i for i in range(n) if weights[i].shape[0] <= NARROW]
        out: list[torch.Tensor] = [x2] * n  # every entry replaced below
        for i in wide:
            out[i] = F.linear(x2, weights[i], biases[i])
        w = None
        if narrow:
            w = torch.cat([weights[i] for i in narrow])
            b = None
            if any(biases[i] is not None for i in narrow):
                b = torch.cat([biases[i] if biases[i] is not None else w.new_zeros(weights[i].shape[0])
                               for i in narrow])
            for i, y in zip(narrow, F.linear(x2, w, b).split([weights[i].shape[0] for i in narrow], dim=-1)):
                out[i] = y
        ctx.save_for_backward(x2, w, *weights)  # w: the narrow readers' weights, one matrix (None without any)
        ctx.set_materialize_grads(False)  # an unused reader's gradient stays None: no zeros to multiply
        ctx.n, ctx.wide, ctx.narrow, ctx.x_shape = n, wide, narrow, x.shape
        ctx.bias_grad = [b is not None and ctx.needs_input_grad[2 + n + i] for i, b in enumerate(biases)]
        return tuple(y.view(*x.shape[:-1], y.shape[-1]) for y in out)

    @staticmethod
    def backward(ctx, *dys):
        x2, w_narrow, *weights = ctx.saved_tensors
        n = ctx.n
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[2:2 + n]
        dx = None
        dw: list[torch.Tensor | None] = [None] * n
        db: list[torch.Tensor | None] = [None] * n

        def read(dy2, w):
            nonlocal dx
            if need_x:
                dx = dy2 @ w if dx is None else dx.addmm_(dy2, w)

        for i in ctx.wide:
            if dys[i] is None:
                continue
            dy2 = dys[i].reshape(-1, dys[i].shape[-1])
            read(dy2, weights[i])
            if need_w[i]:
                dw[i] = dy2.t() @ x2
            if ctx.bias_grad[i]:
                db[i] = dy2.sum(0)
        if ctx.narrow and any(dys[i] is not None for i in ctx.narrow):
            dy2 = torch.cat([dys[i].reshape(x2.shape[0], -1) if dys[i] is not None
                             else x2.new_zeros(x2.shape[0], weights[i].shape[0]) for i in ctx.narrow], dim=-1)
            read(dy2, w_narrow)
            widths = [weights[i].shape[0] for i in ctx.narrow]
            got = [dys[i] is not None for i in ctx.narrow]  # an unused reader's parameters get None, as autograd's
            if any(need_w[i] and ok for i, ok in zip(ctx.narrow, got)):
                for i, ok, g in zip(ctx.narrow, got, (dy2.t() @ x2).split(widths)):
                    dw[i] = g if need_w[i] and ok else None
            for i, ok, g in zip(ctx.narrow, got, dy2.split(widths, dim=-1)):
                if ctx.bias_grad[i] and ok:
                    db[i] = g.sum(0)
        if dx is None and need_x:
            dx = torch.zeros_like(x2)
        return (dx.view(ctx.x_shape) if need_x else None, None, *dw, *db)


def project(x: torch.Tensor, linears: list[nn.Linear], shared: bool) -> list[torch.Tensor]:
    """[lin(x) for lin in linears]; shared: through `SharedInput` (one backward for every reader of x), in the
    dtype F.linear would run in (autocast's where it is on)."""
    if not shared:
        return [lin(x) for lin in linears]
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    weights = [lin.weight.to(dtype) for lin in linears]
    biases = [lin.bias.to(dtype) if lin.bias is not None else None for lin in linears]
    return list(SharedInput.apply(x.to(dtype), len(linears), *weights, *biases))


# False: the fused glue gives each reader its own linear (benchmarks/train_gpu.py --inputs separate measures both)
SHARE_INPUTS = True


def shares_inputs(x: torch.Tensor, mode: str) -> bool:
    """Whether the readers of an input like x project it through `SharedInput` (glue `mode`, on `DEVICES`)."""
    return SHARE_INPUTS and mode == "auto" and x.device.type in DEVICES


def mixer_glue(backend: str, mode: str) -> FusedGlue | None:
    """The fused glue a linear mixer runs around an op on `backend` with glue `mode`, or None for the torch glue."""
    return fused_glue() if mode == "auto" and backend in GPU_BACKENDS else None


def block_glue(x: torch.Tensor, mode: str) -> FusedGlue | None:
    """The fused glue a block runs on tensors like x with glue `mode`, or None for the torch glue."""
    return fused_glue() if mode == "auto" and x.device.type in DEVICES else None


def add_and_norm(norm: nn.RMSNorm, h: torch.Tensor, residual: torch.Tensor | None,
                 glue: FusedGlue | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(s), s) with s = residual + h, the residual stream after a sublayer; residual None: s = h."""
    if glue is None or residual is None:
        # the first block's norm has no add to fuse (and its input, the embedding, is fp32): the plain norm
        stream = h if residual is None else residual + h
        return norm(stream), stream
    return glue.add_rms_norm(h, norm.weight, residual, norm.eps)


def swiglu(gate: torch.Tensor, up: torch.Tensor, glue: FusedGlue | None) -> torch.Tensor:
    """SiLU(gate) * up."""
    return F.silu(gate) * up if glue is None else glue.swiglu(gate, up)


def lm_loss(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, glue: FusedGlue | None) -> torch.Tensor:
    """The summed cross-entropy of the logits x W^T against `labels` (IGNORE_INDEX not scored): an fp32 scalar.

    x [..., D], weight [V, D], labels [...] of x's leading shape. The plain loss takes the logits in at least fp32,
    as the reference; the fused one takes them in the autocast dtype (the dtype the head's GEMM gives the plain loss)."""
    x_ND, labels_N = x.reshape(-1, x.shape[-1]), labels.reshape(-1)
    if glue is None or not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        # the fused loss computes its gradients in the forward: without a backward to come, the plain one
        logits = F.linear(x_ND, weight)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.cross_entropy(logits, labels_N, ignore_index=IGNORE_INDEX, reduction="sum")
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    return glue.linear_cross_entropy(x_ND.to(dtype), labels_N, weight.to(dtype), None, ignore_index=IGNORE_INDEX,
                                     reduction="sum", num_chunks=1, accumulate_grad_in_fp32=False)
