"""Optuna studies through the launch machinery: each trial is one job (a Ray task, an MLflow child run).

The study lives in a real RDB storage (SQLite at `<root>/<sweep>/optuna.db`, written by the driver only),
so a relaunch continues it. `OptunaSource` is the launch's job source (`rla_ablate.sweep.sources.JobSource`)
for a `search:` sweep: the runner asks it for trials while there is capacity and relays the intermediate values
of `search.metric` that workers report (step = tokens seen), which it feeds to the pruner; a pruned job is
stopped through the monitor (status cancelled, cause `pruned`). A trial interrupted by a killed launch is marked
failed and its parameters are enqueued again: the same parameters give the same job id, so the new trial
resumes from the checkpoint. Only Optuna's public API is used (the study, live trials, the storage's methods).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

from rla_ablate.errors import UserError
from rla_ablate.outcome import Cause, JobOutcome, Status
from rla_ablate.sweep.expand import ResolvedJob, expand
from rla_ablate.sweep.schema import SearchConfig, SearchParam

# What a pruned job's error says; whether a job was pruned is its cause (Cause.PRUNED), never this text.
PRUNED_MESSAGE = "pruned by Optuna"
INTERRUPTED = "interrupted"
INVALID = "invalid"  # a trial's user attribute: why its parameters build no valid job


def _storage(uri: str) -> Any:
    import optuna

    return optuna.storages.RDBStorage(uri, engine_kwargs={"connect_args": {"timeout": 30}})


def make_study(cfg: SearchConfig, name: str, storage: Any):
    """Create or load the study `name`; `storage` is a database URI or an optuna storage."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner: optuna.pruners.BasePruner
    if cfg.pruner == "median":
        pruner = optuna.pruners.MedianPruner(n_startup_trials=2)
    elif cfg.pruner == "hyperband":
        pruner = optuna.pruners.HyperbandPruner()
    else:
        pruner = optuna.pruners.NopPruner()
    if isinstance(storage, str):
        storage = _storage(storage)
    study = optuna.create_study(study_name=name, storage=storage, pruner=pruner, direction=cfg.direction,
                                load_if_exists=True)
    # The sampler's seed counts the trials the study already holds: a new study draws from `seed` (reproducible),
    # a continued one (a relaunch, a larger n_trials) from a stream of its own. With `seed` alone a continuation
    # drew the first trials' parameters again, whose jobs were done: it ran nothing new and counted them as trials.
    seed = (cfg.seed + len(study.get_trials(deepcopy=False))) % 2**32  # numpy's seeds are 0 .. 2**32 - 1
    study.sampler = (optuna.samplers.TPESampler(seed=seed) if cfg.sampler == "tpe"
                     else optuna.samplers.RandomSampler(seed=seed))
    return study


# The study's user attribute that records the question it answers (`check_study`).
QUESTION = "rla.question"


def _question(sweep: Any) -> dict[str, Any]:
    """What a study's trials must share to be compared: the metric, its direction, the search space and the job
    they all start from (`_base_job`)."""
    cfg = sweep.config.search
    return {"metric": cfg.metric, "direction": cfg.direction,
            "params": {k: _recorded(p) for k, p in cfg.params.items()}, "base": _base_job(sweep)}


def _recorded(p: SearchParam) -> dict[str, Any]:
    """A parameter as its study records it: `step` only where set, so that the studies recorded before it existed
    answer the same question as before."""
    out = p.model_dump(mode="json")
    if out.get("step") is None:
        out.pop("step", None)
    return out


def _base_job(sweep: Any) -> dict[str, str]:
    """The resolved job of a trial with every searched parameter at a fixed value (its first choice, or low), as
    flat dotted keys: what every trial of the study shares (tokens, schedule, evaluation, model), so that a trial
    trained on another budget is not ranked, or pruned, among the others."""
    from rla_ablate.sweep.expand import expand
    from rla_ablate.tracking.runs import flatten

    fixed = {k: p.choices[0] if p.type == "categorical" else p.low if p.type == "float" else int(p.low)
             for k, p in sweep.config.search.params.items()}
    job = expand(sweep.config, sweep.source, points=[fixed])[0]
    return _shared(flatten(job.job.model_dump(mode="json")), skip=set(fixed))


