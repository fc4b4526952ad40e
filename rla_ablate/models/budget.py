"""Matched-budget controls: the paper's open question is whether RLA / RDN win only by their doubled state.

`matched_state(cfg)` derives, from a residual model, its baseline (rla -> sgla, rdn -> gdn) widened along one axis
until its recurrent state per layer equals the residual model's 2 * H * dk * dv:

    axis="expand_v"   dv' = 2 dv            (wider values: v, g and o projections grow)
    axis="heads"      H'  = 2 H             (more heads: q, k, v, g, o projections grow)
    axis="head_dim"   dk' = 2 dk, dv kept   (wider keys; expand_v is rescaled so that dv stays the same)

`matched_params(cfg)` starts from the matched-state control and sets intermediate_size so that the total parameter
count is as close as integer shapes allow to the residual model's; the remaining difference is reported.
Every number is an exact integer from `rla_ablate.models.accounting` (no model is built).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from rla_ablate.errors import UserError
from rla_ablate.models.accounting import count_params, flops_per_token, state_elements_per_layer
from rla_ablate.models.config import BASELINE_OF, LINEAR_FAMILIES, RESIDUAL_FAMILIES, ModelConfig

Axis = Literal["expand_v", "heads", "head_dim"]
AXES: tuple[str, ...] = ("expand_v", "heads", "head_dim")
# Sequence length at which matched controls report FLOPs/token (the smoke and 100m presets train at 2048 or less).
REPORT_SEQ_LEN = 2048


class MatchError(UserError, ValueError):
    """A control cannot be derived (wrong family, no integer shape); a UserError that is also a ValueError."""


@dataclass(frozen=True)
class MatchedControl:
    """A derived control, the residual model it is matched to, and what moved (flat, so asdict() is a report)."""

    config: ModelConfig
    reference: ModelConfig
    kind: str
    """matched_state | matched_params."""
    axis: str
    baseline_family: str
    changed: dict[str, tuple]
    """Field -> (value in the plain baseline of the reference's shape, value in the control)."""
    seq_len: int
    """Context length at which FLOPs/token are counted."""
    params: int
    reference_params: int
    params_delta: int
    """Control minus reference (0 when exactly matched)."""
    state_elements_per_layer: int
    reference_state_elements_per_layer: int
    state_delta: int
    flops_per_token: float
    reference_flops_per_token: float
    flops_delta: float

    @classmethod
    def build(cls, control: ModelConfig, reference: ModelConfig, base: ModelConfig, kind: str, axis: str,
              seq_len: int) -> "MatchedControl":
        p, rp = count_params(control), count_params(reference)
        s, rs = state_elements_per_layer(control), state_elements_per_layer(reference)
        f, rf = flops_per_token(control, seq_len), flops_per_token(reference, seq_len)
        a, b = base.model_dump(), control.model_dump()
        changed = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
        return cls(config=control, reference=reference, kind=kind, axis=axis, baseline_family=control.family,
                   changed=changed, seq_len=seq_len, params=p, reference_params=rp, params_delta=p - rp,
                   state_elements_per_layer=s, reference_state_elements_per_layer=rs, state_delta=s - rs,
                   flops_per_token=f, reference_flops_per_token=rf, flops_delta=f - rf)

    def summary(self) -> dict:
        """The report without the two configs (plain numbers and strings, JSON-ready)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("config", "reference")}
        out["changed"] = {k: list(v) for k, v in self.changed.items()}
        out["reference_family"] = self.reference.family
        return out


def plain_baseline(cfg: ModelConfig, baseline_family: str | None = None) -> ModelConfig:
    """The baseline of the same shape: no R, residual-only switches back to their defaults."""
    if cfg.family not in RESIDUAL_FAMILIES:
        raise MatchError(f"matched controls are derived from a residual model ({', '.join(RESIDUAL_FAMILIES)}); "
                        f"got family '{cfg.family}'")
    family = baseline_family or BASELINE_OF[cfg.family]
    if family not in LINEAR_FAMILIES or family in RESIDUAL_FAMILIES:
        raise MatchError(f"baseline_family must be one of sgla, gdn (got {family!r})")
    return cfg.replace(family=family, fit=None, target="clip", clip=1.0, clip_mode="absolute", output_gates=True,
                       tied_gamma=False)


def _widen(base: ModelConfig, target_state: int, axis: str) -> ModelConfig:
    H, K, V = base.num_heads, base.head_dim, base.head_v_dim
    if axis == "expand_v":
        new_v, rem = divmod(target_state, H * K)
        if rem:
            raise MatchError(f"no integer value dim gives state {target_state} with {H} heads x dk {K}")
        return base.replace(expand_v=new_v / K)
    if axis == "heads":
        new_h, rem = divmod(target_state, K * V)
        if rem:
            raise MatchError(f"no integer head count gives state {target_state} with dk {K} x dv {V}")
        return base.replace(num_heads=new_h)
    if axis == "head_dim":
        new_k, rem = divmod(target_state, H * V)
        if rem:
            raise MatchError(f"no integer key dim gives state {target_state} with {H} heads x dv {V}")
        return base.replace(head_dim=new_k, expand_v=V / new_k)
    raise MatchError(f"axis must be one of {', '.join(AXES)} (got {axis!r})")


def matched_state(cfg: ModelConfig, baseline_family: str | None = None, axis: str = "expand_v",
                  seq_len: int = REPORT_SEQ_LEN) -> MatchedControl:
    """The baseline widened along `axis` until its state per layer equals the residual model's."""
    base = plain_baseline(cfg, baseline_family)
    control = _widen(base, state_elements_per_layer(cfg), axis)
    if state_elements_per_layer(control) != state_elements_per_layer(cfg):
        raise AssertionError("widening did not match the state; this is a bug in rla_ablate.models.budget")
    return MatchedControl.build(control, cfg, base, "matched_state", axis, seq_len)


def matched_params(cfg: ModelConfig, baseline_family: str | None = None, axis: str = "expand_v",
                   seq_len: int = REPORT_SEQ_LEN) -> MatchedControl:
    """The matched-state control with intermediate_size set so that params match the residual model's."""
    base = plain_baseline(cfg, baseline_family)
    widened = _widen(base, state_elements_per_layer(cfg), axis)
    per_unit = 3 * cfg.hidden_size * cfg.num_layers  # params per unit of intermediate_size (SwiGLU: 3 matrices)
    gap = count_params(cfg) - count_params(widened)
    # Round to the nearest integer width; the remainder (< per_unit / 2) is reported as params_delta.
    step = (2 * gap + per_unit) // (2 * per_unit)
    new_inter = widened.intermediate_size + step
    if new_inter < 1:
        raise MatchError(f"matching params along {axis} would need intermediate_size {new_inter} < 1: the widened "
                        f"mixer alone has more parameters than the whole residual model")
    control = widened.replace(intermediate_size=new_inter)
    return MatchedControl.build(control, cfg, base, "matched_params", axis, seq_len)
