"""The switches of the residual attention op (docs/MATH.md), validated once."""

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
# The tanh target counts as engaged on an element when it moves it by more than this fraction of |x|.
TANH_ENGAGED_RELATIVE_CHANGE = 0.01


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

    def target_changes(self, x: torch.Tensor) -> torch.Tensor:
        """Where the target moves the residual x noticeably (bool, x's shape): the target is engaged there.

        clip: |x| > c. tanh: |c tanh(x / c) - x| > 0.01 |x|, a change of more than 1% (|x| > 0.174 c); the
        tanh moves every nonzero x a little, so a plain != would call it always engaged. identity: never.
        """
        c = float(self.clip)
        if self.target == "clip":
            return x.abs() > c
        if self.target == "tanh":
            return (c * torch.tanh(x / c) - x).abs() > TANH_ENGAGED_RELATIVE_CHANGE * x.abs()
        return torch.zeros_like(x, dtype=torch.bool)


def check_packed_batch(batch: int, cu_seqlens: torch.Tensor | None) -> None:
    """Packed sequences (cu_seqlens, as in FLA) are one row: B = 1. Checked from the shape alone, without reading
    cu_seqlens back from the GPU."""
    if cu_seqlens is not None and batch != 1:
        raise ValueError(f"with cu_seqlens the batch size must be 1 (packed sequences); got B={batch}")
