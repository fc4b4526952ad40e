"""Sweep files: every committed one validates and plans; expansion is deterministic; bad files give exit 2 with
file, line and key (through the real CLI entry point); no Ray, no MLflow, no training here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from rla_ablate.cli import main
from rla_ablate.errors import UserError
from rla_ablate.sweep.expand import load_sweep
from rla_ablate.sweep.ids import job_id

REPO = Path(__file__).resolve().parents[1]
SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
JOB_KEYS = {"job_id", "name", "family", "ablations", "control", "params", "state_elements", "flops_per_token", "tokens",
            "gpu_hours", "mem_gib", "mem_glue", "cuda_graphs", "mem_graph_pool_gib", "gpu_share", "tokens_per_s",
            "cost_source", "control_report"}


def test_committed_sweeps_exist():
    names = {p.name for p in SWEEPS}
    assert {"ablations.yaml", "smoke.yaml", "matched-budget.yaml", "search-example.yaml"} <= names


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_committed_sweep_plans(path, capsys):
    assert main(["plan", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"jobs", "totals"}
    assert doc["jobs"], "a sweep with no jobs"
    for row in doc["jobs"]:
        assert set(row) == JOB_KEYS
        assert row["family"] in ("transformer", "sgla", "gdn", "rla", "rdn")
        assert row["params"] > 0 and row["state_elements"] > 0 and row["flops_per_token"] > 0
        assert row["mem_gib"] > 0 and row["tokens_per_s"] > 0 and row["cost_source"]
        assert row["gpu_hours"] == pytest.approx(row["tokens"] / row["tokens_per_s"] / 3600, rel=1e-3)
        # a graphed job's estimate holds its graph's pool; an eager one's none
        assert (row["mem_graph_pool_gib"] > 0) == row["cuda_graphs"]
    graphed = yaml.safe_load(path.read_text()).get("base", {}).get("train", {}).get("cuda_graphs", False)
    assert all(r["cuda_graphs"] == graphed for r in doc["jobs"])
    ids = [r["job_id"] for r in doc["jobs"]]
    assert len(set(ids)) == len(ids)
    names = [r["name"] for r in doc["jobs"]]
    assert len(set(names)) == len(names)
    assert doc["totals"]["tokens"] >= sum(r["tokens"] for r in doc["jobs"])
    on_cpu = yaml.safe_load(path.read_text()).get("resources", {}).get("gpus", 0) == 0
    assert doc["totals"]["runs_on"] == ("cpu" if on_cpu else "gpu")
    assert main(["plan", str(path)]) == 0
    # A CPU sweep's plan does not pass the GPU's numbers off as its own.
    title = capsys.readouterr().out
    assert ("on the CPU (resources.gpus: 0)" in title) == on_cpu and ("peak memory up to" in title) != on_cpu
    assert ("replay CUDA graphs" in " ".join(title.split())) == graphed


def test_plan_says_what_a_launch_on_this_machine_would_refuse(tmp_path, capsys):
    """A sweep asking for more CPUs than this machine has plans (it may be meant for a cluster), and the plan says
    that a launch here stops, at which key, as the launch would."""
    text = (REPO / "sweeps" / "smoke.yaml").read_text()
    sweep = yaml.safe_load(text)
    sweep["resources"] = dict(sweep.get("resources") or {}, cpus=(os.cpu_count() or 1) + 1)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert main(["plan", str(path)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (f"a launch on this machine stops at resources.cpus: each job asks for {(os.cpu_count() or 1) + 1} CPUs "
            f"but this machine has {os.cpu_count()}; `launch --address` of a Ray cluster that has them runs it") in said
    assert main(["plan", str(REPO / "sweeps" / "smoke.yaml")]) == 0
    assert "a launch on this machine stops" not in capsys.readouterr().out
    # jobs that need CUDA, where there is no GPU: the launch refuses them, and so the plan says
    sweep = yaml.safe_load(text)
    sweep["base"].setdefault("train", {})["device"] = "cuda"
    sweep["resources"] = dict(sweep.get("resources") or {}, gpus="auto")
    path.write_text(yaml.safe_dump(sweep))
    assert main(["plan", str(path)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    import torch

    if not torch.cuda.is_available():
        assert "a launch on this machine stops at train.device:" in said and "need CUDA" in said, said
        # a sweep for GPUs whose jobs may run on the CPU: a launch here trains them all there, and the plan says so
        sweep["base"]["train"]["device"] = "auto"
        path.write_text(yaml.safe_dump(sweep))
        assert main(["plan", str(path)]) == 0
        said = " ".join(capsys.readouterr().out.split())
        assert "this machine has no GPU: a launch here trains every job on the CPU" in said, said
        assert "a launch on a GPU of" not in said, said
        # a job no GPU of the table's size holds: what a launch on such a GPU refuses, said without one here
        sweep["models"] = [{"preset": "tiny-rla", "overrides": {"num_layers": 100_000_000}}]
        sweep["ablations"], sweep["controls"] = [], []
        path.write_text(yaml.safe_dump(sweep))
        assert main(["plan", str(path)]) == 0
        said = " ".join(capsys.readouterr().out.split())
        assert "stops at resources.gpus: job tiny-rla/seed0 needs an estimated" in said and "a launch on a GPU of" \
            in said, said


def test_plan_of_a_cpu_sweep_times_its_job_shapes_here(capsys):
    """No calibration exists for CPUs: `plan` times each distinct job shape's step on this machine and estimates the
    sweep's time from it (never asserted: only its parts and how they add up)."""
    from rla_ablate.sweep.cputime import eval_tokens, shape_key

    sweep = load_sweep(REPO / "sweeps" / "smoke.yaml")
    job = sweep.jobs[0].job
    # 16 steps of 1,024 tokens, evaluated every 8 steps on 4,096 tokens: two evaluations
    assert eval_tokens(job) == 2 * 4096
    assert main(["plan", str(REPO / "sweeps" / "smoke.yaml"), "--json"]) == 0
    c = json.loads(capsys.readouterr().out)["totals"]["cpu_estimate"]
    shapes = {shape_key(j.job, 1) for j in sweep.jobs}
    assert c["shapes"] == len(shapes) and 1 <= c["timed_shapes"] <= c["shapes"]
    assert c["jobs_at_once"] == min(len(sweep.jobs), os.cpu_count() or 1)
    assert 0 < c["setup_seconds"] < c["job_seconds"] and c["job_seconds"] / c["jobs_at_once"] <= c["seconds"] + 1e-9
    assert c["seconds"] <= c["job_seconds"] + 1e-9
    assert main(["plan", str(REPO / "sweeps" / "smoke.yaml")]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "on the CPU (resources.gpus: 0): about" in said and "on this machine" in said, said
    assert "CPU time:" in said and "job shapes' step" in said, said


def test_ablation_suite_covers_the_paper():
    sweep = load_sweep(REPO / "sweeps" / "ablations.yaml")
    by = {(j.family, tuple(j.ablations)) for j in sweep.jobs}
    for fam in ("rla", "rdn"):
        for abl in ("no_fitting", "no_output_gates", "tied_gamma"):
            assert (fam, (abl,)) in by
    assert ("rla", ("no_clip_no_norm",)) in by and ("rdn", ("no_clip",)) in by
    assert ("sgla", ()) in by and ("gdn", ()) in by
    assert ("sgla", ("matched_state",)) in by and ("gdn", ("matched_state",)) in by
    assert all(j.job.train.tokens == 50_000_000_000 for j in sweep.jobs)
    assert {j.seed for j in sweep.jobs} == {0, 1, 2}
    from rla_ablate.models import state_elements_per_layer

    for j in sweep.jobs:
        if j.control_of:
            target = next(t for t in sweep.jobs if t.name == f"{j.control_of}/seed{j.seed}")
            assert state_elements_per_layer(j.job.model) == state_elements_per_layer(target.job.model)


def test_proxy_study_arms_tasks_and_controls():
    import math

    from rla_ablate.sweep.calibration import estimate_speed

    sweep = load_sweep(REPO / "sweeps" / "proxy-study.yaml")
    jobs = {j.name: j for j in sweep.jobs}
    assert {j.seed for j in sweep.jobs} == {0, 1, 2} and sweep.config.resources.gpus == "auto"
    # Each arm's own sections: MQAR arms train on MQAR (queries only) and score four difficulties; LM arms bytes.
    mqar, lm = jobs["mqar-rla/seed0"].job, jobs["lm-rla/seed0"].job
    assert mqar.data.kind == "mqar" and mqar.train.seq_len == 64 and mqar.train.lr == 1e-2
    # The Transformer arm has its own peak lr and shares the rest of the MQAR protocol.
    tf = jobs["mqar-transformer/seed0"].job
    assert tf.train.lr == 1e-3 and tf.train.tokens == mqar.train.tokens and tf.data == mqar.data
    assert [e.name for e in mqar.eval] == ["mqar_kv16", "mqar_kv8", "mqar_kv32", "mqar_kv48_t256"]
    assert mqar.train.precision == "bf16" and mqar.train.device == "cuda"   # shared keys the arm leaves alone
    assert lm.data.kind == "stdlib" and [e.name for e in lm.eval] == ["val"]
    # Ablations and controls inherit the arm's sections.
    assert jobs["mqar-rla/no_fitting/seed0"].job.data.kind == "mqar"
    assert jobs["mqar-rla/learned_beta_base/seed0"].job.model.beta == "learned"
    # The wall-clock budgets are pinned in the file (controls: speeds): the published study's jobs, whatever the
    # calibration table says now.
    speeds = {"rla": 165101, "sgla": 181000, "rdn": 150000, "gdn": 174000}
    for arm, base, residual in (("mqar-rla", "sgla", "rla"), ("lm-rdn", "gdn", "rdn")):
        control = jobs[f"{base}~matched_wallclock({arm})/seed0"]
        ref = jobs[f"{arm}/seed0"].job
        assert control.job.data == ref.data and control.job.model.family == base
        ratio = speeds[base] / speeds[residual]
        assert control.job.train.tokens == math.ceil(ref.train.tokens * ratio)
        # status and the progress lines count to the tokens it trains: its budget rounded up to whole batches
        batch = control.job.train.batch_tokens
        assert control.tokens_target % batch == 0 and 0 <= control.tokens_target - control.job.train.tokens < batch
        assert control.control_report["speed_ratio"] == pytest.approx(ratio)
        assert estimate_speed(control.job, 400.0).tokens_per_s != speeds[base]  # not the table's
    # the ids of docs/study/results.csv, controls included
    import csv

    published = {row["job_id"] for row in csv.DictReader((REPO / "docs" / "study" / "results.csv").open())}
    assert published == {j.job_id for j in sweep.jobs}


def test_arm_base_rejects_unknown_sections(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nmodels:\n  - {preset: tiny-rla, base: {model: {}}}\n")
    with pytest.raises(Exception, match="allowed: train, data, eval"):
        load_sweep(f)


def test_a_sweep_files_independent_problems_come_in_one_report(tmp_path):
    """A misspelt section, the base's problems and a misspelt swept model key are said together, each at its line
    and in the file's order (each had been a run of its own: the schema, then the grid, then the base, whose
    problems shared one line), the base's once for the two arms that share it; a wrong preset stands in for its
    arm's other checks."""
    f = tmp_path / "s.yaml"
    f.write_text("""name: s
models:
  - {preset: tiny-rla}
  - {preset: tiny-gdn}
seeds: [0]
colour: blue
base:
  train: {tokens: 8192, seq_len: 64, batch_tokens: 512, micro_batch_size: 4, lrr: 0.001}
  data: {kind: text, path: %s}
grid:
  model.hiden: [64]
""" % (tmp_path / "no-such-folder"))
    with pytest.raises(UserError) as err:
        load_sweep(f)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{f}: 4 problems"
    assert [ln.split(": ", 2)[:2] for ln in lines[1:]] == [
        [f"{f}:6", "colour"], [f"{f}:8", "base.train.lrr"], [f"{f}:9", "base.data.path"],
        [f"{f}:11", "grid.model.hiden"]]
    assert "did you mean 'lr'" in lines[2] and "did you mean 'hidden_size'" in lines[4]
    f.write_text(f.read_text().replace("colour: blue\n", "").replace("tiny-gdn", "tiny-gnd").replace(
        f"  data: {{kind: text, path: {tmp_path / 'no-such-folder'}}}\n", ""))
    with pytest.raises(UserError) as err:
        load_sweep(f)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{f}: 3 problems"
    assert [ln.split(": ", 2)[1] for ln in lines[1:]] == ["models.1.preset", "base.train.lrr", "grid.model.hiden"]
    # one problem is said as before, on one line
    f.write_text(f.read_text().replace("tiny-gnd", "tiny-gdn").replace(", lrr: 0.001", "").replace("hiden",
                                                                                                  "hidden_size"))
    assert len(load_sweep(f).jobs) == 2
    f.write_text(f.read_text().replace("[64]", "[-1]"))
    with pytest.raises(UserError) as err:
        load_sweep(f)
    assert len(str(err.value).splitlines()) == 1 and ":9: grid.model.hidden_size" in str(err.value)


def test_a_swept_keys_problem_is_said_at_its_own_line_beside_the_bases_and_the_sections_checks(tmp_path):
    """A misspelt zip or grid key beside the base's problems: each at its own line and section (the swept key's had
    been merged into one line, or said at the base's line as the base's key); an unknown ablation and an unknown
    control (a schema problem, which had hidden the rest) in the same report."""
    f = tmp_path / "s.yaml"
    base = """name: s
models:
  - {preset: tiny-rla}
base:
  train: {tokens: 65536, seq_len: 128, micro_batch_size: 8, batch_tokens: 1024, lrr: 1}
  data: {kind: stdlib, seq: 3}
seeds: [0]
"""
    for swept in ("zip:\n  train.warmup_tokns: [0, 128]\n", "grid:\n  data.sed: [1, 2]\n"):
        f.write_text(base + swept)
        with pytest.raises(UserError) as err:
            load_sweep(f)
        lines = str(err.value).splitlines()
        key = swept.split()[1].rstrip(":")
        assert [ln.split(": ", 2)[:2] for ln in lines[1:]] == [
            [f"{f}:5", "base.train.lrr"], [f"{f}:6", "base.data.seq"], [f"{f}:9", f"{swept.split(':')[0]}.{key}"]]
    f.write_text(base + "ablations: [no_fittting]\ncontrols: [matched_stat]\n")
    with pytest.raises(UserError) as err:
        load_sweep(f)
    assert [ln.split(": ", 2)[1] for ln in str(err.value).splitlines()[1:]] == [
        "base.train.lrr", "base.data.seq", "ablations.0", "controls.0"]


def test_a_search_metric_no_trial_logs_is_said_with_the_files_other_problems(tmp_path):
    """A misspelt search metric beside a misspelt section: one report (the metric had been checked after the whole
    expansion, a run after the others)."""
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nmodels: [{preset: tiny-rdn}]\ncolour: blue\nsearch:\n  params:\n"
                 "    train.lr: {type: float, low: 1.0e-4, high: 1.0e-2}\n  n_trials: 2\n  metric: eval/vall/loss\n")
    with pytest.raises(UserError) as err:
        load_sweep(f)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{f}: 2 problems", lines
    assert [ln.split(": ", 2)[:2] for ln in lines[1:]] == [[f"{f}:3", "colour"], [f"{f}:8", "search.metric"]]
    assert "did you mean 'eval/val/loss'" in lines[2]


def test_a_yaml_anchor_two_arms_share_is_one_problem_and_two_keys_of_a_line_two(tmp_path):
    """A base that two arms share through a YAML anchor is one line of the file: its problem is said once, at the
    first arm's key (it was said for each arm); two keys on one line with the same problem are still two."""
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nmodels:\n  - preset: tiny-rla\n    base: &b {train: {tokns: 65536, lrr: 1}}\n"
                 "  - preset: tiny-gdn\n    base: *b\nseeds: [0]\n")
    with pytest.raises(UserError) as err:
        load_sweep(f)
    assert [ln.split(": ", 2)[:2] for ln in str(err.value).splitlines()[1:]] == [
        [f"{f}:4", "models.0.base.train.tokns"], [f"{f}:4", "models.0.base.train.lrr"]]
    f.write_text("name: s\nmodels: [{preset: tiny-rla}]\nbase:\n  train: {tokens: x, seq_len: x}\nseeds: [0]\n")
    with pytest.raises(UserError) as err:
        load_sweep(f)
    assert [ln.split(": ", 2)[1] for ln in str(err.value).splitlines()[1:]] == ["base.train.tokens",
                                                                              "base.train.seq_len"]


