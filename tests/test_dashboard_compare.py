"""Comparisons a dashboard may draw, on real sweep expansions logged with synthetic metrics through the real MLflow
server and tagged as `launch` tags them: one series per config up to the seed (grids, arms with overrides), n
counts seeds, only the current expansion by default, the validity panel's states, and the verdict rules."""

from __future__ import annotations

import csv
import io
import json
import re
import textwrap

import numpy as np
import pytest
import yaml

import dashboard_synthetic as syn
from rla_ablate.cli import main
from rla_ablate.dashboard import data as D
from rla_ablate.dashboard.build import build_dashboard
from rla_ablate.dashboard.reading import read_runs
from rla_ablate.dashboard.spec import load_spec, load_specs
from rla_ablate.dashboard.stats import paired_diff, seeds_for_power
from rla_ablate.models import ABLATIONS
from rla_ablate.sweep.expand import load_sweep
from rla_ablate.tracking import create_or_get_child_run

pytestmark = pytest.mark.slow

BASE = """\
base:
  train: {tokens: 4096, seq_len: 64, micro_batch_size: 2, batch_tokens: 128}
  data: {kind: stdlib}
  eval: [{name: val, data: {kind: stdlib, split: validation}, tokens: 256}]
"""


def sweep_text(body: str) -> str:
    return textwrap.dedent(body) + BASE


def logged(server, tmp_path, text: str, final, diag=None, status=None):
    """Expand the sweep text (BASE added), write its folder under tmp_path/runs, log its jobs; returns
    (root, sweep, run ids)."""
    sweep = load_sweep(syn.sweep_file(tmp_path, sweep_text(text)))
    root = tmp_path / "runs"
    syn.write_sweep_folder(root, sweep, server.uri)
    ids = syn.log_jobs(server.uri, sweep.name, sweep.jobs, final, diag, status)
    return root, sweep, ids


def table(page: str, spec: str) -> dict[str, list[str]]:
    """{row label: cells} of one table section of the HTML page."""
    section = page[page.index(f'id="{spec}"'):]
    section = section[:section.index("</section>")]
    body = section[section.index('<table class="results">'):section.index("</table>") + 8]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", body)]
    return {r[0]: r for r in rows if r}


def dashboard(root, name, server, specs=None, **kw):
    dash = build_dashboard(name, root, specs_dir=specs, tracking_uri=server.uri, log_artifacts=False, **kw)
    return dash, dash.page.read_text()


CLIP_EFFECT = {0.05: 0.04, 0.2: 0.01, 1.0: 0.0}


def clip_loss(job) -> float:
    return 3.0 + CLIP_EFFECT[job.job.model.clip] + (0.05 if "no_fitting" in job.ablations else 0.0) \
        + 0.002 * job.seed


def test_clip_grid_one_series_per_clip_value_n_counts_seeds(server, tmp_path):
    root, sweep, _ = logged(server, tmp_path, """\
        name: clipgrid
        models: [{preset: tiny-rla}]
        grid: {model.clip: [0.05, 0.2, 1.0]}
        ablations: [no_fitting]
        seeds: [0, 1]
        """, clip_loss)
    dash, page = dashboard(root, "clipgrid", server)
    rows = table(page, "table4_no_fitting")
    # Six rows (3 clip values x with/without fitting), each two seeds: nothing pooled, nothing called "paper default".
    assert sorted(rows) == sorted(["RLA, clip=0.05", "RLA, clip=0.2", "RLA, clip=1.0", "RLA, no fitting, clip=0.05",
                                   "RLA, no fitting, clip=0.2", "RLA, no fitting, clip=1.0"])
    assert "paper default" not in page
    for clip, effect in CLIP_EFFECT.items():
        row = rows[f"RLA, clip={clip}"]
        assert float(row[1].split()[0]) == pytest.approx(3.001 + effect, abs=6e-4) and "(n=2)" in row[1]
        # Δ pairs each no-fitting row with the same clip value, seed by seed: exactly +0.05.
        assert rows[f"RLA, no fitting, clip={clip}"][2].startswith("+0.050 ± 0.000 (n=2)")
        links = re.findall(r">seed (\d)<", row[-1])
        assert links == ["0", "1"]
    # A spec may group by the config key itself; each series is one clip value with n = 2 seeds.
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "clip.yaml").write_text(
        "kind: curve\ntitle: clip\nruns: {family: rla}\nseries: [ablations, model.clip]\ny: eval/*/loss\n")
    runs, _ = read_runs("clipgrid", root, server.uri)
    panels = D.group(load_spec(spec_dir / "clip.yaml"), runs)
    series = panels[""]
    assert [s.label for s in series] == ["clip=0.05", "clip=0.2", "clip=1.0", "no fitting, clip=0.05",
                                         "no fitting, clip=0.2", "no fitting, clip=1.0"]
    assert all(s.seeds == ["0", "1"] and len(s.by_seed()) == 2 for s in series)
    # ... and put it on the x axis, coloured by another key, points of one colour joined.
    (spec_dir / "vs_clip.yaml").write_text(
        "kind: scatter\ntitle: loss vs clip\nseries: [ablations, model.clip]\ncolor: ablations\nconnect: true\n"
        "y: eval/*/loss\nx: [{param: model.clip, log: true}]\n")
    from rla_ablate.dashboard.render import render

    drawn = render(load_spec(spec_dir / "vs_clip.yaml"), runs, tmp_path / "out")
    assert not drawn.notes and drawn.png.stat().st_size > 5000
    assert len({name for _, name, _ in drawn.runs}) == 12
    # The verdict on Table 4's RLA claim: one per clip value, each on its own pair of seeds.
    verdicts = [v for v in dash.verdicts if v.spec == "table4_no_fitting" and "RLA" in v.claim.claim]
    assert sorted(v.treatment for v in verdicts) == ["RLA, no fitting, clip=0.05", "RLA, no fitting, clip=0.2",
                                                     "RLA, no fitting, clip=1.0"]
    assert all(v.diff.diff.n == 2 and v.diff.diff.mean == pytest.approx(0.05) for v in verdicts)


def test_arms_with_overrides_stay_apart_and_pair_with_their_own_arm(server, tmp_path):
    def loss(job):
        return 3.0 + (0.02 if job.arm_label == "rdn-c05" else 0.0) + (0.03 * bool(job.ablations)) + 0.001 * job.seed

    root, sweep, _ = logged(server, tmp_path, """\
        name: arms
        models:
          - {preset: tiny-rdn}
          - {preset: tiny-rdn, overrides: {clip: 0.5}, name: rdn-c05}
          - {preset: tiny-rla, overrides: {clip: 0.5}, name: rla-c05}
        ablations: [no_fitting]
        seeds: [0, 1]
        """, loss)
    _, page = dashboard(root, "arms", server)
    rows = table(page, "table4_no_fitting")
    # a named arm alone in its family keeps its name: "RLA" alone would pass for the preset's model (clip 1)
    assert sorted(rows) == ["RDN, no fitting, rdn-c05", "RDN, no fitting, tiny-rdn", "RDN, rdn-c05", "RDN, tiny-rdn",
                            "RLA, no fitting, rla-c05", "RLA, rla-c05"]
    assert float(rows["RDN, rdn-c05"][1].split()[0]) == pytest.approx(3.0205, abs=6e-4)
    assert float(rows["RDN, tiny-rdn"][1].split()[0]) == pytest.approx(3.0005, abs=6e-4)
    assert "(n=2)" in rows["RDN, rdn-c05"][1] and "(n=2)" in rows["RDN, tiny-rdn"][1]
    # Each arm's ablation is paired with the same arm (+0.03), not with the other arm (+0.01 or +0.05).
    assert rows["RDN, no fitting, rdn-c05"][2].startswith("+0.030 ± 0.000 (n=2)")
    assert rows["RDN, no fitting, tiny-rdn"][2].startswith("+0.030 ± 0.000 (n=2)")


def test_two_runs_with_one_seed_are_an_error_not_an_average(server, tmp_path):
    root, sweep, _ = logged(server, tmp_path, """\
        name: dup
        models: [{preset: tiny-rla}]
        seeds: [0, 1]
        """, lambda job: 3.0 + 0.01 * job.seed)
    # A second run claiming the same series and seed, logged by hand into the sweep's experiment; without a
    # jobs.json (e.g. a shared server and no sweep folder) every run of the experiment counts.
    job = next(j for j in sweep.jobs if j.seed == 0)
    extra = create_or_get_child_run(server.uri, "dup", "by-hand", tags=syn.launch_tags(job),
                                    config=job.job.model_dump(mode="json"))
    from mlflow.tracking import MlflowClient

    MlflowClient(server.uri).log_metric(extra, "eval/val/loss", 9.0, step=syn.LAST)
    MlflowClient(server.uri).set_terminated(extra)
    runs, sel = read_runs("dup", root, server.uri)
    assert sel.stale_excluded == 1 and len(D.all_series(runs)) == 1
    (root / "dup" / "jobs.json").unlink()
    runs, sel = read_runs("dup", root, server.uri)
    (series,) = D.all_series(runs)
    assert not sel.expansion_known and set(series.duplicates) == {"0"}
    # Seed 0 is left out (never averaged: 9.0 would drag the mean), seed 1 stands alone: n = 1.
    assert series.by_seed().keys() == {"1"} and D.final_by_seed(series, "eval/val/loss") == {"1": 3.01}
    # A spec that lists runs (no claim, no comparison declared) is drawn for a sweep of one model.
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "runs.yaml").write_text("kind: table\ntitle: runs\nruns: {family: rla}\ncolumns: [{metric: eval/*/loss}]\n")
    _, page = dashboard(root, "dup", server, specs=spec_dir)
    rows = table(page, "runs")
    (label,) = [k for k in rows if k.startswith("RLA")]
    assert "seed 0 has 2 runs" in label and "left out" in label and "(n=1)" in rows[label][1]
    assert "every run of the experiment is shown" in page