def _shared(base: dict[str, Any], skip: Collection[str] = ()) -> dict[str, Any]:
    """The keys of a base job its trials must share: all but `skip` and the bookkeeping that changes how a job is
    stored or observed, not what it computes (checkpoint and log intervals, graphs: `BOOKKEEPING_FIELDS`), except
    the evaluation interval, which sets the steps the pruner compares trials at."""
    from rla_ablate.train.job import BOOKKEEPING_FIELDS

    free = {f"train.{f}" for f in BOOKKEEPING_FIELDS - {"eval_every_tokens"}}
    return {k: v for k, v in base.items() if k not in skip and k not in free}


def value_text(value: Any) -> str:
    """A parameter's value as the search's texts show it: floats to 6 significant digits."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def space_text(params: dict[str, dict]) -> str:
    """A search space in a line: train.lr from 0.0001 to 0.01 (log), model.target in [clip, tanh]."""
    parts = []
    for key, p in params.items():
        if p["type"] == "categorical":
            parts.append(f"{key} in [{', '.join(map(str, p['choices']))}]")
        else:
            parts.append(f"{key} from {value_text(p['low'])} to {value_text(p['high'])}"
                         f"{' (log)' if p.get('log') else ''}{' (int)' if p['type'] == 'int' else ''}"
                         f"{' in steps of ' + str(p['step']) if p.get('step') else ''}")
    return ", ".join(parts)


def params_text(params: dict[str, Any]) -> str:
    """A trial's parameters in a line: train.lr=0.00927766, model.target=tanh (`value_text`)."""
    return ", ".join(f"{k}={value_text(v)}" for k, v in params.items())


def _spelled(value: Any) -> str:
    """A search parameter as a sweep file writes it: {type: int, low: 4, high: 8, log: true} (YAML's spellings;
    whole-number bounds of an int range without '.0', unset and false options left out)."""
    if isinstance(value, dict):
        whole = value.get("type") == "int"
        return "{" + ", ".join(f"{k}: {_yaml_scalar(v, whole)}" for k, v in value.items()
                               if v not in (None, False)) + "}"
    return _yaml_scalar(value, False)


def _yaml_scalar(value: Any, whole: bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and whole and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_scalar(v, whole) for v in value) + "]"
    return value_text(value) if isinstance(value, float) else str(value)


def check_study(study: Any, sweep: Any, sdir: Any) -> None:
    """Refuse to continue a study with another metric, direction, search space or base job than it was made with:
    Optuna loads an existing study as it was (its direction included) and would rank the new trials' values among
    the old ones (an accuracy among losses, or a loss after another token budget), prune them against trials of
    another schedule, draw from the old space's history, and report a best trial the file no longer asks for. A
    study made before this record gets it now; n_trials, sampler, pruner and seed may change (a continued study)."""
    from rla_ablate.sweep.expand import _err

    want, have = _question(sweep), study.user_attrs.get(QUESTION)
    if have is None or "base" not in have:  # a study made before this record (or before it held the base job)
        study.set_user_attr(QUESTION, want if have is None else {**have, "base": want["base"]})
        have = study.user_attrs.get(QUESTION)
    have = {**have, "base": _shared(have["base"])}  # a record that still holds the bookkeeping keys
    if have == want:
        return
    changed = [k for k in ("metric", "direction") if have.get(k) != want[k]]
    path: tuple = ("search", changed[0]) if changed else ("search", "params")
    if changed:
        what = (" and ".join(f"search.{k} {have.get(k)!r}" for k in changed) + "; this file asks for "
                + " and ".join(repr(want[k]) for k in changed))
    elif have.get("params") == want["params"]:
        old, new = have["base"], want["base"]
        key = next(k for k in sorted({*new, *old}) if old.get(k) != new.get(k))
        parts = tuple(int(x) if x.isdigit() else x for x in key.split("."))
        path = ("models", 0, "overrides", *parts[1:]) if parts[0] == "model" else ("base", *parts)
        what = (f"every trial at {key}={old.get(key, '(unset)')}; this file asks for {new.get(key, '(unset)')} "
                "(a budget, schedule or model its trials would not share)")
    else:
        old, new = have.get("params", {}), want["params"]
        key = next(k for k in [*new, *old] if old.get(k) != new.get(k))
        if key in new:
            path = ("search", "params", key)
        what = (f"search.params.{key} {_spelled(old[key]) if key in old else '(not searched)'}; this file asks for "
                f"{_spelled(new[key]) if key in new else '(not searched)'}")
    raise _err(sweep.source, path,
               f"the study in {sdir.optuna_path} ({len(study.trials)} trials) was made with {what}. Its trials "
               "would be ranked with the new ones as if they answered the same question. Give the sweep its own "
               "`name:` for a new study, or set it back to continue this one")


