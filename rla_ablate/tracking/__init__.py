"""MLflow tracking: the local server, the job's logger, and reading runs back for dashboards.

    with TrackingServer("rla-runs/smoke/mlflow") as server:
        parent = server.ensure_parent_run("smoke")
        run_id = server.create_or_get_child_run("smoke", job_id, tags={...}, config=resolved_config)
        logger = MLflowLogger(server.uri, run_id)      # the job's MetricLogger
"""

import os

# MLflow prints "View run NAME at: URL" for every run it ends: one line per job in a launch's output, whose own
# lines already say where the runs are (`status` lists each with its run). A user's own setting wins.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

from rla_ablate.tracking.logger import MLflowLogger, system_metrics  # noqa: E402
from rla_ablate.tracking.runs import (  # noqa: E402
    RUN_STATUS, ablations_tag, create_or_get_child_run, ensure_experiment, ensure_parent_run, experiment_name, flatten,
    git_commit)
from rla_ablate.tracking.server import TrackingServer, is_healthy  # noqa: E402
from rla_ablate.tracking.sync import sync_from_jsonl  # noqa: E402

__all__ = ["TrackingServer", "MLflowLogger", "RUN_STATUS", "ablations_tag", "create_or_get_child_run",
           "ensure_experiment", "ensure_parent_run", "experiment_name", "flatten", "git_commit", "is_healthy",
           "sync_from_jsonl", "system_metrics"]
