"""Sweeps: a YAML file expanded into fully resolved, hashed jobs, planned, launched on Ray, tracked in MLflow.

    from rla_ablate.sweep import load_sweep, LaunchOptions, SweepDir, sweep_status
    from rla_ablate.sweep.launch import launch
    from rla_ablate.sweep.plan import plan
    sweep = load_sweep("sweeps/smoke.yaml")              # validate + expand; UserError names file:line: key
    plan(sweep)                                           # {"jobs": [...], "totals": {...}}
    summary = launch("sweeps/smoke.yaml", LaunchOptions(root=Path("rla-runs")))
    sweep_status(SweepDir("rla-runs", "smoke"))           # the `status --json` document

`launch` and `plan` are functions of the modules of those names. The names below are imported on first use
(`rla_ablate.lazy`). See docs/SWEEPS.md.
"""

# ruff: noqa: F401
from typing import TYPE_CHECKING

from rla_ablate.lazy import exports

if TYPE_CHECKING:  # the names for type checkers (listed in __all__ through _WHERE)
    from rla_ablate.sweep.expand import ResolvedJob, Sweep, load_sweep
    from rla_ablate.sweep.launch import LaunchOptions, LaunchSummary, launch_sweep
    from rla_ablate.sweep.schema import SweepConfig
    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.status import sweep_status

_WHERE = {"ResolvedJob": "expand", "Sweep": "expand", "load_sweep": "expand", "LaunchOptions": "launch",
          "LaunchSummary": "launch", "launch_sweep": "launch", "SweepConfig": "schema", "SweepDir": "state",
          "sweep_status": "status"}
__all__ = sorted(_WHERE)
__getattr__ = exports(__name__, _WHERE)
