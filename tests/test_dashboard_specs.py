"""Every committed dashboard spec loads; bad specs fail with file:line: key and what is allowed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rla_ablate.cli import main
from rla_ablate.dashboard.spec import CurveSpec, GainsSpec, TableSpec, load_spec, load_specs, spec_dir
from rla_ablate.errors import UserError

REQUIRED = {"fig3a_tied_gamma": "curve", "fig3b_gains_by_category": "gains", "fig4a_layer_norms": "layers",
            "fig4b_train_loss": "curve", "table4_no_fitting": "table", "table5_output_gates": "table",
            "matched_budget": "scatter", "appb_logcosh": "table", "validity": "validity"}


def test_committed_specs_load():
    specs = {s.name: s for s in load_specs()}
    assert {name: specs[name].kind for name in REQUIRED} == REQUIRED
    for spec in specs.values():
        assert spec.title and spec.caption, spec.name
    fig3a = specs["fig3a_tied_gamma"]
    assert isinstance(fig3a, CurveSpec) and fig3a.allowed("ablations") == ["none", "tied_gamma"]
    assert fig3a.matches({"family": "rdn", "ablations": "tied_gamma"})
    assert not fig3a.matches({"family": "sgla", "ablations": "none"})
    gains = specs["fig3b_gains_by_category"]
    assert isinstance(gains, GainsSpec)
    # Task accuracies by the paper's categories; eval loss by recall / language modeling until tasks are scored.
    assert [gains.category(s) for s in ("piqa", "lambada_openai", "swde", "val")] == [
        "Reasoning", "Understanding", "Recall", "other"]
    fallback = GainsSpec.model_validate({**gains.model_dump(), **gains.fallback.model_dump(), "fallback": None})
    assert [fallback.category(s) for s in ("mqar_4kv", "niah", "val", "wikitext")] == [
        "recall", "recall", "language modeling", "language modeling"]
    assert fallback.category("hellaswag") == "other"
    assert isinstance(specs["table4_no_fitting"], TableSpec)
    assert len(list(spec_dir().glob("*.yaml"))) == len(specs)
    # Every claim names its rule; the question specs load too.
    for spec in specs.values():
        for claim in spec.claims:
            assert claim.expect in ("higher", "lower") and claim.min_effect > 0 and claim.treatment, spec.name
    study = {s.name: s for s in load_specs(spec_dir() / "study")}
    assert set(study) == {"table4_no_fitting", "fig3a_tied_gamma", "table5_output_gates", "fig4_clip_norm",
                          "table_matched_state", "validity"}
    for spec in study.values():
        # Every claim on a final value is stated on both tasks: MQAR accuracy and code-LM loss; those on when recall
        # was learned (the area under an accuracy curve) are MQAR's.
        final = [c for c in spec.claims if not c.metric.endswith("_area")]
        kinds = [c.treatment.get("data.kind") for c in final]
        assert kinds.count("mqar") == kinds.count("stdlib") == len(kinds) // 2, spec.name
        assert all(c.treatment.get("data.kind") == "mqar" and c.better_is_higher
                   for c in spec.claims if c not in final), spec.name
        # an accuracy column (or the area under its curve) marks its largest mean as the best
        for column in getattr(spec, "columns", []):
            accuracy = column.metric.rsplit("/", 1)[-1].removesuffix("_area") == "acc"
            assert column.better_is_higher == accuracy, (spec.name, column.metric)
    questions = {s.name: s for s in load_specs(spec_dir() / "questions")}
    assert questions["clip_radius"].series == ["model.clip"] and questions["clip_radius"].claims


def write(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("text, where, says", [
    ("""\
     kind: curve
     title: t
     y: train/loss
     smoth: 0.5
     """, ":4: smoth", "did you mean 'smooth'"),
    ("""\
     kind: plot
     title: t
     """, ":1: kind", "allowed: curve, layers, gains, table, scatter"),
    ("""\
     title: t
     y: train/loss
     """, ": kind", "missing"),
    ("""\
     kind: curve
     title: t
     runs:
       famly: [rla]
     y: train/loss
     """, ":3: runs", "unknown tag 'famly' in runs (did you mean 'family'?); allowed: family, ablations"),
    ("""\
     kind: layers
     title: t
     y: layer/attn_out_norm
     """, ":3: y", "must contain {layer}"),
    ("""\
     kind: curve
     title: t
     series: [family, seed]
     y: train/loss
     """, ":3: series", "seeds are aggregated"),
    ("""\
     kind: table
     title: t
     columns:
       - {metric: eval/val/loss}
       - {metric: eval/val/ppl, digits: many}
     """, ":5: columns.1.digits", "valid integer"),
    ("""\
     kind: curve
     title: t
     y: train/loss
     smooth: 1.5
     """, ":4: smooth", "less than 1"),
    ("""\
     kind: scatter
     title: t
     y: eval/val/loss
     x: []
     """, ":4: x", "at least 1"),
    # family and ablation names are closed sets: a misspelt one matched nothing and asked for a sweep edit
    ("""\
     kind: curve
     title: t
     runs:
       family: [rlaa, sgla]
     y: train/loss
     """, ":3: runs", "family 'rlaa' in runs is no family (did you mean 'rla'?)"),
    ("""\
     kind: table
     title: t
     columns: [{metric: eval/val/loss}]
     claims:
       - {claim: c, treatment: {ablations: tied_gama}, reference: {ablations: none}, expect: lower, min_effect: 0}
     """, ":5: claims.0.treatment", "ablations 'tied_gama' in a claim is no ablation or control (did you mean"),
    ("""\
     kind: curve
     title: t
     runs:
       ablations: [none, no_clip+no_nrom]
     y: train/loss
     """, ":3: runs", "ablations 'no_nrom' in runs is no ablation or control (did you mean 'no_norm'?)"),
    # control and version are closed sets too
    ("""\
     kind: table
     title: t
     columns: [{metric: eval/val/loss}]
     claims:
       - {claim: c, treatment: {control: matched_stat}, reference: {control: none}, expect: higher, min_effect: 0.01}
     """, ":5: claims.0.treatment", "control 'matched_stat' in a claim is no derived control (did you mean "
         "'matched_state'?)"),
    ("""\
     kind: curve
     title: t
     runs: {version: olde}
     y: train/loss
     """, ":3: runs", "version 'olde' in runs is no version of the sweep file (did you mean 'older'?)"),
    # numbers as in sweep files: no bool, no infinity
    ("""\
     kind: table
     title: t
     columns: [{metric: eval/val/loss}]
     claims:
       - {claim: c, treatment: {family: sgla}, reference: {family: rla}, expect: higher, min_effect: .inf}
     """, ":5: claims.0.min_effect", "finite number"),
    ("""\
     kind: table
     title: t
     columns: [{metric: eval/val/loss}]
     validity: {target_engaged_min: true}
     """, ":4: validity.target_engaged_min", "true is not a number"),
    # a glob over what is measured, and one comparison stated twice
    ("""\
     kind: table
     title: t
     columns: [{metric: eval/val/loss}]
     claims:
       - {claim: c, metric: eval/val/*, treatment: {family: sgla}, reference: {family: rla}, expect: higher,
          min_effect: 0.01}
     """, ":5: claims.0.metric", "a glob may stand for an eval set or task (eval/*/loss), not for what is measured"),
    ("""\
     kind: table
     title: t
     columns: [{metric: eval/val/loss}]
     claims:
       - {claim: c, treatment: {family: sgla}, reference: {family: rla}, expect: higher, min_effect: 0.01}
       - {claim: d, treatment: {family: sgla}, reference: {family: rla}, expect: higher, min_effect: 0.01}
     """, ":6: claims.1", "repeats claims.0 (the same comparison and rule, in other words)"),
    ("""\
     kind: table
     title: t
     columns: [{metric: eval/val/loss}]
     claims:
       - {claim: c, treatment: {family: rla, ablations: tied_gamma}, reference: {ablations: none}, expect: higher,
          min_effect: 0.01}
       - {claim: d, treatment: {ablations: [tied_gamma], family: rla}, reference: {ablations: none}, expect: higher,
          min_effect: 0.01}
     """, ":7: claims.1", "repeats claims.0"),
])
def test_bad_specs_name_file_line_key(tmp_path, text, where, says):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_spec(path)
    message = str(err.value)
    assert message.startswith(str(path)), message
    assert where in message and says in message, message


