"""Token mixers, FLA style: one residual attention layer for sgla / gdn / rla / rdn, and softmax attention.

`ResidualAttention` is written after `fla.layers.GatedDeltaNet` and `fla.layers.SimpleGatedLinearAttention`,
in plain torch around `rla_ablate.ops.residual_attention`. Every family runs the same code: projections, short
conv + SiLU, q/k norm, output RMSNorm * SiLU gate, o_proj. Only the gates differ, as each baseline has them:

    sgla, rla:  g = logsigmoid(gk_proj(x)) / 16          (FLA's gate_logit_normalizer)
    gdn,  rdn:  g = -exp(A_log) * softplus(a_proj(x) + dt_bias)
    beta  = sigmoid(b_proj(x))                           (sgla: beta = 1, no b_proj)
    gamma = sigmoid(c_proj(x)), or beta when tied        (baselines: none)

so an ablation differs from its reference only where the paper says it does.

Where the op runs on a GPU backend (`triton`, `fla`) and FLA is installed, the glue around it runs on FLA's fused
kernels, as FLA's own layers do (`rla_ablate.models.fusion`): the short conv with its SiLU, the q/k L2 norm and the
output RMSNorm times the SiLU gate. The plain-torch glue stays the reference and runs everywhere else
(`ResidualAttention.glue`).

Both mixers take and return a per-layer decoding state, so the same forward serves training (state None),
prefill and one-token steps; its outputs are those of the parallel forward (tests/test_models.py).

Both also take FLA's packed sequences: x [1, T] and `cu_seqlens` [N + 1] (int offsets from 0 to T). Each
sequence then runs as if alone: the short conv reads no input of an earlier sequence, the linear op starts each
from a zero state, softmax attention attends within it, with positions counted from its start
(tests/test_doc_reset.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from rla_ablate.models.config import ModelConfig
from rla_ablate.models import fusion
from rla_ablate.models.diagnostics import mixer_diagnostics
from rla_ablate.ops import ResidualSpec, kernel_tag, residual_attention, select_backend
from rla_ablate.ops.spec import check_packed_batch
from rla_ablate.ops.chunk import chunk_base_reads

# FLA's SimpleGatedLinearAttention default: keeps alpha = sigmoid(x)^(1/16) close to 1 at init.
GATE_LOGIT_NORMALIZER = 16
# The gates' projections of a linear mixer's input, those its family has: alpha's (gk_proj for sgla/rla, a_proj for
# gdn/rdn), beta's (learned beta) and gamma's (residual families with gamma untied).
GATE_PROJECTIONS = ("gk_proj", "a_proj", "b_proj", "c_proj")
# FLA's l2norm epsilon (fla.modules.l2norm).
L2_EPS = 1e-6
# clip_mode relative: weight of the old value in the running residual RMS (per training forward; a proxy run of a
# few hundred steps forgets its first batches within ~50 forwards).
RESIDUAL_RMS_MOMENTUM = 0.95
# ... and the smallest RMS the radius is scaled by (a zero radius is not a clip).
RELATIVE_CLIP_FLOOR = 1e-12


@dataclass
class LinearState:
    """Decoding state of one linear layer: S, R [B, H, V, K] and the last conv_size - 1 inputs of each conv."""

    S: torch.Tensor | None = None
    R: torch.Tensor | None = None
    conv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    seen: int = 0


@dataclass
class KVState:
    """Decoding state of one attention layer: keys and values so far, [B, T, H_kv, D]."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def seen(self) -> int:
        return 0 if self.k is None else self.k.shape[1]


