"""The switches of the residual attention op (BRIEF §2), validated once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Rule = Literal["additive", "delta"]
Fit = Literal["residual", "none", "off"]
Target = Literal["clip", "tanh", "identity"]

RULES = ("additive", "delta")
FITS = ("residual", "none", "off")
TARGETS = ("clip", "tanh", "identity")


@dataclass(frozen=True)
class ResidualSpec:
    rule: str = "additive"
    """additive (RLA, sGLA base) or delta (RDN, Gated DeltaNet base)."""
    fit: str = "residual"
    """residual: R is a recurrent state; none: R_t = r_t k_t^T (Table 4); off: no auxiliary path (baseline)."""
    target: str = "clip"
    """How the residual v - S_{t-1} k becomes the target: clip (Huber), tanh (log-cosh), identity (plain L2)."""
    clip: float = 1.0
    """c in Clip[-c, c] and c * tanh(x / c)."""
    output_gates: bool = True
    """o = alpha S_{t-1} q + gamma R_t q (True, paper default) or S_{t-1} q + R_t q (Table 5)."""

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {self.rule!r}")
        if self.fit not in FITS:
            raise ValueError(f"fit must be one of {FITS}, got {self.fit!r}")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        if not (isinstance(self.clip, (int, float)) and 0 < float(self.clip) < float("inf")):
            raise ValueError(f"clip must be a positive finite number, got {self.clip!r}")
        if self.fit == "off" and (self.target != "clip" or float(self.clip) != 1.0 or not self.output_gates):
            raise ValueError(
                "fit='off' has no residual path: target, clip and output_gates must keep their defaults "
                f"(got target={self.target!r}, clip={self.clip!r}, output_gates={self.output_gates!r})"
            )

    def apply_target(self, x: torch.Tensor) -> torch.Tensor:
        c = float(self.clip)
        if self.target == "clip":
            return x.clamp(-c, c)
        if self.target == "tanh":
            return c * torch.tanh(x / c)
        return x
