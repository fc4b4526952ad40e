"""Optuna studies through the launch machinery: each trial is one job (a Ray task, an MLflow child run).

The study lives in a real RDB storage (SQLite at `<root>/<sweep>/optuna.db`, written by the driver only),
so a relaunch continues it. The driver asks for trials while there is capacity, feeds the intermediate
values of `search.metric` that workers report (step = tokens seen) to the pruner, and stops a pruned job
through the monitor (status cancelled, cause `pruned`). A trial interrupted by a killed launch is marked
failed and its parameters are enqueued again: the same parameters give the same job id, so the new trial
resumes from the checkpoint.
"""

from __future__ import annotations

from typing import Any

from rla_ablate.outcome import Cause, JobOutcome, Status
from rla_ablate.sweep.expand import ResolvedJob, expand
from rla_ablate.sweep.schema import SearchConfig, SearchParam

# What a pruned job's error says; whether a job was pruned is its cause (Cause.PRUNED), never this text.
PRUNED_MESSAGE = "pruned by Optuna"
INTERRUPTED = "interrupted"


def make_study(cfg: SearchConfig, name: str, storage_uri: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = (optuna.samplers.TPESampler(seed=cfg.seed) if cfg.sampler == "tpe"
               else optuna.samplers.RandomSampler(seed=cfg.seed))
    pruner = {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2),
              "hyperband": optuna.pruners.HyperbandPruner,
              "none": optuna.pruners.NopPruner}[cfg.pruner]()
    storage = optuna.storages.RDBStorage(storage_uri, engine_kwargs={"connect_args": {"timeout": 30}})
    return optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                               direction=cfg.direction, load_if_exists=True)


def suggest(trial: Any, params: dict[str, SearchParam]) -> dict[str, Any]:
    out = {}
    for key, p in params.items():
        if p.type == "float":
            out[key] = trial.suggest_float(key, p.low, p.high, log=p.log)
        elif p.type == "int":
            out[key] = trial.suggest_int(key, int(p.low), int(p.high), log=p.log)
        else:
            out[key] = trial.suggest_categorical(key, p.choices)
    return out


def _counted(study: Any) -> int:
    """Trials that used up the budget: complete, pruned, or failed for a reason other than an interrupted launch."""
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            n += 1
        elif t.state == TrialState.FAIL and not t.user_attrs.get(INTERRUPTED):
            n += 1
    return n


def pruned_count(sdir: Any) -> int:
    """Jobs of the sweep folder that the pruner stopped."""
    n = 0
    for rec in sdir.job_list():
        st = sdir.status(rec["job_id"])
        n += st.status == Status.CANCELLED and st.cause == Cause.PRUNED
    return n


def study_done(sweep: Any, sdir: Any) -> bool:
    """True when the stored study already has its trials and none was left running by a killed launch."""
    from optuna.trial import TrialState

    study = make_study(sweep.config.search, sweep.name, sdir.optuna_uri)
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
    return not running and _counted(study) >= sweep.config.search.n_trials


