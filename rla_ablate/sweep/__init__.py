"""Sweeps: a YAML file expanded into fully resolved, hashed jobs, planned, launched on Ray, tracked in MLflow.

    from rla_ablate.sweep import load_sweep, plan, launch, LaunchOptions, SweepDir, sweep_status
    sweep = load_sweep("sweeps/smoke.yaml")              # validate + expand; UserError names file:line: key
    plan(sweep)                                           # {"jobs": [...], "totals": {...}}
    summary = launch("sweeps/smoke.yaml", LaunchOptions(root=Path("rla-runs")))
    sweep_status(SweepDir("rla-runs", "smoke"))           # the `status --json` document

See docs/SWEEPS.md.
"""

from rla_ablate.sweep.expand import ResolvedJob, Sweep, load_sweep
from rla_ablate.sweep.launch import LaunchOptions, LaunchSummary, launch, launch_sweep
from rla_ablate.sweep.plan import plan
from rla_ablate.sweep.schema import SweepConfig
from rla_ablate.sweep.state import SweepDir
from rla_ablate.sweep.status import sweep_status

__all__ = ["LaunchOptions", "LaunchSummary", "ResolvedJob", "Sweep", "SweepConfig", "SweepDir", "launch",
           "launch_sweep", "load_sweep", "plan", "sweep_status"]