def suggest(trial: Any, params: dict[str, SearchParam]) -> dict[str, Any]:
    out = {}
    for key, p in params.items():
        if p.type == "categorical":
            out[key] = trial.suggest_categorical(key, p.choices)
            continue
        assert p.low is not None and p.high is not None  # SearchParam requires both for float and int
        if p.type == "float":
            out[key] = trial.suggest_float(key, p.low, p.high, log=p.log)
        else:
            out[key] = trial.suggest_int(key, int(p.low), int(p.high), step=p.step or 1, log=p.log)
    return out


def counted(study: Any) -> int:
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


def load_study(sdir: Any):
    """The sweep's stored Optuna study, read as it is (`make_study` creates one), or None for a sweep without one
    (a grid sweep, a search not launched yet)."""
    if not sdir.optuna_path.is_file():
        return None
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=sdir.name, storage=sdir.optuna_uri)
    except KeyError:  # the database holds no study of this name (yet)
        return None


def trials_of_jobs(sdir: Any) -> dict[str, tuple[int, float | None]]:
    """job id -> (the Optuna trial that last ran it, its value if complete) for a search sweep's jobs; {} for a grid
    sweep or a search not launched yet. A job run again after an interrupted launch keeps the later trial (the
    interrupted one is told failed)."""
    study = load_study(sdir)
    if study is None:
        return {}
    from optuna.trial import TrialState

    out: dict[str, tuple[int, float | None]] = {}
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        job_id = t.user_attrs.get("job_id")
        if job_id:  # a pruned trial's value is its last report, not the metric it would have finished with
            out[job_id] = (t.number, t.value if t.state == TrialState.COMPLETE else None)
    return out


def study_done(sweep: Any, sdir: Any) -> bool:
    """True when the stored study already has its trials and none was left running by a killed launch."""
    from optuna.trial import TrialState

    study = make_study(sweep.config.search, sweep.name, sdir.optuna_uri)
    check_study(study, sweep, sdir)
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
    return not running and counted(study) >= sweep.config.search.n_trials