def test_edited_and_relaunched_sweep_shows_only_its_current_jobs(server, tmp_path, capsys):
    text = """\
        name: edited
        models: [{preset: tiny-rla}, {preset: tiny-sgla}]
        seeds: [0, 1, 2]
        """
    failed = lambda job: "FAILED" if job.family == "sgla" and job.seed == 2 else "FINISHED"  # noqa: E731
    root, v1, _ = logged(server, tmp_path, text, lambda job: 3.0 + 0.01 * job.seed, status=failed)
    # The file is edited to one seed and relaunched: jobs.json now lists only seed 0; seeds 1 and 2 are stale.
    v2 = load_sweep(syn.sweep_file(tmp_path, sweep_text(text.replace("seeds: [0, 1, 2]", "seeds: [0]"))))
    syn.write_sweep_folder(root, v2, server.uri)
    dash, page = dashboard(root, "edited", server)
    rows = table(page, "table_matched_state")
    assert sorted(rows) == ["RLA", "sGLA"]
    assert "(n=1)" in rows["sGLA"][1] and "seeds finished" not in page
    assert "4 run(s) of earlier versions of the sweep file are not shown" in page
    assert "older sweep version" not in table(page, "table_matched_state")
    # With the flag, the older runs are back, labelled, in series of their own.
    dash, page = dashboard(root, "edited", server, include_stale=True)
    rows = table(page, "table_matched_state")
    assert sorted(rows) == ["RLA", "RLA (older sweep version)", "sGLA",
                            "sGLA (older sweep version) [1 of 2 seeds finished; 1 failed]"]
    assert "(n=2)" in rows["RLA (older sweep version)"][1] and "(n=1)" in rows["RLA"][1]
    # results: one row per current job, the same with --include-stale plus the older ones.
    assert main(["results", "edited", "--root", str(root), "--tracking-uri", server.uri, "--csv"]) == 0
    current = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert sorted((r["family"], r["seed"], r["version"]) for r in current) == [("rla", "0", "current"),
                                                                                ("sgla", "0", "current")]
    assert main(["results", "edited", "--root", str(root), "--tracking-uri", server.uri, "--json",
                 "--include-stale"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert len(every) == 6 and sum(r["version"] == "older" for r in every) == 4
    assert {r["series"] for r in every if r["family"] == "rla"} == {v1.jobs[0].series}


def diag_values(target: float | None, mixer: float | None) -> dict:
    out = {}
    if target is not None:
        out.update({"diag/target_engaged": target, "layer_00/target_engaged": target})
    if mixer is not None:
        out.update({"diag/mixer_rms_over_sqrt_eps": mixer, "layer_00/mixer_rms_over_sqrt_eps": mixer})
    out.update({"diag/residual_rms": 0.3, "diag/alpha_mean": 0.5, "diag/beta_mean": 0.5, "diag/gamma_mean": 0.5})
    return out


VALIDITY = """\
    name: valid
    models: [{preset: tiny-rla}, {preset: tiny-rdn}]
    ablations:
      - {name: no_clip, families: [rdn]}
      - {name: no_clip_no_norm, families: [rla]}
      - no_output_gates
      - tied_gamma
      - {name: logcosh, families: [rla]}
    seeds: [0, 1]
    """


def test_validity_panel_states_engaged_off_not_measured_identical(server, tmp_path, capsys):
    def loss(job):
        # tied_gamma of RLA computes the same model here: identical final results, seed by seed.
        shift = {"tied_gamma": 0.0 if job.family == "rla" else 0.02, "no_clip": 0.03, "no_clip_no_norm": 0.04,
                 "no_output_gates": 0.01, "logcosh": 0.005}
        return 3.0 + sum(shift[a] for a in job.ablations) + 0.003 * job.seed

    def diag(job):
        if job.family == "rla" and "logcosh" in job.ablations:
            return None                     # logged no diagnostics: an older run
        if job.family == "rdn":
            # RDN's clip never engages here; its output path is alive except without output gates.
            return diag_values(0.0, 0.4 if "no_output_gates" in job.ablations else 3.0)
        return diag_values(0.05, 3.0)

    root, sweep, _ = logged(server, tmp_path, VALIDITY, loss, diag)
    dash, page = dashboard(root, "valid", server)
    panel = page[page.index('id="validity"'):]
    panel = panel[:panel.index("</section>")]
    states = {}
    for row in re.findall(r'<tr class="s-([a-z/-]+)">(.*?)</tr>', panel):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row[1])
        states[(cells[0], cells[1])] = cells[4]
    assert states[("RLA, w/o clip &amp; norm", "0")] == "engaged"             # the reference's clip engaged
    assert states[("RDN, w/o clip", "0")] == "off"                             # the reference's clip never did
    assert states[("RDN, no output gates", "1")] == "off"                      # mixer below sqrt(eps)
    assert states[("RLA, log-cosh", "0")] == "not measured"                    # no diagnostics: never "engaged"
    assert states[("RLA, tied γ", "0")] == states[("RLA, tied γ", "1")] == "identical"
    assert states[("RDN, tied γ", "0")] == "engaged" and states[("RLA", "0")] == "engaged"
    assert "target_engaged &gt;= 0.001 (reference)" in panel and "mixer_rms_over_sqrt_eps: job 0.4 (&lt; 1)" in panel
    # Figures and tables comparing those variants say so on themselves.
    fig4 = next(r for r in dash.rendered if r.name == "fig4b_train_loss")
    assert ("off", "RDN: w/o clip") in [(st, label) for st, label, _ in fig4.flagged]
    # the values that put it off are its reference's (RDN's clip never engaged), and its note says whose they are
    off_detail = next(d for st, label, d in fig4.flagged if (st, label) == ("off", "RDN: w/o clip"))
    assert off_detail == "diag/target_engaged 0 < 0.001 in 2 runs of clip + q/k norm (paper)", off_detail
    rows = table(page, "table5_output_gates")
    assert rows["RDN, no output gates"][-2] == "off*" and rows["RLA, no output gates"][-2] == "engaged"
    logcosh = table(page, "appb_logcosh")
    assert logcosh["RLA, log-cosh"][-2] == "not measured*"
    tied = [v for v in dash.verdicts if v.spec == "fig3a_tied_gamma" and "RLA" in v.claim.claim][0]
    assert tied.mechanism == "identical" and tied.verdict == "unresolved" and "identical" in tied.reason
    gates = [v for v in dash.verdicts if v.spec == "table5_output_gates" and "RDN" in v.claim.claim][0]
    assert gates.mechanism == "off" and gates.verdict == "unresolved"
    # An invalid comparison never recommends seeds: no count, and the reason says which values were too low.
    assert gates.reason.startswith("mechanism off (diag/mixer_rms_over_sqrt_eps 0.4 < 1 in 2 runs)")
    assert gates.seeds_needed is None and tied.seeds_needed is None
    assert gates.seeds_text() == "— (more seeds do not help until the mechanism is engaged)"
    assert tied.seeds_text() == "— (more seeds do not help: the results are identical)"
    svg = (dash.out_dir / "table5_output_gates.svg").read_text()
    text = re.sub(r"\s+", " ", " ".join(re.findall(r"<text[^>]*>(.*?)</text>", svg, re.S)))
    # the figure's footer gives each verdict's q among the dashboard's claims (they are evaluated before any figure)
    assert "RDN, no output gates − RDN: Δ = +0.0100 ± 0.0000 (n=2), p=0, q=0; seeds for 80% power: — (more seeds " \
           "do not help until the mechanism is engaged)" in text
    assert "Cells: mean ± the 95% t-interval's half-width over n seeds" in text and "ONE SEED" not in text
    saved = {(v["spec"], v["claim"]): v for v in json.loads((dash.out_dir / "verdicts.json").read_text())}
    assert saved[("table5_output_gates", gates.claim.claim)]["seeds_needed"] is None
    # Spec thresholds are used: with the mixer threshold lowered to 0.1, RDN without output gates is engaged.
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "gates.yaml").write_text(
        "kind: table\ntitle: gates\nruns: {ablations: [none, no_output_gates]}\n"
        "columns: [{metric: eval/*/loss}]\nvalidity: {mixer_rms_over_sqrt_eps_min: 0.1}\n")
    _, page = dashboard(root, "valid", server, specs=spec_dir)
    assert table(page, "gates")["RDN, no output gates"][-2] == "engaged"


