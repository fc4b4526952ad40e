"""Paper-style dashboards from tracked runs: figure specs (`dashboards/*.yaml`), seed statistics, rendering, HTML.

    dash = build_dashboard("smoke", root="rla-runs")     # PNG + SVG per spec, index.html, logged to MLflow

The names below are imported on first use (`rla_ablate.lazy`): `rla-sweep results` reads runs without the
plotting modules.
"""

# ruff: noqa: F401
from typing import TYPE_CHECKING

from rla_ablate.lazy import exports

if TYPE_CHECKING:  # the names for type checkers (listed in __all__ through _WHERE)
    from rla_ablate.dashboard.build import Dashboard, build_dashboard
    from rla_ablate.dashboard.spec import FigureSpec, load_spec, load_specs
    from rla_ablate.dashboard.stats import PairedDiff, Summary, mean_ci, paired_diff

_WHERE = {"Dashboard": "build", "build_dashboard": "build", "FigureSpec": "spec", "load_spec": "spec",
          "load_specs": "spec", "PairedDiff": "stats", "Summary": "stats", "mean_ci": "stats", "paired_diff": "stats"}
__all__ = sorted(_WHERE)
__getattr__ = exports(__name__, _WHERE)
