"""Downstream accuracy end to end on the CPU, offline: a tiny trained job scored by `rla-sweep eval` on the shipped
multiple-choice and generation tasks, the scores in the job folder, in MLflow (a launched sweep's `evals:` stage)
and in the dashboard's Table 5; the HF export scored the same through lm-eval's own `hf` model; clear errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rla_ablate.cli import main

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

TINY = {"num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "head_dim": 16}
TRAIN = {"tokens": 512, "seq_len": 64, "micro_batch_size": 4, "batch_tokens": 256, "warmup_tokens": 0,
         "eval_every_tokens": 512, "checkpoint_every_tokens": 256, "cpu_threads": 1}
EVAL = [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 256}]
TASKS = ["rla_choice", "rla_complete"]
# Any attempt to reach the network fails at once: the shipped tasks must load from their local files.
NO_NETWORK = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1"}


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory) -> Path:
    from rla_ablate.models import load_preset
    from rla_ablate.train import JobConfig, run_job

    out = tmp_path_factory.mktemp("job")
    job = JobConfig.model_validate({"model": load_preset("tiny-rla").replace(vocab_size=257, **TINY).model_dump(),
                                    "train": TRAIN, "data": {"kind": "stdlib"}, "eval": EVAL})
    (out / "job.json").write_text(job.model_dump_json(indent=1))
    assert run_job(job, out).status == "finished"
    return out


def _score(job: Path) -> list[Path]:
    """Score the job on TASKS (4 examples each) through the CLI; the files of that scoring."""
    assert main(["eval", str(job), "--tasks", ",".join(TASKS), "--limit", "4", "--batch-size", "1"]) == 0
    return [f for f in (job / "evals").glob("*.json") if json.loads(f.read_text())["limit"] == 4]


def test_export_takes_a_sweeps_job_by_its_name_or_id(job_dir, tmp_path, capsys):
    """`export JOB OUT --sweep NAME`: the job as `status` names it (its name, or the start of its id); a sweep's name
    given as JOB_DIR says how; an unknown job lists the sweep's jobs."""
    from dashboard_synthetic import write_sweep_folder

    from rla_ablate.sweep.expand import load_sweep

    sweep = load_sweep(REPO / "sweeps" / "smoke.yaml")
    sdir = write_sweep_folder(tmp_path / "runs", sweep, "sqlite:///" + str(tmp_path / "store.db"))
    first = sweep.jobs[0]
    shutil.rmtree(sdir.job_dir(first.job_id))
    shutil.copytree(job_dir, sdir.job_dir(first.job_id), ignore=shutil.ignore_patterns("evals"))
    root = ["--root", str(tmp_path / "runs")]
    for i, job in enumerate((first.name, first.job_id[:8])):
        assert main(["export", job, str(tmp_path / f"hf{i}"), "--sweep", "smoke", *root]) == 0
        assert f"exported {sdir.job_dir(first.job_id)} (" in capsys.readouterr().out
    assert main(["export", "smoke", str(tmp_path / "x"), *root]) == 2
    assert ("JOB_DIR: smoke is a sweep; export takes one of its jobs: `rla-sweep export JOB OUT --sweep smoke`"
            in capsys.readouterr().err)
    assert main(["export", "tiny-rla/seed9", str(tmp_path / "x"), "--sweep", "smoke", *root]) == 2
    err = capsys.readouterr().err
    assert f"sweep smoke has no job 'tiny-rla/seed9'; its jobs (name or id): {first.name} ({first.job_id[:8]})" in err
    # a job's name or id without --sweep: the sweeps under the root that have it, and the command
    for job in (first.name, first.job_id):
        assert main(["export", job, str(tmp_path / "x"), *root]) == 2
        assert (f"JOB_DIR: no folder {job}; it names a job of sweep smoke: `rla-sweep export {job} {tmp_path / 'x'} "
                f"--sweep smoke --root {tmp_path / 'runs'}`") in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_eval_scores_a_job_offline_and_does_not_rescore(job_dir, monkeypatch, capsys):
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in NO_NETWORK.items():
        monkeypatch.setenv(name, value)
    files = _score(job_dir)
    out = capsys.readouterr()
    # The command went offline for the local task files and left the environment as it found it.
    assert "HF_DATASETS_OFFLINE" not in os.environ
    import datasets.config

    from rla_ablate.evals.core import offline

    with offline():
        assert datasets.config.HF_HUB_OFFLINE is True and os.environ["HF_DATASETS_OFFLINE"] == "1"
    assert "HF_DATASETS_OFFLINE" not in os.environ
    assert len(files) == 1 and files[0].name.startswith("000000000000512-")
    result = json.loads(files[0].read_text())
    assert result["tokens"] == 512 and result["tasks"] == TASKS and result["limit"] == 4
    assert 0.0 <= result["metrics"]["eval/rla_choice/acc"] <= 1.0
    assert 0.0 <= result["metrics"]["eval/rla_complete/exact_match"] <= 1.0
    assert "eval/rla_choice/acc" in out.out
    # The same request again reads the file (task order does not matter).
    assert main(["eval", str(job_dir), "--tasks", ",".join(reversed(TASKS)), "--limit", "4"]) == 0
    assert "already scored" in capsys.readouterr().out
    assert list((job_dir / "evals").glob("*.json")) == files
    # fewer examples than that scoring: a job trained outside a sweep has no run whose scores it could differ from
    assert main(["eval", str(job_dir), "--tasks", "rla_choice", "--limit", "2", "--batch-size", "1"]) == 0
    assert "not the MLflow run's" not in capsys.readouterr().err
    for extra in set((job_dir / "evals").glob("*.json")) - set(files):
        extra.unlink()


