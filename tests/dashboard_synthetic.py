"""A synthetic sweep logged through the real tracking stack, with known effects, for dashboard tests.

Curves follow L(t) = floor + a·exp(-t / tau) + seed noise; each ablation shifts the floor by a known
amount, so a rendered figure or table can be checked against numbers computed here.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rla_ablate.tracking import MLflowLogger, create_or_get_child_run, ensure_parent_run

SEEDS = (0, 1, 2)
TOKENS = [i * 4096 for i in range(1, 25)]
EVAL_EVERY = 4
LAYERS = 4
# family -> {ablation: effect on the final loss floor}
ARMS = {
    "rla": {"none": 0.0, "tied_gamma": 0.030, "no_fitting": 0.050, "no_output_gates": 0.020, "no_clip_no_norm": 0.080},
    "rdn": {"none": -0.02, "tied_gamma": 0.025, "no_fitting": 0.045, "no_output_gates": 0.015, "no_clip": 0.060},
    "sgla": {"none": 0.12, "matched_state": 0.09},
    "gdn": {"none": 0.08, "matched_state": 0.06},
}
STATE = {"rla": 32768, "rdn": 32768, "sgla": 16384, "gdn": 16384}
PARAMS = {"rla": 1_210_000, "rdn": 1_230_000, "sgla": 1_180_000, "gdn": 1_200_000}
# Left unfinished on purpose: one job still running, one failed.
RUNNING = ("rdn", "tied_gamma", 2)
FAILED = ("rla", "no_fitting", 2)
# Recall sets gain more from the independent gate than plain LM loss (what Fig. 3b shows in the paper).
RECALL_GAIN = 2.0


def floor(family: str, ablation: str, seed: int) -> float:
    return 3.0 + ARMS[family][ablation] + 0.01 * (seed - 1)


def eval_loss(family: str, ablation: str, seed: int, eval_set: str, tokens: int) -> float:
    scale = RECALL_GAIN if eval_set == "mqar" else 1.0
    base = 3.0 + scale * ARMS[family][ablation] + 0.01 * (seed - 1) + (0.4 if eval_set == "mqar" else 0.0)
    return base + 1.5 * math.exp(-tokens / 30000)


def layer_norm(family: str, ablation: str, layer: int, seed: int) -> float:
    growth = 1.6 if ablation in ("no_clip", "no_clip_no_norm") else 1.05
    return (1.0 + 0.02 * seed) * growth ** layer


def log_sweep(tracking_uri: str, sweep: str) -> dict[tuple, str]:
    """Log every arm x seed; returns (family, ablation, seed) -> run id."""
    parent = ensure_parent_run(tracking_uri, sweep)
    runs = {}
    rng = np.random.default_rng(42)
    for family, arms in ARMS.items():
        for ablation in arms:
            for seed in SEEDS:
                job_id = f"{family}-{ablation}-{seed}"
                state = STATE[family] * (2 if ablation == "matched_state" else 1)
                params = {"accounting.state_elements_per_layer": state,
                          "accounting.params": PARAMS[family] + (60_000 if ablation == "matched_state" else 0)}
                run_id = create_or_get_child_run(tracking_uri, sweep, job_id, params=params, tags={
                    "family": family, "ablations": [] if ablation == "none" else [ablation], "seed": seed})
                runs[(family, ablation, seed)] = run_id
                logger = MLflowLogger(tracking_uri, run_id, flush_interval_s=0.2, system_metrics_interval_s=None)
                stop = len(TOKENS) // 2 if (family, ablation, seed) in (RUNNING, FAILED) else len(TOKENS)
                for i, tokens in enumerate(TOKENS[:stop]):
                    loss = floor(family, ablation, seed) + 1.5 * math.exp(-tokens / 30000) + rng.normal(0, 0.02)
                    metrics = {"train/loss": loss, "lr": 3e-4, "grad_norm": 0.5 + 0.1 * rng.random()}
                    if (i + 1) % EVAL_EVERY == 0:
                        for eval_set in ("val", "mqar"):
                            value = eval_loss(family, ablation, seed, eval_set, tokens)
                            metrics[f"eval/{eval_set}/loss"] = value
                            metrics[f"eval/{eval_set}/ppl"] = math.exp(value)
                        for layer in range(LAYERS):
                            metrics[f"layer_{layer:02d}/attn_out_norm"] = layer_norm(family, ablation, layer, seed) * (
                                0.5 + 0.5 * tokens / TOKENS[-1])
                    logger.log(metrics, step=tokens)
                if (family, ablation, seed) == RUNNING:
                    assert logger.flush(timeout=60)
                    logger._stop.set()
                else:
                    logger.close("failed" if (family, ablation, seed) == FAILED else "finished",
                                 "RuntimeError: synthetic" if (family, ablation, seed) == FAILED else None)
    runs["parent"] = parent
    return runs


# A real sweep expansion logged with synthetic metrics, tagged exactly as `launch` tags its runs, and its sweep
# folder written as `launch` writes it: for tests of series identity, stale runs, validity and verdicts
# without training anything.
LAST = 4096
STEPS = (1024, 2048, LAST)
REPO_SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


def write_sweep_folder(root, sweep, tracking_uri: str):
    """ROOT/NAME as a launch of `sweep` leaves it: sweep.json, jobs.json (the current expansion), job.json."""
    from rla_ablate.sweep.sources import job_record
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(root, sweep.name)
    sdir.path.mkdir(parents=True, exist_ok=True)
    sdir.write_meta(tracking_uri=tracking_uri, backend_uri=tracking_uri, embedded_tracking=False)
    sdir.write_job_list([job_record(j) for j in sweep.jobs])
    for job in sweep.jobs:
        sdir.job_dir(job.job_id).mkdir(parents=True, exist_ok=True)
        path = sdir.job_dir(job.job_id) / "job.json"
        if not path.exists():
            path.write_text(job.job.model_dump_json(indent=1))
    return sdir


def launch_tags(job) -> dict:
    """The tags `rla_ablate.sweep.launch` gives a job's run."""
    tags = {"family": job.family, "ablations": list(job.ablations), "seed": job.seed, "name": job.name,
            **job.identity_tags()}
    if job.control_of:
        tags["control_of"] = job.control_of
    return tags


