"""An Optuna `search:` sweep end to end: real RDB storage in the sweep folder, trials as Ray tasks on a local Ray
instance, intermediate eval losses fed to the pruner, one MLflow child run per trial; a relaunch adds nothing."""

from __future__ import annotations

import json
import zipfile

import pytest
import yaml
from cli_run import cli

pytestmark = pytest.mark.slow

TINY = {"vocab_size": 257, "num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "head_dim": 16}
SEARCH = {
    "name": "e2e-search",
    "models": [{"preset": "tiny-rdn", "overrides": TINY}],
    "base": {
        "train": {"tokens": 4096, "seq_len": 64, "micro_batch_size": 4, "batch_tokens": 256, "warmup_tokens": 256,
                  "min_lr": 1.0e-5, "eval_every_tokens": 1024, "checkpoint_every_tokens": 2048, "cpu_threads": 1},
        "data": {"kind": "stdlib"},
        "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 512}],
    },
    "search": {"params": {"train.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True},
                          "model.target": {"type": "categorical", "choices": ["clip", "tanh"]}},
               "n_trials": 3, "metric": "eval/val/loss", "pruner": "median", "seed": 1},
    "resources": {"cpus": 1},
}


def test_search_runs_trials_through_ray_and_mlflow(tmp_path):
    import optuna
    from mlflow.tracking import MlflowClient
    from optuna.trial import TrialState

    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.status import sweep_status

    f = tmp_path / "search.yaml"
    f.write_text(yaml.safe_dump(SEARCH, sort_keys=False))
    root = tmp_path / "runs"
    out = cli("launch", str(f), "--root", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    sdir = SweepDir(root, "e2e-search")
    study = optuna.load_study(study_name="e2e-search", storage=sdir.optuna_uri)
    trials = study.get_trials()
    assert len(trials) == 3
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert all(t.intermediate_values for t in trials), "eval losses never reached the pruner"
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert complete and all(0 < t.value < 10 for t in complete)
    doc = sweep_status(sdir)
    assert sorted(j["job_id"] for j in doc["jobs"]) == sorted(t.user_attrs["job_id"] for t in trials)
    client = MlflowClient(doc["tracking_uri"])
    exp = client.get_experiment_by_name("rla-sweep/e2e-search")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`rla.role` = 'job'")
    assert sorted(r.info.run_id for r in runs) == sorted(j["mlflow_run_id"] for j in doc["jobs"])
    for t in complete:
        job = next(j for j in doc["jobs"] if j["job_id"] == t.user_attrs["job_id"])
        assert job["status"] == "finished"
        run = client.get_run(job["mlflow_run_id"])
        assert run.data.metrics["eval/val/loss"] == pytest.approx(t.value)
        assert float(run.data.params["train.lr"]) == pytest.approx(t.params["train.lr"])
    # status: each job's trial and its value (complete trials), in the table and in --json
    by_job = {j["job_id"]: j for j in doc["jobs"]}
    for t in trials:
        assert by_job[t.user_attrs["job_id"]]["trial"] == t.number
        assert by_job[t.user_attrs["job_id"]]["value"] == (t.value if t.state == TrialState.COMPLETE else None)
    shown = cli("status", "e2e-search", "--root", str(root))
    assert shown.returncode == 0 and "trial" in shown.stdout and "value" in shown.stdout, shown.stdout
    assert f"{complete[0].value:.6g}" in shown.stdout, shown.stdout
    # results: the same trial and value beside each job's identity and metrics
    import csv
    import io

    table = cli("results", "e2e-search", "--root", str(root), "--csv")
    assert table.returncode == 0, table.stderr
    rows = {r["job_id"]: r for r in csv.DictReader(io.StringIO(table.stdout))}
    for t in trials:
        row = rows[t.user_attrs["job_id"]]
        assert row["trial"] == str(t.number)
        assert row["value"] == (str(t.value) if t.state == TrialState.COMPLETE else "")
    for t in trials:  # each trial's run names its trial; a pruned one says so (its status is cancelled)
        job = next(j for j in doc["jobs"] if j["job_id"] == t.user_attrs["job_id"])
        tags = client.get_run(job["mlflow_run_id"]).data.tags
        assert tags["rla.trial"] == str(t.number), tags
        if t.state == TrialState.PRUNED:
            assert tags["rla.cause"] == "pruned" and tags["rla.status_reason"].startswith("pruned by Optuna"), tags

    again = cli("launch", str(f), "--root", str(root))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to run" in again.stdout
    assert len(optuna.load_study(study_name="e2e-search", storage=sdir.optuna_uri).get_trials()) == 3
    assert len(client.search_runs([exp.experiment_id], filter_string="tags.`rla.role` = 'job'")) == 3
    # plan counts the existing study's trials under --root (none elsewhere), and refuses what a launch would
    more = tmp_path / "more.yaml"
    more.write_text(yaml.safe_dump({**SEARCH, "search": {**SEARCH["search"], "n_trials": 5}}, sort_keys=False))
    planned = cli("plan", str(more), "--root", str(root))
    said = " ".join(planned.stdout.split())
    assert planned.returncode == 0 and f"its study under {root} has 3 of them done, so a launch runs the 2 left" in said
    fresh = json.loads(cli("plan", str(more), "--root", str(tmp_path / "elsewhere"), "--json").stdout)
    assert fresh["totals"]["search_trials_done"] is None
    lr = {**SEARCH["search"]["params"]["train.lr"], "high": 2.0e-2}
    more.write_text(yaml.safe_dump({**SEARCH, "search": {**SEARCH["search"], "params": {
        **SEARCH["search"]["params"], "train.lr": lr}}}, sort_keys=False))
    refused = cli("plan", str(more), "--root", str(root))
    assert refused.returncode == 2 and "search.params.train.lr: the study in" in refused.stderr, refused.stderr


def test_a_continued_study_draws_new_parameters_and_a_new_one_repeats_its_seed(tmp_path):
    """A relaunch with more trials continues the study: its sampler must not draw the first trials' parameters
    again (their jobs are done, so the launch ran nothing and counted them as new trials). A new study with the same
    seed draws the same points (reproducible)."""
    from rla_ablate.sweep.schema import SearchConfig
    from rla_ablate.sweep.search import make_study, suggest

    cfg = SearchConfig.model_validate({**SEARCH["search"], "sampler": "tpe"})

    def draw(uri: str, n: int) -> list[dict]:
        study = make_study(cfg, "s", uri)
        points = []
        for _ in range(n):
            trial = study.ask()
            points.append(suggest(trial, cfg.params))
            study.tell(trial, 1.0)
        return points

    first = draw(f"sqlite:///{tmp_path / 'a.db'}", 3)
    more = draw(f"sqlite:///{tmp_path / 'a.db'}", 3)      # the same study, continued
    assert len({p["train.lr"] for p in first + more}) == 6, (first, more)
    assert draw(f"sqlite:///{tmp_path / 'b.db'}", 3) == first


def _search_folder(tmp_path, data=None):
    """(sweep, its folder, a runner stand-in) of `data` (SEARCH), for the job source's unit tests."""
    from types import SimpleNamespace

    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.summary import LaunchSummary

    f = tmp_path / "search.yaml"
    f.write_text(yaml.safe_dump(data or SEARCH))
    sweep = load_sweep(f)
    sdir = SweepDir(tmp_path / "runs", sweep.name)
    sdir.path.mkdir(parents=True)
    return sweep, sdir, SimpleNamespace(summary=LaunchSummary(sweep.name), progress=SimpleNamespace(note=print))


def test_a_trial_enqueued_again_after_an_interrupted_launch_keeps_its_jobs_name(tmp_path):
    """A launch killed mid-trial leaves the trial running in the study; the next launch marks it interrupted and
    enqueues its parameters, which Optuna asks as a new trial number but which give the same job: the job keeps the
    name it was listed under (status, results and the launch's progress lines say the same trial-NNN)."""
    from rla_ablate.sweep.search import OptunaSource

    sweep, sdir, runner = _search_folder(tmp_path)

    first = OptunaSource(sweep, sdir)
    first.start(runner)
    job = next(first.next_jobs(1))  # asked and started, never told: the launch was killed
    assert job.name == "trial-000"

    again = OptunaSource(sweep, sdir)
    again.start(runner)
    resumed = next(again.next_jobs(1))
    assert resumed.job_id == job.job_id and again.trials[job.job_id].number == 1
    assert resumed.name == "trial-000" and [r["name"] for r in sdir.job_list()] == ["trial-000"]


def test_an_int_range_whose_inside_values_build_no_job_is_refused_with_the_values_that_work(tmp_path):
    """A batch of 256 tokens in rows of 64 takes 1, 2 and 4 rows a micro-batch, not 3: a range 1-4 validates at
    its ends, and a trial drawing 3 would have no job to run. `plan` names the search key and what works."""
    search = dict(SEARCH["search"], params={"train.micro_batch_size": {"type": "int", "low": 1, "high": 4}})
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(dict(SEARCH, search=search), sort_keys=False))
    out = cli("plan", str(f))
    err = " ".join(out.stderr.split())
    assert out.returncode == 2 and "Traceback" not in err, err
    assert "search.params.train.micro_batch_size" in err and "train.micro_batch_size = 3 is refused" in err, err
    assert "{type: categorical, choices: [1, 2, 4]}" in err, err
    # a step draws only the values that work: 1 and 4 rows (every third from 1); a step the range cannot end on,
    # or on a float, is refused
    search = dict(SEARCH["search"], params={"train.micro_batch_size": {"type": "int", "low": 1, "high": 4, "step": 3}})
    f.write_text(yaml.safe_dump(dict(SEARCH, search=search), sort_keys=False))
    out = cli("plan", str(f))
    assert out.returncode == 0 and "train.micro_batch_size from 1 to 4 (int) in steps of 3" in " ".join(
        out.stdout.split()), out.stdout + out.stderr
    import optuna

    from rla_ablate.sweep.schema import SearchParam
    from rla_ablate.sweep.search import suggest

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    param = {"train.micro_batch_size": SearchParam(type="int", low=1, high=4, step=3)}
    assert {suggest(study.ask(), param)["train.micro_batch_size"] for _ in range(30)} == {1, 4}
    for spec, said in (({"type": "int", "low": 1, "high": 4, "step": 2},
                        "high (4) must be low (1) plus a multiple of step (2): e.g. high: 3"),
                       ({"type": "float", "low": 1.0e-4, "high": 1.0e-2, "step": 1}, "'step' is for int parameters")):
        key = "train.micro_batch_size" if spec["type"] == "int" else "train.lr"
        f.write_text(yaml.safe_dump(dict(SEARCH, search=dict(SEARCH["search"], params={key: spec})), sort_keys=False))
        out = cli("plan", str(f))
        err = " ".join(out.stderr.split())
        assert out.returncode == 2 and f"search.params.{key}" in err and said in err, err
    # a choice the job refuses elsewhere in its config (base.data): said at the search's key, with where it failed
    search = dict(SEARCH["search"], params={"data.kind": {"type": "categorical", "choices": ["stdlib", "bogus"]}})
    f.write_text(yaml.safe_dump(dict(SEARCH, search=search), sort_keys=False))
    out = cli("plan", str(f))
    err = " ".join(out.stderr.split())
    assert out.returncode == 2 and "search.params.data.kind: the trials would draw data.kind = 'bogus', which is " \
        "refused (base.data): unknown kind 'bogus'" in err, err
    # a grid's list where a range belongs: how a search writes it, at the key
    f.write_text(yaml.safe_dump(dict(SEARCH, search=dict(SEARCH["search"], params={"model.clip": [0.5, 1.0]})),
                                sort_keys=False))
    out = cli("plan", str(f))
    err = " ".join(out.stderr.split())
    assert out.returncode == 2 and "search.params.model.clip: a list, as a grid gives its values" in err, err
    assert "{type: categorical, choices: [0.5, 1.0]}" in err, err


def test_parameters_that_build_no_job_fail_their_trial_and_the_search_goes_on(tmp_path, monkeypatch, capsys):
    """Parameters that pass the file's checks and still build no job (a wide int range is checked at 16 points; a
    study an earlier version left): the trial fails with the reason and counts, the launch goes on with the next
    trial, and a resume never asks for those parameters again (before, the launch exited 2 on the draw, left the
    trial running, and every resume enqueued it again)."""
    from optuna.trial import TrialState

    from rla_ablate.sweep import expand as expand_module
    from rla_ablate.sweep.progress import Progress
    from rla_ablate.sweep.search import INVALID, OptunaSource

    monkeypatch.setattr(expand_module, "_check_inside", lambda *args: None)
    sweep, sdir, runner = _search_folder(tmp_path, dict(SEARCH, search=dict(SEARCH["search"], params={
        "train.micro_batch_size": {"type": "int", "low": 1, "high": 4}})))
    notes = []
    runner.progress.note = notes.append
    source = OptunaSource(sweep, sdir)
    source.start(runner)
    source.study.enqueue_trial({"train.micro_batch_size": 3})
    source.study.enqueue_trial({"train.micro_batch_size": 2})
    job = next(source.next_jobs(1))
    assert job.job.train.micro_batch_size == 2 and source.trials[job.job_id].number == 1
    bad = source.study.trials[0]
    assert bad.state == TrialState.FAIL and "micro_batch_size" in bad.user_attrs[INVALID]
    assert len(notes) == 1 and notes[0].startswith("trial 0: train.micro_batch_size=3 makes no valid job"), notes
    assert runner.summary.invalid == 1  # the launch's last line counts it (the study has no job of it)
    runner.summary.counts, runner.summary.study_counts = {"finished": 1}, {"finished": 1}
    Progress(sweep.name, console=None, interactive=False).final(runner.summary, sdir)
    assert "(0 attempts run; 0 pruned; 1 trial failed making no valid job, see above)" in capsys.readouterr().out
    # a resume: the running trial is enqueued again, the invalid one is not
    again = OptunaSource(sweep, sdir)
    again.start(runner)
    resumed = next(again.next_jobs(1))
    assert resumed.job_id == job.job_id and len(notes) == 1


def test_a_trial_that_resumes_an_interrupted_job_holds_the_jobs_earlier_reports(tmp_path):
    """The new trial of a job resumed after an interrupted launch must hold what the job reported up to the
    checkpoint it resumes from, or the median pruner compares every other trial at those steps without it. The
    job's metrics.jsonl is the record; the steps after the checkpoint come again from the resumed job, and a job
    without a checkpoint (it starts over) brings nothing."""
    import json

    from optuna.trial import TrialState

    from rla_ablate.sweep.search import OptunaSource

    sweep, sdir, runner = _search_folder(tmp_path)
    first = OptunaSource(sweep, sdir)
    first.start(runner)
    job = next(first.next_jobs(1))
    logged = [(1024, 3.5), (2048, 3.25), (3072, 3.0)]
    with open(sdir.job_dir(job.job_id) / "metrics.jsonl", "w") as fh:
        for step, value in logged:
            fh.write(json.dumps({"type": "metrics", "step": step, "values": {"eval/val/loss": value}}) + "\n")
    assert first.observe(job, logged) is None  # then the launch is killed

    def relaunch() -> OptunaSource:
        source = OptunaSource(sweep, sdir)
        source.start(runner)
        assert next(source.next_jobs(1)).job_id == job.job_id
        return source

    def reports(source: OptunaSource, number: int) -> dict:
        return next(t for t in source.study.get_trials() if t.number == number).intermediate_values

    again = relaunch()  # no checkpoint: the job starts over, and so does what its trial holds
    assert reports(again, 1) == {}
    (sdir.job_dir(job.job_id) / "checkpoints").mkdir()
    with zipfile.ZipFile(sdir.job_dir(job.job_id) / "checkpoints" / f"ckpt-{2048:015d}.pt", "w") as z:
        z.writestr("data.pkl", b"")  # whole, as a torch checkpoint is a zip archive
    again = relaunch()
    assert again.observe(job, [(3072, 2.9), (4096, 2.75)]) is None  # the resumed job from its 2,048 checkpoint
    assert [t.state for t in again.study.get_trials()][:2] == [TrialState.FAIL, TrialState.FAIL]
    assert reports(again, 2) == {1024: 3.5, 2048: 3.25, 3072: 2.9, 4096: 2.75}


def test_a_trials_run_is_tagged_with_its_trial_and_a_pruned_one_with_its_cause(tmp_path):
    """A pruned trial's run ends cancelled, as a job stopped by hand does: its tags say pruned (rla.cause, and the
    reason the sweep folder gives), and every trial's run names its Optuna trial (rla.trial)."""
    from types import SimpleNamespace

    from rla_ablate.outcome import JobOutcome, Status
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.search import OptunaSource
    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.summary import LaunchSummary

    f = tmp_path / "search.yaml"
    f.write_text(yaml.safe_dump(SEARCH))
    sweep = load_sweep(f)
    sdir = SweepDir(tmp_path / "runs", sweep.name)
    sdir.path.mkdir(parents=True)
    tagged: list[tuple[str, dict]] = []
    runner = SimpleNamespace(summary=LaunchSummary(sweep.name), progress=SimpleNamespace(note=print),
                             tag_run=lambda job, tags: tagged.append((job.job_id, tags)))
    source = OptunaSource(sweep, sdir)
    source.start(runner)
    pruned, finished = list(source.next_jobs(2))
    source.pruned.add(pruned.job_id)
    source.done(pruned, JobOutcome(Status.CANCELLED, error="cancelled at 1,024 tokens"))
    source.done(finished, JobOutcome(Status.FINISHED, metrics={"eval/val/loss": 3.0}))
    assert tagged == [(pruned.job_id, {"rla.trial": "0", "rla.cause": "pruned",
                                       "rla.status_reason": "pruned by Optuna (trial 0)"}),
                      (finished.job_id, {"rla.trial": "1"})]
    assert sdir.status(pruned.job_id).cause.value == "pruned" and runner.summary.pruned == 1


def test_a_trial_that_trained_to_its_end_is_complete_whatever_the_pruner_says(tmp_path, monkeypatch):
    """The pruner hears a job's last reports with its outcome, or asks a stop that reaches the job after its last
    step: such a trial trained to its end, and is complete with its value (status, results and the study agree),
    not pruned. A running job is still stopped."""
    import optuna
    from optuna.trial import TrialState

    from rla_ablate.outcome import JobOutcome, Status
    from rla_ablate.sweep.search import OptunaSource

    monkeypatch.setattr(optuna.trial.Trial, "should_prune", lambda self: True)
    sweep, sdir, runner = _search_folder(tmp_path)
    notes: list[str] = []
    runner.progress.note, runner.tag_run = notes.append, lambda job, tags: None
    source = OptunaSource(sweep, sdir)
    source.start(runner)
    ended, late, running = list(source.next_jobs(3))
    logged = [(1024, 3.5), (2048, 3.25)]
    assert source.observe(ended, logged, ended=True) is None
    assert source.observe(late, logged) == "pruned by Optuna at 2,048 tokens"
    assert source.observe(running, logged) == "pruned by Optuna at 2,048 tokens"
    source.done(ended, JobOutcome(Status.FINISHED, metrics={"eval/val/loss": 3.0}))
    source.done(late, JobOutcome(Status.FINISHED, metrics={"eval/val/loss": 3.1}))
    source.done(running, JobOutcome(Status.CANCELLED, error="cancelled at 2,048 tokens"))
    trials = {t.user_attrs["job_id"]: t for t in source.study.get_trials()}
    assert trials[ended.job_id].state == TrialState.COMPLETE and trials[ended.job_id].value == 3.0
    assert trials[late.job_id].state == TrialState.COMPLETE and trials[late.job_id].value == 3.1
    assert trials[running.job_id].state == TrialState.PRUNED
    assert sdir.status(late.job_id).cause is None and sdir.status(running.job_id).cause.value == "pruned"
    assert runner.summary.pruned == 1
    assert notes == [f"{late.name}: finished before the pruner's stop reached it; its final eval/val/loss counts "
                     "(not pruned)"]


def test_a_continued_study_refuses_another_metric_direction_search_space_or_base_job(tmp_path):
    """Optuna loads an existing study as it was: a relaunch whose file asks for another metric, direction, search
    space or base job (another token budget, evaluation schedule, model) would rank the new trials' values with the
    old ones, and prune them against trials of another schedule. Refused, at the file's line; a larger n_trials (or
    another sampler, pruner, seed), or another base value of a searched key, continues the study."""
    import copy

    from rla_ablate.errors import UserError
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.search import check_study, make_study
    from rla_ablate.sweep.state import SweepDir

    def sweep_with(train=None, **search):
        cfg = copy.deepcopy(SEARCH)
        cfg["search"].update(search)
        cfg["base"]["train"].update(train or {})
        f = tmp_path / "search.yaml"
        f.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return load_sweep(f)

    sdir = SweepDir(tmp_path / "runs", SEARCH["name"])
    uri = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = sweep_with()
    check_study(make_study(first.config.search, first.name, uri), first, sdir)  # records the question
    lr = dict(SEARCH["search"]["params"]["train.lr"], high=3.0e-2)
    for change, key in (({"metric": "eval/val/ppl"}, "search.metric"),
                        ({"params": {**SEARCH["search"]["params"], "train.lr": lr}}, "search.params.train.lr")):
        sweep = sweep_with(**change)
        with pytest.raises(UserError, match="was made with") as err:
            check_study(make_study(sweep.config.search, sweep.name, uri), sweep, sdir)
        assert err.value.key == key and err.value.line is not None, (change, err.value)
    assert "search.params.train.lr {type: float, low: 0.0001, high: 0.01, log: true}" in str(err.value), err.value
    both = sweep_with(metric="eval/val/acc", direction="maximize")  # both named, said at the first
    with pytest.raises(UserError, match="was made with search.metric 'eval/val/loss' and search.direction "
                                        "'minimize'; this file asks for 'eval/val/acc' and 'maximize'") as err:
        check_study(make_study(both.config.search, both.name, uri), both, sdir)
    assert err.value.key == "search.metric", err.value
    # the direction, of a metric that has no better side (a loss's is refused by the file's own check)
    neutral = sweep_with(metric="train/grad_norm")
    other = f"sqlite:///{tmp_path / 'optuna-2.db'}"
    check_study(make_study(neutral.config.search, neutral.name, other), neutral, sdir)
    sweep = sweep_with(metric="train/grad_norm", direction="maximize")
    with pytest.raises(UserError, match="was made with") as err:
        check_study(make_study(sweep.config.search, sweep.name, other), sweep, sdir)
    assert err.value.key == "search.direction" and err.value.line is not None, err.value
    for change in ({"metric": "eval/val/acc"}, {"direction": "maximize"}):  # the worst model sought: refused
        with pytest.raises(UserError, match="the search would look for the worst one") as err:
            sweep_with(**change)
        assert err.value.key == "search.direction" and err.value.line is not None, (change, err.value)
    for train, key in (({"tokens": 8192}, "base.train.tokens"), ({"eval_every_tokens": 2048},
                                                                  "base.train.eval_every_tokens")):
        sweep = sweep_with(train=train)
        with pytest.raises(UserError, match="every trial at") as err:
            check_study(make_study(sweep.config.search, sweep.name, uri), sweep, sdir)
        assert err.value.key == key and err.value.line is not None, (train, err.value)
        assert f"{key[5:]}={SEARCH['base']['train'][key.split('.')[-1]]}" in str(err.value), str(err.value)
    # a model the trials would not share: said at the arm (its overrides), eval sets at their entry
    cfg = copy.deepcopy(SEARCH)
    cfg["models"][0]["overrides"] = {**TINY, "num_layers": 2}
    cfg["base"]["eval"][0]["tokens"] = 1024
    for change, key in (({"models": cfg["models"]}, "models.0.overrides.num_layers"),
                        ({"base": cfg["base"]}, "base.eval.0.tokens")):
        f = tmp_path / "search.yaml"
        f.write_text(yaml.safe_dump({**SEARCH, **change}, sort_keys=False))
        sweep = load_sweep(f)
        with pytest.raises(UserError, match="every trial at") as err:
            check_study(make_study(sweep.config.search, sweep.name, uri), sweep, sdir)
        assert err.value.key == key and err.value.line is not None, (key, err.value)
    more = sweep_with(n_trials=5, sampler="random", seed=3, train={"lr": 5.0e-3})  # train.lr is searched
    check_study(make_study(more.config.search, more.name, uri), more, sdir)
    # bookkeeping (checkpoint interval, kept checkpoints) changes what is stored, not what a trial computes
    kept = sweep_with(train={"checkpoint_every_tokens": 1024, "keep_checkpoints": 3})
    check_study(make_study(kept.config.search, kept.name, uri), kept, sdir)


def test_a_refused_relaunch_leaves_the_saved_file_and_resume_as_they_were(tmp_path):
    """A relaunch whose study check fails (a widened range, in place or from another file with --new-version) is
    refused before the launch saves anything: the sweep folder's copy of the file and its record of where it came
    from stay those of the last launch, so `resume` still runs that."""
    import copy
    import json

    from rla_ablate.errors import UserError
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.launch import LaunchOptions, launch
    from rla_ablate.sweep.search import check_study, make_study
    from rla_ablate.sweep.state import SweepDir

    root = tmp_path / "runs"
    f = tmp_path / "search.yaml"
    f.write_text(yaml.safe_dump(SEARCH, sort_keys=False))
    first = load_sweep(f)
    sdir = SweepDir(root, SEARCH["name"])
    sdir.path.mkdir(parents=True)
    check_study(make_study(first.config.search, first.name, sdir.optuna_uri), first, sdir)  # as its launch left it
    (sdir.path / "sweep.yaml").write_text(f.read_text())
    sdir.write_meta(sweep_file=str(f.resolve()), cwd=str(tmp_path))
    saved, meta = (sdir.path / "sweep.yaml").read_text(), json.loads((sdir.path / "sweep.json").read_text())
    wider = copy.deepcopy(SEARCH)
    wider["search"]["params"]["train.lr"]["high"] = 2.0e-2
    other = tmp_path / "other" / "search.yaml"
    other.parent.mkdir()
    for path, new_version in ((f, False), (other, True)):
        path.write_text(yaml.safe_dump(wider, sort_keys=False))
        with pytest.raises(UserError, match="was made with") as err:
            launch(path, LaunchOptions(root=root, new_version=new_version))
        assert err.value.key == "search.params.train.lr", err.value
        assert (sdir.path / "sweep.yaml").read_text() == saved
        assert json.loads((sdir.path / "sweep.json").read_text()) == meta


def test_a_search_sweeps_dashboard_says_what_its_study_did_and_asks_for_no_grid_edit(tmp_path):
    """The page of a search sweep opens with its study (trials by state, the best with its job and parameters),
    draws it (the value by trial, against each parameter), lists the trials best first, and the claims it cannot
    test point to a grid sweep instead of edits a search file refuses."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    from optuna.trial import TrialState

    from rla_ablate.dashboard.build import untested_lines
    from rla_ablate.dashboard.coverage import Untested
    from rla_ablate.dashboard.search import search_part
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.search import check_study, make_study
    from rla_ablate.sweep.state import SweepDir

    f = tmp_path / "search.yaml"
    f.write_text(yaml.safe_dump(SEARCH))
    sweep = load_sweep(f)
    sdir = SweepDir(tmp_path / "runs", sweep.name)
    sdir.path.mkdir(parents=True)
    out = tmp_path / "dash"
    assert search_part(sdir, out) is None  # no study: not a search page
    study = make_study(sweep.config.search, sweep.name, sdir.optuna_uri)
    check_study(study, sweep, sdir)  # as a launch does: the study records its metric
    space = {"train.lr": FloatDistribution(1e-4, 1e-2, log=True),
             "model.target": CategoricalDistribution(["clip", "tanh"])}
    trial = study.ask(space)
    study.tell(trial, state=TrialState.FAIL)
    part = search_part(sdir, out)
    assert part.section is None and "(1 trials: 1 fail)" in part.note  # nothing to draw yet
    jobs = [{"job_id": "job0", "name": "trial-000"}]
    for value, state in ((3.5, TrialState.COMPLETE), (3.25, TrialState.COMPLETE), (None, TrialState.PRUNED),
                         (3.75, TrialState.COMPLETE)):
        trial = study.ask(space)
        trial.set_user_attr("job_id", f"job{trial.number}")
        jobs.append({"job_id": f"job{trial.number}", "name": f"trial-{trial.number:03d}"})
        if state == TrialState.PRUNED:
            trial.report(4.5, 2)
        study.tell(trial, value, state=state)
    sdir.write_job_list(jobs)
    part = search_part(sdir, out, run_url=lambda run: f"http://ui/{run}", run_ids={"job2": "run2"})
    assert part.note.startswith("a search sweep: its runs are the trials of one Optuna study (5 trials: 3 complete, "
                                "1 pruned, 1 fail); best: trial 2 (job trial-002), 3.25 with "), part.note
    sec = part.section
    assert sec.png.name == "optuna_study.png" and sec.png.is_file() and sec.svg.is_file()
    svg = sec.svg.read_text()
    for text in ("against train.lr", "against model.target", "pruned (last report)", "best so far"):
        assert text in svg, text
    assert sec.header == ["trial", "job", "eval/val/loss", "model.target", "train.lr"]
    assert [row[0].text for row in sec.rows] == ["2", "1", "4"]  # completed, best first (minimized)
    assert [row[0].best for row in sec.rows] == [True, False, False]
    assert sec.rows[0][1].link == "http://ui/run2" and sec.rows[1][1].link is None
    from rla_ablate.dashboard.html import _section

    html = _section(sec, lambda run: run)
    assert "<img" in html and html.count("<tr>") == 4, html
    # trials whose mechanism was off (the validity panel's runs): hollow, counted in the note, caption and figure;
    # a trial a launch left running and asked again is interrupted, not failed
    from rla_ablate.sweep.search import INTERRUPTED

    trial = study.ask(space)
    trial.set_user_attr(INTERRUPTED, True)
    study.tell(trial, state=TrialState.FAIL)
    part = search_part(sdir, out, off=lambda: {"job1", "job4"})
    assert "(6 trials: 3 complete, 1 pruned, 1 fail, 1 interrupted (run again))" in part.note, part.note
    assert "MECHANISM OFF in 2 of 3 completed trials (drawn hollow" in part.note
    assert "MECHANISM OFF in 2 of 3 completed trials" in part.section.caption
    assert part.section.flagged == [("off", "trials 1, 4", "their values rank training with the mechanism idle")]
    svg = part.section.svg.read_text()
    assert "completed, mechanism off" in svg and "MECHANISM OFF in 2 of 3" in svg
    assert "best, mechanism off" not in svg
    # the best trial's mechanism off: its star is hollow and says so
    part = search_part(sdir, out, off=lambda: {"job2"})
    assert "best, mechanism off" in part.section.svg.read_text()
    untested = [Untested("table4", "a claim", "family=rla, ablations=no_fitting", "ablations=none", "", False)]
    assert "from a grid sweep" in untested_lines(untested, 1, search=True)[0]
    assert len(untested_lines(untested, 1, search=True)) == 1 and len(untested_lines(untested, 1)) == 2
    assert "add them to the sweep file" in untested_lines(untested, 1)[0]