@pytest.mark.parametrize("train, message", [
    ("{seqlen: 64}", ":6: models.0.base.train.seqlen: unknown key 'seqlen' (did you mean 'seq_len'?)"),
    ("{seq_len: fast}", ":6: models.0.base.train.seq_len: Input should be a valid integer"),
])
def test_an_error_in_an_arms_own_base_points_at_the_arm(tmp_path, train, message):
    """Not at the sweep's base, whose line and key say nothing of the arm's typo."""
    f = tmp_path / "s.yaml"
    f.write_text(f"""name: s
models:
  - preset: tiny-rla
    overrides: {{vocab_size: 257}}
    base:
      train: {train}
  - preset: tiny-gdn
base:
  train: {{tokens: 8192, seq_len: 64, batch_tokens: 512, micro_batch_size: 4}}
  data: {{kind: stdlib}}
""")
    with pytest.raises(UserError) as err:
        load_sweep(f)
    assert message in str(err.value)


def test_expansion_is_deterministic_and_ids_ignore_key_order(tmp_path):
    src = REPO / "sweeps" / "smoke.yaml"
    a = load_sweep(src)
    b = load_sweep(src)
    assert [(j.job_id, j.name) for j in a.jobs] == [(j.job_id, j.name) for j in b.jobs]
    data = yaml.safe_load(src.read_text())

    def reverse(x):
        if isinstance(x, dict):
            return {k: reverse(x[k]) for k in reversed(list(x))}
        if isinstance(x, list):
            return [reverse(v) for v in x]
        return x

    shuffled = tmp_path / "smoke.yaml"
    shuffled.write_text(yaml.safe_dump(reverse(data), sort_keys=False))
    c = load_sweep(shuffled)
    assert [(j.job_id, j.name) for j in c.jobs] == [(j.job_id, j.name) for j in a.jobs]
    # The id is the hash of the canonical config: equal for its plain JSON data, different for any change.
    job = a.jobs[0].job
    assert job_id(json.loads(job.model_dump_json())) == a.jobs[0].job_id
    changed = job.model_copy(update={"train": job.train.model_copy(update={"lr": job.train.lr * 2})})
    assert job_id(changed) != a.jobs[0].job_id


