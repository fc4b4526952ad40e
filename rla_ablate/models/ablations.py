"""The named ablations and controls of docs/MATH.md: what each changes, where the paper shows it, which families it fits.

    from rla_ablate.models.ablations import ABLATIONS, apply_ablation
    cfg_no_fit = apply_ablation("no_fitting", cfg)          # = ABLATIONS["no_fitting"].apply(cfg)

Sweeps check names and families when they are expanded (`check(name, family)`), before anything is scheduled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rla_ablate.errors import UserError, did_you_mean
from rla_ablate.models.config import ModelConfig


@dataclass(frozen=True)
class Ablation:
    name: str
    families: tuple[str, ...]
    """The families it applies to."""
    change: str
    """What it changes, in the words of docs/MATH.md."""
    evidence: str
    """Where the paper shows it (or that it never ran)."""
    _apply: Callable[[ModelConfig], ModelConfig]

    def apply(self, cfg: ModelConfig) -> ModelConfig:
        """The ablated copy of `cfg`; raises UserError when `cfg.family` is not one this ablation fits."""
        check(self.name, cfg.family)
        return self._apply(cfg)


def _set(**changes) -> Callable[[ModelConfig], ModelConfig]:
    return lambda cfg: cfg.replace(**changes)


_RESIDUAL = ("rla", "rdn")
# What a residual model sets that its baseline must leave at the defaults (ModelConfig's residual-only switches).
_BASE_DEFAULTS = {"fit": None, "target": "clip", "clip": 1.0, "clip_mode": "absolute", "output_gates": True,
                  "tied_gamma": False}


def _learned_beta_base(cfg: ModelConfig) -> ModelConfig:
    # Everything shared with RLA is kept (shape, init, conv, q/k norm); only R and gamma go.
    return cfg.replace(family="sgla", beta="learned", **_BASE_DEFAULTS)
ABLATIONS: dict[str, Ablation] = {a.name: a for a in (
    Ablation("no_fitting", _RESIDUAL, "fit=none: R_t = r_t k_t^T, no memory in R",
             "Table 4 (50B tokens)", _set(fit="none")),
    Ablation("tied_gamma", _RESIDUAL, "gamma_t := beta_t", "Fig. 3a/3b", _set(tied_gamma=True)),
    Ablation("no_output_gates", _RESIDUAL, "output_gates=False: o_t = S_{t-1} q_t + R_t q_t",
             "Table 5", _set(output_gates=False)),
    Ablation("no_fitting_no_clip", _RESIDUAL, "fit=none and target=identity: R_t = (v_t - S_{t-1} k_t) k_t^T",
             "Table 4 as the slide writes it (the no-fitting state has no clip)", _set(fit="none", target="identity")),
    Ablation("no_clip", _RESIDUAL, "target=identity (plain L2 residual)",
             "Fig. 4b (RDN vs RDN w/o clip); for RLA the separate half of Fig. 4's 'w/o clip and norm'",
             _set(target="identity")),
    Ablation("no_norm", ("sgla", "gdn", "rla", "rdn"), "qk_norm=none (no L2 norm of q and k)", "Fig. 4",
             _set(qk_norm="none")),
    Ablation("no_clip_no_norm", _RESIDUAL, "target=identity and qk_norm=none", "Fig. 4a/4b (RLA)",
             _set(target="identity", qk_norm="none")),
    Ablation("logcosh", _RESIDUAL, "target=tanh: c * tanh(x / c) (log-cosh loss)", "App. B proposal, never run",
             _set(target="tanh")),
    Ablation("learned_beta_base", ("rla",),
             "sGLA with RLA's learned beta = sigmoid(W_b x) and no R: the residual model minus R and gamma",
             "none: sGLA writes with beta = 1 while RLA learns beta, so rla vs sgla also changes beta; this "
             "control isolates R", _learned_beta_base),
)}

# Derived controls are not ablations: each is a different model (another family, widened, or trained for another
# model's time) that a sweep derives from a residual arm under `controls:` (rla_ablate.models.budget), named in
# the job as `sgla~matched_state(<arm>)`.
CONTROL_NAMES = ("matched_state", "matched_params", "matched_wallclock")


def not_an_ablation(name: str) -> str | None:
    """The message for a control listed as an ablation, else None."""
    if name in CONTROL_NAMES:
        return f"'{name}' is a control, not an ablation: list it under `controls:` (allowed there: " \
               f"{', '.join(CONTROL_NAMES)})"
    return None


def get_ablation(name: str) -> Ablation:
    if (control := not_an_ablation(name)) is not None:
        raise UserError(control)
    if name not in ABLATIONS:
        raise UserError(f"unknown ablation '{name}'{did_you_mean(name, ABLATIONS)}; allowed: {', '.join(ABLATIONS)}")
    return ABLATIONS[name]


def check(name: str, family: str) -> None:
    """Raise UserError unless ablation `name` exists and fits `family`."""
    ablation = get_ablation(name)
    if family not in ablation.families:
        raise UserError(f"ablation '{name}' ({ablation.change}) does not apply to family '{family}'; "
                        f"it applies to: {', '.join(ablation.families)}")


def apply_ablation(name: str, cfg: ModelConfig) -> ModelConfig:
    return get_ablation(name).apply(cfg)