def test_verdict_rules_on_known_effects(server, tmp_path):
    rng = np.random.default_rng(7)
    seeds = list(range(6))
    noise = {s: rng.normal(0, 0.02) for s in seeds}            # shared by a seed's runs: pairing removes it
    # Per-seed differences to the reference, chosen so that each rule has one clear case.
    delta = {"no_fitting": [0.050, 0.052, 0.048, 0.051, 0.049, 0.050],          # +0.05, tight: confirmed
             "no_output_gates": [0.040, 0.042, 0.038, 0.041, 0.039, 0.040],     # claimed lower, is higher: reversed
             "tied_gamma": [0.040, -0.020, 0.030, -0.010, 0.035, -0.015],       # +0.01, wide: unresolved
             "no_clip": [0.0010, 0.0012, 0.0008, 0.0011, 0.0009, 0.0010]}      # real but tiny: negligible

    def loss(job):
        a = job.ablations[0] if job.ablations else None
        return 3.0 + noise[job.seed] + (delta[a][job.seed] if a else 0.0)

    text = f"""\
        name: verdicts
        models: [{{preset: tiny-rla}}]
        ablations: [no_fitting, no_output_gates, tied_gamma, no_clip]
        seeds: {seeds}
        """
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "claims.yaml").write_text(
        "kind: table\ntitle: claims\nruns: {family: rla}\ncolumns: [{metric: eval/*/loss}]\nclaims:\n"
        "  - {claim: fitting helps, treatment: {ablations: no_fitting}, reference: {ablations: none},"
        " expect: higher, min_effect: 0.01}\n"
        "  - {claim: gates hurt RLA, treatment: {ablations: no_output_gates}, reference: {ablations: none},"
        " expect: lower, min_effect: 0.01}\n"
        "  - {claim: tying γ hurts, treatment: {ablations: tied_gamma}, reference: {ablations: none},"
        " expect: higher, min_effect: 0.01}\n"
        "  - {claim: the clip matters, treatment: {ablations: no_clip}, reference: {ablations: none},"
        " expect: higher, min_effect: 0.01}\n"
        "  - {claim: nothing to compare, treatment: {ablations: no_norm}, reference: {ablations: none},"
        " expect: higher, min_effect: 0.01}\n"
        # Both series at the metric's chance value (a task nobody learned): no verdict, whatever the interval says.
        "  - {claim: clip at chance, treatment: {ablations: no_clip}, reference: {ablations: none},"
        " expect: higher, min_effect: 0.05, chance: 3.0}\n"
        "  - {claim: fitting clears chance, treatment: {ablations: no_fitting}, reference: {ablations: none},"
        " expect: higher, min_effect: 0.01, chance: 3.0}\n"
        # A treatment the sweep has, compared with a series it lacks: not tested either, not a verdict.
        "  - {claim: no reference here, treatment: {ablations: no_fitting}, reference: {ablations: logcosh},"
        " expect: higher, min_effect: 0.01}\n")
    root, sweep, _ = logged(server, tmp_path, text, loss,
                            lambda job: diag_values(0.05, 3.0))
    dash, page = dashboard(root, "verdicts", server, specs=spec_dir)
    got = {v.claim.claim: v for v in dash.verdicts}
    assert got["fitting helps"].verdict == "confirmed"
    assert got["gates hurt RLA"].verdict == "contradicted" and got["gates hurt RLA"].reason.startswith("reversed")
    assert got["tying γ hurts"].verdict == "unresolved"
    assert got["the clip matters"].verdict == "contradicted" and got["the clip matters"].reason.startswith("negligible")
    # No run of the treatment: no verdict, one line naming the runs it needs.
    assert "nothing to compare" not in got and "no reference here" not in got
    missing, unpaired = dash.untested
    assert missing.line() == ("claims: nothing to compare: needs runs with ablations=no_norm, compared with "
                              "ablations=none (sweep file: add no_norm to ablations:)")
    assert unpaired.line().startswith("claims: no reference here: needs runs with ablations=no_fitting, compared "
                                      "with ablations=logcosh"), unpaired.line()
    assert got["clip at chance"].verdict == "unresolved" and got["clip at chance"].reason.startswith("not learned")
    assert got["fitting clears chance"].verdict == "confirmed"
    # The numbers are the paired statistics, and the seed count is the power analysis of the observed spread.
    by = {(j.ablations[0] if j.ablations else "none", j.seed): loss(j) for j in sweep.jobs}
    # With a chance level, the seeds on which each side left chance are named when they differ.
    learned = {a: {str(s) for s in seeds if abs(by[(a, s)] - 3.0) >= 0.01} for a in ("no_fitting", "none")}
    assert learned["no_fitting"] != learned["none"]          # the reference's noise leaves it at chance on some seeds
    assert "learned the task (at least 0.01 from chance) on seeds 0, 1, 2, 3, 4, 5 of the treatment and seed" \
        in got["fitting clears chance"].reason, got["fitting clears chance"].reason
    assert "learned the task" not in got["fitting helps"].reason               # no chance level: nothing to say
    # the figure's footer repeats that caveat after the verdict's line, and only the caveats (not its rule's words)
    from rla_ablate.dashboard.render import _caveats

    said = _caveats(got["fitting clears chance"])
    assert said.startswith(" (learned the task (at least 0.01 from chance)") and "interval" not in said, said
    assert _caveats(got["fitting helps"]) == ""
    for claim, abl in (("fitting helps", "no_fitting"), ("tying γ hurts", "tied_gamma")):
        expected = paired_diff({s: by[(abl, s)] for s in seeds}, {s: by[("none", s)] for s in seeds})
        v = got[claim]
        assert v.diff.diff.n == 6
        assert v.diff.diff.mean == pytest.approx(expected.diff.mean, abs=1e-9)
        assert v.diff.diff.lo == pytest.approx(expected.diff.lo, abs=1e-9)
        assert v.seeds_needed == seeds_for_power(expected.diff.std, 0.01)
    assert got["tying γ hurts"].seeds_needed > 6 and got["fitting helps"].seeds_needed <= 3
    verdicts = json.loads((dash.out_dir / "verdicts.json").read_text())
    assert {v["claim"]: v["verdict"] for v in verdicts}["fitting helps"] == "confirmed"
    assert 'class="v-confirmed"' in page and 'class="v-contradicted"' in page


def test_divergence_decides_a_claim_when_one_side_diverged_on_every_seed(server, tmp_path, capsys):
    """no_norm diverges on all 3 seeds, the full model on none: a claim that it is worse is confirmed, one that it
    is better contradicted. no_clip diverges on one seed: that seed is left out of the pairing and named."""
    seeds = [0, 1, 2]

    def status(job):
        a = job.ablations[0] if job.ablations else None
        return "DIVERGED" if a == "no_norm" or (a == "no_clip" and job.seed == 1) else "FINISHED"

    def loss(job):
        return 3.0 + 0.001 * job.seed + (0.05 if job.ablations else 0.0)

    text = f"""\
        name: diverging
        models: [{{preset: tiny-rla}}]
        ablations: [no_norm, no_clip]
        seeds: {seeds}
        """
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "claims.yaml").write_text(
        "kind: table\ntitle: claims\nruns: {family: rla}\ncolumns: [{metric: eval/*/loss}]\nclaims:\n"
        "  - {claim: the norm matters, treatment: {ablations: no_norm}, reference: {ablations: none},"
        " expect: higher, min_effect: 0.01}\n"
        "  - {claim: the norm hurts, treatment: {ablations: no_norm}, reference: {ablations: none},"
        " expect: lower, min_effect: 0.01}\n"
        "  - {claim: the clip matters, treatment: {ablations: no_clip}, reference: {ablations: none},"
        " expect: higher, min_effect: 0.01}\n")
    (spec_dir / "validity.yaml").write_text("kind: validity\ntitle: validity\n")
    root, _, _ = logged(server, tmp_path, text, loss, status=status)
    dash, page = dashboard(root, "diverging", server, specs=spec_dir)
    got = {v.claim.claim: v for v in dash.verdicts}
    assert got["the norm matters"].verdict == "confirmed"
    assert "treatment diverged on every seed (0, 1, 2)" in got["the norm matters"].reason
    assert got["the norm matters"].seeds_needed is None
    # A diverged run has no final diagnostics and needs none: the verdict says so instead of "not measured", and
    # the validity panel names the job's own status.
    assert got["the norm matters"].mechanism == "n/a", got["the norm matters"].mechanism_detail
    assert "decided by divergence" in got["the norm matters"].mechanism_detail
    panel = page[page.index('id="validity"'):]
    assert "run diverged" in panel and "run failed" not in panel
    rows = table(page, "claims")
    (norm,) = [cells for label, cells in rows.items() if label.startswith("RLA, w/o norm")]
    assert "0 of 3 seeds finished; 3 diverged" in norm[0] and norm[-2] == "diverged", norm
    assert got["the norm hurts"].verdict == "contradicted"
    clip = got["the clip matters"]
    assert clip.diff.diff.n == 2 and "treatment diverged on seed 1 (left out)" in clip.reason
    # `results` names the job's own status too (MLflow ends a diverged run as failed)
    capsys.readouterr()
    assert main(["results", "diverging", "--root", str(root), "--tracking-uri", server.uri, "--json"]) == 0
    statuses = {(r["ablations"], r["seed"]): r["status"] for r in json.loads(capsys.readouterr().out)}
    assert statuses[("no_norm", 0)] == statuses[("no_clip", 1)] == "diverged"
    assert statuses[("no_clip", 0)] == statuses[("none", 2)] == "finished"


def test_claim_direction_of_a_metric():
    from rla_ablate.dashboard.spec import Claim
    base = {"claim": "c", "treatment": {"ablations": "no_fitting"}, "reference": {"ablations": "none"}, "expect": "lower",
            "min_effect": 0.01}
    assert Claim(**base, metric="eval/mqar_kv32/acc").better_is_higher
    assert not Claim(**base, metric="eval/val/loss").better_is_higher
    assert not Claim(**base, metric="eval/x/acc", higher_is_better=False).better_is_higher
    assert Claim(**base, metric="eval/mqar_kv8/acc_area").better_is_higher   # the area under an accuracy curve
    assert not Claim(**base, metric="eval/val/loss_area").better_is_higher
    # a table column and a gains figure take the same rule (a column's accuracies had been lower-is-better)
    from rla_ablate.dashboard.spec import Column, GainsFallback

    assert Column(metric="eval/*/acc").better_is_higher and not Column(metric="eval/*/loss").better_is_higher
    assert not Column(metric="eval/*/acc", higher_is_better=False).better_is_higher
    assert GainsFallback(metric="eval/{set}/acc", categories={}).better_is_higher
    assert not GainsFallback(metric="eval/{set}/loss", categories={}).better_is_higher


def test_an_area_claim_says_when_the_two_sides_were_evaluated_at_other_tokens():
    """eval/<set>/acc_area averages each evaluation over the tokens since the one before: two evaluation schedules or
    two budgets are two grids, which a verdict on the areas names (the metric's own schedule only; other metrics say
    nothing); an unset eval_every_tokens (logged as null: 10 evaluations a run) is a schedule too."""
    from rla_ablate.dashboard.verdict import _schedule_note
    from rla_ablate.tracking.read import RunRecord

    key = "eval/mqar_kv8/acc_area"

    def series(every, last=4096, status="finished"):
        runs = [RunRecord(f"r{seed}", "0", status, {"seed": str(seed)}, {"train.eval_every_tokens": every}, {},
                          steps={key: last}) for seed in (0, 1)]
        return D.Series(("s",), {}, "x", runs)

    assert _schedule_note(key, series("262144"), series("262144")) == ""
    note = _schedule_note(key, series("262144"), series("524288"))
    assert "different evaluation schedules or budgets (every 262144 tokens to 4,096; every 524288 tokens to 4,096" in note
    assert _schedule_note("eval/mqar_kv8/acc", series("262144"), series("524288")) == ""
    assert _schedule_note(key, series("262144"), series("524288", status="failed")) == ""
    assert _schedule_note(key, series("null"), series("null")) == ""
    note = _schedule_note(key, series("null", last=4096), series("null", last=4608))  # a longer control
    assert "(10 evaluations a run to 4,096; 10 evaluations a run to 4,608)" in note, note
    assert "10 evaluations a run" in _schedule_note(key, series("null"), series("1024"))