def test_ids_are_stable_across_processes():
    code = ("from rla_ablate.sweep.expand import load_sweep;"
            "print(' '.join(j.job_id for j in load_sweep('sweeps/smoke.yaml').jobs))")
    env = dict(os.environ, PYTHONHASHSEED="123")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [j.job_id for j in load_sweep(REPO / "sweeps" / "smoke.yaml").jobs]


def test_edit_changes_only_the_edited_jobs(tmp_path):
    data = yaml.safe_load((REPO / "sweeps" / "smoke.yaml").read_text())
    before = {j.name: j.job_id for j in load_sweep(REPO / "sweeps" / "smoke.yaml").jobs}
    data["models"][0].setdefault("overrides", {})["clip"] = 0.5
    data["ablations"].append("no_norm")
    edited = tmp_path / "smoke.yaml"
    edited.write_text(yaml.safe_dump(data, sort_keys=False))
    after = {j.name: j.job_id for j in load_sweep(edited).jobs}
    changed = {n for n in after if before.get(n) != after[n]}
    # The rla arm changed (all its jobs, incl. its derived control); no_norm adds one job to each of the 4 arms.
    added = {n for n in after if n.split("/")[1] == "no_norm"}
    assert len(added) == 4
    assert all(n.startswith(("tiny-rla", "sgla~matched_state(tiny-rla)")) or n in added for n in changed)
    assert {n for n in after if n.startswith("tiny-rdn")} - changed


