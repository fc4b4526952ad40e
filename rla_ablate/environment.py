"""Settings the project reads from the environment (no torch here: the CLI checks them before anything starts).

RLA_GLUE   auto (default) | torch: the glue of every model a process builds (rla_ablate.models.fusion). A launch
           forwards it to its jobs' workers, and each run records the glue it ran (tag `glue`).
RLA_ROOT   the default of every command's --root (the folder a launch writes its sweeps to): ./rla-runs when unset.
"""

from __future__ import annotations

import os

from rla_ablate.errors import UserError

GLUE_ENV = "RLA_GLUE"
GLUE_MODES = ("auto", "torch")
# What a launch forwards to a remote cluster's workers besides RLA_SWEEP_* (local workers inherit the environment).
FORWARDED = (GLUE_ENV,)


ROOT_ENV = "RLA_ROOT"


def default_root() -> str:
    """The folder --root names when it is not given: RLA_ROOT, else ./rla-runs."""
    return os.environ.get(ROOT_ENV, "").strip() or "rla-runs"


def add_root_option(parser, help: str = "the launch's --root") -> None:
    """A command's --root, whose default is RLA_ROOT (else ./rla-runs), said in its help."""
    where = f"${ROOT_ENV}, now {os.environ[ROOT_ENV]}" if os.environ.get(ROOT_ENV, "").strip() else \
        f"${ROOT_ENV}, else ./rla-runs"
    parser.add_argument("--root", default=default_root(), help=f"{help} (default: {where})")


def glue_mode() -> str:
    """The glue mode RLA_GLUE asks for ("auto" when unset); a UserError naming the variable for another value."""
    mode = os.environ.get(GLUE_ENV, "auto").strip() or "auto"
    if mode not in GLUE_MODES:
        raise UserError(f"{mode!r} is not a glue mode; allowed: {', '.join(GLUE_MODES)}", key=GLUE_ENV)
    return mode


def check() -> None:
    """Refuse a bad setting before a command does anything."""
    glue_mode()
