"""Settings the project reads from the environment (no torch here: the CLI checks them before anything starts).

RLA_GLUE   auto (default) | torch: the glue of every model a process builds (rla_ablate.models.fusion). A launch
           forwards it to its jobs' workers, and each run records the glue it ran (tag `glue`).
"""

from __future__ import annotations

import os

from rla_ablate.errors import UserError

GLUE_ENV = "RLA_GLUE"
GLUE_MODES = ("auto", "torch")
# What a launch forwards to a remote cluster's workers besides RLA_SWEEP_* (local workers inherit the environment).
FORWARDED = (GLUE_ENV,)


def glue_mode() -> str:
    """The glue mode RLA_GLUE asks for ("auto" when unset); a UserError naming the variable for another value."""
    mode = os.environ.get(GLUE_ENV, "auto").strip() or "auto"
    if mode not in GLUE_MODES:
        raise UserError(f"{mode!r} is not a glue mode; allowed: {', '.join(GLUE_MODES)}", key=GLUE_ENV)
    return mode


def check() -> None:
    """Refuse a bad setting before a command does anything."""
    glue_mode()
