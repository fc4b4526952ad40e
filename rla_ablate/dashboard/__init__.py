"""Paper-style dashboards from tracked runs: figure specs (`dashboards/*.yaml`), seed statistics, rendering, HTML.

    dash = build_dashboard("smoke", root="rla-runs")     # PNG + SVG per spec, index.html, logged to MLflow
"""

from rla_ablate.dashboard.build import Dashboard, build_dashboard
from rla_ablate.dashboard.spec import FigureSpec, load_spec, load_specs
from rla_ablate.dashboard.stats import PairedDiff, Summary, mean_ci, paired_diff

__all__ = ["Dashboard", "build_dashboard", "FigureSpec", "load_spec", "load_specs", "PairedDiff", "Summary",
           "mean_ci", "paired_diff"]