class ShortConvolution(nn.Conv1d):
    """Causal depthwise conv over time followed by SiLU, as `fla.modules.ShortConvolution`, in plain torch.

    y_t = SiLU(sum_{i<W} w_i x_{t-W+1+i}); inputs before the sequence are zeros, or the cached last W - 1 inputs.
    With `cu_seqlens` (B = 1, packed sequences) the inputs before each sequence's start are zeros too.
    """

    def __init__(self, channels: int, kernel_size: int):
        super().__init__(channels, channels, kernel_size, groups=channels, bias=False)

    def forward(self, x_BTD: torch.Tensor, cache_BWD: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None):
        B, T, D = x_BTD.shape
        W = self.kernel_size[0]
        if cu_seqlens is not None:
            if cache_BWD is not None:
                raise ValueError("packed sequences (cu_seqlens) take no conv cache")
            return self._packed(x_BTD, cu_seqlens)
        if cache_BWD is None:
            cache_BWD = x_BTD.new_zeros(B, W - 1, D)
        x_full = torch.cat([cache_BWD.to(x_BTD.dtype), x_BTD], dim=1)  # [B, W - 1 + T, D]
        y_BDT = F.conv1d(x_full.transpose(1, 2), self.weight, groups=D)
        new_cache = x_full[:, x_full.shape[1] - (W - 1):]
        # [B, T, D] in memory too: a transposed view would reach the heads' kernels with a strided last dimension
        return F.silu(y_BDT.transpose(1, 2).contiguous()), new_cache

    def _packed(self, x_BTD: torch.Tensor, cu_seqlens: torch.Tensor):
        """Tap by tap: the tap reading x_{t-s} counts only when t - s lies in t's own sequence (s <= t - start)."""
        B, T, D = x_BTD.shape
        W = self.kernel_size[0]
        offset_T = _offsets_in_sequence(cu_seqlens, T, x_BTD.device)
        # Summed in at least float32 (as conv1d accumulates under autocast), returned in x's dtype.
        acc = torch.promote_types(x_BTD.dtype, torch.float32)
        x_full = F.pad(x_BTD.to(acc), (0, 0, W - 1, 0))  # [B, W - 1 + T, D]
        w_DW = self.weight[:, 0].to(acc)
        y_BTD = x_full[:, W - 1:] * w_DW[:, W - 1]
        for s in range(1, W):
            keep_T1 = (offset_T >= s).to(acc)[:, None]
            y_BTD = y_BTD + x_full[:, W - 1 - s:W - 1 - s + T] * keep_T1 * w_DW[:, W - 1 - s]
        # Final states per sequence are not kept: packed forwards are for training and evaluation.
        return F.silu(y_BTD.to(x_BTD.dtype)), None