def test_export_loads_in_transformers_and_scores_the_same_through_lm_eval(job_dir, tmp_path, capsys):
    import lm_eval
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rla_ablate.evals.core import EvalRequest, flatten_results, offline, resolve_tasks
    from rla_ablate.train.checkpoint import load_latest

    out = tmp_path / "hf"
    assert main(["export", str(job_dir), str(out)]) == 0
    said = capsys.readouterr()
    assert f"({512:,} of {512:,} tokens)" in said.out and "has not finished" not in said.err
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "rla_sweep" and config["auto_map"]["AutoModelForCausalLM"].startswith("modeling_")
    assert (out / "modeling_rla_sweep.py").is_file() and (out / "tokenizer.json").is_file()
    # every file as readable as the process's umask makes new files (safetensors writes its weights 0600)
    mask = os.umask(0)
    os.umask(mask)
    assert {f.name: f.stat().st_mode & 0o777 for f in out.iterdir()} == {f.name: 0o666 & ~mask for f in out.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(out)
    # Byte ids, as in training; and the weights are the checkpoint's.
    assert tok("é\n").input_ids == [0xC3, 0xA9, 10] and tok.eos_token_id == 256
    _, state = load_latest(job_dir)
    assert torch.equal(model.model.embed.weight, state["model"]["embed.weight"])

    # lm-eval's `hf` model on the export scores as `rla-sweep eval` did on the checkpoint (scored here unless an
    # earlier test of the file did)
    ours = json.loads(_score(job_dir)[0].read_text())["metrics"]
    tm, tasks, local = resolve_tasks(EvalRequest(tasks=TASKS))
    assert local
    with offline(local):
        results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={out},trust_remote_code=True",
                                          tasks=tasks, task_manager=tm, limit=4, batch_size=1, device="cpu",
                                          bootstrap_iters=0)
    assert flatten_results(results) == pytest.approx(ours)
    # a job not trained to its budget is exported with a note saying so
    unfinished = tmp_path / "unfinished"
    shutil.copytree(job_dir, unfinished)
    spec = json.loads((unfinished / "job.json").read_text())
    spec["train"]["tokens"] = 1024
    (unfinished / "job.json").write_text(json.dumps(spec))
    assert main(["export", str(unfinished), str(tmp_path / "hf2")]) == 0
    assert "note: the job has not finished: it exported its last checkpoint, at 512 of 1,024 tokens" in capsys.readouterr().err


