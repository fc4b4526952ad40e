"""Downstream accuracy: a job's checkpoint scored on lm-evaluation-harness tasks, and the HF export.

    from rla_ablate.evals import EvalRequest, score_job
    result = score_job("rla-runs/smoke/jobs/<id>", EvalRequest(tasks=["rla_choice"]))   # EvalResult

The shipped offline tasks live in `rla_ablate/evals/tasks/` (always on the include path).
"""

from rla_ablate.evals.core import TASKS_DIR, EvalRequest, EvalResult, score_job

__all__ = ["TASKS_DIR", "EvalRequest", "EvalResult", "score_job"]
