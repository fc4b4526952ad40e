"""`ModelConfig`: the shape of a model and every ablation switch of docs/MATH.md, validated at construction.

The family fixes what the switches may be:

| family      | mixer                              | rule     | fit                      |
|-------------|------------------------------------|----------|--------------------------|
| transformer | softmax attention (SDPA, RoPE, GQA)| -        | off                      |
| sgla        | simple gated linear attention      | additive | off (beta = 1)           |
| gdn         | Gated DeltaNet                     | delta    | off                      |
| rla         | residual linear attention          | additive | residual (or none)       |
| rdn         | residual delta net                 | delta    | residual (or none)       |

Switches that only mean something for a residual model (target, clip, clip_mode, output_gates, tied_gamma) must
keep their defaults on a baseline; switches left unset (`fit`, `qk_norm`, `use_short_conv`, `beta`) resolve to the
family's default, so the validated config always spells out what runs; its JSON (which job ids hash) leaves out
only the proxy switches at the values every earlier config had (clip_mode absolute, conv_init normal, the family's
beta).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict, Field, model_serializer, model_validator

from rla_ablate.config.numbers import NumbersNotBools

Family = Literal["transformer", "sgla", "gdn", "rla", "rdn"]
FAMILIES: tuple[str, ...] = ("transformer", "sgla", "gdn", "rla", "rdn")
LINEAR_FAMILIES: tuple[str, ...] = ("sgla", "gdn", "rla", "rdn")
RESIDUAL_FAMILIES: tuple[str, ...] = ("rla", "rdn")
# The baseline each residual family extends (docs/MATH.md): same retention gate and update rule, no R.
BASELINE_OF: dict[str, str] = {"rla": "sgla", "rdn": "gdn"}
RULE_OF: dict[str, str] = {"sgla": "additive", "rla": "additive", "gdn": "delta", "rdn": "delta"}
# Switches added for the small-scale proxies, with the value every earlier config had. The dump leaves them out at
# that value, so earlier configs keep their JSON: their job ids, checkpoints and the golden run still match.
_LATER_SWITCHES = {"clip_mode": "absolute", "conv_init": "normal"}
_BETA_OF: dict[str, str | None] = {"transformer": None, "sgla": "fixed", "gdn": "learned", "rla": "learned",
                                   "rdn": "learned"}


class ModelConfig(NumbersNotBools):
    """A causal LM: embeddings, `num_layers` blocks (RMSNorm, mixer, RMSNorm, SwiGLU MLP), final norm, head."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: Family
    """Mixer family: transformer | sgla | gdn (baselines) | rla | rdn (residual models of the paper)."""
    vocab_size: int = Field(256, ge=2)
    """Vocabulary size (256 = raw bytes)."""
    hidden_size: int = Field(ge=1)
    """Width of the residual stream."""
    num_layers: int = Field(ge=1)
    """Number of blocks."""
    intermediate_size: int = Field(ge=1)
    """Width of the SwiGLU MLP (the paper's 1.5B models: 8192 at hidden 2048)."""
    num_heads: int = Field(ge=1)
    """Attention heads (query heads for the transformer)."""
    head_dim: int = Field(ge=1)
    """Key (and query) dimension per head, dk."""
    expand_v: float = Field(1.0, gt=0)
    """Value dimension per head as a multiple of head_dim: dv = head_dim * expand_v (must be an integer)."""
    num_kv_heads: int | None = Field(None, ge=1)
    """Transformer only: key/value heads for grouped-query attention (default: num_heads, i.e. no GQA)."""
    rope_theta: float = Field(10000.0, gt=0)
    """Transformer only: RoPE base."""
    fit: Literal["residual", "none", "off"] | None = None
    """rla/rdn: residual (R is a recurrent state) or none (R_t = r_t k_t^T, Table 4). Baselines: off (resolved)."""
    target: Literal["clip", "tanh", "identity"] = "clip"
    """Residual target: clip (Huber, paper), tanh (log-cosh, App. B) or identity (plain L2, 'no clip')."""
    clip: float = Field(1.0, gt=0, allow_inf_nan=False)
    """c in Clip[-c, c] and c * tanh(x / c) (clip_mode absolute), or its multiple of the residual RMS (relative)."""
    clip_mode: Literal["absolute", "relative"] = "absolute"
    """absolute: the radius is `clip` (paper). relative: the radius is `clip` times the RMS of the layer's residual
    v_t - S_{t-1} k_t, measured without gradients (batch value in training, its running mean in eval and decoding),
    so the target acts on a fixed share of the residuals at any scale (docs/MATH.md, "Small-scale proxies")."""
    output_gates: bool = True
    """o = alpha S_{t-1} q + gamma R_t q (True, paper) or S_{t-1} q + R_t q (Table 5)."""
    tied_gamma: bool = False
    """gamma_t := beta_t instead of its own projection (Fig. 3)."""
    qk_norm: Literal["l2", "none"] | None = None
    """L2-normalize q and k over the head dim (default for linear families) or not (Fig. 4 'w/o norm')."""
    use_short_conv: bool | None = None
    """Causal depthwise conv + SiLU on q, k, v (default for linear families; the transformer has none)."""
    conv_size: int = Field(4, ge=1)
    """Kernel size of the short convolution."""
    conv_init: Literal["normal", "identity"] = "normal"
    """Init of the short convolution: normal (N(0, init_std) as every weight, FLA) or identity (the current
    token's tap 1, the others 0: the conv starts as a pass-through and does not shrink q, k, v)."""
    beta: Literal["fixed", "learned"] | None = None
    """Base write strength: learned (beta = sigmoid(W_b x); gdn, rla, rdn) or fixed (beta = 1; sgla's default).
    sgla may set learned: the additive base with RLA's beta and no R, the clean control for RLA."""
    init_std: float = Field(0.006, gt=0)
    """Std of the normal init of every linear, conv and embedding weight (paper App. C: 0.006)."""
    norm_eps: float = Field(1e-6, gt=0)
    """Epsilon of every RMSNorm."""
    tie_embeddings: bool = False
    """Share the input embedding and the output head."""
    backend: str = "auto"
    """Op backend for linear families: auto (chunk on CPU, fastest available on GPU) or a name (naive, chunk, fla)."""

    @model_validator(mode="after")
    def _resolve_and_check(self) -> "ModelConfig":
        fam = self.family
        residual_only = {"target": "clip", "clip": 1.0, "clip_mode": "absolute", "output_gates": True,
                         "tied_gamma": False}
        if fam in RESIDUAL_FAMILIES:
            if self.fit == "off":
                raise ValueError(f"fit='off' removes the residual path: use family '{BASELINE_OF[fam]}' instead of "
                                 f"'{fam}' (allowed fit for {fam}: residual, none)")
            fit = self.fit or "residual"
        else:
            if self.fit not in (None, "off"):
                raise ValueError(f"family '{fam}' has no residual path, so fit must be 'off' (got {self.fit!r}); "
                                 f"the residual families are {', '.join(RESIDUAL_FAMILIES)}")
            fit = "off"
            moved = [f"{k}={getattr(self, k)!r}" for k, d in residual_only.items() if getattr(self, k) != d]
            if moved:
                raise ValueError(f"{', '.join(moved)} {'apply' if len(moved) > 1 else 'applies'} only to residual families ({', '.join(RESIDUAL_FAMILIES)}); "
                                 f"family '{fam}' must keep the defaults "
                                 + ", ".join(f"{k}={d!r}" for k, d in residual_only.items()))
        if fam == "transformer":
            if self.qk_norm == "l2":
                raise ValueError("qk_norm='l2' is a linear-attention switch; the transformer uses qk_norm='none'")
            if self.use_short_conv:
                raise ValueError("use_short_conv is a linear-attention switch; the transformer has no short conv")
            if self.expand_v != 1.0:
                raise ValueError(f"expand_v must be 1 for the transformer (got {self.expand_v})")
            if self.head_dim % 2:
                raise ValueError(f"RoPE rotates pairs of dimensions: the transformer needs an even head_dim "
                                 f"(got {self.head_dim})")
            kv = self.num_kv_heads or self.num_heads
            if self.num_heads % kv:
                raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={kv}")
            qk_norm, use_short_conv, num_kv_heads = "none", False, kv
        else:
            if self.num_kv_heads is not None:
                raise ValueError(f"num_kv_heads is for the transformer's GQA; family '{fam}' has one k/v per head")
            dv = self.head_dim * self.expand_v
            if not math.isclose(dv, round(dv), rel_tol=0, abs_tol=1e-9) or round(dv) < 1:
                raise ValueError(f"head_dim * expand_v must be a positive integer (got {self.head_dim} * "
                                 f"{self.expand_v} = {dv})")
            qk_norm = self.qk_norm or "l2"
            use_short_conv = True if self.use_short_conv is None else self.use_short_conv
            num_kv_heads = None
        if fam == "transformer":
            if self.beta is not None:
                raise ValueError("beta is a linear-attention switch; the transformer has no write gate")
            beta = None
        elif fam == "sgla":
            beta = self.beta or "fixed"
        else:
            if self.beta == "fixed":
                raise ValueError(f"family '{fam}' learns beta; only sgla may fix it (beta='fixed' is sgla's default)")
            beta = "learned"
        if self.conv_init != "normal" and not use_short_conv:
            raise ValueError(f"conv_init={self.conv_init!r} needs the short convolution (use_short_conv=True)")
        # GPU backends register on import (rla_ablate.ops), so their names are listed here, not looked up.
        known = ("auto", "naive", "chunk", "fla", "triton")
        if self.backend not in known:
            raise ValueError(f"backend {self.backend!r} is not one of {', '.join(known)}")
        if self.backend != "auto" and fam == "transformer":
            raise ValueError(f"backend={self.backend!r} selects a linear-attention op; the transformer runs SDPA "
                             "(leave backend='auto')")
        # The model is frozen; fill the resolved values in place once, at validation.
        for key, value in (("fit", fit), ("qk_norm", qk_norm), ("use_short_conv", use_short_conv),
                           ("num_kv_heads", num_kv_heads), ("beta", beta)):
            object.__setattr__(self, key, value)
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        data = handler(self)
        for key, default in _LATER_SWITCHES.items():
            if data.get(key) == default:
                data.pop(key)
        # beta as the family has it is what every earlier config meant.
        if "beta" in data and data["beta"] == _BETA_OF[self.family]:
            data.pop("beta")
        return data

    @property
    def rule(self) -> str | None:
        """additive | delta for linear families, None for the transformer."""
        return RULE_OF.get(self.family)

    @property
    def head_v_dim(self) -> int:
        """dv = head_dim * expand_v."""
        return int(round(self.head_dim * self.expand_v))

    @property
    def is_residual(self) -> bool:
        return self.family in RESIDUAL_FAMILIES

    def replace(self, **changes) -> "ModelConfig":
        """A validated copy with `changes` applied (unset switches re-resolve for a new family)."""
        data = self.model_dump()
        if "family" in changes and changes["family"] != self.family:
            for key in ("fit", "qk_norm", "use_short_conv", "num_kv_heads", "beta"):
                if key not in changes and (self.family == "transformer") != (changes["family"] == "transformer"):
                    data[key] = None
            if "fit" not in changes:
                data["fit"] = None
            if "beta" not in changes:
                data["beta"] = None
        data.update(changes)
        return ModelConfig.model_validate(data)