class OptunaSource:
    """The trials of the sweep's study (`JobSource`): one job per trial, asked for while there is room, until
    `n_trials` have run (a relaunch continues the study)."""

    ahead = 1

    def __init__(self, sweep: Any, sdir: Any):
        self.sweep, self.sdir = sweep, sdir
        self.cfg: SearchConfig = sweep.config.search
        self.watch: str | None = self.cfg.metric
        self.jobs: list[ResolvedJob] = []
        self.study: Any = None
        self.runner: Any = None
        # job_id -> the live optuna Trial of a job in flight; the jobs the pruner stopped
        self.trials: dict[str, Any] = {}
        self.pruned: set[str] = set()
        self.known: dict[str, dict] = {}
        # job_id -> the steps its live trial has been told (a resumed job logs again what its checkpoint preceded)
        self.reported: dict[str, set[int]] = {}

    def data_jobs(self) -> list[ResolvedJob]:
        """The sweep's expansion: a trial changes search parameters, not which data a job reads."""
        return list(self.sweep.jobs)

    def check(self) -> None:
        """A stored study must answer this file's question (`check_study`), checked before the launch saves the
        file: a refused relaunch (a widened range) leaves the saved file, and so `resume`, as they were."""
        if self.sdir.optuna_path.exists():
            check_study(make_study(self.cfg, self.sweep.name, self.sdir.optuna_uri), self.sweep, self.sdir)

    def prepare(self) -> None:
        """Trials are listed in jobs.json as they are asked for."""

    def nothing_to_do(self, summary: Any) -> bool:
        from rla_ablate.sweep.sources import count_statuses

        if not self.sdir.optuna_path.exists() or not study_done(self.sweep, self.sdir):
            return False
        summary.counts = count_statuses(self.sdir, (r["job_id"] for r in self.sdir.job_list()))
        summary.pruned = pruned_count(self.sdir)
        return True

    def start(self, runner: Any) -> None:
        """Open the study; a trial left running by a killed launch is marked interrupted (it does not count), failed,
        and its parameters enqueued again: the same parameters give the same job, which resumes."""
        from optuna.trial import TrialState

        self.runner = runner
        storage = _storage(self.sdir.optuna_uri)
        self.study = make_study(self.cfg, self.sweep.name, storage)
        check_study(self.study, self.sweep, self.sdir)
        study_id = storage.get_study_id_from_name(self.sweep.name)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            storage.set_trial_user_attr(storage.get_trial_id_from_study_id_trial_number(study_id, t.number),
                                        INTERRUPTED, True)
            self.study.tell(t.number, state=TrialState.FAIL)
            self.study.enqueue_trial(t.params, skip_if_exists=False)
        self.known = {rec["job_id"]: rec for rec in self.sdir.job_list()}

    def next_jobs(self, capacity: int) -> Iterator[ResolvedJob]:
        from optuna.trial import TrialState

        study, cfg, sdir = self.study, self.cfg, self.sdir
        while capacity > 0 and counted(study) + len(self.trials) < cfg.n_trials:
            trial = study.ask()
            params = suggest(trial, cfg.params)
            try:
                job = expand(self.sweep.config, self.sweep.source, points=[params])[0]
            except UserError as exc:
                # parameters that build no valid job (`check_search` checks what it can before a launch): the
                # trial fails and counts, and the search goes on; the launch never stops on one draw, and a resume
                # never asks for these parameters again (only an interrupted trial's are enqueued again)
                trial.set_user_attr(INVALID, exc.message)
                study.tell(trial, state=TrialState.FAIL)
                self.runner.summary.invalid += 1
                self.runner.progress.note(f"trial {trial.number}: {params_text(params)} makes no valid job "
                                          f"({exc.message}); it counts as failed and the search goes on")
                continue
            # a job is named after the first trial that ran it: parameters enqueued again after an interrupted
            # launch (or proposed again by the sampler) give the same job, which keeps its name everywhere
            job.name = self.known[job.job_id]["name"] if job.job_id in self.known else f"trial-{trial.number:03d}"
            trial.set_user_attr("job_id", job.job_id)
            if job.job_id not in self.known:
                rec = job.describe()
                rec["tokens_target"] = job.tokens_target
                rec["trial"] = trial.number
                self.known[job.job_id] = rec
                sdir.write_job_list(list(self.known.values()))
                sdir.job_dir(job.job_id).mkdir(parents=True, exist_ok=True)
                (sdir.job_dir(job.job_id) / "job.json").write_text(job.job.model_dump_json(indent=1))
            self.jobs.append(job)
            st = sdir.status(job.job_id)
            # The sampler proposed parameters that already ran: reuse the result instead of training again.
            if st.status == Status.FINISHED and job.job_id in _values(sdir, job.job_id, cfg.metric):
                study.tell(trial, _values(sdir, job.job_id, cfg.metric)[job.job_id])
                continue
            if st.status == Status.CANCELLED and st.cause == Cause.PRUNED:
                self.runner.summary.pruned += 1
                study.tell(trial, state=TrialState.PRUNED)
                continue
            if job.job_id in self.trials:
                trial.set_user_attr("duplicate_of", self.trials[job.job_id].number)
                study.tell(trial, state=TrialState.FAIL)
                continue
            self.trials[job.job_id] = trial
            self._report(job.job_id, trial, self._history(job.job_id))
            capacity -= 1
            yield job

    def _history(self, job_id: str) -> list[tuple[int, float]]:
        """What a job logged of the metric up to the checkpoint it resumes from: a job that an interrupted launch
        left resumes under a new trial, which must hold those steps too, or the pruner compares every other trial at
        them without it (and this one with fewer). Later steps are dropped as the trainer drops them (it logs them
        again); a job without a checkpoint starts over and keeps nothing."""
        from rla_ablate.sweep.status import resume_tokens
        from rla_ablate.train.loggers import metric_series, read_jsonl

        kept = resume_tokens(self.sdir, job_id)
        series = metric_series(read_jsonl(self.sdir.job_dir(job_id) / "metrics.jsonl"), self.cfg.metric)
        return [(step, value) for step, value in series if step <= kept] if kept else []

    def _report(self, job_id: str, trial: Any, values: list[tuple[int, float]]) -> None:
        """Tell the trial each step once: the first value of a step stands (a resumed job reports again the
        steps between its checkpoint and where the interrupted launch had reached)."""
        told = self.reported.setdefault(job_id, set())
        for step, value in values:
            if step not in told:
                trial.report(value, step)
                told.add(step)

    def observe(self, job: ResolvedJob, values: list[tuple[int, float]], ended: bool = False) -> str | None:
        """Feed the values to the pruner; a pruned trial's job is stopped. An attempt that has `ended` is told its
        values and never pruned: a trial that trained to its end is complete, whatever its last report says."""
        trial = self.trials.get(job.job_id)
        if trial is None or job.job_id in self.pruned:
            return None
        self._report(job.job_id, trial, values)
        if ended or not trial.should_prune():
            return None
        self.pruned.add(job.job_id)
        return f"{PRUNED_MESSAGE} at {values[-1][0]:,} tokens"

    def done(self, job: ResolvedJob, outcome: JobOutcome) -> None:
        """Tell the study: pruned, its value, interrupted (enqueued again, does not count) or failed."""
        from optuna.trial import TrialState

        trial = self.trials.pop(job.job_id, None)
        self.reported.pop(job.job_id, None)
        if trial is None:
            return
        from rla_ablate.tracking.runs import CAUSE, STATUS_REASON, TRIAL

        study, cfg, status = self.study, self.cfg, outcome.status
        if job.job_id in self.pruned and status == Status.FINISHED and cfg.metric in outcome.metrics:
            # the stop reached the job after its last step: it trained to its end, so its final value counts
            self.pruned.discard(job.job_id)
            self.runner.progress.note(f"{job.name}: finished before the pruner's stop reached it; its final "
                                      f"{cfg.metric} counts (not pruned)")
        if job.job_id in self.pruned:
            error = f"{PRUNED_MESSAGE} (trial {trial.number})"
            self.sdir.set_status(job.job_id, status=Status.CANCELLED, cause=Cause.PRUNED, error=error)
            self.runner.summary.pruned += 1
            study.tell(trial, state=TrialState.PRUNED)
            # in MLflow too: its run ended cancelled, as a job stopped by hand does
            self.runner.tag_run(job, {TRIAL: str(trial.number), CAUSE: Cause.PRUNED.value, STATUS_REASON: error})
            return
        self.runner.tag_run(job, {TRIAL: str(trial.number)})
        if status == Status.FINISHED and cfg.metric in outcome.metrics:
            study.tell(trial, float(outcome.metrics[cfg.metric]))
        elif status == Status.CANCELLED:
            trial.set_user_attr(INTERRUPTED, True)
            study.tell(trial, state=TrialState.FAIL)
            study.enqueue_trial(trial.params, skip_if_exists=False)
        else:
            if status == Status.FINISHED:
                self.sdir.set_status(job.job_id, error=f"finished without logging {cfg.metric}; check search.metric")
            study.tell(trial, state=TrialState.FAIL)

    def drain(self) -> list[ResolvedJob]:
        return []

    def finish(self) -> None:
        from optuna.trial import TrialState

        study = self.study
        if any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
            best = study.best_trial
            job = self.known.get(best.user_attrs.get("job_id"), {}).get("name", f"trial-{best.number:03d}")
            self.runner.progress.note(f"best trial {best.number} (job {job}): {self.cfg.metric} = "
                                      f"{study.best_value:.4f} with {params_text(best.params)}")


def _values(sdir: Any, job_id: str, metric: str) -> dict[str, float]:
    """The final value of `metric` of a finished job, read from its metrics.jsonl (ground truth)."""
    from rla_ablate.train.loggers import metric_series, read_jsonl

    series = metric_series(read_jsonl(sdir.job_dir(job_id) / "metrics.jsonl"), metric)
    return {job_id: series[-1][1]} if series else {}
