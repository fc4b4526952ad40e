"""The causal LM: embeddings, blocks (RMSNorm, mixer, RMSNorm, SwiGLU MLP), final RMSNorm, head.

    model = build_model(cfg)
    logits_BTV = model(input_ids_BT)                 # training / evaluation
    cache = model.new_cache()                        # decoding: per-layer (S, R, conv) or KV state
    logits_BTV = model(prompt_BT, cache=cache)       # prefill; cache now holds the states after the prompt
    logits_BV = model.step(next_token_B, cache)      # one token; equals the parallel forward's last position
    logits_BTV = model(input_ids_BT, cu_seqlens=cu)  # packed documents (below)
    nll = model(input_ids_BT, labels=labels_BT)      # training: the summed cross-entropy (fusion.lm_loss)

With `cu_seqlens` (int offsets [N + 1] into the batch flattened to one row of B·T tokens, from 0 to B·T and
including every row's start, FLA's convention) the batch runs as one row of N documents, each as if alone: every
layer gets the offsets, so no state, conv input or attention crosses a document boundary. The logits come back
[B, T, V]. Offsets that are exactly the row starts are the plain batch and run as one.

`model.backend_used` names the op backend that ran last (`model.kernel_used` its implementation, as runs log it);
with `model.track_stats(True)`, `model.layer_stats()` returns `{"layer_00/attn_out_norm": ...,
"layer_00/S_norm": ..., "layer_00/residual_rms": ..., ...}` from the last forward: state norms and the mechanism
diagnostics (`rla_ablate.models.diagnostics`, docs/TRAINING.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from rla_ablate import environment
from rla_ablate.models import fusion
from rla_ablate.models.config import ModelConfig
from rla_ablate.models.layers import KVState, LinearState, ResidualAttention, ShortConvolution, build_mixer


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, glue: fusion.FusedGlue | None = None, shared: bool = False) -> torch.Tensor:
        """shared: gate and up projections through `fusion.SharedInput` (one backward for both readers of x)."""
        gate, up = fusion.project(x, [self.gate_proj, self.up_proj], shared)
        return self.down_proj(fusion.swiglu(gate, up, glue))


class Block(nn.Module):
    """x + mixer(norm(x)), then + mlp(norm(.)); each residual add is fused into the norm after it (FLA's prenorm).

    The block takes and returns the stream in two parts, the last sublayer's output h not yet added to the residual
    stream before it: forward(h, residual, state) -> (mlp output, stream after the mixer, the new decoding state),
    the stream being residual + h (h alone where residual is None, in the first block). `glue`: as
    `ResidualAttention.glue` (`fusion`).
    """

    glue = "auto"

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = build_mixer(cfg, layer_idx)
        self.mlp_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h_BTD: torch.Tensor, residual_BTD: torch.Tensor | None = None, state=None,
                cu_seqlens: torch.Tensor | None = None):
        glue = fusion.block_glue(h_BTD, self.glue)
        x_BTD, residual_BTD = fusion.add_and_norm(self.attn_norm, h_BTD, residual_BTD, glue)
        h_BTD, state = self.attn(x_BTD, state, cu_seqlens=cu_seqlens)
        x_BTD, residual_BTD = fusion.add_and_norm(self.mlp_norm, h_BTD, residual_BTD, glue)
        return self.mlp(x_BTD, glue, fusion.shares_inputs(x_BTD, self.glue)), residual_BTD, state


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # The glue the last forward ran in its blocks and loss: "fused" (FLA's kernels) or "torch"; runs log it.
        self.glue_used: str | None = None
        self.set_glue(environment.glue_mode())
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, init_std) for every linear, conv and embedding weight, zero biases, GDN's gate init."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, ResidualAttention):
                module.reset_gate_parameters()
        if self.cfg.conv_init == "identity":
            # After the loop above (which also drew the conv weights): the last tap reads the current token.
            for module in self.modules():
                if isinstance(module, ShortConvolution):
                    module.weight.zero_()
                    module.weight[:, :, -1] = 1.0

    @property
    def glue(self) -> str:
        """"auto": FLA's fused glue where it applies (`rla_ablate.models.fusion`); "torch": the plain-torch glue."""
        return self.layers[0].glue if len(self.layers) else Block.glue

    def set_glue(self, mode: str) -> None:
        """Run the glue of every block and mixer as `mode` ("auto" or "torch"): the same model, other kernels."""
        if mode not in fusion.GLUE_MODES:
            raise ValueError(f"glue must be one of {list(fusion.GLUE_MODES)}; got {mode!r}")
        for layer in self.layers:
            layer.glue = layer.attn.glue = mode

    def new_cache(self) -> list:
        """Empty per-layer decoding states; pass the list to `forward(..., cache=)` / `step`, which update it."""
        return [KVState() if self.cfg.family == "transformer" else LinearState() for _ in self.layers]

    def forward(self, input_ids: torch.Tensor, cache: list | None = None,
                cu_seqlens: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab]; with `labels` [B, T] the summed cross-entropy over the scored labels instead (those
        not `fusion.IGNORE_INDEX`), an fp32 scalar: the training loss, on FLA's fused kernel where the glue is."""
        B, T = input_ids.shape
        if cu_seqlens is not None:
            if cache is not None:
                raise ValueError("packed documents (cu_seqlens) run without a decoding cache")
            cu_seqlens = _packed_offsets(cu_seqlens, B, T)
            if cu_seqlens is None:
                return self.forward(input_ids, labels=labels)
            input_ids = input_ids.reshape(1, B * T)
        h_BTD, residual_BTD = self.embed(input_ids), None
        for i, layer in enumerate(self.layers):
            h_BTD, residual_BTD, new_state = layer(h_BTD, residual_BTD, None if cache is None else cache[i],
                                                   cu_seqlens=cu_seqlens)
            if cache is not None:
                cache[i] = new_state
        glue = fusion.block_glue(h_BTD, self.glue)
        self.glue_used = "torch" if glue is None else "fused"
        x_BTD, _ = fusion.add_and_norm(self.norm, h_BTD, residual_BTD, glue)
        if labels is not None:
            return fusion.lm_loss(x_BTD, self.lm_head.weight, labels, glue)
        return self.lm_head(x_BTD).view(B, T, -1)

    def step(self, token_ids: torch.Tensor, cache: list) -> torch.Tensor:
        """One decoding step: token_ids [B] -> logits [B, vocab]; `cache` is updated in place."""
        return self.forward(token_ids[:, None], cache=cache)[:, -1]

    @property
    def backend_used(self) -> str | None:
        """The op backend that ran in the last forward ('sdpa' for the transformer)."""
        names = [layer.attn.backend_used for layer in self.layers if layer.attn.backend_used is not None]
        return names[-1] if names else None

    @property
    def kernel_used(self) -> str | None:
        """What ran in the last forward, down to the implementation: `ops.kernel_tag`, e.g. 'triton/rla-fused'
        where `backend_used` says 'triton' ('sdpa' for the transformer). Runs log this as their backend."""
        names = [layer.attn.kernel_used for layer in self.layers if layer.attn.kernel_used is not None]
        return names[-1] if names else None

    def _relative_clip_mixers(self) -> list[nn.Module]:
        return [layer.attn for layer in self.layers if hasattr(layer.attn, "residual_rms_ema")]

    def relative_clip_rms(self) -> list[torch.Tensor]:
        """The running residual RMS of each layer with clip_mode relative (float64 scalars on the device)."""
        return [attn.residual_rms_ema for attn in self._relative_clip_mixers()]

    def read_and_hand_over(self, *values: torch.Tensor) -> list[float]:
        """A training step's one host read: `values` (scalars on the device, e.g. the loss and the grad norm) as
        floats; every relative-clip layer's running RMS is handed over for the next step's forwards on the device
        (`hand_over_clip_rms`), without a read."""
        self.hand_over_clip_rms()
        return torch.stack([v.double() for v in values]).tolist()

    def hand_over_clip_rms(self, values: list[float | None] | None = None) -> None:
        """Give each relative-clip layer, in `relative_clip_rms` order, the running RMS its training forwards scale
        the radius by until the next hand-over (`read_and_hand_over` makes it once per step; None for a layer: its
        forwards use their running mean). values None: the running RMS in the buffers now, copied on the device,
        for the layers that have one (after a step, after a checkpoint is loaded)."""
        mixers = self._relative_clip_mixers()
        if values is None:
            for attn in mixers:
                attn.handed_rms.copy_(torch.where(attn.residual_rms_updates > 0, attn.residual_rms_ema, math.nan))
            return
        if len(values) != len(mixers):
            raise ValueError(f"{len(values)} values for {len(mixers)} relative-clip layers")
        for attn, value in zip(mixers, values):
            attn.handed_rms.fill_(math.nan if value is None else value)

    def track_stats(self, enabled: bool = True) -> None:
        """Record per-layer norms and diagnostics on every forward.

        Linear layers then also rerun the base recurrence (no gradients, float32) to get the residuals: about
        the cost of the forward op again, so switch it on for single evaluation forwards, not for training.
        """
        for layer in self.layers:
            layer.attn.stats_enabled = bool(enabled)
            layer.attn.stats = {}

    def layer_stats(self) -> dict[str, float]:
        """`layer_XX/<name>` from the last forward with tracking on, as floats (names: docs/TRAINING.md).

        attn_out_norm, S_norm, R_norm (rla/rdn), residual_rms, target_engaged (rla/rdn), mixer_rms,
        mixer_rms_over_sqrt_eps, alpha_mean, beta_mean, gamma_mean (rla/rdn); the transformer: attn_out_norm.
        """
        out: dict[str, float] = {}
        for i, layer in enumerate(self.layers):
            for name, value in layer.attn.stats.items():
                out[f"layer_{i:02d}/{name}"] = float(value)
        return out


def _packed_offsets(cu_seqlens: torch.Tensor, B: int, T: int) -> torch.Tensor | None:
    """Checked offsets of a packed [B, T] batch; None when they are exactly the row starts (the plain batch)."""
    if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
        raise ValueError("cu_seqlens must be a 1-D integer tensor [N + 1] of document boundaries")
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or bounds[-1] != B * T or any(a > b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to B·T = {B * T}; got {bounds}")
    if not set(range(0, B * T, T)) <= set(bounds):
        raise ValueError(f"cu_seqlens must include every row start (multiples of T = {T}): a document cannot run "
                         "from one row into the next")
    if len(bounds) == B + 1:
        return None
    return cu_seqlens


def build_model(cfg: ModelConfig) -> CausalLM:
    return CausalLM(cfg)