def test_smoke_sweep_dashboard_has_the_validity_panel_and_a_verdict_per_claim(server, tmp_path):
    sweep = load_sweep(syn.REPO_SWEEPS / "smoke.yaml")
    root = tmp_path / "runs"
    syn.write_sweep_folder(root, sweep, server.uri)
    syn.log_jobs(server.uri, sweep.name, sweep.jobs, lambda job: 3.0 + 0.01 * len(job.ablations),
                 lambda job: diag_values(0.0, 0.5))
    dash, page = dashboard(root, sweep.name, server)
    assert 'id="validity"' in page and '<table class="validity">' in page
    claims = [(s.name, c.claim) for s in load_specs() for c in s.claims]
    decided = {(v.spec, v.claim.claim) for v in dash.verdicts}
    assert set(claims) == decided and len(claims) >= 10
    # One seed: no interval, so nothing is confirmed or contradicted; and with every mechanism off, no verdict
    # suggests more seeds (they would not make any comparison valid).
    assert {v.verdict for v in dash.verdicts} == {"unresolved"} and not dash.untested
    assert all(v.diff is None or v.diff.diff.n <= 1 for v in dash.verdicts)
    # (sGLA and RLA end with the same loss here: that comparison is 'identical', the others 'off'.)
    assert {v.mechanism for v in dash.verdicts} == {"off", "identical"}
    assert {v.seeds_text() for v in dash.verdicts} == {"— (more seeds do not help until the mechanism is engaged)",
                                                      "— (more seeds do not help: the results are identical)"}
    # Every ablation of the smoke sweep shows up in the validity panel; at this scale none was engaged.
    panel = page[page.index('id="validity"'):]
    for name in ("no output gates", "no fitting", "tied γ", "w/o clip &amp; norm", "w/o clip", "log-cosh",
                 "matched state"):
        assert f"{name}</td>" in panel, name
    states = re.findall(r'<tr class="s-([a-z-]+)">', panel)
    assert len(states) == len(sweep.jobs) and set(states) == {"off"}      # mixer output 0.5 < sqrt(eps)


def test_every_registry_ablation_has_a_figure_or_table():
    shown = set()
    for spec in load_specs():
        shown |= set(spec.allowed("ablations") or [])
    assert set(ABLATIONS) <= shown, set(ABLATIONS) - shown


def test_a_claim_on_a_metric_no_run_logged_says_so_and_names_the_closest(server, tmp_path):
    """A claim whose metric no run of the sweep logged (here misspelt) is unresolved with that reason and the logged
    names closest to it, without a seed count, and with its runs' mechanism state (it had said n/a, which is the
    transformer's); its neighbour on a logged metric is decided."""
    root, sweep, _ = logged(server, tmp_path, """\
        name: typo
        models: [{preset: tiny-rla}]
        ablations: [no_fitting]
        seeds: [0, 1]
        """, lambda job: 3.0 + 0.03 * bool(job.ablations) + 0.001 * job.seed, lambda job: diag_values(0.05, 3.0))
    specs = tmp_path / "specs"
    specs.mkdir()
    claim = {"treatment": {"family": "rla", "ablations": "no_fitting"}, "reference": {"ablations": "none"},
             "expect": "higher", "min_effect": 0.005}
    (specs / "t.yaml").write_text(yaml.safe_dump({
        "kind": "table", "title": "t", "runs": {"family": ["rla"]}, "series": ["family", "ablations"],
        "columns": [{"metric": "eval/*/loss", "label": "eval loss"}],
        "claims": [{"claim": "misspelt", "metric": "eval/vall/loss", **claim},
                   {"claim": "logged", "metric": "eval/val/loss", **claim}]}))
    dash, page = dashboard(root, "typo", server, specs=specs)
    got = {v.claim.claim: v for v in dash.verdicts}
    bad = got["misspelt"]
    assert bad.verdict == "unresolved" and bad.metric is None and bad.diff is None
    assert bad.reason.startswith("no run of this sweep logged eval/vall/loss (did you mean eval/val/loss"), bad.reason
    assert bad.mechanism == got["logged"].mechanism == "engaged" and bad.seeds_text() == "— (no run logs the metric)"
    assert "no run of this sweep logged eval/vall/loss" in page
    assert got["logged"].verdict == "confirmed" and got["logged"].diff.diff.n == 2
    # Rendered again with other specs into the same folder (--out; by default each set of specs has its own): the
    # first render's figures go, a user's file stays.
    assert (dash.out_dir / "t.png").is_file() and dash.out_dir.name == "dashboard-specs"
    (dash.out_dir / "mine.png").write_bytes(b"not ours")
    other = tmp_path / "other"
    other.mkdir()
    (other / "u.yaml").write_text((specs / "t.yaml").read_text())
    dash, _ = dashboard(root, "typo", server, specs=other, out_dir=dash.out_dir)
    assert (dash.out_dir / "u.png").is_file() and (dash.out_dir / "mine.png").is_file()
    assert not (dash.out_dir / "t.png").exists() and not (dash.out_dir / "t.svg").exists()