def run_search(runner: Any) -> None:
    """Run the sweep's study to `n_trials` (relaunch: continue it) on the runner's Ray and MLflow."""
    from optuna.trial import TrialState

    sweep, sdir = runner.sweep, runner.sdir
    cfg: SearchConfig = sweep.config.search
    study = make_study(cfg, sweep.name, sdir.optuna_uri)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        if t.state == TrialState.RUNNING:
            study._storage.set_trial_user_attr(t._trial_id, INTERRUPTED, True)
            study.tell(t.number, state=TrialState.FAIL)
            study.enqueue_trial(t.params, skip_if_exists=False)

    runner.watch = cfg.metric
    trials: dict[str, Any] = {}
    pruned: set[str] = set()
    known = {rec["job_id"]: rec for rec in sdir.job_list()}

    def on_values(job: ResolvedJob, values: list[tuple[int, float]]) -> None:
        trial = trials.get(job.job_id)
        if trial is None or job.job_id in pruned:
            return
        for step, value in values:
            trial.report(value, step)
        if trial.should_prune():
            pruned.add(job.job_id)
            runner.progress.note(f"{job.name}: {PRUNED_MESSAGE} at {values[-1][0]:,} tokens")
            runner.monitor.request_stop.remote(job.job_id)

    def tell(job: ResolvedJob, outcome: JobOutcome) -> None:
        trial = trials.pop(job.job_id, None)
        if trial is None:
            return
        status = outcome.status
        if job.job_id in pruned:
            sdir.set_status(job.job_id, status=Status.CANCELLED, cause=Cause.PRUNED,
                            error=f"{PRUNED_MESSAGE} (trial {trial.number})")
            runner.summary.pruned += 1
            study.tell(trial, state=TrialState.PRUNED)
        elif status == Status.FINISHED and cfg.metric in outcome.metrics:
            study.tell(trial, float(outcome.metrics[cfg.metric]))
        elif status == Status.CANCELLED:
            study._storage.set_trial_user_attr(trial._trial_id, INTERRUPTED, True)
            study.tell(trial, state=TrialState.FAIL)
            study.enqueue_trial(trial.params, skip_if_exists=False)
        else:
            if status == Status.FINISHED:
                sdir.set_status(job.job_id, error=f"finished without logging {cfg.metric}; check search.metric")
            study.tell(trial, state=TrialState.FAIL)

    runner.on_values, runner.on_done = on_values, tell
    while True:
        try:
            if not _search_round(runner, study, cfg, trials, known, sweep, sdir):
                break
        except KeyboardInterrupt:
            runner.interrupted()
    best = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if best:
        runner.progress.note(f"best trial {study.best_trial.number}: {cfg.metric} = {study.best_value:.4f} "
                             f"with {study.best_trial.params}")


def _search_round(runner: Any, study: Any, cfg: SearchConfig, trials: dict, known: dict, sweep: Any,
                  sdir: Any) -> bool:
    """Ask for trials while there is room, then wait a little for outcomes; False once nothing is left to do."""
    from optuna.trial import TrialState

    while (not runner.stopping and runner.capacity > 0
           and _counted(study) + len(trials) < cfg.n_trials):
        trial = study.ask()
        params = suggest(trial, cfg.params)
        job = expand(sweep.config, sweep.source, points=[params])[0]
        job.name = f"trial-{trial.number:03d}"
        trial.set_user_attr("job_id", job.job_id)
        if job.job_id not in known:
            rec = job.describe()
            rec["tokens_target"] = int(job.job.train.tokens)
            rec["trial"] = trial.number
            known[job.job_id] = rec
            sdir.write_job_list(list(known.values()))
            sdir.job_dir(job.job_id).mkdir(parents=True, exist_ok=True)
            (sdir.job_dir(job.job_id) / "job.json").write_text(job.job.model_dump_json(indent=1))
        runner.all_jobs.append(job)
        st = sdir.status(job.job_id)
        # The sampler proposed parameters that already ran: reuse the result instead of training again.
        if st.status == Status.FINISHED and job.job_id in _values(sdir, job.job_id, cfg.metric):
            study.tell(trial, _values(sdir, job.job_id, cfg.metric)[job.job_id])
            continue
        if st.status == Status.CANCELLED and st.cause == Cause.PRUNED:
            runner.summary.pruned += 1
            study.tell(trial, state=TrialState.PRUNED)
            continue
        if job.job_id in trials:
            trial.set_user_attr("duplicate_of", trials[job.job_id].number)
            study.tell(trial, state=TrialState.FAIL)
            continue
        trials[job.job_id] = trial
        runner.progress.update(job, Status.PENDING, st.tokens_done)
        runner.submit(job)
    if not runner.inflight:
        return False
    for job, _outcome, retry in runner.step():
        if retry:
            runner.submit(job)
    return True


def _values(sdir: Any, job_id: str, metric: str) -> dict[str, float]:
    """The final value of `metric` of a finished job, read from its metrics.jsonl (ground truth)."""
    from rla_ablate.train.loggers import metric_series, read_jsonl

    series = metric_series(read_jsonl(sdir.job_dir(job_id) / "metrics.jsonl"), metric)
    return {job_id: series[-1][1]} if series else {}