def _offsets_in_sequence(cu_seqlens: torch.Tensor, T: int, device) -> torch.Tensor:
    """[T] int64: each token's position within its packed sequence (t - start of its sequence)."""
    t = torch.arange(T, device=device)
    bounds = cu_seqlens.to(device=device, dtype=torch.int64)
    seq = torch.searchsorted(bounds, t, right=True) - 1
    return t - bounds[seq]


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / |x| over the last dim, computed in at least fp32 and returned in x's dtype.

    Under CUDA autocast rsqrt runs in fp32, so without the cast q and k would leave here fp32 while v stays bf16:
    the kernels need one dtype (FLA refuses the mix; `triton` would fall back to its fp32 path).
    """
    x32 = x.to(torch.promote_types(x.dtype, torch.float32))
    return (x32 * torch.rsqrt((x32 * x32).sum(-1, keepdim=True) + L2_EPS)).to(x.dtype)


class ResidualAttention(nn.Module):
    """The linear mixer of every linear family; `cfg.family` picks the gates and the residual path.

    `glue`: "auto" runs the short conv, the q/k norm and the output norm and gate on FLA's fused kernels where the
    op's backend is a GPU one and FLA is installed, "torch" always in plain torch (the reference; tests compare).
    """

    glue = "auto"

    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        H, K, V, D = cfg.num_heads, cfg.head_dim, cfg.head_v_dim, cfg.hidden_size
        self.num_heads, self.head_k_dim, self.head_v_dim = H, K, V
        self.rule = cfg.rule
        self.spec = ResidualSpec(rule=cfg.rule, fit=cfg.fit, target=cfg.target, clip=cfg.clip,
                                 output_gates=cfg.output_gates)
        self.q_proj = nn.Linear(D, H * K, bias=False)
        self.k_proj = nn.Linear(D, H * K, bias=False)
        self.v_proj = nn.Linear(D, H * V, bias=False)
        if cfg.use_short_conv:
            self.q_conv1d = ShortConvolution(H * K, cfg.conv_size)
            self.k_conv1d = ShortConvolution(H * K, cfg.conv_size)
            self.v_conv1d = ShortConvolution(H * V, cfg.conv_size)
        if cfg.family in ("sgla", "rla"):
            self.gk_proj = nn.Linear(D, H, bias=True)
        else:
            self.a_proj = nn.Linear(D, H, bias=False)
            self.A_log = nn.Parameter(torch.zeros(H))
            # 1-D: the optimizer's parameter groups leave them without weight decay (train.loop._param_groups)
            self.dt_bias = nn.Parameter(torch.zeros(H))
        if cfg.beta == "learned":
            self.b_proj = nn.Linear(D, H, bias=False)
        if cfg.is_residual and not cfg.tied_gamma:
            self.c_proj = nn.Linear(D, H, bias=False)
        self.g_proj = nn.Linear(D, H * V, bias=False)
        self.o_norm = nn.RMSNorm(V, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(H * V, D, bias=False)
        if cfg.clip_mode == "relative":
            # The running residual RMS that scales the clip in eval and decoding; 1 until the first training
            # forward measures it (so an untrained model clips at the absolute radius `clip`).
            self.register_buffer("residual_rms_ema", torch.ones((), dtype=torch.float64))
            self.register_buffer("residual_rms_updates", torch.zeros((), dtype=torch.int64))
            # The running residual RMS at the end of the last optimizer step, handed over by the trainer on the
            # device (CausalLM.hand_over_clip_rms); NaN: none yet, training forwards then use the running mean.
            # Not in the checkpoint: a resumed run hands the restored running mean over itself.
            self.register_buffer("handed_rms", torch.full((), math.nan, dtype=torch.float64), persistent=False)
        self.backend_used: str | None = None
        self.kernel_used: str | None = None
        self.stats_enabled = False
        self.stats: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def _clip_radius(self, k_BTHK, v_BTHV, g_BTH, beta_BTH, S0, cu_seqlens=None) -> tuple[float, torch.Tensor | None]:
        """(the clip the op receives, the scale of v around the op): `clip` and None, or with clip_mode relative
        the radius `clip` times the running residual RMS s.

        Eval forwards and decoding pass the radius itself (one host read of the running mean), so a step-by-step
        decode equals the parallel forward. Training forwards keep s on the device, never reading it: the op then
        runs on v / s with the radius `clip` and its output (and state) is scaled back by s. The op is homogeneous
        in (v, radius) (every target, clip, tanh or identity, is), so this is the op at radius `clip` * s, its
        gradient the plain clip's (s is detached), and a CUDA graph can replay it with an s that changes every step.

        In training, s is the running mean handed over by the trainer once per optimizer step (`handed_rms`), so
        every micro batch of a step clips alike; before the first hand-over, the running mean, and in the very
        first training forward, with no running mean yet, the batch's own RMS (the initial 1 where that is not
        finite: a blown-up base state, e.g. the delta rule without the q/k norm, whose non-finite loss the
        divergence guard judges). Each training forward folds its batch's finite RMS into the running mean.
        """
        cfg = self.cfg
        if cfg.clip_mode == "absolute":
            return cfg.clip, None
        if not self.training:
            return cfg.clip * max(float(self.residual_rms_ema), RELATIVE_CLIP_FLOOR), None
        acc = torch.promote_types(v_BTHV.dtype, torch.float32)
        with torch.autocast(device_type=v_BTHV.device.type, enabled=False):
            pred = chunk_base_reads(k_BTHK, v_BTHV, g_BTH, beta_BTH, self.rule, S0, cu_seqlens=cu_seqlens)
            rms = (v_BTHV.to(acc) - pred.to(acc)).square().mean().sqrt().to(torch.float64)
        ema, handed = self.residual_rms_ema, self.handed_rms
        finite, first = torch.isfinite(rms), self.residual_rms_updates == 0
        running = torch.where(first & finite, rms, ema)
        scale = torch.where(torch.isnan(handed), running, handed).clamp_min(RELATIVE_CLIP_FLOOR)
        # The running mean takes finite batch values only, so it stays finite whatever a batch does.
        new = torch.where(first, rms, RESIDUAL_RMS_MOMENTUM * ema + (1 - RESIDUAL_RMS_MOMENTUM) * rms)
        ema.copy_(torch.where(finite, new, ema))
        self.residual_rms_updates.add_(finite.to(torch.int64))
        return cfg.clip, scale

    @torch.no_grad()
    def reset_gate_parameters(self) -> None:
        """GDN's init of A_log (A ~ U(0, 16)) and dt_bias (softplus^-1 of dt ~ logU(1e-3, 1e-1), floor 1e-4)."""
        if not hasattr(self, "A_log"):
            return
        H = self.A_log.shape[0]
        self.A_log.copy_(torch.empty(H).uniform_(0, 16).log())
        dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def forward(self, x_BTD: torch.Tensor, state: LinearState | None = None, cu_seqlens: torch.Tensor | None = None):
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        H, K, V = self.num_heads, self.head_k_dim, self.head_v_dim
        if cu_seqlens is not None and state is not None:
            raise ValueError("packed sequences (cu_seqlens) run without a decoding state")
        # every projection of x at once (fusion.SharedInput where the glue is fused): q, k, v, the output gate and
        # the gates' own (GATE_PROJECTIONS, those this family has)
        names = ("q_proj", "k_proj", "v_proj", "g_proj") + tuple(n for n in GATE_PROJECTIONS if hasattr(self, n))
        proj = dict(zip(names, fusion.project(x_BTD, [getattr(self, n) for n in names],
                                              fusion.shares_inputs(x_BTD, self.glue))))
        q, k, v = proj["q_proj"], proj["k_proj"], proj["v_proj"]
        self.backend_used = select_backend(q.view(B, T, H, K), cfg.backend, self.rule)
        glue = fusion.mixer_glue(self.backend_used, self.glue)
        conv_state = None
        if cfg.use_short_conv and glue is not None and state is None and cu_seqlens is None:
            # Training and evaluation forwards (no conv cache in or out): one fused kernel per conv and direction.
            q, k, v = (glue.conv(t, conv.weight[:, 0], activation="silu")[0]
                       for t, conv in ((q, self.q_conv1d), (k, self.k_conv1d), (v, self.v_conv1d)))
        elif cfg.use_short_conv:
            cq, ck, cv = state.conv if state is not None and state.conv is not None else (None, None, None)
            q, cq = self.q_conv1d(q, cq, cu_seqlens)
            k, ck = self.k_conv1d(k, ck, cu_seqlens)
            v, cv = self.v_conv1d(v, cv, cu_seqlens)
            conv_state = (cq, ck, cv)
        else:
            # GDN applies SiLU to q, k, v also without the conv; doing the same keeps conv on/off a pure ablation.
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q_BTHK, k_BTHK, v_BTHV = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V)
        if cfg.qk_norm == "l2":
            if glue is not None:
                q_BTHK, k_BTHK = glue.l2norm(q_BTHK, L2_EPS), glue.l2norm(k_BTHK, L2_EPS)
            else:
                q_BTHK, k_BTHK = _l2norm(q_BTHK), _l2norm(k_BTHK)

        # Gates in at least float32, as FLA computes them, whatever the activation dtype.
        acc = torch.promote_types(x_BTD.dtype, torch.float32)
        if cfg.family in ("sgla", "rla"):
            g_BTH = F.logsigmoid(proj["gk_proj"].to(acc)) / GATE_LOGIT_NORMALIZER
        else:
            g_BTH = -self.A_log.to(acc).exp() * F.softplus(proj["a_proj"].to(acc) + self.dt_bias.to(acc))
        if cfg.beta == "fixed":
            beta_BTH = torch.ones_like(g_BTH)
        else:
            beta_BTH = torch.sigmoid(proj["b_proj"].to(acc))
        if not cfg.is_residual:
            gamma_BTH = None
        elif cfg.tied_gamma:
            gamma_BTH = beta_BTH
        else:
            gamma_BTH = torch.sigmoid(proj["c_proj"].to(acc))

        initial = (state.S, state.R) if state is not None and state.S is not None else None
        self.kernel_used = kernel_tag(self.backend_used, q_BTHK, v_BTHV, self.spec, cu_seqlens)
        clip, v_scale = self._clip_radius(k_BTHK, v_BTHV, g_BTH, beta_BTH,
                                          initial[0] if initial is not None else None, cu_seqlens)
        v_op, initial_op = v_BTHV, initial
        if v_scale is not None:
            # the op at radius clip * s as clip on v / s, scaled back (_clip_radius)
            v_op = v_BTHV / v_scale
            if initial is not None:
                initial_op = tuple(None if x is None else x / v_scale for x in initial)
        o_BTHV, (S, R) = residual_attention(
            q_BTHK, k_BTHK, v_op, g_BTH, beta_BTH, gamma_BTH,
            rule=self.rule, fit=cfg.fit, target=cfg.target, clip=clip, output_gates=cfg.output_gates,
            initial_state=initial_op, backend=self.backend_used, cu_seqlens=cu_seqlens,
        )
        if v_scale is not None:
            o_BTHV = o_BTHV * v_scale
            S, R = (None if x is None else x * v_scale for x in (S, R))
            if self.stats_enabled:
                clip = clip * float(v_scale)  # stats read the radius on the host
        if self.stats_enabled:
            self._record_stats(o_BTHV, S, R)
            spec = self.spec if clip == self.spec.clip else replace(self.spec, clip=clip)
            if cfg.clip_mode == "relative":
                self.stats["clip_radius"] = torch.tensor(clip)
            self.stats |= mixer_diagnostics(
                o_BTHV, k_BTHK, v_BTHV, g_BTH, beta_BTH, gamma_BTH, spec=spec, norm_eps=self.o_norm.eps,
                S0=initial[0] if initial is not None else None, cu_seqlens=cu_seqlens,
            )

        gate_BTHV = proj["g_proj"].view(B, T, H, V)
        if glue is not None:
            y = glue.norm_gate(o_BTHV, gate_BTHV, self.o_norm.weight, None,
                               activation="swish", eps=self.o_norm.eps)
        else:
            y = self.o_norm(o_BTHV.to(x_BTD.dtype)) * F.silu(gate_BTHV)
        y_BTD = self.o_proj(y.reshape(B, T, H * V))
        new_state = None
        if state is not None:
            new_state = LinearState(S=S, R=R, conv=conv_state, seen=state.seen + T)
        return y_BTD, new_state

    @torch.no_grad()
    def _record_stats(self, o_BTHV, S, R):
        # Per token, the L2 norm over all heads of the op output (before the output norm, which would hide it).
        self.stats = {"attn_out_norm": o_BTHV.float().flatten(2).norm(dim=-1).mean()}
        # Frobenius norm of each sequence's final state over all heads, averaged over the batch.
        self.stats["S_norm"] = S.float().flatten(1).norm(dim=-1).mean()
        if R is not None:
            self.stats["R_norm"] = R.float().flatten(1).norm(dim=-1).mean()