def test_small_sweep_draws_what_it_compares_and_lists_the_claims_it_cannot_test(server, tmp_path, capsys):
    """Two families, one ablation, two seeds: Table 4 and the validity panel are drawn, every other spec is one line
    per claim naming the runs it needs; the phases are announced as they start."""
    def status(job):
        return "FAILED" if job.family == "rdn" and job.ablations and job.seed == 1 else "FINISHED"

    root, sweep, _ = logged(server, tmp_path, """\
        name: mine
        models: [{preset: tiny-rla}, {preset: tiny-rdn}]
        ablations: [no_fitting]
        seeds: [0, 1]
        """, lambda job: 3.0 + 0.03 * bool(job.ablations) + 0.001 * job.seed, lambda job: diag_values(0.05, 3.0),
        status=status)
    phases: list[str] = []
    dash, page = dashboard(root, "mine", server, phase=phases.append)
    assert [r.name for r in dash.rendered] == ["table4_no_fitting", "validity"]
    assert sorted(p.name for p in dash.out_dir.glob("*.png")) == ["table4_no_fitting.png", "validity.png"]
    for name in ("table5_output_gates", "fig3a_tied_gamma", "fig3b_gains_by_category", "matched_budget"):
        assert f'id="{name}"' not in page, name
    # Table 4's two claims are decided; RDN's has one paired seed and says which seed is missing where.
    got = {v.claim.claim.split(":")[0]: v for v in dash.verdicts}
    assert sorted(got) == ["Persistent R helps RDN", "Persistent R helps RLA"]
    rla, rdn = got["Persistent R helps RLA"], got["Persistent R helps RDN"]
    assert rla.verdict == "confirmed" and rla.diff.diff.n == 2
    assert rla.seeds_text() == ("2 (decided at n=2; a rerun with this many seeds detects an effect of min_effect "
                                "80% of the time)")
    assert rdn.verdict == "unresolved" and rdn.diff.diff.n == 1
    assert "seeds finished with the metric: RDN, no fitting: seed 0, not 1; RDN: seeds 0, 1" in rdn.reason
    assert rdn.seeds_text() == "unknown (1 paired seed; 2+ estimate the spread)"
    # Every other claim: no verdict and no power line, one line with the runs it needs.
    claims = {(s.name, c.claim) for s in load_specs() for c in s.claims}
    untested = [u for u in dash.untested if u.claim]
    assert {(u.spec, u.claim) for u in untested} == claims - {(v.spec, v.claim.claim) for v in dash.verdicts}
    lines = {u.line() for u in dash.untested}
    assert ("appb_logcosh: Log-cosh improves on the clip target for RLA (the App. B proposal): needs runs with "
            "family=rla, ablations=logcosh, compared with ablations=none (sweep file: add logcosh to ablations:)"
            ) in lines
    assert ("table_matched_state: RLA beats sGLA at matched state: sGLA widened to RLA's state still has the higher "
            "eval loss: needs runs with family=sgla, ablations=matched_state, compared with family=rla, "
            "ablations=none, control=none (sweep file: add matched_state to controls:)") in lines
    assert ("fig4a_layer_norms: (no claims; not drawn): needs runs with family=rla|rdn, ablations=no_clip|no_norm|"
            "no_clip_no_norm, compared with ablations=none (sweep file: add no_clip or no_norm or no_clip_no_norm to "
            "ablations:)") in lines
    # fig. 3b compares with tied γ: the side this sweep lacks is named.
    assert ("fig3b_gains_by_category: (no claims; not drawn): needs runs with family=rla|rdn, ablations=tied_gamma: "
            "what the series of this sweep are compared with (sweep file: add tied_gamma to ablations:)") in lines
    assert "no run matches the treatment" not in page and "needs 2+ seeds" not in page
    assert f"Not tested by this sweep ({len(untested)} claims)" in page
    assert dash.notes[0].startswith(f"not tested by this sweep: {len(untested)} claims; 8 of 10 specs have nothing "
                                    "to compare here and are not drawn")
    saved = json.loads((dash.out_dir / "verdicts.json").read_text())
    assert sorted(v["verdict"] for v in saved) == sorted(["confirmed", "unresolved"] + ["not tested"] * len(untested))
    # The phases, in order, each announced as it starts.
    assert phases[0] == "reading the runs of sweep 'mine'"
    assert phases[1] == ("rendering 2 of 10 specs from 8 jobs (1 failed, 7 finished); 8 have nothing to compare "
                         "in this sweep")
    assert phases[2].startswith("writing ") and phases[2].endswith("index.html and verdicts.json")
    # The command line: phases on stderr as they start, the untested claims as lines, only the decided verdicts;
    # with a study file (a search sweep's: here without a study in it) the rendering phase names its figure too
    (root / "mine" / "optuna.db").touch()
    assert main(["dashboard", "mine", "--root", str(root), "--tracking-uri", server.uri]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("dashboard mine: loading the specs\ndashboard: reading the runs of sweep 'mine'\n"
                          "dashboard: rendering 2 of 10 specs and the search's figure from 8 jobs")
    assert "dashboard: logging the files to the sweep's parent run in MLflow" in err
    assert "add logcosh to ablations:" in out and len(re.findall(r"^  (unresolved|confirmed) ", out, re.M)) == 2


def test_clip_radius_question_with_the_mechanism_off_recommends_no_seeds(server, tmp_path, capsys):
    """The walk-through of docs/SWEEPS.md at the tiny presets' scale: the mixer output stays below the output norm's
    sqrt(eps), so both verdicts are unresolved, and the power line says seeds do not help (not 'add seeds')."""
    rng = np.random.default_rng(3)
    noise = {s: rng.normal(0, 0.003) for s in range(3)}
    root, _, _ = logged(server, tmp_path, """\
        name: clip-radius
        models: [{preset: tiny-rla}]
        grid: {model.clip: [0.05, 0.2, 1.0]}
        seeds: [0, 1, 2]
        """, lambda job: 3.9 + noise[job.seed] + {0.05: 0.002, 0.2: 0.0001, 1.0: 0.0}[job.job.model.clip] * (
            job.seed + 1), lambda job: diag_values(0.0, 0.5))
    first, _ = dashboard(root, "clip-radius", server)  # the repository's specs: the sweep's default page
    dash, page = dashboard(root, "clip-radius", server, specs=syn.REPO_SWEEPS.parent / "dashboards" / "questions")
    # another set of specs renders a page of its own beside it, which leaves the first one as it was
    assert first.out_dir.name == "dashboard" and dash.out_dir.name == "dashboard-questions"
    assert dash.out_dir.parent == first.out_dir.parent and (first.out_dir / "index.html").is_file()
    assert {p.name for p in first.out_dir.glob("*.png")} and not {p.name for p in first.out_dir.glob("clip_radius*")}
    assert [r.name for r in dash.rendered] == ["clip_radius", "clip_radius_curve"]
    assert {u.spec for u in dash.untested} == {"clip_radius_relative"}      # the relative-radius question's claims
    assert [v.verdict for v in dash.verdicts] == ["unresolved", "unresolved"]
    for v in dash.verdicts:
        assert v.mechanism == "off" and v.diff.diff.n == 3 and v.seeds_needed is None
        assert v.reason.startswith("mechanism off (diag/mixer_rms_over_sqrt_eps 0.5 < 1 in ")
        assert v.seeds_text() == "— (more seeds do not help until the mechanism is engaged)"
    assert "diag/target_engaged &lt; 0.001 at both radii (seeds 0, 1, 2)" in page
    assert main(["dashboard", "clip-radius", "--root", str(root), "--tracking-uri", server.uri, "--specs",
                 str(syn.REPO_SWEEPS.parent / "dashboards" / "questions")]) == 0
    out = capsys.readouterr().out
    assert out.count("seeds for 80% power: — (more seeds do not help until the mechanism is engaged)") == 2
    assert not re.search(r"seeds for 80% power: \d", out)
    # With the proxy options (relative radius) the mechanisms act: the comparison is valid, and now the power line
    # gives the seeds that would decide it.
    root, _, _ = logged(server, tmp_path, """\
        name: clip-radius-relative
        models: [{preset: tiny-rla, overrides: {init_std: 0.0339, conv_init: identity, clip_mode: relative}}]
        grid: {model.clip: [0.5, 2.0, 8.0]}
        seeds: [0, 1, 2]
        """, lambda job: 3.6 + 3 * noise[job.seed] + {0.5: 0.004, 2.0: 0.0, 8.0: 0.001}[job.job.model.clip] * (
            job.seed + 1), lambda job: diag_values({0.5: 0.5, 2.0: 0.05, 8.0: 0.003}[job.job.model.clip], 20.0))
    dash, _ = dashboard(root, "clip-radius-relative", server, specs=syn.REPO_SWEEPS.parent / "dashboards" / "questions")
    assert [r.name for r in dash.rendered] == ["clip_radius_relative"]
    assert {u.spec for u in dash.untested} == {"clip_radius", "clip_radius_curve"}
    assert [v.treatment for v in dash.verdicts] == ["RLA, clip=0.5", "RLA, clip=8.0"]
    for v in dash.verdicts:
        assert v.mechanism == "engaged" and v.reference == "RLA, clip=2.0" and v.diff.diff.n == 3
        assert v.seeds_needed == seeds_for_power(v.diff.diff.std, 0.005)
        assert v.seeds_text() == (f"{v.seeds_needed} (decided at n=3; a rerun with this many seeds detects an "
                                  "effect of min_effect 80% of the time)" if v.verdict != "unresolved" else
                                  f"{v.seeds_needed} (rough: the spread from 3 seeds)")


def test_a_baseline_against_a_residual_model_is_judged_by_its_mixers_not_by_two_clip_radii():
    # sGLA widened to RLA's state against RLA: the baseline's `model.clip` is unused (no residual path, no
    # target_engaged), so the comparison is not one of two clip radii; its mixers' checks decide. Two RLA
    # radii still are one, and a radius whose target never engaged on either side is off.
    from types import SimpleNamespace

    from rla_ablate.dashboard import validity as V
    from rla_ablate.dashboard.spec import ValidityThresholds
    from rla_ablate.sweep.identity import ARM, CONTROL, SERIES
    from rla_ablate.tracking.read import RunRecord

    def run(series, family, control, clip, seed, **diag):
        tags = {SERIES: series, "version": "current", "family": family, "ablations": "none", CONTROL: control,
                ARM: "lm-rla", "seed": str(seed)}
        metrics = {"eval/val/loss": 1.3 + 0.01 * seed + 0.1 * clip, "diag/mixer_rms_over_sqrt_eps": 7.0,
                   **{f"diag/{k}": v for k, v in diag.items()}}
        return RunRecord(f"{series}-{seed}", "0", "finished", tags, {"model.clip": str(clip)}, metrics)

    runs = [run("rla", "rla", "none", 2.0, s, target_engaged=0.03) for s in (0, 1)]
    runs += [run("sgla-matched", "sgla", "matched_state", 1.0, s) for s in (0, 1)]
    runs += [run("rla-r4", "rla", "none", 4.0, s, target_engaged=0.0) for s in (0, 1)]
    runs += [run("rla-r8", "rla", "none", 8.0, s, target_engaged=0.0) for s in (0, 1)]
    index = V.ValidityIndex(SimpleNamespace(jobs=runs), ValidityThresholds())
    series = {s.key[0]: s for s in index.everything}
    state, detail = V.comparison(index, series["sgla-matched"], series["rla"])
    assert state == V.ENGAGED, detail
    assert V.comparison(index, series["rla-r4"], series["rla"])[0] == V.ENGAGED
    state, detail = V.comparison(index, series["rla-r8"], series["rla-r4"])
    assert state == V.OFF and "target_engaged" in detail, detail


def test_a_derived_control_without_a_run_of_its_baseline_is_checked_against_the_run_it_is_compared_with(tmp_path):
    # A sweep with RLA and its matched-state control but no plain sGLA: the control's own reference has no run, so
    # it is checked against the RLA it derives from, in the validity panel as in a comparison: engaged (or off, when
    # a side measured below the threshold), not 'not measured'.
    from types import SimpleNamespace

    from rla_ablate.dashboard import validity as V
    from rla_ablate.dashboard.spec import ValidityThresholds
    from rla_ablate.sweep.identity import ARM, CONTROL, SERIES
    from rla_ablate.tracking.read import RunRecord

    def run(series, family, ablations, seed, mixer):
        tags = {SERIES: series, "version": "current", "family": family, "ablations": ablations,
                CONTROL: ablations if ablations != "none" else "none", ARM: "lm-rla", "seed": str(seed)}
        metrics = {"eval/val/loss": 1.3 + 0.01 * seed + (0.1 if family == "sgla" else 0.0),
                   "diag/mixer_rms_over_sqrt_eps": mixer}
        return RunRecord(f"{series}-{seed}", "0", "finished", tags, {}, metrics)

    for control_mixer, want in ((86.0, V.ENGAGED), (0.5, V.OFF)):
        runs = [run("rla", "rla", "none", s, 22.0) for s in (0, 1)]
        runs += [run("sgla-wallclock", "sgla", "matched_wallclock", s, control_mixer) for s in (0, 1)]
        index = V.ValidityIndex(SimpleNamespace(jobs=runs), ValidityThresholds())
        series = {s.key[0]: s for s in index.everything}
        control = series["sgla-wallclock"]
        # the validity panel's own state of the control is that of the comparison, against the RLA it derives from,
        # which the panel names as its reference
        assert index.of(control).reference is series["rla"] and index.of(control).state == want
        from rla_ablate.dashboard.render import Rendered, validity_rows

        path = tmp_path / "v.yaml"
        path.write_text("kind: validity\ntitle: v\n")
        out = Rendered("v", "v", "", "validity")
        validity_rows(load_spec(path), SimpleNamespace(jobs=runs), out, lambda run_id: None, index)
        measured = {row[0].text: row[3].text for row in out.rows}
        assert [m for label, m in measured.items() if label.startswith("sGLA")][0].endswith(
            f"; reference: {series['rla'].label}, the model it is derived from"), measured
        for pair in ((control, series["rla"]), (series["rla"], control)):
            state, detail = V.comparison(index, *pair)
            assert state == want, (pair, detail)
            assert "not measured" not in detail, detail


def test_a_missing_claim_names_the_arms_it_needs_on_both_sides():
    """A sweep of rla and sgla with matched_state controls: RDN's claims ask for an rdn arm (which derives the gdn
    control, already in controls:) and, for the main comparison, for the gdn and rdn arms alike."""
    from types import SimpleNamespace

    from rla_ablate.dashboard.coverage import for_claim

    spec = SimpleNamespace(name="table_matched_state")
    families, present = {"rla", "sgla"}, {"none", "matched_state"}
    at_state = SimpleNamespace(claim="RDN beats GDN at matched state", treatment={"family": "gdn",
                               "ablations": "matched_state"}, reference={"family": "rdn", "ablations": "none"})
    assert for_claim(spec, at_state, True, families, present).hint == (
        "add a rdn arm to models: (matched_state derives gdn from it)")
    base = SimpleNamespace(claim="RDN beats its base GDN", treatment={"family": "gdn", "ablations": "none"},
                           reference={"family": "rdn", "ablations": "none"})
    assert for_claim(spec, base, True, families, present).hint == (
        "add a gdn arm to models:; add a rdn arm to models:")
    # without the control in any run, it is asked for too
    assert "add matched_state to controls:" in for_claim(spec, at_state, True, families, {"none"}).hint


def test_a_hint_puts_each_config_value_where_a_sweep_file_takes_it():
    """Model keys go in an arm's overrides:, train and data keys in base: (or an arm's base:), which an arm's
    overrides: would refuse; any of them in grid:."""
    from rla_ablate.dashboard.coverage import sweep_file_hint

    assert sweep_file_hint({"point.model.clip": 0.5}) == "model.clip = 0.5 in grid: or an arm's overrides:"
    assert sweep_file_hint({"data.kind": "stdlib"}) == "data.kind = stdlib in grid: or base: or an arm's base:"
    assert sweep_file_hint({"model.target": "tanh", "train.lr": 0.01, "model.clip": 2}) == (
        "model.target = tanh and model.clip = 2 in grid: or an arm's overrides:; train.lr = 0.01 in grid: or base: "
        "or an arm's base:")
    # a value some run of the sweep already has is not asked for again (the claim lacks its ablation, not its data)
    seen = {"data.kind": {"stdlib"}, "model.clip_mode": {"absolute", "relative"}}.get
    assert sweep_file_hint({"ablations": "tied_gamma", "data.kind": "stdlib"}, seen=lambda k: seen(k, set())) == \
        "add tied_gamma to ablations:"
    assert sweep_file_hint({"data.kind": "mqar"}, seen=lambda k: seen(k, set())) \
        == "data.kind = mqar (the runs have stdlib) in grid: or base: or an arm's base:"
    # a value no run has, close to one they have: a typo in the spec, not a value to add to the sweep file
    assert sweep_file_hint({"model.clip_mode": "relativ"}, seen=lambda k: seen(k, set())) == (
        "model.clip_mode = relativ (the runs have absolute, relative (did you mean 'relative'?)) in grid: or an "
        "arm's overrides:")


def test_labels_shorten_a_search_draw_and_keep_what_a_sweep_file_wrote():
    """A series label shows an Optuna draw (logged whole) to 6 significant digits, and a value a sweep file wrote
    (1.0, 1e-3, clip) as written."""
    from rla_ablate.dashboard.data import value_text

    assert value_text("0.7238517082858716") == "0.723852" and value_text("0.008803650445861911") == "0.00880365"
    assert value_text("1.0") == "1.0" and value_text("1e-3") == "1e-3" and value_text("clip") == "clip"
    assert value_text("2") == "2" and value_text("nan") == "nan"


def test_results_table_rounds_the_grid_and_search_values_runs_keep_as_strings():
    """`results` (text): an Optuna float comes back from MLflow as the string it was logged as; the table shows 6
    significant digits, like the metrics, and leaves other strings alone (--csv keeps them whole, --json as
    numbers)."""
    from rla_ablate.commands.results import _text

    assert _text("0.0012345678901234567", "point.train.lr") == "0.00123457"
    assert _text("1e-3", "point.train.lr") == "0.001"
    assert _text("clip", "point.model.target") == "clip"
    assert _text("2", "point.model.num_layers") == "2"
    assert _text("0.0012345678901234567", "name") == "0.0012345678901234567"
    assert _text(3.14159265, "eval/val/loss") == "3.14159" and _text(None, "x") == ""
    # --json: the grid and search values as numbers, for pandas; other strings and columns as they are
    from rla_ablate.commands.results import _json_value

    assert _json_value("0.0012345678901234567", "point.train.lr") == 0.0012345678901234567
    assert _json_value("2", "point.model.num_layers") == 2 and _json_value("1e-3", "point.train.lr") == 0.001
    assert _json_value("clip", "point.model.target") == "clip" and _json_value("nan", "point.x") == "nan"
    assert _json_value("12", "seed") == "12"


def test_point_labels_at_one_place_are_moved_apart():
    """Two series at one x and one value (a matched-state control sits at its reference's state): their labels
    print one under the other, not over each other."""
    import matplotlib.pyplot as plt

    from rla_ablate.dashboard.render import _unstack

    fig, ax = plt.subplots()
    ax.plot([4096, 4096], [3.93, 3.93], "o")
    notes = [ax.annotate(label, (4096, 3.93), textcoords="offset points", xytext=(7, -3), fontsize=7)
             for label in ("RLA", "sGLA, matched state", "GDN")]
    ax.autoscale_view()  # as render_scatter does before: a label's extent is known once its point is in view
    before = [n.get_window_extent(fig.canvas.get_renderer()) for n in notes]
    assert before[0].overlaps(before[1]) and before[0].width > 1
    _unstack(fig, notes)
    boxes = [n.get_window_extent(fig.canvas.get_renderer()) for n in notes]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(fig)


def test_a_side_measured_below_its_threshold_is_off_whether_or_not_the_other_was_measured():
    """A derived control has no run of its reference's: its own mixer value under the threshold makes it `off`
    (it read `not measured`, unhatched, and a control at 0.06 could be the table's best row)."""
    from rla_ablate.dashboard import validity as V

    check = V.Check("mixer", V.MIXER_METRIC, 1.0, ("job", "reference"), "the mixer output is above sqrt(eps)")
    assert V.Measured(check, {"job": 0.06, "reference": None}).state == V.OFF
    assert V.Measured(check, {"job": 3.0, "reference": None}).state == V.NOT_MEASURED
    assert V.Measured(check, {"job": 3.0, "reference": float("nan")}).state == V.NOT_MEASURED
    assert V.Measured(check, {"job": 3.0, "reference": 2.0}).state == V.ENGAGED
    assert V.Measured(check, {"job": 3.0, "reference": 0.5}).state == V.OFF


def test_a_panel_with_no_valid_comparison_says_so_across_it_and_one_seed_is_said_under_the_figure():
    """Every series of a panel flagged (mechanism off, or identical to its reference): the panel itself says so,
    where the curves are, not only its legend; a panel with one valid series does not. A figure that shows a value
    of one seed says, under it, that no interval exists there."""
    import matplotlib.pyplot as plt

    from rla_ablate.dashboard import validity as V
    from rla_ablate.dashboard.render import Rendered, _footer, _watermark

    def marks(states):
        fig, ax = plt.subplots()
        _watermark(ax, states)
        said = [t.get_text() for t in ax.texts]
        plt.close(fig)
        return said

    assert marks([V.OFF, V.OFF]) == ["MECHANISM OFF\nnot a test of the ablation"]
    assert marks([V.IDENTICAL]) == ["IDENTICAL TO REFERENCE\nnot a test of the ablation"]
    assert marks([V.OFF, V.IDENTICAL]) == ["NOT A VALID COMPARISON\nnot a test of the ablation"]
    assert marks([V.OFF, V.ENGAGED]) == marks([]) == []

    def footer(**kw):
        fig, _ = plt.subplots()
        _footer(fig, Rendered("t", "t", "", "curve", **kw))
        said = " ".join(t.get_text() for t in fig.texts)
        plt.close(fig)
        return said

    assert "ONE SEED: where n=1 no interval or test exists" in footer(single_seed=True)
    assert "ONE SEED" not in footer(single_seed=False)


def test_a_table_orders_numbered_columns_says_n_a_for_another_tasks_metric_and_lists_seeds(server, tmp_path):
    """A glob column over MQAR's sets runs kv8, kv16, kv32 (not the text's kv16, kv32, kv8); a row whose finished
    runs never log such a metric (an LM model under an MQAR column) says n/a, not missing; a `per_seed` column lists
    each seed's value under the mean; the HTML caption and the figure's footer say what both mean."""
    acc = {0: 0.99, 1: 0.70, 2: 0.08}                           # bimodal across seeds: the t-interval says little

    def recall(job):
        sets = {"rla": (8, 16, 32), "gdn": (8, 16)}.get(job.job.model.family, ())  # GDN's 32-pair eval lost
        return {f"eval/mqar_kv{n}/acc": acc[job.seed] - 0.01 * n for n in sets} or None

    root, _, _ = logged(server, tmp_path, """\
        name: tasks
        models: [{preset: tiny-rla}, {preset: tiny-sgla}, {preset: tiny-gdn}]
        seeds: [0, 1, 2]
        """, lambda job: 3.0 + 0.01 * job.seed, diag=recall)
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "recall.yaml").write_text(
        "kind: table\ntitle: recall\nruns: {family: [rla, sgla, gdn]}\nseries: [family]\n"
        "columns: [{metric: 'eval/mqar_*/acc', label: acc, per_seed: true, higher_is_better: true},"
        " {metric: eval/val/loss}]\n")
    dash, page = dashboard(root, "tasks", server, specs=spec_dir)
    section = page[page.index('id="recall"'):]
    heads = re.findall(r"<th>(.*?)</th>", section[:section.index("</thead>")])
    assert [h for h in heads if h.startswith("acc")] == ["acc (kv8) ↑", "acc (kv16) ↑", "acc (kv32) ↑"]
    rows = table(page, "recall")
    assert rows["sGLA"][1:7] == ["n/a", "n/a"] * 3 and rows["sGLA"][7].startswith("3.010")
    assert rows["RLA"][1] == "0.510 ± 1.155 (n=3)<br>s0 0.910  s1 0.620  s2 0.000"
    # a set of the column that a row's runs did not log where they logged others: missing, not another task's
    assert rows["GDN"][5] == "missing" and rows["GDN"][1].startswith("0.510")
    caption = section[section.index('<p class="caption">'):]
    assert "then each seed's value (s0 = seed 0)" in caption and "a value n/a: the row's runs do not log" in caption
    svg = (dash.out_dir / "recall.svg").read_text()
    text = re.sub(r"\s+", " ", " ".join(re.findall(r"<text[^>]*>(.*?)</text>", svg, re.S)))
    assert "then each seed's value (s0 = seed 0)" in text and "n/a: the row's runs do not log that metric" in text
    assert "sGLA n/a n/a n/a 3.010" in text                     # no Δ line under an n/a value
    # the mechanism column names the checks it ran, and what they cannot show
    assert "mechanism: engaged when each check holds" in text and "not that the model learned" in text
    assert "mixer_rms_over_sqrt_eps &gt;= 1 (job)" in caption