def test_bad_task_missing_checkpoint_and_bad_checkpoint_are_user_errors(job_dir, tmp_path, capsys):
    assert main(["eval", str(job_dir), "--tasks", "rla_chioce", "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert "unknown task(s) 'rla_chioce' (did you mean rla_choice" in err and "allowed:" in err
    assert "Traceback" not in err
    for none in ("", ",", " , "):
        assert main(["eval", str(job_dir), "--tasks", none]) == 2
        assert f"--tasks: names no task (got {none!r}); give lm-eval task names" in capsys.readouterr().err
    empty = tmp_path / "untrained"
    empty.mkdir()
    (empty / "job.json").write_text((job_dir / "job.json").read_text())
    assert main(["eval", str(empty), "--tasks", "rla_choice"]) == 2
    assert "no checkpoint in" in capsys.readouterr().err
    # a finished run whose checkpoints were deleted: not "train it first" (`train` refuses a finished record)
    (empty / "metrics.jsonl").write_text((job_dir / "metrics.jsonl").read_text())
    assert main(["eval", str(empty), "--tasks", "rla_choice"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{empty} holds a finished run whose checkpoints are gone: there is no model to score; to train it " \
        f"again, move {empty / 'metrics.jsonl'} away first" in err, err
    assert main(["eval", str(job_dir), "--tasks", "rla_choice", "--checkpoint", "100"]) == 2
    assert "allowed: 256, 512" in capsys.readouterr().err
    assert main(["export", str(tmp_path), str(tmp_path / "x")]) == 2
    assert "not a job folder" in capsys.readouterr().err
    (tmp_path / "swept").mkdir()   # a sweep's folder named as a job's: its name is what eval takes
    (tmp_path / "swept" / "jobs.json").write_text("[]")
    assert main(["eval", str(tmp_path / "swept"), "--tasks", "rla_choice"]) == 2
    assert (f"{tmp_path / 'swept'} is a sweep's folder; give its name to score its finished jobs: `rla-sweep eval "
            f"swept --root {tmp_path} --tasks ...`") in capsys.readouterr().err
    # a job id as `status` shows it (8 of its 12 characters), and a folder that does not exist
    full = tmp_path / "jobs" / "0123456789ab"
    full.mkdir(parents=True)
    (full / "job.json").write_text((job_dir / "job.json").read_text())
    prefix = full.parent / "01234567"
    for argv in (["export", str(prefix), str(tmp_path / "x")], ["eval", str(prefix), "--tasks", "rla_choice"]):
        assert main(argv) == 2
        assert f"{prefix} does not exist; did you mean {full}?" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nope" / "x"), "--tasks", "rla_choice"]) == 2
    assert capsys.readouterr().err.endswith(f"{tmp_path / 'nope' / 'x'} does not exist\n")
    assert main(["eval", "no-such-sweep", "--tasks", "rla_choice", "--root", str(tmp_path)]) == 2
    assert "no sweep 'no-such-sweep'" in capsys.readouterr().err
    assert main(["eval", str(job_dir), "--tasks", "rla_choice", "--limit", "0"]) == 2  # what was given, as elsewhere
    assert "--limit: Input should be greater than 0 (got 0)" in capsys.readouterr().err
    # A torn newest checkpoint, one of another model, a corrupt job.json: exit 2 naming the file, nothing written
    import shutil as sh

    from rla_ablate.models import load_preset
    from rla_ablate.train import JobConfig

    torn = tmp_path / "torn"
    sh.copytree(job_dir, torn, ignore=sh.ignore_patterns("evals"))
    newest = sorted((torn / "checkpoints").glob("ckpt-*.pt"))[-1]
    newest.write_bytes(newest.read_bytes()[:5000])
    for argv in (["eval", str(torn), "--tasks", "rla_choice"], ["export", str(torn), str(tmp_path / "out1")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"the newest checkpoint, {newest}, is unreadable" in err and "--checkpoint TOKENS (256)" in err, err
    assert main(["eval", str(torn), "--tasks", "rla_choice", "--checkpoint", "512"]) == 2
    assert f"{newest} does not load" in capsys.readouterr().err
    other = tmp_path / "other"
    sh.copytree(job_dir, other, ignore=sh.ignore_patterns("evals"))
    job = JobConfig.model_validate_json((other / "job.json").read_text())
    wider = job.model_copy(update={"model": load_preset("tiny-rla").replace(vocab_size=257, **{**TINY, "hidden_size": 48})})
    (other / "job.json").write_text(wider.model_dump_json())
    for argv in (["eval", str(other), "--tasks", "rla_choice"], ["export", str(other), str(tmp_path / "out2")]):
        assert main(argv) == 2
        assert "does not hold the model of" in capsys.readouterr().err
    (other / "job.json").write_text("{not json")
    assert main(["eval", str(other), "--tasks", "rla_choice"]) == 2
    assert "job.json is not a job config rla-sweep wrote" in capsys.readouterr().err
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()
    # a task file whose data file is missing
    tasks = tmp_path / "badtasks"
    tasks.mkdir()
    shipped = (REPO / "rla_ablate" / "evals" / "tasks" / "rla_choice.yaml").read_text()
    (tasks / "broken.yaml").write_text(shipped.replace("task: rla_choice", "task: broken")
                                       .replace("rla_choice.jsonl", "missing.jsonl"))
    before = sorted(job_dir.glob("evals/*"))
    assert main(["eval", str(job_dir), "--tasks", "broken", "--include-path", str(tasks), "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert "--tasks: a task's data could not be read" in err and "missing.jsonl" in err and "Traceback" not in err
    assert sorted(job_dir.glob("evals/*")) == before
    # a task on the Hub, offline, with its data in no cache (as lm-eval's own tasks on a compute node): datasets
    # raises ConnectionError, which was a traceback
    import datasets.config
    import huggingface_hub.constants

    (tasks / "hubonly.yaml").write_text(shipped.replace("task: rla_choice", "task: hubonly").replace(
        "dataset_path: json", "dataset_path: rla-sweep-tests/no-such-dataset").replace("    test: rla_choice.jsonl\n", "")
        .replace("dataset_kwargs:\n  data_files:\n", ""))
    with pytest.MonkeyPatch.context() as mp:
        for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
            mp.setenv(name, "1")
        mp.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        assert main(["eval", str(job_dir), "--tasks", "hubonly", "--include-path", str(tasks), "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert "--tasks: a task's data is not in this machine's Hugging Face cache and the Hub cannot be reached" in err
    assert "rla-sweep-tests/no-such-dataset" in err and "Traceback" not in err, err
    assert sorted(job_dir.glob("evals/*")) == before
    assert not list(torn.glob("evals/*")) and not list(other.glob("evals/*"))
    # a task folder that does not exist is said also where the result is cached (rla_choice was scored above)
    assert main(["eval", str(job_dir), "--tasks", "rla_choice", "--include-path", str(tmp_path / "nodir")]) == 2
    assert "--include-path: no such folder" in capsys.readouterr().err
    assert main(["eval", str(job_dir), "--tasks", "rla_choice", "--include-path", str(tasks / "broken.yaml")]) == 2
    assert "--include-path: " + str(tasks / "broken.yaml") + " is a file, not a folder" in capsys.readouterr().err
    # a task file that does not parse: lm-eval skips it, so its task is only unknown; the error names the file
    (tasks / "torn.yaml").write_text("task: torn\ndataset_path: json\ndoc_to_text: [unclosed\n")
    assert main(["eval", str(job_dir), "--tasks", "torn", "--include-path", str(tasks), "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert "unknown task(s) 'torn'" in err and f"these task files do not parse, so lm-eval skipped them: {tasks / 'torn.yaml'}:4" in err, err
    # a task named as one of the job's eval sets: both would log eval/rla_choice/* into its run
    clash = tmp_path / "clash"
    sh.copytree(job_dir, clash, ignore=sh.ignore_patterns("evals"))
    job = JobConfig.model_validate_json((clash / "job.json").read_text())
    renamed = [e.model_copy(update={"name": "rla_choice"}) for e in job.eval[:1]] + list(job.eval[1:])
    (clash / "job.json").write_text(job.model_copy(update={"eval": renamed}).model_dump_json())
    assert main(["eval", str(clash), "--tasks", "rla_choice"]) == 2
    assert "task 'rla_choice' has the name of one of the job's eval sets" in capsys.readouterr().err
    assert not list(clash.glob("evals/*"))


def test_sweep_evals_stage_reaches_mlflow_and_table5_and_is_not_rescored(tmp_path):
    sweep = {"name": "evals-e2e", "models": [{"preset": "tiny-rla", "overrides": TINY}],
             "base": {"train": TRAIN, "data": {"kind": "stdlib"}, "eval": EVAL},
             "resources": {"cpus": 1, "retries": 0},
             "evals": {"tasks": TASKS, "limit": 4, "batch_size": 2}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    root = tmp_path / "runs"
    cmd = [sys.executable, "-m", "rla_ablate.cli", "launch", str(path), "--root", str(root)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "evals: 1 job(s) scored" in out.stdout
    (job,) = json.loads((root / "evals-e2e" / "jobs.json").read_text())
    (scored,) = (root / "evals-e2e" / "jobs" / job["job_id"] / "evals").glob("*.json")
    acc = json.loads(scored.read_text())["metrics"]["eval/rla_choice/acc"]

    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{root / 'evals-e2e' / 'mlflow' / 'mlflow.db'}"
    run_id = json.loads((scored.parent.parent / "status.json").read_text())["mlflow_run_id"]
    (metric,) = MlflowClient(store).get_metric_history(run_id, "eval/rla_choice/acc")
    assert metric.value == acc and metric.step == 512
    assert MlflowClient(store).get_metric_history(run_id, "eval/rla_complete/exact_match")
    # `results` exports every task metric, not only the eval sets' loss, ppl and acc
    csv = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "results", "evals-e2e", "--root", str(root), "--csv"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    header = csv.stdout.splitlines()[0].split(",")
    assert {"eval/rla_choice/acc", "eval/rla_complete/exact_match", "eval/val/loss"} <= set(header), header
    # `rla-sweep eval SWEEP` names each job (the stage's scores are read back, not computed again)
    again = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "eval", "evals-e2e", "--root", str(root),
                            "--tasks", ",".join(TASKS), "--limit", "4"], cwd=REPO, capture_output=True, text=True,
                           timeout=300, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"tiny-rla/seed0 ({job['job_id'][:8]}): " in again.stdout and "already scored" in again.stdout
    assert "[1/1] tiny-rla/seed0: already scored" in again.stderr, again.stderr
    # A quicker check on fewer examples is printed and kept in its file, not logged over the stage's scores
    check = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "eval", "evals-e2e", "--root", str(root),
                            "--tasks", "rla_choice", "--limit", "2"], cwd=REPO, capture_output=True, text=True,
                           timeout=300, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "not the MLflow run's: it keeps those of " + scored.name in check.stderr, check.stderr
    # one line a job with the time left (none here: the last job), not lm-eval's progress bars
    assert "[1/1] tiny-rla/seed0: scored in " in check.stderr and "it/s]" not in check.stderr, check.stderr
    assert [m.value for m in MlflowClient(store).get_metric_history(run_id, "eval/rla_choice/acc")] == [acc]

    from rla_ablate.dashboard.build import build_dashboard

    # Only the committed Table 5 spec (rendering all of them takes longer than the rest of the test), narrowed to
    # this sweep's one model and without its claims: a spec is drawn only where the sweep has the runs it compares.
    specs = tmp_path / "specs"
    specs.mkdir()
    spec = yaml.safe_load((REPO / "dashboards" / "table5_output_gates.yaml").read_text())
    spec.pop("claims")
    spec["runs"] = {"family": "rla"}
    (specs / "table5_output_gates.yaml").write_text(yaml.safe_dump(spec))
    dash = build_dashboard("evals-e2e", root, specs_dir=specs, tracking_uri=store, log_artifacts=False)
    (table,) = dash.rendered
    assert table.header[1] == "acc (rla_choice) ↑" and not table.fallbacks  # higher is better; the task named
    assert table.rows[0][1].text.startswith(f"{acc:.3f}")

    # A relaunch trains nothing and scores nothing: the file is keyed by tasks, limit and checkpoint.
    mtime = scored.stat().st_mtime_ns
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "evals: 0 job(s) scored" in again.stdout and "1 already scored" in again.stdout
    assert scored.stat().st_mtime_ns == mtime

    # A task lm-eval does not know, in another file of the sweep: refused at its line before the launch writes
    # anything, so the sweep's saved file and metadata stay those of its last good launch (and `resume` works).
    saved = {f: (root / "evals-e2e" / f).read_bytes() for f in ("sweep.yaml", "sweep.json")}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**sweep, "evals": {**sweep["evals"], "tasks": ["rla_choise"]}}, sort_keys=False))
    refused = subprocess.run([*cmd[:4], str(bad), *cmd[5:]], cwd=REPO, capture_output=True, text=True, timeout=900,
                             env=env)
    line = next(i for i, text in enumerate(bad.read_text().splitlines(), 1) if text.strip() == "tasks:")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"bad.yaml:{line}: evals.tasks: unknown task(s) 'rla_choise' (did you mean" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert {f: (root / "evals-e2e" / f).read_bytes() for f in saved} == saved


def test_sweep_evals_section_is_checked_at_its_line(tmp_path):
    from rla_ablate.errors import UserError
    from rla_ablate.evals import EvalRequest
    from rla_ablate.sweep.expand import load_sweep

    base = {"name": "s", "models": [{"preset": "tiny-rla"}]}
    for evals, says in (({"tasks": ["a", "a"]}, "names a more than once"), ({"taks": ["a"]}, "taks"), ({"tasks": []}, "tasks")):
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump({**base, "evals": evals}, sort_keys=False))
        with pytest.raises(UserError, match=says) as err:
            load_sweep(path)
        assert "s.yaml:" in str(err.value) and "evals" in str(err.value)
    # a task folder that does not exist: `plan` says so at its line (a task name is resolved there too)
    path.write_text(yaml.safe_dump({**base, "evals": {"tasks": ["rla_choice"], "include_path": ["no-such"]}},
                                   sort_keys=False))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "include_path" in text)
    with pytest.raises(UserError, match=f"s.yaml:{line}: evals.include_path: no such folder: .*no-such"):
        from rla_ablate.sweep.launch import check_evals

        check_evals(load_sweep(path))
    from rla_ablate.cli import main

    assert main(["plan", str(path)]) == 2
    # an eval set named as a task: both would log eval/<name>/* into each run, one over the other
    val = {"name": "rla_choice", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 4096}
    path.write_text(yaml.safe_dump({**base, "base": {"eval": [{**val, "name": "val"}, val]},
                                    "evals": {"tasks": ["rla_choice"]}}, sort_keys=False))
    line = [i for i, text in enumerate(path.read_text().splitlines(), 1) if "name: rla_choice" in text][0]
    with pytest.raises(UserError, match=f"s.yaml:{line}: base.eval.1.name: the eval set 'rla_choice' and the evals "
                                        "task 'rla_choice' would both log"):
        check_evals(load_sweep(path))
    assert main(["plan", str(path)]) == 2
    # The result file's key: task order does not matter, the limit does.
    assert EvalRequest(tasks=["a", "b"]).key() == EvalRequest(tasks=["b", "a"], batch_size=2).key()
    assert EvalRequest(tasks=["a", "b"]).key() != EvalRequest(tasks=["a", "b"], limit=4).key()


def test_without_lm_eval_installed_eval_and_a_sweeps_evals_say_what_to_install(job_dir, tmp_path, capsys,
                                                                               monkeypatch):
    """An environment without lm-eval (a partial install): `eval` and a sweep file's `evals:` name the package
    and its pinned version at exit 2, not an import traceback; a scoring already on disk is still read."""
    import importlib.util
    import sys

    from rla_ablate.cli import main
    from rla_ablate.errors import UserError
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.sweep.launch import check_evals

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else find_spec(name, *a))
    assert main(["eval", str(job_dir), "--tasks", "rla_complete", "--limit", "3"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"--tasks: scoring tasks needs lm-evaluation-harness, which this Python ({sys.executable}) does not "
            f"have: `{sys.executable} -m pip install 'lm-eval[hf]==0.4.13'`") in err, err
    assert "Traceback" not in err
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "models": [{"preset": "tiny-rla"}],
                                    "evals": {"tasks": ["rla_choice"]}}, sort_keys=False))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "tasks" in text)
    with pytest.raises(UserError, match=f"s.yaml:{line}: evals.tasks: scoring tasks needs lm-evaluation-harness"):
        check_evals(load_sweep(path))


def test_fig3b_reads_task_accuracy_by_category_when_present(tmp_path):
    from rla_ablate.dashboard.render import render
    from rla_ablate.dashboard.spec import load_spec
    from rla_ablate.tracking.read import RunRecord, SweepRuns

    # RLA with independent γ scores 0.05 higher on piqa and 0.02 higher on lambada than tied γ, on both seeds.
    acc = {("none", "piqa"): 0.60, ("tied_gamma", "piqa"): 0.55, ("none", "lambada_openai"): 0.42,
           ("tied_gamma", "lambada_openai"): 0.40}
    runs = SweepRuns.__new__(SweepRuns)
    runs.tracking_uri, runs.sweep, runs.client, runs.parent, runs._history = "", "s", None, None, {}
    runs.jobs = []
    for ablation in ("none", "tied_gamma"):
        for seed in (0, 1):
            metrics = {f"eval/{task}/acc": v + 0.001 * seed for (a, task), v in acc.items() if a == ablation}
            # The training eval set's argmax accuracy is no task: it belongs to no category and is left out.
            metrics.update({"eval/val/acc": 0.3, "eval/val/loss": 2.0})
            tags = {"family": "rla", "ablations": ablation, "seed": str(seed), "series": f"rla-{ablation}",
                    "job_id": f"{ablation}{seed}", "mlflow.runName": f"{ablation}-{seed}"}
            runs.jobs.append(RunRecord(f"{ablation}{seed}", "0", "finished", tags, {}, metrics))
    spec = load_spec(REPO / "dashboards" / "fig3b_gains_by_category.yaml")
    out = render(spec, runs, tmp_path)
    assert not out.fallbacks and not any("could not render" in n for n in out.notes), out.notes
    svg = (tmp_path / "fig3b_gains_by_category.svg").read_text()
    assert "+0.050" in svg and "+0.020" in svg and "Reasoning" in svg and "Understanding" in svg
    assert "FALLBACK" not in svg and "(val)" not in svg


def test_hf_tokenizer_matches_the_jobs_data_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from rla_ablate.data.config import MQARData, NIAHData, TextData
    from rla_ablate.data.tokenizer import ByteTokenizer, JsonTokenizer
    from rla_ablate.errors import UserError
    from rla_ablate.evals.core import hf_tokenizer

    text = "def f(x):\n    return x + 1  # é\n"
    (tmp_path / "a.txt").write_text(text * 3)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([text * 3], trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "</s>"]))
    tok.save(str(tmp_path / "tok.json"))
    json_cfg = TextData(path=tmp_path, tokenizer=tmp_path / "tok.json")
    ours = JsonTokenizer(tmp_path / "tok.json")
    for cfg, reference in ((json_cfg, ours), (NIAHData(haystack=json_cfg), ours), (TextData(path=tmp_path), ByteTokenizer())):
        fast = hf_tokenizer(cfg)
        assert fast(text, add_special_tokens=False).input_ids == reference.encode(text).tolist()
        assert fast.eos_token_id == reference.eos_id == fast.pad_token_id
    with pytest.raises(UserError, match="MQAR"):
        hf_tokenizer(MQARData())


def test_the_run_keeps_the_most_complete_scoring_and_an_unfinished_job_is_noted(tmp_path, capsys, monkeypatch):
    """Per metric and checkpoint, a scoring on more examples (none: all) holds the MLflow run's value, whichever
    ran last; scoring a job folder before its training ended says so."""
    from rla_ablate.commands.eval import _note_unfinished
    from rla_ablate.evals.core import EvalResult, kept_by_more_complete
    from rla_ablate.models import load_preset
    from rla_ablate.train import JobConfig

    evals = tmp_path / "evals"
    evals.mkdir()

    def result(limit, tokens=512, tasks=("a", "b")):
        return EvalResult(tasks=list(tasks), limit=limit, tokens=tokens, checkpoint="c",
                          metrics={f"eval/{t}/acc": 0.5 for t in tasks})

    (evals / f"{512:015d}-full.json").write_text(result(None, tasks=("a",)).model_dump_json())
    (evals / f"{512:015d}-l100.json").write_text(result(100).model_dump_json())
    (evals / f"{256:015d}-old.json").write_text(result(None).model_dump_json())   # another checkpoint
    assert kept_by_more_complete(tmp_path, result(4)) == {"eval/a/acc": f"{512:015d}-full.json",
                                                          "eval/b/acc": f"{512:015d}-l100.json"}
    assert kept_by_more_complete(tmp_path, result(100)) == {"eval/a/acc": f"{512:015d}-full.json"}
    assert kept_by_more_complete(tmp_path, result(None)) == {}
    assert kept_by_more_complete(tmp_path, result(4, tokens=1024)) == {}
    # a task's examples count stays with its scores, also where the more complete file predates the count
    counted = result(4)
    counted.metrics.update({"eval/a/examples": 4.0, "eval/b/examples": 4.0})
    assert kept_by_more_complete(tmp_path, counted) == {
        "eval/a/acc": f"{512:015d}-full.json", "eval/b/acc": f"{512:015d}-l100.json",
        "eval/a/examples": f"{512:015d}-full.json", "eval/b/examples": f"{512:015d}-l100.json"}

    job = JobConfig.model_validate({"model": load_preset("tiny-rla").replace(vocab_size=257, **TINY).model_dump(),
                                    "train": {**TRAIN, "tokens": 1000}, "data": {"kind": "stdlib"}, "eval": EVAL})
    (tmp_path / "job.json").write_text(job.model_dump_json())
    _note_unfinished(tmp_path, result(None, tokens=512), None)
    err = capsys.readouterr().err
    assert "the job has not finished: this scored its last checkpoint, at 512 of 1,024 tokens; resume it" in err, err
    # a search trial its pruner stopped ends at its checkpoint: no resume advice
    (tmp_path / "status.json").write_text(json.dumps({"status": "cancelled", "cause": "pruned"}))
    _note_unfinished(tmp_path, result(None, tokens=512), None)
    err = capsys.readouterr().err
    assert "a search trial that its pruner stopped at 512 of 1,024 tokens; this scored its last checkpoint" in err, err
    assert "resume" not in err, err
    # a run made again (a lost tracking store) gets each scoring's values as that scoring logged them
    from mlflow.tracking import MlflowClient

    from rla_ablate.evals.core import log_results_again

    (evals / f"{512:015d}-l100.json").write_text(result(100).model_copy(update={"metrics": {
        "eval/a/acc": 0.25, "eval/b/acc": 0.75}}).model_dump_json())
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    client = MlflowClient(uri)
    monkeypatch.chdir(tmp_path)  # an SQLite store keeps its experiments' artifacts under ./mlruns
    run = client.create_run(client.create_experiment("again"))
    # full: a; l100: b (its a kept by full's); "old" (a full scoring at 512 too): a and b
    assert log_results_again(tmp_path, uri, run.info.run_id) == 1 + 1 + 2
    history = {k: sorted(m.value for m in client.get_metric_history(run.info.run_id, k))
               for k in ("eval/a/acc", "eval/b/acc")}
    assert history == {"eval/a/acc": [0.5, 0.5], "eval/b/acc": [0.5, 0.75]}  # l100's a (0.25) never logged
    capsys.readouterr()  # MLflow's notes on making the store
    for tokens, checkpoint in ((1024, None), (512, 512)):   # finished; or a checkpoint asked for by name
        _note_unfinished(tmp_path, result(None, tokens=tokens), checkpoint)
        assert capsys.readouterr().err == ""


def test_a_launch_whose_evals_stopped_fails_and_asks_for_the_tasks_to_be_fixed():
    """The evals stage stopping (a task's data missing) fails the launch after its runs are closed; with every job
    trained, resuming the jobs is not the remedy."""
    from rla_ablate.commands.launch import exit_code
    from rla_ablate.outcome import Status
    from rla_ablate.sweep.summary import LaunchSummary

    done = LaunchSummary(sweep="s", counts={Status.FINISHED: 2})
    assert done.ok and exit_code(done) == 0
    stopped = LaunchSummary(sweep="s", counts={Status.FINISHED: 2}, evals_error="UserError: no data")
    assert not stopped.ok and not stopped.resume_helps and exit_code(stopped) == 1
    partial = LaunchSummary(sweep="s", counts={Status.FINISHED: 1, Status.FAILED: 1}, evals_error="x")
    assert partial.resume_helps


def test_lm_eval_asks_no_git_and_its_instance_warning_is_dropped(caplog):
    """Outside a git checkout lm-eval's commit probe printed `fatal: not a git repository` once per scored job;
    and it warns on every model instance, which is how rla-sweep always passes one. Both only while scoring."""
    import logging

    import lm_eval.evaluator as evaluator

    from rla_ablate.evals.core import lm_eval_quirks

    probe = evaluator.get_git_commit_hash
    log = logging.getLogger("lm_eval.models.huggingface")
    with caplog.at_level(logging.WARNING, logger="lm_eval.models.huggingface"):
        with lm_eval_quirks():
            assert evaluator.get_git_commit_hash() is None
            log.warning("`pretrained` model kwarg is not of type `str`. Many other model arguments may be ignored.")
            log.warning("Passed an already-initialized model through `pretrained`, assuming single-process call to "
                        "evaluate() or custom distributed integration")
            log.warning("another warning")
        log.warning("`pretrained` model kwarg is not of type `str` (after)")
    assert evaluator.get_git_commit_hash is probe
    assert [r.getMessage() for r in caplog.records] == ["another warning",
                                                       "`pretrained` model kwarg is not of type `str` (after)"]


def test_eval_of_a_sweep_without_a_finished_job_says_so_and_exits_1(tmp_path, capsys):
    """`eval SWEEP` ends on a line of how many jobs have scores and why the others have none; with none scored it
    exits 1, so that a script does not go on as if the sweep had been scored."""
    from rla_ablate.sweep.state import SweepDir

    from rla_ablate.outcome import Cause, Status

    sdir = SweepDir(tmp_path, "unfinished")
    sdir.path.mkdir(parents=True)
    sdir.write_job_list([{"job_id": "a" * 16, "name": "tiny-rla/seed0"}, {"job_id": "b" * 16, "name": "trial-001"}])
    sdir.job_dir("b" * 16).mkdir(parents=True)
    sdir.set_status("b" * 16, status=Status.CANCELLED, cause=Cause.PRUNED, error="pruned by Optuna (trial 1)")
    assert main(["eval", "unfinished", "--tasks", "rla_choice", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "tiny-rla/seed0: pending, not scored" in err, err
    # a pruned trial is not sent to `resume`, which would not train it
    assert (f"eval unfinished: 0 of 2 jobs scored; 1 pruned by Optuna, not scored; 1 not finished, not scored: "
            f"`rla-sweep resume unfinished --root {tmp_path}` trains them, then eval again") in err, err
    # the sweep's file names it, as for status and results (it was taken for a job folder)
    (tmp_path / "unfinished.yaml").write_text("name: unfinished\n")
    assert main(["eval", str(tmp_path / "unfinished.yaml"), "--tasks", "rla_choice", "--root", str(tmp_path)]) == 1
    assert "eval unfinished: 0 of 2 jobs scored" in capsys.readouterr().err


def test_task_files_that_changed_score_again_and_a_task_without_scores_saves_nothing(job_dir, tmp_path, capsys):
    """A result is read back only for the task files it was scored with: a task's data edited (or another folder
    with a task of that name) scores again. A task whose metric lm-eval does not know returns no score: exit 2, no
    file (it would be read back as 'already scored'). Each scored task records its examples count."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shipped = REPO / "rla_ablate" / "evals" / "tasks"
    text = (shipped / "rla_choice.yaml").read_text().replace("task: rla_choice", "task: mine")
    (tasks / "mine.yaml").write_text(text.replace("rla_choice.jsonl", "mine.jsonl"))
    shutil.copy(shipped / "rla_choice.jsonl", tasks / "mine.jsonl")
    argv = ["eval", str(job_dir), "--tasks", "mine", "--include-path", str(tasks), "--limit", "3", "--batch-size", "1"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "scored in" in out.out and "  eval/mine/examples = 3\n" in out.out
    (path,) = [p for p in (job_dir / "evals").glob("*.json") if json.loads(p.read_text())["tasks"] == ["mine"]]
    first = json.loads(path.read_text())
    assert first["metrics"]["eval/mine/examples"] == 3 and len(first["definitions"]) == 16
    assert main(argv) == 0 and "already scored" in capsys.readouterr().out
    # the task's data edited: scored again, with a note, the file replaced
    lines = (tasks / "mine.jsonl").read_text().splitlines()
    (tasks / "mine.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "scored in" in out.out and "the task files (shipped or in --include-path) differ from those" in out.err
    assert json.loads(path.read_text())["definitions"] != first["definitions"]
    # a metric lm-eval does not know: no score, nothing saved
    (tasks / "mine.yaml").write_text(text.replace("task: rla_choice", "task: mine").replace("rla_choice.jsonl",
                                     "mine.jsonl").replace("metric: acc_norm", "metric: accuracyy").replace(
                                     "metric: acc\n", "metric: accuracyyy\n"))
    before = sorted((job_dir / "evals").glob("*.json"))
    assert main([*argv, "--force"]) == 2
    err = capsys.readouterr().err
    assert "--tasks: lm-eval returned no score for task(s) mine: a metric a task's YAML names" in err
    assert "Nothing was saved" in err and "Traceback" not in err
    assert sorted((job_dir / "evals").glob("*.json")) == before
    path.unlink()


def test_a_sweep_job_folder_copied_out_of_its_sweep_is_scored_without_its_run(job_dir, tmp_path, capsys):
    """A sweep job's folder copied elsewhere (its status.json still names its MLflow run): scored, the scores in its
    evals/, a note that the run was not updated; no MLflow store is made beside the copy."""
    copy = tmp_path / "some place" / "job copy"
    shutil.copytree(job_dir, copy, ignore=shutil.ignore_patterns("evals"))
    (copy / "status.json").write_text(json.dumps({"status": "finished", "mlflow_run_id": "0123456789abcdef"}))
    assert main(["eval", str(copy), "--tasks", "rla_choice", "--limit", "2", "--batch-size", "1"]) == 0
    said = capsys.readouterr()
    assert "scored in" in said.out and "Traceback" not in said.err
    assert f"note: {copy} is not in its sweep's folder (copied or moved: no sweep.json two levels up), so its MLflow " \
           "run 01234567 was not updated" in said.err
    assert len(list((copy / "evals").glob("*.json"))) == 1
    assert not any(p.name in ("mlflow", "mlflow.db") for p in tmp_path.rglob("*"))
