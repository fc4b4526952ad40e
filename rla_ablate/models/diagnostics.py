"""Mechanism diagnostics of the linear mixers: is the residual target acting, is the output norm a fixed gain?

An ablation that switches a mechanism off only tests something when the mechanism is on in the reference. Two
can be off without any error: the target T (clip / tanh) when every residual is well inside +-c, and the signal
in the scale of the mixer output when that output is far below sqrt(eps) of the per-head output RMSNorm, which
then divides by ~sqrt(eps), a constant. These numbers say which; docs/TRAINING.md gives the definitions and the
thresholds.

The residual x_t = v_t - S_{t-1} k_t lives inside the fast kernels, so it is recomputed here, without gradients
and in float32 (float64 for float64 models), from the k, v, g, beta the op saw: `chunk_base_reads`, the base
stage of the chunked form. Only forwards with stats tracking on pay for it (the training loop: one eval batch
per stats point).
"""

from __future__ import annotations

import math

import torch

from rla_ablate.ops.chunk import DEFAULT_CHUNK, chunk_base_reads
from rla_ablate.ops.spec import ResidualSpec

# Model-level aggregates over layers: the name under diag/ and how layers combine. The output path is only as
# alive as its most drowned layer, hence the minimum for the norm ratio.
DIAG_MEAN = ("residual_rms", "target_engaged", "alpha_mean", "beta_mean", "gamma_mean")
DIAG_MIN = ("mixer_rms_over_sqrt_eps",)
# "Engaged" thresholds documented in docs/TRAINING.md, for readers of the metrics (dashboards, reports).
TARGET_ENGAGED_MIN = 1e-3
MIXER_RMS_OVER_SQRT_EPS_MIN = 1.0


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x.square().mean().sqrt()


@torch.no_grad()
def mixer_diagnostics(o_BTHV, k_BTHK, v_BTHV, g_BTH, beta_BTH, gamma_BTH, *, spec: ResidualSpec, norm_eps: float,
                      S0=None, chunk_size: int = DEFAULT_CHUNK,
                      cu_seqlens: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The diagnostics of one linear layer's forward, as 0-dim tensors (no host sync here).

    o: the op output the output norm receives; k, v, g, beta, gamma: the op's inputs (k, v after conv and
    norm); S0: the initial base state or None; cu_seqlens: packed sequences, as the op saw them.
    `target_engaged` only with a residual path (spec.fit != "off"), `gamma_mean` only when gamma is given.
    """
    acc = torch.promote_types(v_BTHV.dtype, torch.float32)
    # Under autocast the chunked matmuls would run in bf16: the diagnostics are float32 whatever the model runs in.
    with torch.autocast(device_type=v_BTHV.device.type, enabled=False):
        pred_BTHV = chunk_base_reads(k_BTHK, v_BTHV, g_BTH, beta_BTH, spec.rule, S0, chunk_size=chunk_size,
                                     cu_seqlens=cu_seqlens)
        x_BTHV = v_BTHV.to(acc) - pred_BTHV.to(acc)
        mixer_rms = _rms(o_BTHV.to(acc))
        out = {"residual_rms": _rms(x_BTHV)}
        if spec.fit != "off":
            out["target_engaged"] = spec.target_changes(x_BTHV).to(acc).mean()
        out["mixer_rms"] = mixer_rms
        out["mixer_rms_over_sqrt_eps"] = mixer_rms / math.sqrt(norm_eps)
        out["alpha_mean"] = g_BTH.to(acc).exp().mean()
        out["beta_mean"] = beta_BTH.to(acc).mean()
        if gamma_BTH is not None:
            out["gamma_mean"] = gamma_BTH.to(acc).mean()
    return out


def aggregate_diagnostics(layer_stats: dict[str, float]) -> dict[str, float]:
    """`diag/<name>` over the layers of `model.layer_stats()`: the mean for DIAG_MEAN, the minimum for DIAG_MIN.

    A name no layer reports (a transformer, gamma and target_engaged on the baselines) is left out; a NaN in any
    layer makes the aggregate NaN.
    """
    per_name: dict[str, list[float]] = {}
    for key, value in layer_stats.items():
        prefix, _, name = key.partition("/")
        if prefix.startswith("layer_") and name in DIAG_MEAN + DIAG_MIN:
            per_name.setdefault(name, []).append(float(value))
    out: dict[str, float] = {}
    for name, values in per_name.items():
        if any(math.isnan(v) for v in values):
            out[f"diag/{name}"] = math.nan
        elif name in DIAG_MIN:
            out[f"diag/{name}"] = min(values)
        else:
            out[f"diag/{name}"] = sum(values) / len(values)
    return out