def test_a_tables_checks_are_named_once_per_metric_with_every_run_they_read():
    from rla_ablate.dashboard import validity as V
    from rla_ablate.dashboard.render import _note_check, check_lines

    checks: dict[str, list[str]] = {}
    mixer = "diag/mixer_rms_over_sqrt_eps"
    for check in (V.Check("mixer", mixer, 1.0, ("job",), ""), V.Check("target", "diag/target_engaged", 0.001,
                                                                       ("reference",), ""),
                  V.Check("mixer", mixer, 1.0, ("job", "reference"), ""), V.Check("mixer", mixer, 0.5, ("job",), "")):
        _note_check(checks, check)
    assert check_lines(checks) == ["mixer_rms_over_sqrt_eps >= 1 (job, reference)",
                                   "target_engaged >= 0.001 (reference)", "mixer_rms_over_sqrt_eps >= 0.5 (job)"]


def test_lm_eval_scores_on_different_numbers_of_examples_are_not_compared(server, tmp_path):
    """A task's scores of runs scored with different --limit values are of different examples: a claim on them is
    unresolved, saying so and how to fix it, and the figure's footer and the terminal's notes say it; scored on the
    same examples, the same claim is decided as usual."""
    from mlflow.tracking import MlflowClient

    root, sweep, ids = logged(server, tmp_path, """\
        name: limits
        models: [{preset: tiny-rla}]
        ablations: [no_output_gates]
        seeds: [0, 1, 2]
        """, lambda job: 3.0, lambda job: diag_values(0.1, 3.0))
    client = MlflowClient(server.uri)
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "acc.yaml").write_text(
        "kind: table\ntitle: acc\nruns: {family: rla}\ncolumns: [{metric: eval/rla_choice/acc}]\nclaims:\n"
        "  - {claim: gates help, metric: eval/rla_choice/acc, treatment: {ablations: no_output_gates},"
        " reference: {ablations: none}, expect: lower, min_effect: 0.01}\n")

    def score(examples):
        for job in sweep.jobs:
            ablated = bool(job.ablations)
            client.log_metric(ids[job.job_id], "eval/rla_choice/acc", 0.5 - 0.1 * ablated + 0.01 * job.seed,
                              step=syn.LAST)
            client.log_metric(ids[job.job_id], "eval/rla_choice/examples", examples(ablated), step=syn.LAST)

    score(lambda ablated: 4 if ablated else 8)      # the references scored whole, the ablation with --limit 4
    dash, _ = dashboard(root, "limits", server, specs=spec_dir)
    (v,) = dash.verdicts
    assert v.verdict == "unresolved" and v.reason.startswith("scored on different numbers of examples (4, 8): the "
                                                             "difference mixes example sets; score every job on the "
                                                             "same examples: `rla-sweep eval SWEEP")
    assert v.seeds_text() == "— (more seeds do not help until every run is scored on the same examples)"
    (rendered,) = dash.rendered
    assert rendered.mixed == ["eval/rla_choice/acc: scored on different numbers of examples (4, 8) in the runs "
                              "shown: its differences mix example sets; score every job on the same examples: "
                              "`rla-sweep eval SWEEP --tasks ... [--limit N] --force`"]
    assert rendered.mixed[0] in rendered.notes
    score(lambda ablated: 8)                        # every job scored on the same 8 examples
    dash, _ = dashboard(root, "limits", server, specs=spec_dir)
    (v,) = dash.verdicts
    assert v.verdict == "confirmed" and not dash.rendered[0].mixed, v.reason