def _rope(x_BTHD: torch.Tensor, positions_T: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, rotate-half convention (Llama / torchtitan's HF layout)."""
    D = x_BTHD.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, D, 2, device=x_BTHD.device, dtype=torch.float64) / D)
    angles_TD = torch.outer(positions_T.to(torch.float64), inv_freq).repeat(1, 2)
    cos = angles_TD.cos().to(x_BTHD.dtype)[None, :, None, :]
    sin = angles_TD.sin().to(x_BTHD.dtype)[None, :, None, :]
    x1, x2 = x_BTHD[..., : D // 2], x_BTHD[..., D // 2:]
    return x_BTHD * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Causal softmax attention with RoPE and grouped-query attention (the Transformer baseline). `glue`: as
    `ResidualAttention.glue` (here: whether q, k and v share one backward, `fusion.SharedInput`)."""

    glue = "auto"

    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        D, H, Hkv, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = H, Hkv, Dh
        self.q_proj = nn.Linear(D, H * Dh, bias=False)
        self.k_proj = nn.Linear(D, Hkv * Dh, bias=False)
        self.v_proj = nn.Linear(D, Hkv * Dh, bias=False)
        self.o_proj = nn.Linear(H * Dh, D, bias=False)
        self.backend_used: str | None = None
        self.kernel_used: str | None = None
        self.stats_enabled = False
        self.stats: dict[str, torch.Tensor] = {}

    def forward(self, x_BTD: torch.Tensor, state: KVState | None = None, cu_seqlens: torch.Tensor | None = None):
        B, T, _ = x_BTD.shape
        H, Dh = self.num_heads, self.head_dim
        if cu_seqlens is not None:
            if state is not None:
                raise ValueError("packed sequences (cu_seqlens) run without a decoding state")
            check_packed_batch(B, cu_seqlens)
            # Each sequence alone, positions from its start: exact per-document attention without a T x T mask.
            bounds = cu_seqlens.tolist()
            parts = [self._attend(x_BTD[:, a:b], None)[0] for a, b in zip(bounds, bounds[1:]) if b > a]
            o_BTHD, new_state = torch.cat(parts, dim=1), None
        else:
            o_BTHD, new_state = self._attend(x_BTD, state)
        self.backend_used = self.kernel_used = "sdpa"
        if self.stats_enabled:
            with torch.no_grad():
                self.stats = {"attn_out_norm": o_BTHD.float().flatten(2).norm(dim=-1).mean()}
        y_BTD = self.o_proj(o_BTHD.reshape(B, T, H * Dh))
        return y_BTD, new_state

    def _attend(self, x_BTD: torch.Tensor, state: KVState | None):
        """Causal attention of one batch of sequences: (o [B, T, H, Dh], the new state or None)."""
        B, T, _ = x_BTD.shape
        H, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        past = state.seen if state is not None else 0
        positions = torch.arange(past, past + T, device=x_BTD.device)
        q, k, v = fusion.project(x_BTD, [self.q_proj, self.k_proj, self.v_proj], fusion.shares_inputs(x_BTD, self.glue))
        q_BTHD = _rope(q.view(B, T, H, Dh), positions, self.cfg.rope_theta)
        k_BTHD = _rope(k.view(B, T, Hkv, Dh), positions, self.cfg.rope_theta)
        v_BTHD = v.view(B, T, Hkv, Dh)
        if state is not None and state.k is not None:
            k_BTHD = torch.cat([state.k, k_BTHD], dim=1)
            v_BTHD = torch.cat([state.v, v_BTHD], dim=1)
        mask = None
        if past and T > 1:
            # Query i (absolute position past + i) sees keys 0 .. past + i.
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x_BTD.device).tril(past)
        o_BHTD = F.scaled_dot_product_attention(
            q_BTHD.transpose(1, 2), k_BTHD.transpose(1, 2), v_BTHD.transpose(1, 2),
            attn_mask=mask, is_causal=(past == 0 and T > 1), enable_gqa=(H != Hkv),
        )
        new_state = KVState(k=k_BTHD, v=v_BTHD) if state is not None else None
        return o_BHTD.transpose(1, 2), new_state


def build_mixer(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    return Attention(cfg, layer_idx) if cfg.family == "transformer" else ResidualAttention(cfg, layer_idx)
