"""The divergence guard: skip steps whose loss or gradient is not finite, fail past a limit, flag spikes.

Its whole state is a few numbers, saved in every checkpoint so a resumed run flags exactly what the
uninterrupted run would have flagged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# Running loss statistics: EMA decay and how many steps to see before spikes are judged.
SPIKE_EMA_DECAY = 0.99
SPIKE_MIN_STEPS = 20


@dataclass
class GuardVerdict:
    skip: bool
    """Do not apply this step's update."""
    diverged: bool
    """Too many skipped steps: the job must stop."""
    spike: dict | None
    """Detail of a loss spike (loss, running mean, std, z-score), or None."""


@dataclass
class DivergenceGuard:
    max_skipped_steps: int
    spike_zscore: float | None
    skipped: int = 0
    seen: int = 0
    mean: float = 0.0
    var: float = 0.0

    def check(self, loss: float, grad_norm: float) -> GuardVerdict:
        """Judge one optimizer step from its mean loss and (pre-clipping) gradient norm."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.skipped += 1
            return GuardVerdict(skip=True, diverged=self.skipped > self.max_skipped_steps, spike=None)
        spike = None
        if self.spike_zscore is not None and self.seen >= SPIKE_MIN_STEPS:
            std = math.sqrt(self.var)
            z = (loss - self.mean) / std if std > 0 else 0.0
            if z > self.spike_zscore:
                spike = {"loss": loss, "mean": self.mean, "std": std, "zscore": z}
        self._update(loss)
        return GuardVerdict(skip=False, diverged=False, spike=spike)

    def _update(self, loss: float) -> None:
        if self.seen == 0:
            self.mean, self.var = loss, 0.0
        else:
            delta = loss - self.mean
            self.mean += (1 - SPIKE_EMA_DECAY) * delta
            self.var = SPIKE_EMA_DECAY * (self.var + (1 - SPIKE_EMA_DECAY) * delta * delta)
        self.seen += 1

    def state_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k in ("skipped", "seen", "mean", "var")}

    def load_state_dict(self, state: dict) -> None:
        self.skipped, self.seen = int(state["skipped"]), int(state["seen"])
        self.mean, self.var = float(state["mean"]), float(state["var"])