def test_a_claim_compares_only_the_series_its_spec_shows(server, tmp_path):
    """A spec's `runs` filter holds for its claims too: with the controls filtered out, a claim on sGLA against RLA
    has one verdict (the plain sGLA), not another for sGLA widened to RLA's state."""
    root, _, _ = logged(server, tmp_path, """\
        name: filtered
        models: [{preset: tiny-rla}, {preset: tiny-sgla}]
        controls: [matched_state]
        seeds: [0, 1]
        """, lambda job: 3.0 + 0.01 * (job.family == "sgla") + 0.001 * job.seed, lambda job: diag_values(0.1, 3.0))
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    claim = ("  - {claim: R helps, metric: eval/val/loss, treatment: {family: sgla}, reference: {family: rla}, "
             "expect: higher, min_effect: 0.001}\n")
    (spec_dir / "plain.yaml").write_text("kind: table\ntitle: plain\nruns: {control: [none]}\n"
                                         "columns: [{metric: eval/val/loss}]\nclaims:\n" + claim)
    dash, _ = dashboard(root, "filtered", server, specs=spec_dir)
    assert [(v.treatment, v.reference) for v in dash.verdicts] == [("sGLA", "RLA")], \
        [(v.treatment, v.reference) for v in dash.verdicts]
    (spec_dir / "plain.yaml").write_text("kind: table\ntitle: plain\ncolumns: [{metric: eval/val/loss}]\nclaims:\n"
                                         + claim)
    dash, _ = dashboard(root, "filtered", server, specs=spec_dir)
    assert len(dash.verdicts) == 2                   # unfiltered: the control is a treatment too


def test_a_glob_claim_reads_each_pairs_own_metric_in_a_sweep_of_two_tasks(tmp_path):
    """eval/*/loss in a sweep with an LM arm (eval/val/loss) and an MQAR arm (eval/mqar_kv8/loss): each pair of
    series is compared on the metric its own runs log, not on the sweep's preferred match, which the MQAR runs never
    log (every MQAR verdict read 'no seed finished with the metric')."""
    from types import SimpleNamespace

    from rla_ablate.dashboard import validity as V
    from rla_ablate.dashboard.spec import ValidityThresholds
    from rla_ablate.dashboard.verdict import evaluate
    from rla_ablate.sweep.identity import ARM, CONTROL, SERIES
    from rla_ablate.tracking.read import RunRecord

    def run(arm, ablations, seed):
        metric = "eval/val/loss" if arm == "lm-rla" else "eval/mqar_kv8/loss"
        tags = {SERIES: f"{arm}-{ablations}", "version": "current", "family": "rla", "ablations": ablations,
                CONTROL: "none", ARM: arm, "seed": str(seed)}
        value = 2.0 + (0.1 if ablations == "no_fitting" else 0.0) + 0.01 * seed * (1 + (ablations == "none"))
        return RunRecord(f"{arm}-{ablations}-{seed}", "0", "finished", tags, {},
                         {metric: value, "diag/mixer_rms_over_sqrt_eps": 20.0, "diag/target_engaged": 0.1})

    runs = SimpleNamespace(jobs=[run(arm, a, s) for arm in ("lm-rla", "mqar-rla") for a in ("none", "no_fitting")
                                 for s in (0, 1, 2)])
    path = tmp_path / "t4.yaml"
    path.write_text("kind: table\ntitle: t4\ncolumns: [{metric: eval/*/loss}]\nclaims:\n"
                    "  - {claim: R helps, metric: eval/*/loss, treatment: {family: rla, ablations: no_fitting}, "
                    "reference: {ablations: none}, expect: higher, min_effect: 0.01}\n")
    verdicts, _ = evaluate(load_spec(path), runs, V.ValidityIndex(runs, ValidityThresholds()))
    by_arm = {v.treatment.rsplit(", ", 1)[-1]: v for v in verdicts}
    assert {arm: v.metric for arm, v in by_arm.items()} == {"lm-rla": "eval/val/loss",
                                                             "mqar-rla": "eval/mqar_kv8/loss"}, by_arm
    assert all(v.diff is not None and v.diff.diff.n == 3 and v.verdict == "confirmed" for v in verdicts), verdicts


def test_a_glob_columns_cell_of_an_eval_set_the_rows_runs_do_not_evaluate_says_n_a(tmp_path):
    """eval/*/loss over an LM arm (eval set val) and an MQAR arm (mqar_kv8): the LM row under `eval loss (mqar_kv8)`
    says n/a (its runs are not configured with that set), not missing; a set the runs evaluate but did not log, or a
    task not scored, stays missing."""
    from rla_ablate.dashboard.render import NOT_APPLICABLE, _absent
    from rla_ablate.tracking.read import RunRecord

    def series(eval_set, metrics):
        runs = [RunRecord(f"{eval_set}{seed}", "0", "finished", {"seed": str(seed)}, {"eval.0.name": eval_set},
                          metrics) for seed in (0, 1)]
        return D.Series(("s",), {}, eval_set, runs)

    path = tmp_path / "t.yaml"
    path.write_text("kind: table\ntitle: t\ncolumns: [{metric: eval/*/loss}, {metric: eval/*/acc}]\n")
    loss, acc = load_spec(path).columns
    lm, mqar = series("val", {"eval/val/loss": 1.2}), series("mqar_kv8", {"eval/mqar_kv8/loss": 0.3})
    sets = {"val", "mqar_kv8"}
    assert _absent(lm, loss, "eval/mqar_kv8/loss", sets) == NOT_APPLICABLE
    assert _absent(mqar, loss, "eval/val/loss", sets) == NOT_APPLICABLE
    assert _absent(series("mqar_kv8", {"eval/mqar_kv8/acc": 0.9}), loss, "eval/mqar_kv8/loss", sets) == NOT_APPLICABLE
    assert _absent(series("val", {"eval/piqa/acc": 0.5}), acc, "eval/mqar_kv8/acc", sets) == NOT_APPLICABLE
    assert _absent(series("val", {"eval/val/loss": 1.0, "eval/val/acc": 0.3}), loss, "eval/val/loss", sets) == "missing"
    assert _absent(series("val", {"eval/val/acc": 0.3, "eval/piqa/acc": 0.5}), acc, "eval/arc/acc", sets) == "missing"


def test_a_columns_best_mean_is_marked_among_rows_of_one_task(tmp_path):
    """train/loss over an LM arm and an MQAR arm: each task's lowest loss is bold, not the lowest of both (an MQAR
    model's loss is no better LM)."""
    from types import SimpleNamespace

    from rla_ablate.dashboard import validity as V
    from rla_ablate.dashboard.render import Rendered, table_rows
    from rla_ablate.dashboard.spec import ValidityThresholds
    from rla_ablate.sweep.identity import ARM, CONTROL, SERIES
    from rla_ablate.tracking.read import RunRecord

    def run(arm, family, seed):
        tags = {SERIES: f"{arm}-{family}", "version": "current", "family": family, "ablations": "none",
                CONTROL: "none", ARM: arm, "seed": str(seed)}
        loss = {"lm": 1.2, "mqar": 0.1}[arm] + (0.05 if family == "sgla" else 0.0)
        return RunRecord(f"{arm}-{family}-{seed}", "0", "finished", tags,
                         {"eval.0.name": "val" if arm == "lm" else "mqar_kv8"}, {"train/loss": loss})

    runs = SimpleNamespace(jobs=[run(a, f, s) for a in ("lm", "mqar") for f in ("rla", "sgla") for s in (0, 1)])
    path = tmp_path / "t.yaml"
    path.write_text("kind: table\ntitle: t\nseries: [arm, family]\ncolumns: [{metric: train/loss}]\n")
    out = Rendered("t", "t", "", "table")
    table_rows(load_spec(path), runs, out, lambda run_id: None, V.ValidityIndex(runs, ValidityThresholds()))
    bold = sorted(row[0].text for row in out.rows if row[1].best)
    assert len(bold) == 2 and all("rla" in label.lower() and "sgla" not in label.lower() for label in bold), \
        [(row[0].text, row[1].text, row[1].best) for row in out.rows]