def log_jobs(tracking_uri: str, sweep_name: str, jobs, final, diag=None, status=None) -> dict[str, str]:
    """Log each job's run: eval/val/loss and train/loss descending to `final(job)` at LAST tokens, and the
    diagnostics `diag(job)` (a dict of diag/* values, or None for none) at every eval point.
    `status(job)` gives the MLflow end status (default FINISHED), or DIVERGED: a FAILED run tagged as the divergence
    guard's end tags it. Returns job id -> run id."""
    import contextlib
    import io
    import time

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    out = {}
    for job in jobs:
        run_id = create_or_get_child_run(tracking_uri, sweep_name, job.job_id, tags=launch_tags(job),
                                         config=job.job.model_dump(mode="json"))
        end = (status or (lambda j: "FINISHED"))(job)
        steps = STEPS if end == "FINISHED" else STEPS[:1]
        now = int(time.time() * 1000)
        metrics = []
        for step in steps:
            loss = final(job) + 0.5 * (LAST - step) / LAST
            values = {"eval/val/loss": loss, "eval/val/ppl": math.exp(loss), "train/loss": loss + 0.01}
            values.update((diag(job) or {}) if diag is not None else {})
            metrics += [Metric(k, float(v), now, step) for k, v in values.items()]
        client.log_batch(run_id, metrics=metrics)
        if end == "DIVERGED":
            client.set_tag(run_id, "rla.status", "diverged")
            end = "FAILED"
        with contextlib.redirect_stdout(io.StringIO()):     # set_terminated prints a "View run" link
            client.set_terminated(run_id, status=end)
        out[job.job_id] = run_id
    return out


def sweep_file(tmp_path, text: str, name: str = "sweep.yaml"):
    import textwrap

    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path