def test_grid_and_zip_expand(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text(textwrap.dedent("""
        name: g
        models: [{preset: tiny-rla, overrides: {vocab_size: 257}}, {preset: tiny-gdn, overrides: {vocab_size: 257}}]
        base: {train: {tokens: 1024, seq_len: 64, micro_batch_size: 2, batch_tokens: 128}, data: {kind: stdlib}}
        grid: {train.lr: [1.0e-3, 3.0e-3], model.num_layers: [1, 2]}
        zip: {train.warmup_tokens: [0, 128], train.min_lr: [1.0e-5, 2.0e-5]}
        seeds: [0, 1]
    """))
    jobs = load_sweep(f).jobs
    assert len(jobs) == 2 * 2 * 2 * 2 * 2
    rows = {(j.job.train.warmup_tokens, j.job.train.min_lr) for j in jobs}
    assert rows == {(0, 1e-5), (128, 2e-5)}
    assert {j.job.model.num_layers for j in jobs} == {1, 2}
    assert len({j.job_id for j in jobs}) == len(jobs)


def test_grid_values_or_zip_rows_that_validate_to_one_job_are_said(tmp_path):
    """true and 1 for a switch (pydantic reads 1 as true) or two equal zip rows would silently run once: an error
    naming the file, the key's line and the values."""
    head = textwrap.dedent("""
        name: g
        models: [{preset: tiny-rla, overrides: {vocab_size: 257}}]
        base: {train: {tokens: 1024, seq_len: 64, micro_batch_size: 2, batch_tokens: 128}, data: {kind: stdlib}}
    """)
    cases = [("grid:\n  model.output_gates: [true, 1]\n", "model.output_gates",
              "grid.model.output_gates: true and 1 make one job (the config reads them as the same value)"),
             ("zip:\n  train.lr: [1.0e-3, 2.0e-3, 1.0e-3]\n  train.min_lr: [0.0, 0.0, 0]\n", "train.min_lr",
              "zip.train.min_lr: 0.0 and 0 make one job"),  # the key whose spellings differ
             ("zip:\n  train.lr: [1.0e-3, 1.0e-3]\n  train.min_lr: [0.0, 0.0]\n", "train.lr",
              "zip.train.lr: two rows are the same; each row runs once")]
    for body, key, says in cases:
        f = tmp_path / "g.yaml"
        f.write_text(head + body)
        with pytest.raises(UserError) as err:
            load_sweep(f)
        line = next(i for i, text in enumerate(f.read_text().splitlines(), 1) if key in text)
        assert str(err.value).startswith(f"{f}:{line}: {says}"), str(err.value)
    # distinct values still expand: a switch both ways, zip rows that repeat one key's value
    f.write_text(head + "grid:\n  model.output_gates: [true, false]\nzip:\n  train.lr: [1.0e-3, 1.0e-3]\n"
                        "  train.min_lr: [0.0, 1.0e-5]\n")
    assert len(load_sweep(f).jobs) == 4
    # a control derived at each point is one job when its baseline ignores the gridded key: run once, no error
    f.write_text(head + "grid:\n  model.clip: [0.5, 1.0, 2.0]\ncontrols: [matched_state]\n")
    jobs = load_sweep(f).jobs
    assert len(jobs) == 3 + 1, [j.name for j in jobs]


def test_a_bad_grid_key_is_named_not_the_key_it_starts_like(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text(textwrap.dedent("""
        name: g
        models: [{preset: tiny-rla}]
        grid:
          train.lr: [1.0e-3, 2.0e-3]
          train.lrr: [1]
    """))
    with pytest.raises(UserError) as err:
        load_sweep(f)
    line = next(i for i, text in enumerate(f.read_text().splitlines(), 1) if "train.lrr" in text)
    assert str(err.value).startswith(f"{f}:{line}: grid.train.lrr: unknown key 'train.lrr' (did you mean 'train.lr'?)")


def test_plan_10000_jobs_is_fast(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text(textwrap.dedent("""
        name: big
        models: [{preset: 1.5b-rla}, {preset: 1.5b-rdn}]
        base: {train: {tokens: 1000000000}, data: {kind: stdlib}}
        ablations: [no_fitting, tied_gamma, no_output_gates, no_clip, logcosh]
        grid: {train.lr: [1.0e-4, 2.0e-4, 3.0e-4, 4.0e-4, 5.0e-4, 6.0e-4, 7.0e-4, 8.0e-4, 9.0e-4, 1.0e-3]}
        zip: {train.warmup_tokens: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                    21, 22, 23, 24, 25]}
        seeds: [0, 1, 2, 3]
    """))
    t0 = time.perf_counter()
    from rla_ablate.sweep.plan import plan

    doc = plan(load_sweep(f))
    elapsed = time.perf_counter() - t0
    assert len(doc["jobs"]) == 2 * 6 * 10 * 25 * 4 == 12000
    # Generous bound (shared CI cores); benchmarks/orchestration.py measures the real number.
    assert elapsed < 60


BAD = {
    "unknown_key": ("name: x\nmodels: [{preset: tiny-rla}]\nablation: [no_fitting]\n", 3, "did you mean 'ablations'"),
    "wrong_type": ("name: x\nmodels: [{preset: tiny-rla}]\nseeds: [zero]\n", 3, "seeds"),
    "unknown_ablation": ("name: x\nmodels: [{preset: tiny-rla}]\nablations:\n  - no_fiting\n", 4,
                         "did you mean 'no_fitting'"),
    "unknown_preset": ("name: x\nmodels:\n  - preset: tiny-rlaa\n", 3, "did you mean 'tiny-rla'"),
    "model_as_list": ("name: x\nmodels:\n  - [tiny-rla, tiny-gdn]\n", 3,
                      "a model is a mapping with its preset, not a list; give each model its own entry: "
                      "models: [{preset: tiny-rla}, {preset: tiny-gdn}]"),
    "model_as_number": ("name: x\nmodels:\n  - 3\n", 3, "a model is a mapping with its preset, e.g. "
                        "{preset: tiny-rla} (got 3)"),
    "control_as_ablation": ("name: x\nmodels: [{preset: tiny-rla}]\nablations:\n  - no_fitting\n  - matched_state\n",
                            5, "'matched_state' is a control, not an ablation: list it under `controls:`"),
    "not_a_family": ("name: x\nmodels: [{preset: tiny-rla}]\nablations:\n  - {name: no_clip, families: [rdm]}\n", 4,
                     "'rdm' is not a family (did you mean 'rdn'?)"),
    "not_applicable": ("name: x\nmodels: [{preset: tiny-rla}, {preset: tiny-sgla}]\nablations:\n"
                       "  - {name: no_clip, families: [sgla]}\n", 4, "does not apply to family 'sgla'"),
    "applies_to_none": ("name: x\nmodels: [{preset: tiny-sgla}]\nablations: [tied_gamma]\n", 3,
                        "applies to rla, rdn"),
    "fractional_gpus": ("name: x\nmodels: [{preset: tiny-rla}]\nresources:\n  gpus: 1.5\n", 4, "whole GPUs"),
    # the '[' that is never closed, not the line where PyYAML notices
    "malformed": ("name: x\nmodels: [{preset: tiny-rla}\nseeds: [0]\n", 2, "models: malformed YAML"),
    "bad_grid_key": ("name: x\nmodels: [{preset: tiny-rla}]\nbase: {data: {kind: stdlib}}\n"
                     "grid:\n  train.lrr: [0.1]\n", 5, "did you mean 'train.lr'"),
    "bad_override": ("name: x\nmodels:\n  - preset: tiny-rla\n    overrides: {num_layer: 3}\n", 4,
                     "did you mean 'num_layers'"),
    "zip_lengths": ("name: x\nmodels: [{preset: tiny-rla}]\nzip:\n  train.lr: [0.1, 0.2]\n"
                    "  train.min_lr: [0.01]\n", 3, "same length"),
    "search_metric": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                      "    train.lr: {type: float, low: 1.0e-4, high: 1.0e-2}\n  n_trials: 2\n"
                      "  metric: eval/vall/loss\n", 7, "did you mean 'eval/val/loss'"),
    # a GPU-only metric where the trials train on the CPU (resources.gpus 0): every trial would fail to report
    "search_gpu_metric": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                          "    train.lr: {type: float, low: 1.0e-4, high: 1.0e-2}\n  n_trials: 2\n"
                          "  metric: train/mfu\n", 7, "'train/mfu' is logged by jobs on a GPU only"),
    "search_no_params": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params: {}\n  n_trials: 2\n", 4,
                         "at least one parameter"),
    "search_key": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                   "    train.lrr: {type: float, low: 1.0e-4, high: 1.0e-2}\n  n_trials: 2\n", 5,
                   "did you mean 'train.lr'"),
    # a float range on an int key: its whole-number ends validate, the trials' draws would not (caught at plan)
    "search_float_on_int": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                            "    model.num_layers: {type: float, low: 1, high: 2}\n  n_trials: 2\n", 5,
                            "search.params.model.num_layers.type: its ends validate, but the trials draw "
                            "fractions such as 1.382 from the range"),
    "search_int_fraction": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                            "    model.num_layers: {type: int, low: 1, high: 2.5}\n  n_trials: 2\n", 5,
                            "an int parameter needs whole-number bounds (got low 1, high 2.5)"),
    # a bad choice of the second key: reported at its own key and line, not at the first key's
    "search_choice_second": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                             "    model.clip: {type: float, low: 0.5, high: 2.0}\n"
                             "    model.target: {type: categorical, choices: [clip, bogus]}\n  n_trials: 2\n", 6,
                             "search.params.model.target: 'bogus' is not allowed"),
    # a value listed twice would be drawn twice as often; one value, or equal ends, is no search
    "search_choice_twice": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                            "    model.target: {type: categorical, choices: [clip, clip]}\n  n_trials: 2\n", 5,
                            "'clip' is listed twice in 'choices'"),
    # a job's section written at the top of the file: where it belongs
    "top_level_train": ("name: x\nmodels: [{preset: tiny-rdn}]\ntrain: {tokens: 65536}\n", 3,
                        "train: unknown key 'train' (did you mean base.train?); allowed: ablations, base"),
    "top_level_model": ("name: x\nmodels: [{preset: tiny-rdn}]\nmodel: {clip: 0.5}\n", 3,
                        "model: unknown key 'model' (a model's keys go in models: [{preset: ..., overrides: "
                        "{...}}])"),
    # a swept key outside the job's config: at its own line (it was at the grid's), with a did-you-mean
    "grid_prefix": ("name: x\nmodels: [{preset: tiny-rdn}]\ngrid:\n  model.clip: [1.0]\n  modle.clip: [0.5]\n", 5,
                    "grid.modle.clip: a swept key is a dotted key of the job's config under model., train. or data. "
                    "(e.g. model.clip, train.lr) (did you mean 'model.clip'?)"),
    "search_prefix": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                      "    train.lr: {type: float, low: 0.1, high: 0.2}\n"
                      "    trian.seq_len: {type: categorical, choices: [64, 128]}\n  n_trials: 2\n", 6,
                      "search.params.trian.seq_len: a swept key is a dotted key of the job's config under model., "
                      "train. or data. (e.g. model.clip, train.lr) (did you mean 'train.seq_len'?)"),
    # a key the draw would ignore, a fractional step, a seed numpy refuses (it failed the launch with a traceback)
    "search_foreign_key": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                           "    train.lr: {type: float, low: 1.0e-4, high: 1.0e-2, choices: [1, 2]}\n  n_trials: 2\n",
                           5, "'choices' is not for a float parameter, which takes 'low' and 'high'"),
    "search_float_step": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                          "    train.lr: {type: float, low: 0.1, high: 0.2, step: 0.001}\n  n_trials: 2\n", 5,
                          "'step' is for int parameters (this one is float)"),
    "search_seed": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                    "    train.lr: {type: float, low: 0.1, high: 0.2}\n  n_trials: 2\n  seed: -3\n", 7,
                    "search.seed: Input should be greater than or equal to 0"),
    "search_trials": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                      "    train.lr: {type: float, low: 0.1, high: 0.2}\n  n_trials: 200000\n", 6,
                      "search.n_trials: Input should be less than or equal to 100000"),
    # a value as the file spells it (YAML's true, not Python's True)
    "search_trials_bool": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                           "    train.lr: {type: float, low: 0.1, high: 0.2}\n  n_trials: true\n", 6,
                           "search.n_trials: true is not a number; give a number (got true)"),
    # a did-you-mean before the allowed list, as for keys
    "search_pruner": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                      "    train.lr: {type: float, low: 0.1, high: 0.2}\n  n_trials: 2\n  pruner: mediann\n", 7,
                      "search.pruner: 'mediann' is not allowed (did you mean 'median'?); allowed: median, hyperband"),
    "search_one_value": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                         "    train.lr: {type: float, low: 1.0e-2, high: 1.0e-2}\n  n_trials: 2\n", 5,
                         "low and high are both 0.01: one value is no search"),
    "search_choice": ("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                      "    model.target: {type: categorical, choices: [clip, tanhh, tanh]}\n  n_trials: 2\n", 5,
                      "model.target"),
    "bad_value": ("name: x\nmodels: [{preset: tiny-rla}]\nbase:\n  data: {kind: stdlib}\n  train:\n"
                  "    lr: -1\n", 6, "lr"),
    # at the eval list, its section named once (it read 'base: base: eval names ...' at the base line)
    "repeated_eval_name": ("name: x\nmodels: [{preset: tiny-rla}]\nbase:\n  eval:\n"
                           "    - {name: val, data: {kind: stdlib}}\n    - {name: val, data: {kind: stdlib}}\n", 4,
                           ": base.eval: names must be unique; repeated: val"),
    # a text eval set of fewer tokens than one window would score a whole window all the same
    "eval_under_a_window": ("name: x\nmodels: [{preset: tiny-rla}]\nbase:\n  train: {seq_len: 128}\n  eval:\n"
                            "    - {name: val, data: {kind: stdlib}, tokens: 10}\n", 5,
                            ": base.eval: set 0 ('val'): tokens 10 is under one window of train.seq_len (128); an "
                            "eval set scores whole windows: use at least 128"),
    # a section that is not a mapping (a traceback before); seeds torch, numpy and Python all take
    "train_not_mapping": ("name: x\nmodels: [{preset: tiny-rla}]\nbase:\n  data: {kind: stdlib}\n"
                          "  train: [tokens, 8192]\n", 5,
                          "base.train: must be a mapping of train keys, e.g. {tokens: 8192, lr: 3.0e-3} (got list)"),
    "train_empty": ("name: x\nmodels: [{preset: tiny-rla}]\nbase:\n  train:\n", 4, "(got nothing)"),
    # an overridden key's bad value at its own line (it was at overrides:)
    "override_value_line": ("name: x\nmodels:\n  - preset: tiny-rla\n    overrides:\n      clip: 0.5\n"
                            "      head_dim: zero\n", 6, "models.0.overrides.head_dim: Input should be a valid integer"),
    "seed_too_large": ("name: x\nmodels: [{preset: tiny-rla}]\nseeds: [0, 18446744073709551616]\n", 3,
                       "seeds.1: Input should be less than or equal to 9223372036854775807"),
    "whole_job_check": ("name: x\nmodels: [{preset: tiny-rla}]\nbase:\n  train: {seq_len: 128}\n"
                        "  data: {kind: mqar, seq_len: 64}\n", 3,
                        ":3: base: data.seq_len (64) must equal train.seq_len (128)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sweep_file_exit_2(case, tmp_path, capsys):
    text, line, needle = BAD[case]
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    assert main(["plan", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:{line}:" in err, err
    assert needle in err, err
    assert "Traceback" not in err


def test_every_searched_keys_own_problem_comes_in_one_report(tmp_path):
    """Problems of different search keys do not depend on each other: each is said at its line in one report."""
    f = tmp_path / "s.yaml"
    f.write_text("name: x\nmodels: [{preset: tiny-rdn}]\nsearch:\n  params:\n"
                 "    train.lrr: {type: float, low: 1.0e-4, high: 1.0e-2}\n"
                 "    model.clipp: {type: float, low: 0.5, high: 2.0}\n"
                 "    model.clip: {type: float, low: 0.5, high: 2.0}\n"
                 "    model.target: {type: categorical, choices: [clip, bogus]}\n  n_trials: 2\n")
    with pytest.raises(UserError) as err:
        load_sweep(f)
    lines = str(err.value).splitlines()
    assert lines[0].endswith("s.yaml: 3 problems"), lines
    assert [line.split(": ")[0].rsplit(":", 1)[1] for line in lines[1:]] == ["5", "6", "8"], lines
    assert "did you mean 'train.lr'" in lines[1] and "did you mean 'clip'" in lines[2] and "'bogus'" in lines[3]


def test_impossible_resources_launch_nothing(tmp_path, capsys):
    f = tmp_path / "gpu.yaml"
    f.write_text("name: gpu\nmodels: [{preset: tiny-rla, overrides: {vocab_size: 257}}]\nbase: {data: {kind: stdlib}}\n"
                 "resources:\n  gpus: 64\n")
    root = tmp_path / "runs"
    assert main(["launch", str(f), "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:4: resources.gpus:" in err and "Ray cluster has" in err
    assert not root.exists()


def test_bad_file_process_exit_code_and_no_traceback(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD["unknown_ablation"][0])
    out = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "launch", str(f), "--root", str(tmp_path / "r")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and f"{f}:4:" in out.stderr
    assert not (tmp_path / "r").exists()


def test_status_of_unknown_sweep(tmp_path, capsys):
    assert main(["status", "nope", "--root", str(tmp_path)]) == 2
    assert "no sweep 'nope'" in capsys.readouterr().err


def test_second_launch_of_a_sweep_is_refused(tmp_path, capsys):
    from rla_ablate.sweep.state import SweepDir

    f = tmp_path / "one.yaml"
    f.write_text("name: one\nmodels: [{preset: tiny-rla, overrides: {vocab_size: 257}}]\n"
                 "base: {data: {kind: stdlib}}\n")
    holder = SweepDir(tmp_path / "runs", "one")
    holder.acquire()
    try:
        assert main(["launch", str(f), "--root", str(tmp_path / "runs")]) == 2
        err = capsys.readouterr().err
        assert "already being launched" in err and f"pid {os.getpid()}" in err
    finally:
        holder.release()


def test_the_locks_go_on_unguarded_where_the_file_system_has_none(tmp_path, monkeypatch):
    """A file system without flock (some network mounts: ENOLCK) takes a launch and a train unguarded, as a folder
    with locks takes the first of two; a held lock is LockHeld, and unlocking lets the next one in."""
    import errno
    import fcntl

    from rla_ablate.fileio import LockHeld, lock_exclusive, unlock
    from rla_ablate.sweep.state import SweepDir

    fd = lock_exclusive(tmp_path / "a.lock")
    assert fd is not None
    pid = os.fork()
    if pid == 0:  # another process: the lock is held
        try:
            lock_exclusive(tmp_path / "a.lock")
            os._exit(1)
        except LockHeld:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    unlock(fd)
    unlock(lock_exclusive(tmp_path / "a.lock"))

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert lock_exclusive(tmp_path / "b.lock") is None
    sdir = SweepDir(tmp_path / "runs", "s")
    sdir.acquire()
    assert json.loads((sdir.path / "launch.json").read_text())["pid"] == os.getpid()
    sdir.release()
    assert "ended" in json.loads((sdir.path / "launch.json").read_text())


def test_next_launch_stops_what_a_killed_launch_left(tmp_path):
    import psutil

    from rla_ablate.sweep.state import SweepDir, write_json

    sdir = SweepDir(tmp_path, "s")
    sdir.path.mkdir(parents=True)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        created = psutil.Process(orphan.pid).create_time()
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        # A record as a SIGKILLed launch leaves it: its own pid is gone, its descendants are listed.
        write_json(sdir.path / "launch.json", {"pid": dead.pid, "pgid": dead.pid, "host": os.uname().nodename,
                                               "started": 0, "children": [[orphan.pid, created],
                                                                          [os.getpid(), 12345.0]]})
        sdir.acquire()
        sdir.release()
        assert orphan.wait(timeout=10) is not None
        # A pid whose start time does not match the record (reused) is left alone: this test is still running.
    finally:
        if orphan.poll() is None:
            orphan.kill()



def _as_launched(sweep, root: Path):
    """The sweep folder as a launch of `sweep` leaves it: its file, its expansion and where it was launched from."""
    from rla_ablate.sweep.sources import job_record
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(root, sweep.name)
    sdir.path.mkdir(parents=True)
    (sdir.path / "sweep.yaml").write_text(Path(sweep.source.file).read_text())
    sdir.write_job_list([job_record(j) for j in sweep.jobs])
    sdir.write_meta(sweep_file=str(Path(sweep.source.file).resolve()))
    return sdir


def test_a_file_sharing_a_sweeps_name_but_none_of_its_jobs_is_refused(tmp_path, capsys):
    from rla_ablate.sweep.launch import LaunchOptions, _check_version

    head = "name: mine\nbase: {data: {kind: stdlib}}\n"
    mine, other = tmp_path / "mine.yaml", tmp_path / "other.yaml"
    mine.write_text(head + "models: [{preset: tiny-rla, overrides: {vocab_size: 257}}]\nseeds: [0, 1]\n")
    other.write_text(head + "models: [{preset: tiny-gdn, overrides: {vocab_size: 257}}]\n")
    root = tmp_path / "runs"
    sdir = _as_launched(load_sweep(mine), root)
    saved = (sdir.path / "sweep.yaml").read_text()
    assert main(["launch", str(other), "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{other}:1: name:" in err and "none of its 2 job(s) is in" in err and "--new-version" in err, err
    assert (sdir.path / "sweep.yaml").read_text() == saved and len(sdir.job_list()) == 2
    # Asked for, it becomes the next version, and the launch says what it leaves out.
    note = _check_version(load_sweep(other), sdir, LaunchOptions(root=root, new_version=True))
    assert note.startswith("2 job(s) of the previous version (0 finished) are not in this file")
    # An edit of the file itself (the same path) is the next version without asking; so is the same file moved
    # (another machine's checkout), which shares its jobs.
    mine.write_text(mine.read_text().replace("seeds: [0, 1]", "seeds: [1, 2]"))
    assert _check_version(load_sweep(mine), sdir, LaunchOptions(root=root)).startswith("1 job(s) of the previous")
    moved = tmp_path / "elsewhere.yaml"
    moved.write_text(mine.read_text())
    assert _check_version(load_sweep(moved), sdir, LaunchOptions(root=root)).startswith("1 job(s)")
    # `resume` launches the folder's own copy.
    assert _check_version(load_sweep(sdir.path / "sweep.yaml"), sdir, LaunchOptions(root=root)) is None


def test_the_plan_counts_the_tokens_a_job_trains_on(capsys):
    """train.tokens rounded up to whole batches, as the training loop runs them: gpu-100m's 10M tokens are 153
    batches of 65,536."""
    assert main(["plan", str(REPO / "sweeps" / "gpu-100m.yaml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["tokens"] for r in doc["jobs"]} == {153 * 65536}
    assert doc["totals"]["tokens"] == 19 * 153 * 65536


def test_the_plan_says_whose_gpu_its_speeds_are(capsys, monkeypatch):
    """Shares are computed for this machine's GPU, speeds come from the calibration table's GPU: on another card
    the plan names both, so an H100 user does not read H200 speeds as their own."""
    from rla_ablate.sweep import packing

    path = str(REPO / "sweeps" / "smoke.yaml")
    monkeypatch.setattr(packing, "gpu_identity", lambda: ("NVIDIA H100 80GB HBM3", 80 * 2**30))
    assert main(["plan", path, "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert (totals["gpu"], totals["gpu_memory_gib"], totals["speeds_measured_on"]) == (
        "NVIDIA H100 80GB HBM3", 80.0, "NVIDIA H200")
    assert main(["plan", path]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "tok/s alone on one NVIDIA H200 (the calibration table's GPU, not this machine's NVIDIA H100 80GB HBM3" in said
    assert "GPU tok/s" in said  # smoke runs on the CPU: the speed column's header says whose speed it is
    # a sweep that runs on the GPU: what packing adds to each share, and keeps free on each GPU
    assert main(["plan", str(REPO / "sweeps" / "gpu-graphs.yaml")]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert ("a GPU share adds 1 GiB for the job's process, and 4.5 GiB of each GPU stays free for the one packed job "
            "that autotunes at a time") in said
    assert "tok/s" in said and "GPU tok/s" not in said
    # on the table's own card, or without a GPU, the caption names the table's GPU alone
    monkeypatch.setattr(packing, "gpu_identity", lambda: None)
    assert main(["plan", path]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "tok/s alone on one NVIDIA H200 from:" in said and "not this machine's" not in said


WALLCLOCK = """name: wc
models:
  - {{preset: tiny-rla, overrides: {{vocab_size: 257}}}}
  - {{preset: tiny-rdn, overrides: {{vocab_size: 257}}}}
base:
  train: {{tokens: 8192, seq_len: 64, batch_tokens: 512, micro_batch_size: 4}}
  data: {{kind: stdlib}}
controls:
  - {control}
"""


def test_matched_wallclock_speeds_pinned_in_the_file_set_the_budgets(tmp_path):
    """`speeds` replaces the calibration table's estimates (a study expands the same jobs whatever table ships);
    a family it lacks, or speeds on another control, is an error at its line."""
    import math

    f = tmp_path / "wc.yaml"
    f.write_text(WALLCLOCK.format(control="{name: matched_wallclock, speeds: {rla: 100, sgla: 150, rdn: 80, gdn: 120}}"))
    jobs = {j.name: j for j in load_sweep(f).jobs}
    for arm, base, ratio in (("tiny-rla", "sgla", 1.5), ("tiny-rdn", "gdn", 1.5)):
        control = jobs[f"{base}~matched_wallclock({arm})/seed0"]
        assert control.job.train.tokens == math.ceil(8192 * ratio)
        assert control.control_report["speed_source"] == "pinned in the sweep file"
        assert control.control_report["reference_tokens_per_s"] == {"sgla": 100, "gdn": 80}[base]
    for control, message in (
        ("{name: matched_wallclock, speeds: {rla: 100, sgla: 150}}",
         ":9: controls.0.speeds: matched_wallclock for 'tiny-rdn' needs the pinned speeds of rdn and gdn; missing: "
         "rdn, gdn"),
        ("{name: matched_state, speeds: {rla: 100, sgla: 150}}", "speeds applies to matched_wallclock only"),
        ("{name: matched_wallclock, speeds: {rla: 0, sgla: 150}}", ":9: controls.0.speeds.rla: a speed is a positive"),
        ("{name: matched_wallclock, speeds: {rla: true, sgla: 150}}", ":9: controls.0.speeds.rla: a speed is a positive"),
        ("{name: matched_wallclock, speeds: {rla: .inf, sgla: 150}}", ":9: controls.0.speeds.rla: a speed is a positive"),
        ("{name: matched_wallclock, speeds: {rla: fast, sgla: 150}}", "not 'fast'"),
        ("{name: matched_wallclock, speeds: {rla: 1, sgla: 1, rdn: 1, gdn: 1, gla: 1}}",
         ":9: controls.0.speeds.gla: unknown family 'gla'; allowed: gdn, rdn, rla, sgla"),
    ):
        f.write_text(WALLCLOCK.format(control=control))
        with pytest.raises(UserError) as err:
            load_sweep(f)
        assert message in str(err.value), str(err.value)


def test_a_control_asked_twice_an_axis_it_ignores_or_a_family_without_one_is_refused_at_its_line(tmp_path):
    """Controls are checked per family (the family that has no control is named, not the sweep's models), a second
    entry asking the same control, axis and family is refused rather than merged, and matched_wallclock, which trains
    the baseline at the residual model's shape, refuses an axis. A slower baseline's budget says it gets fewer
    tokens."""
    f = tmp_path / "wc.yaml"
    head = WALLCLOCK.format(control="").split("controls:")[0].replace("tiny-rdn", "tiny-transformer")
    for controls, message in (
        ("[{name: matched_state, families: [transformer]}]",
         ":8: controls.0.families: 'transformer' has no matched_state control: controls are derived from residual "
         "models; allowed: rdn, rla"),
        ("[{name: matched_state, families: [rdn]}]",
         ":8: controls.0.families: family 'rdn' has no model in this sweep; models here: rla, transformer"),
        ("[{name: matched_state, families: [rlaa]}]", "controls.0.families: 'rlaa' is not a family (did you mean 'rla'?)"),
        ("[{name: matched_state, axis: heads}, {name: matched_state, axis: heads}]",
         ":8: controls.1: controls.0 already asks matched_state along heads for rla: list each control once"),
        ("[matched_state, {name: matched_state, axis: expand_v}]", "controls.0 already asks matched_state along expand_v"),
        ("[{name: matched_wallclock, axis: heads}]", ":8: controls.0.axis: matched_wallclock trains the baseline at "
                                                     "the residual model's own shape: it takes no axis"),
    ):
        f.write_text(head + f"controls: {controls}\n")
        with pytest.raises(UserError) as err:
            load_sweep(f)
        assert message in str(err.value), str(err.value)
    f.write_text(head + "controls: [matched_state, {name: matched_state, axis: heads}]\n")  # two axes: two controls
    assert len([j for j in load_sweep(f).jobs if j.control]) == 2
    f.write_text(WALLCLOCK.format(control="{name: matched_wallclock, speeds: {rla: 100, sgla: 80, rdn: 1, gdn: 1}}"))
    from rla_ablate.sweep.expand import budget_lines

    lines = budget_lines([j.describe() for j in load_sweep(f).jobs])
    assert "in the residual model's time it trains on fewer tokens (0.81x)" in lines[1], lines
    f.write_text(WALLCLOCK.format(control="{name: matched_wallclock, speeds: {rla: 100, sgla: 99, rdn: 1, gdn: 1}}"))
    lines = budget_lines([j.describe() for j in load_sweep(f).jobs])  # 0.99 x 8,192 rounds up to 8,192
    assert "its budget, rounded up to whole batches, is the residual model's: this control trains the baseline on " \
           "the same tokens" in lines[1], lines


def test_the_plan_shows_each_wallclock_budget_as_trained(capsys):
    """plan's caption and --json give each matched wall-clock control's budget as it trains (train.tokens rounded
    up to whole batches), the speed ratio and both speeds' sources."""
    path = str(REPO / "sweeps" / "proxy-study.yaml")
    assert main(["plan", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    lines = doc["totals"]["budgets"]
    assert len(lines) == 4 and all("as trained" in line and "pinned in the sweep file" in line for line in lines)
    lm = next(line for line in lines if line.startswith("sgla~matched_wallclock(lm-rla)"))
    assert "1.10x the tokens of lm-rla (9,240,576 against 8,388,608 as trained; speed ratio 1.096" in lm
    control = next(r for r in doc["jobs"] if r["name"] == "sgla~matched_wallclock(lm-rla)/seed0")
    assert control["control_report"]["tokens_trained"] == control["tokens"] == 9_240_576
    assert control["control"] == "matched_wallclock" and control["ablations"] == ["matched_wallclock"]
    assert main(["plan", path]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "matched wall-clock budgets" in said and "sgla~matched_wallclock(lm-rla): 1.10x" in said


def test_tables_name_a_control_as_a_variant_not_an_ablation():
    """plan's and status's variant column: a derived control by its tag (with its axis), an ablated job by its
    ablations, the unablated job '-'. The records keep the control's name under `ablations`, where the
    dashboards' run filters look for it."""
    from rla_ablate.sweep.plan import variant_label

    assert variant_label(["matched_state"], "matched_state[heads]") == "matched_state[heads]"
    assert variant_label(["no_clip", "no_norm"], None) == "no_clip+no_norm"
    assert variant_label([], None) == "-"


def test_a_search_file_is_refused_where_it_asks_what_a_search_cannot_do(tmp_path, capsys):
    """A search tunes one model with one seed: searching train.seed is refused at its key (the study would rank
    the seeds' noise), and a grid beside a search at the grid's line, in the words of every search misuse."""
    from rla_ablate.sweep.expand import load_sweep

    search = {"params": {"train.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True}}, "n_trials": 2}
    base = {"name": "s", "models": [{"preset": "tiny-rla"}], "search": search}
    cases = (({**base, "search": {**search, "params": {**search["params"], "train.seed": {"type": "int", "low": 0,
                                                                                          "high": 3}}}},
              "search.params", "'train.seed' is not searched"),
             ({**base, "grid": {"train.lr": [1.0e-3, 2.0e-3]}}, "grid", "a search sweep tunes one model with one seed"))
    for doc, key, says in cases:
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.startswith(key.split(".")[0]))
        with pytest.raises(UserError, match=says) as err:
            load_sweep(path)
        assert err.value.key.startswith(key) and err.value.line >= line, (err.value.key, err.value.line, line)
        assert main(["plan", str(path)]) == 2 and says in capsys.readouterr().err


def test_the_plan_of_a_search_says_its_space_and_counts_its_trials(capsys):
    """A search's plan names what its trials draw, the metric and the direction; its totals count the trials
    (by family too) and --json carries the search section."""
    path = str(REPO / "sweeps" / "search-example.yaml")
    assert main(["plan", path, "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    n = totals["search_trials"]
    assert totals["jobs"] == n and totals["jobs_by_family"] == {"rdn": n} and totals["search"]["n_trials"] == n
    assert main(["plan", path]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (f"runs as {n} trials (totals include them), each with train.lr from 0.0003 to 0.01 (log)" in said
            and "model.target in [clip, tanh]; minimize eval/val/loss (tpe sampler, median pruner)" in said), said


@pytest.mark.parametrize("name", ["_server", "..", ".hidden"])
def test_a_sweep_name_that_is_not_a_plain_folder_says_why(tmp_path, capsys, name):
    """Names of allowed characters that would be the shared server's folder or a path of their own: the message
    says what the first character must be, not only which characters are allowed."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": name, "models": [{"preset": "tiny-rla"}]}, sort_keys=False))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "s.yaml:1: name: " in err and "it must start with a letter or digit" in err and f"(got '{name}')" in err


def test_a_key_with_nothing_under_it_says_how_to_write_none(tmp_path):
    """`ablations:` whose entries were deleted or commented out is YAML's null: the message says so and what to
    write, at the key's line (not pydantic's "Input should be a valid list")."""
    f = tmp_path / "s.yaml"
    for tail, where, empty in (("ablations:\n  # - tied_gamma\n", "4: ablations", "[]"),
                               ("base:\n  data:\n", "5: base.data", "{}")):
        f.write_text("name: s\nmodels:\n  - {preset: tiny-rla}\n" + tail)
        with pytest.raises(UserError) as err:
            load_sweep(f)
        assert str(err.value) == (f"{f}:{where}: has no value (nothing under the key); give its entries, write "
                                  f"{empty} for none, or delete the key")


def test_a_model_given_by_its_preset_name_alone_says_how_to_write_it(tmp_path):
    """`models: tiny-rla` and `- tiny-rla`: the message writes the mapping the entry takes, at the key's line (not
    pydantic's "Input should be a valid list" / "a mapping")."""
    f = tmp_path / "s.yaml"
    for models, where, write in (("models: tiny-rla\n", "2: models: takes a list of models",
                                  "write models: [{preset: tiny-rla}]"),
                                 ("models:\n  - tiny-rla\n", "3: models.0: a model is a mapping",
                                  "write {preset: tiny-rla}")):
        f.write_text("name: s\n" + models)
        with pytest.raises(UserError) as err:
            load_sweep(f)
        assert str(err.value).startswith(f"{f}:{where}") and write in str(err.value), str(err.value)


def test_a_damaged_sweep_record_is_named_not_read_as_an_empty_sweep(tmp_path, capsys, monkeypatch):
    """jobs.json or sweep.json damaged from outside (they are written atomically): status and results name the file
    and exit 2. Read as empty, status showed no jobs and results called every finished run stale."""
    monkeypatch.chdir(tmp_path)  # an SQLite store keeps its runs' artifacts under ./mlruns
    from dashboard_synthetic import log_jobs, write_sweep_folder

    sweep = load_sweep(REPO / "sweeps" / "smoke.yaml")
    uri = "sqlite:///" + str(tmp_path / "store.db")
    sdir = write_sweep_folder(tmp_path, sweep, uri)
    log_jobs(uri, sweep.name, sweep.jobs, final=lambda job: 1.0)
    assert main(["status", sweep.name, "--root", str(tmp_path)]) == 0
    capsys.readouterr()
    jobs = sdir.path / "jobs.json"
    jobs.write_text(jobs.read_text()[:40])
    for command in (["status", sweep.name], ["results", sweep.name]):
        assert main(command + ["--root", str(tmp_path)]) == 2, command
        err = " ".join(capsys.readouterr().err.split())
        assert f"{jobs}: damaged: not a JSON list" in err and "Traceback" not in err, (command, err)
    jobs.write_text("[1, 2]")
    assert main(["status", sweep.name, "--root", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "jobs.json: damaged: an entry is not a job's record" in err and "rla-sweep resume" in err, err
    jobs.write_text("[]")
    (sdir.path / "sweep.json").write_text("{}")
    assert main(["status", sweep.name, "--root", str(tmp_path)]) == 2
    assert "sweep.json: damaged: the sweep's name is missing" in " ".join(capsys.readouterr().err.split())
    (sdir.path / "sweep.json").write_text("[1, 2]")
    assert main(["status", sweep.name, "--root", str(tmp_path)]) == 2
    assert "sweep.json: damaged: not a JSON object (list)" in " ".join(capsys.readouterr().err.split())
    # the embedded tracking store damaged, or gone
    (sdir.path / "sweep.json").write_text(json.dumps({"name": sweep.name, "embedded_tracking": True}))
    sdir.mlflow_dir.mkdir()
    (sdir.mlflow_dir / "mlflow.db").write_bytes(b"garbage" * 10)
    for command in (["results", sweep.name], ["dashboard", sweep.name], ["ui", sweep.name]):
        assert main(command + ["--root", str(tmp_path)]) == 2, command
        err = " ".join(capsys.readouterr().err.split())
        assert "mlflow.db: damaged: not an SQLite database" in err and "Traceback" not in err, (command, err)
    (sdir.mlflow_dir / "mlflow.db").unlink()
    assert main(["results", sweep.name, "--root", str(tmp_path)]) == 2
    assert "mlflow.db is missing; no launch has run a job yet)" in " ".join(capsys.readouterr().err.split())


def test_a_damaged_job_status_is_named_once_and_read_as_an_attempt_that_ran(tmp_path):
    """A status.json damaged from outside was read as a job never started: `status` showed it at 0 tokens, and a
    resume said none of its jobs came from a checkpoint while it resumed one. It is now named (once a process) and
    read as pending after an attempt, so a resume's count looks for the job's checkpoints."""
    import warnings

    from rla_ablate.errors import Notice
    from rla_ablate.outcome import Status
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(tmp_path, "s")
    path = sdir.job_dir("abc") / "status.json"
    path.parent.mkdir(parents=True)
    assert sdir.status("abc").attempts == 0  # no file: never started
    path.write_text('{"attempts": 1, "stat')
    with pytest.warns(Notice, match=r"status\.json: damaged: not a job's status record; the job is read as pending"):
        st = sdir.status("abc")
    assert (st.status, st.attempts) == (Status.PENDING, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sdir.status("abc")  # named once
    # a record whose values are not the launch's (an error that is not text) is named the same way
    other = sdir.job_dir("def") / "status.json"
    other.parent.mkdir(parents=True)
    other.write_text('{"status": "failed", "error": 5}')
    with pytest.warns(Notice, match="damaged: a value of the job's status record is not one the launch writes"):
        assert sdir.status("def").status == Status.PENDING


def test_the_resume_point_said_is_the_newest_whole_checkpoint(tmp_path):
    """`status` names where a resume starts: the newest checkpoint a resume can load, not a torn newer file."""
    import zipfile

    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.sweep.status import resume_tokens

    sdir = SweepDir(tmp_path, "s")
    folder = sdir.job_dir("abc") / "checkpoints"
    folder.mkdir(parents=True)
    for tokens in (1024, 2048):
        with zipfile.ZipFile(folder / f"ckpt-{tokens:015d}.pt", "w") as z:
            z.writestr("data.pkl", b"x" * 100)
    assert resume_tokens(sdir, "abc") == 2048
    whole = (folder / f"ckpt-{2048:015d}.pt").read_bytes()
    (folder / f"ckpt-{2048:015d}.pt").write_bytes(whole[:len(whole) // 2])
    assert resume_tokens(sdir, "abc") == 1024


def test_a_damaged_sqlite_store_is_named_whatever_the_damage(tmp_path):
    """`check_sqlite`: a store cut short (a copy or a full disk), one whose schema page was overwritten, or one that
    is not SQLite at all is a UserError naming the file and the remedy; an intact, an empty or a missing file is
    not, nor one beside a rollback journal or write-ahead log (SQLite's to finish)."""
    import sqlite3

    from rla_ablate.errors import UserError
    from rla_ablate.fileio import check_sqlite

    db = tmp_path / "mlflow.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE metrics (key TEXT, value REAL)")
    con.executemany("INSERT INTO metrics VALUES (?, ?)", [(f"k{i}", i) for i in range(5000)])
    con.commit()
    con.close()
    check_sqlite(db)
    check_sqlite(tmp_path / "missing.db")
    (tmp_path / "empty.db").write_bytes(b"")
    check_sqlite(tmp_path / "empty.db")
    good = db.read_bytes()

    def damage(data: bytes, match: str) -> None:
        db.write_bytes(data)
        with pytest.raises(UserError, match=match) as err:
            check_sqlite(db, remedy="do this")
        assert err.value.file == str(db) and str(err.value).endswith("do this"), str(err.value)

    damage(good[:len(good) // 2], r"shorter than its header says \([\d,]+ of [\d,]+ bytes")
    damage(good[:100] + b"\xff" * 3996 + good[4096:], "SQLite cannot read it")
    damage(b"garbage" * 10, "not an SQLite database")
    # a write a crash interrupted leaves its journal beside the file: the next read-write open finishes or undoes it,
    # so the file alone is not judged (a read-only open cannot roll it back, and said 'damaged')
    db.write_bytes(good[:len(good) // 2])
    (tmp_path / "mlflow.db-journal").write_bytes(b"\xd9\xd5\x05\xf9 \xa1c\xd7")
    check_sqlite(db)


def test_a_new_version_that_changes_only_bookkeeping_says_its_jobs_train_again(tmp_path):
    """A job's id hashes its whole config, checkpoint interval included: a file that changes only such keys makes
    every job new. The launch's note on the previous version says which keys and how to keep the earlier runs."""
    from dashboard_synthetic import write_sweep_folder

    from rla_ablate.sweep.launch import LaunchOptions, _check_version

    path = tmp_path / "smoke.yaml"
    text = (REPO / "sweeps" / "smoke.yaml").read_text()
    path.write_text(text)
    sdir = write_sweep_folder(tmp_path / "runs", load_sweep(path), "sqlite:///unused.db")
    sdir.write_meta(sweep_file=str(path.resolve()))
    (sdir.path / "sweep.yaml").write_text(text)
    path.write_text(text.replace("checkpoint_every_tokens: 8192", "checkpoint_every_tokens: 4096"))
    edited = load_sweep(path)
    note = " ".join(_check_version(edited, sdir, LaunchOptions(root=tmp_path / "runs")).split())
    n = len(edited.jobs)
    assert f"{n} job(s) of the previous version" in note
    assert f"Of those, {n} differ from a job of this file only in train.checkpoint_every_tokens" in note
    assert f"--root {tmp_path / 'runs'} --include-stale" in note  # the printed command works where it is pasted
    # another change than bookkeeping: no such words
    path.write_text(text.replace("lr: 3.0e-3", "lr: 2.0e-3"))
    assert "but for" not in (_check_version(load_sweep(path), sdir, LaunchOptions(root=tmp_path / "runs")) or "")


@pytest.mark.parametrize("batch, mbs, seq_len, works", [
    (2048, [8, 16], [128, 256], True),     # (16, 256) is refused, (8, 256) and (16, 128) build jobs
    (2048, [16, 8], [128, 256], True),     # the same space, its choices in another order
    (8192, [32, 64], [512, 1024], False),  # each key alone builds jobs, no pair of them does
])
def test_a_searchs_keys_together_are_refused_only_where_no_combination_builds_a_job(tmp_path, batch, mbs, seq_len,
                                                                                     works):
    """The joint check of a search's keys does not depend on the order of their choices (it had tried the first
    choices together and the last ones together, and refused a valid space at the base's line): it refuses where
    no combination builds a job, at the search's parameters."""
    f = tmp_path / "s.yaml"
    f.write_text(f"""name: s
models: [{{preset: tiny-rla}}]
base:
  train: {{tokens: 65536, seq_len: 128, micro_batch_size: 8, batch_tokens: {batch}}}
  data: {{kind: stdlib}}
seeds: [0]
resources: {{gpus: 0, cpus: 1}}
search:
  params:
    train.micro_batch_size: {{type: categorical, choices: {mbs}}}
    train.seq_len: {{type: categorical, choices: {seq_len}}}
  n_trials: 2
""")
    if works:
        assert len(load_sweep(f).jobs) == 1
        return
    with pytest.raises(UserError) as err:
        load_sweep(f)
    assert ":9: search.params: the searched keys together build no job at any combination of their choices and " \
           "range ends; at train.micro_batch_size = 32, train.seq_len = 512: batch_tokens (8192) must be a " \
           "multiple of" in str(err.value)