def test_a_column_no_run_logs_is_left_out_unless_every_column_is(tmp_path):
    """A sweep that runs one task of a study (an LM-only replication read with the study's specs): the MQAR column
    is left out of the table, and the figure's note names its metric; a table of nothing but unlogged columns keeps
    them (missing), so it still says what it looked for."""
    from types import SimpleNamespace

    from rla_ablate.dashboard import validity as V
    from rla_ablate.dashboard.render import Rendered, table_rows, unlogged
    from rla_ablate.dashboard.spec import ValidityThresholds
    from rla_ablate.sweep.identity import ARM, CONTROL, SERIES
    from rla_ablate.tracking.read import RunRecord

    def run(family, seed):
        tags = {SERIES: family, "version": "current", "family": family, "ablations": "none", CONTROL: "none",
                ARM: f"lm-{family}", "seed": str(seed)}
        return RunRecord(f"{family}-{seed}", "0", "finished", tags, {"eval.0.name": "val"},
                         {"eval/val/loss": 1.2 + seed / 100})

    runs = SimpleNamespace(jobs=[run(f, s) for f in ("rla", "sgla") for s in (0, 1)])
    index = V.ValidityIndex(runs, ValidityThresholds())

    def table(columns):
        path = tmp_path / "t.yaml"
        path.write_text(f"kind: table\ntitle: t\nseries: [family]\ncolumns: {columns}\n")
        spec, out = load_spec(path), Rendered("t", "t", "", "table")
        table_rows(spec, runs, out, lambda run_id: None, index)
        return out.header, [row[1].text for row in out.rows], unlogged(spec, runs) + out.left_out

    header, cells, notes = table('[{metric: eval/val/loss, label: loss}, {metric: "eval/mqar_*/acc", label: acc}]')
    assert header == ["model", "loss ↓", "Δ loss ↓", "mechanism", "runs"], header
    assert notes == ["no run of this sweep logged eval/mqar_*/acc", "acc (eval/mqar_*/acc)"], notes
    header, cells, _ = table('[{metric: "eval/mqar_*/acc", label: acc}]')
    assert header[1] == "acc ↑" and cells == ["missing", "missing"], (header, cells)


def test_a_claim_never_compares_a_series_with_itself_and_a_tag_no_run_has_is_named(tmp_path):
    """A reference that leaves the treatment's runs as they are ({family: sgla} against {ablations: none}) is a
    spec to fix, not a sweep to extend; in a treatment of several series the one that is its own reference is left
    out; a tag value no run has (a misspelt arm) is named with the values the runs have."""
    from types import SimpleNamespace

    from rla_ablate.dashboard import validity as V
    from rla_ablate.dashboard.spec import ValidityThresholds
    from rla_ablate.dashboard.verdict import evaluate
    from rla_ablate.sweep.identity import ARM, CONTROL, SERIES
    from rla_ablate.tracking.read import RunRecord

    def run(family, seed):
        tags = {SERIES: family, "version": "current", "family": family, "ablations": "none", CONTROL: "none",
                ARM: f"tiny-{family}", "seed": str(seed)}
        return RunRecord(f"{family}-{seed}", "0", "finished", tags, {},
                         {"eval/val/loss": 2.0 + (0.1 if family == "sgla" else 0) + seed / 100,
                          "diag/mixer_rms_over_sqrt_eps": 20.0})

    runs = SimpleNamespace(jobs=[run(f, s) for f in ("rla", "sgla") for s in (0, 1)])

    def claim(treatment, reference):
        path = tmp_path / "c.yaml"
        path.write_text(f"kind: table\ntitle: t\ncolumns: [{{metric: eval/val/loss}}]\nclaims:\n  - {{claim: c, "
                        f"treatment: {treatment}, reference: {reference}, expect: higher, min_effect: 0.01}}\n")
        return evaluate(load_spec(path), runs, V.ValidityIndex(runs, ValidityThresholds()))

    verdicts, (untested,) = claim("{family: sgla}", "{ablations: none}")
    assert not verdicts and untested.fix_in == "spec"
    assert untested.hint.startswith("its reference changes nothing for the runs its treatment selects (sGLA, "
                                    "tiny-sgla), so each would be compared with itself"), untested.hint
    (verdict,), untested = claim("{family: [sgla, rla]}", "{family: rla}")
    assert not untested and (verdict.verdict, verdict.treatment, verdict.reference) == \
        ("confirmed", "sGLA, tiny-sgla", "RLA, tiny-rla")
    _, (untested,) = claim("{arm: tiny-sgl}", "{arm: tiny-rla}")
    assert untested.hint == ("arm = tiny-sgl: an arm named tiny-sgl in models: (the runs have tiny-rla, tiny-sgla "
                             "(did you mean 'tiny-sgla'?))"), untested.hint


def test_a_verdict_says_when_its_difference_changed_sign_or_is_closing(tmp_path):
    """The mean paired difference at the last two evaluations both sides share: a sign change is a caveat (the
    comparison is still turning); a steady one, another budget (a wall-clock control's last evaluation is at other
    tokens) or runs without readable histories say nothing. A difference that shrank to half or less over the second
    half of the run, from at least min_effect, is a caveat too (the gap is closing)."""
    from types import SimpleNamespace

    from rla_ablate.dashboard import validity as V
    from rla_ablate.dashboard.spec import ValidityThresholds
    from rla_ablate.dashboard.verdict import evaluate
    from rla_ablate.sweep.identity import ARM, CONTROL, SERIES
    from rla_ablate.tracking.read import RunRecord

    def run(ablations, seed):
        tags = {SERIES: ablations, "version": "current", "family": "rla", "ablations": ablations, CONTROL: "none",
                ARM: "lm-rla", "seed": str(seed)}
        return RunRecord(f"{ablations}-{seed}", "0", "finished", tags, {},
                         {"eval/val/loss": 2.0 + (0.05 if ablations == "no_fitting" else 0.0) + 0.01 * seed,
                          "diag/mixer_rms_over_sqrt_eps": 20.0})

    path = tmp_path / "t4.yaml"
    path.write_text("kind: table\ntitle: t4\ncolumns: [{metric: eval/val/loss}]\nclaims:\n"
                    "  - {claim: R helps, metric: eval/val/loss, treatment: {ablations: no_fitting}, "
                    "reference: {ablations: none}, expect: higher, min_effect: 0.01}\n")
    spec, jobs = load_spec(path), [run(a, s) for a in ("none", "no_fitting") for s in (0, 1)]

    def caveats(curves, about="changed sign"):
        runs = SimpleNamespace(jobs=jobs, history=lambda run_id, key: curves[run_id.split("-")[0]])
        (verdict,), _ = evaluate(spec, runs, V.ValidityIndex(runs, ValidityThresholds()))
        return [c for c in verdict.caveats if about in c]

    turning = {"none": [(1024, 2.5), (2048, 2.2), (4096, 2.0)], "no_fitting": [(1024, 2.6), (2048, 2.1), (4096, 2.05)]}
    assert caveats(turning) == ["the mean difference changed sign over the last evaluation interval (-0.1 at 2,048 "
                                "tokens, +0.05 at 4,096): the comparison is still turning, and more training may "
                                "turn it back"]
    assert caveats({**turning, "no_fitting": [(1024, 2.6), (2048, 2.3), (4096, 2.05)]}) == []       # steady sign
    assert caveats({**turning, "no_fitting": [(1024, 2.6), (2048, 2.1), (4608, 2.05)]}) == []       # another budget
    runs = SimpleNamespace(jobs=jobs)                                                              # no histories
    assert evaluate(spec, runs, V.ValidityIndex(runs, ValidityThresholds()))[0][0].caveats == ()

    # closing: +0.12 at half the run (2,048 of 4,096 tokens), +0.05 at the end
    closing = {"none": [(1024, 2.5), (2048, 2.2), (3072, 2.1), (4096, 2.0)],
               "no_fitting": [(1024, 2.7), (2048, 2.32), (3072, 2.18), (4096, 2.05)]}
    assert caveats(closing, "closing") == ["the gap is closing: the mean difference shrank from +0.12 at 2,048 "
                                           "tokens to +0.05 at 4,096, so the verdict holds for this budget and a "
                                           "longer run may narrow it further"]
    assert caveats({**closing, "no_fitting": [(1024, 2.7), (2048, 2.28), (3072, 2.18), (4096, 2.05)]},
                   "closing") == []                      # +0.08 to +0.05: not halved
    assert caveats({**closing, "no_fitting": [(1024, 2.7), (2048, 2.208), (3072, 2.1), (4096, 2.003)]},
                   "closing") == []                      # +0.008 to +0.003: below min_effect at half the run
    assert caveats({**closing, "no_fitting": [(1024, 2.7), (2048, 2.32), (3072, 2.0), (4096, 2.05)]},
                   "closing") == []                      # turned and back: the last interval's change is the caveat


def test_a_not_tested_claims_hint_names_only_what_is_missing_and_a_self_comparison_is_refused(tmp_path):
    """An ablation the sweep has is not asked for again; a reference's own config value (train.lr = 0.02) is; values
    each present but never together say so; a claim whose reference restates its treatment is refused at its line."""
    from rla_ablate.dashboard.coverage import for_claim
    from rla_ablate.dashboard.spec import Claim
    from rla_ablate.errors import UserError

    seen = {"train.lr": {"0.01", "0.003"}}
    spec = type("Spec", (), {"name": "t"})()

    def hint(treatment, reference):
        claim = Claim(claim="c", treatment=treatment, reference=reference, expect="higher", min_effect=0.01)
        return for_claim(spec, claim, True, {"rdn"}, {"tied_gamma"}, seen=lambda k: seen.get(k, set())).hint

    assert hint({"family": "rdn", "ablations": "tied_gamma"}, {"ablations": "none", "train.lr": 0.02}) == \
        "train.lr = 0.02 (the runs have 0.003, 0.01) in grid: or base: or an arm's base:"
    assert hint({"family": "rdn", "ablations": "tied_gamma", "train.lr": 0.01}, {"ablations": "none"}) == \
        "the sweep has runs with each of these values, but none with all of them together"
    with pytest.raises(ValueError, match="its values are the treatment's own"):
        Claim(claim="c", treatment={"family": "rdn", "ablations": "none"}, reference={"ablations": "none"},
              expect="higher", min_effect=0.01)
    path = tmp_path / "s.yaml"
    path.write_text("kind: table\ntitle: t\ncolumns: [{metric: eval/val/loss}]\nclaims:\n"
                    "  - {claim: c, treatment: {ablations: none}, reference: {ablations: none}, expect: higher, "
                    "min_effect: 0.01}\n")
    with pytest.raises(UserError, match="s.yaml:5: claims.0: reference: its values are the treatment's own"):
        load_spec(path)