def test_malformed_yaml_and_cli_exit_code(tmp_path, capsys):
    path = write(tmp_path, "kind: curve\ntitle: [unclosed\n", name="broken.yaml")
    with pytest.raises(UserError, match=r"broken.yaml:2: title: malformed YAML"):
        load_spec(path)
    # The CLI validates every spec before touching a tracking store: exit 2, one line, no traceback.
    (tmp_path / "runs" / "smoke").mkdir(parents=True)
    (tmp_path / "runs" / "smoke" / "sweep.json").write_text("{}")
    assert main(["dashboard", "smoke", "--root", str(tmp_path / "runs"), "--specs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "broken.yaml" in err and "Traceback" not in err
    # an unknown sweep is said first, alone: no "loading the specs" before it
    assert main(["dashboard", "smoke", "--root", str(tmp_path / "nowhere"), "--specs", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("rla-sweep: error: no sweep 'smoke'")


def test_a_spec_folder_reads_yml_files_too_and_refuses_two_specs_of_one_name(tmp_path):
    """A `.yml` spec was skipped without a word; two files of one name (a.yaml, a.yml) would write one figure."""
    text = (spec_dir() / "table4_no_fitting.yaml").read_text()
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "b.yml").write_text(text)
    assert [s.name for s in load_specs(tmp_path)] == ["a", "b"]
    (tmp_path / "a.yml").write_text(text)
    with pytest.raises(UserError, match="two specs named 'a': a.yaml and a.yml; rename one"):
        load_specs(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=r"no dashboard specs \(\*.yaml, \*.yml\)"):
        load_specs(empty)


def test_metrics_and_params_no_run_has_are_noted_with_the_closest(tmp_path):
    """A misspelt metric or param draws an empty panel or a 'missing' column: the figure's notes say which name no
    run has, with the closest the runs have; a column whose fallback the runs have is not noted (the table says
    so itself), nor a glob that matches."""
    from types import SimpleNamespace

    from rla_ablate.dashboard.render import unlogged
    from rla_ablate.tracking.read import RunRecord

    run = RunRecord("r", "e", "finished", {}, {"accounting.params": "1", "model.clip": "1.0"},
                    {"train/loss": 3.0, "eval/val/loss": 3.1, "eval/val/acc": 0.2})
    runs = SimpleNamespace(jobs=[run])
    curve = load_spec(write(tmp_path, "kind: curve\ntitle: t\ny: train/los\n"))
    assert unlogged(curve, runs) == ["no run of this sweep logged train/los (did you mean train/loss?)"]
    scatter = load_spec(write(tmp_path, "kind: scatter\ntitle: t\ny: eval/*/loss\n"
                                        "x: [{param: accounting.parms}, {param: model.clip}]\n"))
    assert unlogged(scatter, runs) == ["no run of this sweep has param accounting.parms (did you mean "
                                       "accounting.params?)"]
    table = load_spec(write(tmp_path, "kind: table\ntitle: t\ncolumns:\n  - {metric: eval/*/loss}\n"
                                      "  - {metric: eval/*/accuracy}\n"
                                      "  - {metric: eval/piqa/acc, fallback: {metric: eval/*/loss}}\n"))
    assert unlogged(table, runs) == ["no run of this sweep logged eval/*/accuracy (did you mean eval/val/acc?)"]


def test_labels_that_name_no_series_are_noted_with_the_closest(tmp_path):
    """A misspelt `labels` key leaves its series under the default name: the notes say so; keys that are the
    joined series values of a run, or one value a run has (a tag or a config value), are not noted."""
    from types import SimpleNamespace

    from rla_ablate.dashboard.render import unlogged, unmatched_labels
    from rla_ablate.tracking.read import RunRecord

    runs = SimpleNamespace(jobs=[
        RunRecord("a", "e", "finished", {"family": "rla", "ablations": "none"}, {"model.clip": "1.0"}, {"train/loss": 3.0}),
        RunRecord("b", "e", "finished", {"family": "rla", "ablations": "tied_gamma"}, {"model.clip": "1.0"},
                  {"train/loss": 3.1})])
    spec = load_spec(write(tmp_path, "kind: curve\ntitle: t\ny: train/loss\nlabels:\n  rla/tied_gamma: RLA, tied\n"
                                     "  none: independent\n  '1.0': clip 1\n  rla/tied_gama: typo\n  nonee: typo\n"))
    assert unlogged(spec, runs) == [
        "labels: 'rla/tied_gama' names no series of this sweep (did you mean rla/tied_gamma, tied_gamma?)",
        "labels: 'nonee' names no series of this sweep (did you mean none, rla/none?)"]
    # values the spec's runs filter allows are labels for series this sweep lacks, not typos (the shipped specs)
    spec = load_spec(write(tmp_path, "kind: curve\ntitle: t\ny: train/loss\nruns: {family: [rla, rdn], ablations: "
                                     "[none, no_clip]}\nlabels:\n  no_clip: w/o clip\n  rdn/none: RDN\n"))
    assert unlogged(spec, runs) == []
    # a value with '/' in it (a data file) joins with the others as the runs have it
    path_runs = SimpleNamespace(jobs=[RunRecord("c", "e", "finished", {"family": "rla"},
                                                {"data.path": "configs/code.yaml"}, {"train/loss": 3.0})])
    spec = load_spec(write(tmp_path, "kind: curve\ntitle: t\ny: train/loss\nseries: [family, data.path]\n"
                                     "labels:\n  rla/configs/code.yaml: RLA on code\n"))
    assert unlogged(spec, path_runs) == []
    for path in sorted((Path(__file__).resolve().parents[1] / "dashboards").rglob("*.yaml")):  # no shipped spec labels what it cannot draw
        assert unmatched_labels(load_spec(path), SimpleNamespace(jobs=[])) == [], path


def test_two_spec_folders_of_one_name_cannot_share_a_sweeps_page(tmp_path):
    """`--specs a/specs` and `--specs b/specs` both render to the sweep's dashboard-specs (and the parent run's
    folder of that name): the second is refused, the first renders again, the repository's specs are never recorded."""
    from rla_ablate.dashboard.build import FOLDERS, claim_folder, dashboard_folder
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(tmp_path / "runs", "s")
    sdir.path.mkdir(parents=True)
    first, second = tmp_path / "a" / "specs", tmp_path / "b" / "specs"
    assert dashboard_folder(first) == dashboard_folder(second) == "dashboard-specs"
    claim_folder(sdir, "dashboard-specs", first)
    claim_folder(sdir, "dashboard-specs", first)  # the same folder again
    with pytest.raises(UserError, match=f"the sweep's dashboard-specs is the page of the specs in {first}"):
        claim_folder(sdir, "dashboard-specs", second)
    claim_folder(sdir, "dashboard", None)
    import json

    assert json.loads((sdir.path / FOLDERS).read_text()) == {"dashboard-specs": str(first.resolve())}


def test_every_bad_spec_of_a_folder_is_named_in_one_report(tmp_path):
    """A folder of specs is fixed in one pass: each bad file's problem at its own file and line, in one error."""
    (tmp_path / "a.yaml").write_text("kind: table\ntitle: t\ncolumns: [{metric: eval/val/loss}]\n"
                                     "validity: {target_engaged_min: true}\n")
    (tmp_path / "b.yaml").write_text("kind: curve\ntitle: t\nruns: {version: olde}\ny: train/loss\n")
    (tmp_path / "c.yaml").write_text("kind: curve\ntitle: t\ny: train/loss\n")
    with pytest.raises(UserError) as err:
        load_specs(tmp_path)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{tmp_path}: --specs: 2 specs have problems", lines
    assert lines[1].startswith(f"{tmp_path / 'a.yaml'}:4: validity.target_engaged_min: true is not a number"), lines
    assert lines[2].startswith(f"{tmp_path / 'b.yaml'}:3: runs: version 'olde'"), lines


def test_a_control_widened_on_another_axis_is_a_control_value():
    """matched_state[heads] tags the control widened by heads: a filter may select it by that value."""
    from rla_ablate.dashboard.spec import check_values

    check_values({"control": ["none", "matched_state[heads]", "matched_params[head_dim]"]}, "runs")
    with pytest.raises(ValueError, match=r"control 'matched_state\[head\]' in runs is no derived control"):
        check_values({"control": "matched_state[head]"}, "runs")
