"""`rla-sweep dashboard` end to end on a synthetic sweep logged through the real MLflow server, and the pages
it produces opened in headless Chromium (the HTML dashboard and the MLflow UI's experiment page)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess

import pytest
from mlflow.tracking import MlflowClient

import dashboard_synthetic as syn
from rla_ablate.cli import main
from rla_ablate.dashboard.spec import load_specs
from rla_ablate.dashboard.stats import mean_ci
from rla_ablate.tracking import TrackingServer

pytestmark = pytest.mark.slow

SWEEP = "syn"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
# .ci/run installs Debian's chromium and sets this: there the browser checks must run, never skip.
REQUIRED = os.environ.get("RLA_REQUIRE_CHROMIUM") == "1"
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not REQUIRED,
                                    reason="no chromium on PATH (Debian: apt-get install chromium); CI installs it")


def chromium(tmp_path, *args: str) -> str:
    assert CHROMIUM, "RLA_REQUIRE_CHROMIUM=1 but no chromium on PATH"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}",
           "--window-size=1400,1000", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    with TrackingServer(root / "tracking") as server:
        runs = syn.log_sweep(server.uri, SWEEP)
        # The sweep folder as the launcher leaves it: a shared tracking server, and one job not started yet.
        (root / SWEEP).mkdir()
        (root / SWEEP / "sweep.json").write_text(json.dumps(
            {"name": SWEEP, "tracking_uri": server.uri, "embedded_tracking": False}))
        # jobs.json lists the current expansion: every logged job, plus one not started yet.
        logged = [{"job_id": f"{family}-{ablation}-{seed}", "name": f"{family}-{ablation}-s{seed}", "family": family,
                   "ablations": [] if ablation == "none" else [ablation], "seed": seed}
                  for family, arms in syn.ARMS.items() for ablation in arms for seed in syn.SEEDS]
        (root / SWEEP / "jobs.json").write_text(json.dumps(logged + [
            {"job_id": "rdn-no_fitting-3", "name": "rdn-no_fitting-s3", "family": "rdn",
             "ablations": ["no_fitting"], "seed": 3}]))
        assert main(["dashboard", SWEEP, "--root", str(root)]) == 0
        yield root, server, runs


def test_a_job_cancelled_before_it_started_reads_as_cancelled(sweep):
    """No run in MLflow, but the sweep's status says cancelled (a cancel before the job started): the dashboard
    says cancelled, as `status` does, not 'not started'."""
    from rla_ablate.dashboard.reading import read_runs
    from rla_ablate.sweep.state import SweepDir

    root, server, _ = sweep
    sdir = SweepDir(root, SWEEP)

    def planned() -> str:
        runs, _ = read_runs(SWEEP, root, server.uri)
        return next(r.status for r in runs.jobs if r.tags["job_id"] == "rdn-no_fitting-3")

    assert planned() == "not started"
    sdir.set_status("rdn-no_fitting-3", status="cancelled")
    try:
        assert planned() == "cancelled"
    finally:
        (sdir.job_dir("rdn-no_fitting-3") / "status.json").unlink()


def final_eval(family, ablation, seeds):
    return [syn.eval_loss(family, ablation, s, "val", syn.TOKENS[-1]) for s in seeds]


def test_every_spec_rendered_with_missing_data_shown(sweep, capsys):
    root, server, runs = sweep
    out = root / SWEEP / "dashboard"
    specs = load_specs()
    for spec in specs:
        for ext in ("png", "svg"):
            assert (out / f"{spec.name}.{ext}").stat().st_size > 5000, (spec.name, ext)
    page = (out / "index.html").read_text()
    for spec in specs:
        assert f'id="{spec.name}"' in page
    assert "could not render" not in page
    # Unfinished jobs are reported, not dropped silently and not a crash.
    assert "RDN: tied γ (γ = β): 2 of 3 seeds finished; 1 running" in page
    assert "RLA, no fitting: 2 of 3 seeds finished; 1 failed" in page
    assert "RDN, no fitting: 3 of 4 seeds finished; 1 not started" in page
    # The sweep folder records the tracking server it was logged to (as a `--tracking-uri` launch does): run links
    # open that server's UI, not whatever answers on the embedded stores' UI port.
    exp = MlflowClient(server.uri).get_experiment_by_name(f"rla-sweep/{SWEEP}").experiment_id
    rla_seed0 = runs[("rla", "none", 0)]
    assert f'href="{server.uri.rstrip("/")}/#/experiments/{exp}/runs/{rla_seed0}"' in page


def test_accuracy_specs_fall_back_to_eval_loss_and_say_so_on_the_figure(sweep):
    root, _, _ = sweep
    out = root / SWEEP / "dashboard"
    page = (out / "index.html").read_text()
    # No run of the synthetic sweep has task accuracies: Table 5 and Fig. 3b show eval loss and say so, in the
    # page's notes and in the drawn figure itself (the SVG keeps its text as text).
    for name, says in (("table5_output_gates", "FALLBACK: no run has eval/*/acc"),
                       ("fig3b_gains_by_category", "FALLBACK: no run has eval/&lt;task&gt;/acc")):
        section = page[page.index(f'id="{name}"'):]
        assert says in section[:section.index("</section>")], name
        assert "FALLBACK" in (out / f"{name}.svg").read_text(), name
    section = page[page.index('id="table5_output_gates"'):]
    assert "eval loss (no task accuracy yet)" in section[:section.index("</section>")]
    # Specs without a fallback say nothing of the kind.
    section = page[page.index('id="table4_no_fitting"'):]
    assert "FALLBACK" not in section[:section.index("</section>")]


def test_table_numbers_are_the_seed_statistics(sweep):
    root, _, _ = sweep
    page = (root / SWEEP / "dashboard" / "index.html").read_text()
    section = page[page.index('id="table4_no_fitting"'):]
    section = section[:section.index("</section>")]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", section)]
    by_model = {r[0]: r for r in rows if r}
    rla = mean_ci(final_eval("rla", "none", syn.SEEDS))
    assert by_model["RLA"][1] == f"{rla.mean:.3f} ± {rla.half_width:.3f} (n=3)"
    assert by_model["RLA"][2] == "reference"
    # No fitting: seed 2 failed, so the paired difference uses seeds 0 and 1; the effect is exactly +0.05.
    no_fit = by_model["RLA, no fitting [2 of 3 seeds finished; 1 failed]"]
    assert no_fit[1].startswith(f"{mean_ci(final_eval('rla', 'no_fitting', (0, 1))).mean:.3f} ± ")
    assert no_fit[2].startswith("+0.050 ± 0.000 (n=2)")
    ppl = mean_ci([math.exp(v) for v in final_eval("rdn", "none", syn.SEEDS)])
    assert by_model["RDN"][5] == f"{ppl.mean:.2f} ± {ppl.half_width:.2f} (n=3)"


def test_dashboard_logged_to_parent_run(sweep):
    root, server, runs = sweep
    client = MlflowClient(server.uri)
    files = {f.path for f in client.list_artifacts(runs["parent"], "dashboard")}
    assert {"dashboard/index.html", "dashboard/fig3a_tied_gamma.png", "dashboard/matched_budget.svg",
            "dashboard/table5_output_gates.png"} <= files


def test_no_log_writes_the_page_without_logging_it(sweep, tmp_path, capsys):
    """--no-log: a draft render (its own --out) adds no folder to the sweep's parent run."""
    root, server, runs = sweep
    client = MlflowClient(server.uri)
    before = {f.path for f in client.list_artifacts(runs["parent"])}
    assert main(["dashboard", SWEEP, "--root", str(root), "--out", str(tmp_path / "draft"), "--no-log"]) == 0
    assert (tmp_path / "draft" / "index.html").is_file()
    assert "not logged to MLflow (--no-log)" in capsys.readouterr().out
    assert {f.path for f in client.list_artifacts(runs["parent"])} == before


@needs_chromium
def test_html_page_renders_in_chromium(sweep, tmp_path):
    root, _, _ = sweep
    page = root / SWEEP / "dashboard" / "index.html"
    # Measure in the browser: every image decoded with a real size, every table laid out with rows.
    probe = ("<script>window.addEventListener('load', () => { document.body.setAttribute('data-probe', JSON.stringify({"
             "images: [...document.images].map(i => [i.alt, i.complete, i.naturalWidth,"
             " i.getBoundingClientRect().width]),"
             "tables: [...document.querySelectorAll('table.results')].map(t => [t.closest('section').id, t.rows.length,"
             " t.getBoundingClientRect().height])})); });</script></body>")
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", probe))
    dom = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    found = json.loads(re.search(r"data-probe=\"(.*?)\"", dom).group(1).replace("&quot;", '"'))
    specs = load_specs()
    figures = [s for s in specs if s.kind != "table"]
    tables = [s for s in specs if s.kind == "table"]
    assert [img[0] for img in found["images"]] == [s.title for s in figures]
    for alt, complete, natural, shown in found["images"]:
        assert complete and natural > 600 and shown > 300, alt
    assert [t[0] for t in found["tables"]] == [s.name for s in tables]
    for name, nrows, height in found["tables"]:
        assert nrows >= 3 and height > 40, name


@needs_chromium
def test_mlflow_ui_shows_the_sweep_experiment(sweep, tmp_path):
    _, server, runs = sweep
    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name(f"rla-sweep/{SWEEP}").experiment_id
    n = len(client.search_runs([exp], max_results=1000))
    dom = chromium(tmp_path, "--virtual-time-budget=20000", "--dump-dom", f"{server.uri}/#/experiments/{exp}/runs")
    # The text the user sees, after the app fetched the runs: tags stripped, whitespace collapsed.
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom[dom.find("<body"):]))
    assert f"rla-sweep/{SWEEP}" in text and "Training runs" in text
    assert f"{n} matching runs" in text, text[:2000]
    assert f" {client.get_run(runs['parent']).info.run_name} " in text


def test_a_render_deletes_the_figures_an_earlier_one_logged_and_it_did_not(tmp_path):
    """MLflow's log_artifacts adds and overwrites but never removes: a figure of a spec since dropped would sit in
    the parent run's dashboard/ beside the current page. The real server deletes it; the user's other files stay."""
    from rla_ablate.dashboard.build import _log_files

    with TrackingServer(tmp_path / "tracking") as server:
        client = MlflowClient(server.uri)
        exp = client.create_experiment("rla-sweep/forget")
        run_id = client.create_run(exp).info.run_id
        first, second = tmp_path / "first", tmp_path / "second"
        # the first render's figures (its manifest) and a user's own files beside them, one a PNG
        for folder, names, figures in ((first, ("index.html", "notes.txt", "mine.png"), ["a.png", "a.svg", "old.png",
                                                                                         "old.svg"]),
                                       (second, ("index.html",), ["a.png", "a.svg"])):
            folder.mkdir()
            for name in [*names, *figures]:
                (folder / name).write_text(f"{folder.name} {name}")
            (folder / "figures.json").write_text(json.dumps(figures))
        unlogged: list[str] = []
        assert _log_files(client, run_id, first, "dashboard", server.uri, "forget", unlogged) == run_id
        assert _log_files(client, run_id, second, "dashboard", server.uri, "forget", unlogged) == run_id
        assert unlogged == []
        files = {f.path for f in client.list_artifacts(run_id, "dashboard")}
        assert files == {f"dashboard/{n}" for n in ("index.html", "figures.json", "a.png", "a.svg", "notes.txt",
                                                     "mine.png")}, files
        page = client.download_artifacts(run_id, "dashboard/index.html", str(tmp_path))
        assert open(page).read() == "second index.html"


def test_a_read_only_sweep_folder_renders_from_its_store_as_it_is(sweep, tmp_path, monkeypatch, capsys):
    """A sweep folder the user cannot write (another user's, a read-only copy), its page written elsewhere: the
    store is read as it is, without starting a server (which writes its log there), and the command says the page
    was not logged to MLflow."""
    import rla_ablate.dashboard.build as build

    root = sweep[0]
    copy = tmp_path / "runs"
    shutil.copytree(root / "tracking", copy / SWEEP / "mlflow")
    shutil.copy(root / SWEEP / "jobs.json", copy / SWEEP / "jobs.json")
    (copy / SWEEP / "sweep.json").write_text(json.dumps({"name": SWEEP, "embedded_tracking": True}))
    store = copy / SWEEP / "mlflow"
    before = sorted(p.name for p in store.iterdir())
    real = os.access
    monkeypatch.setattr(build.os, "access", lambda path, mode: False if os.fspath(path) == os.fspath(store)
                        else real(path, mode))
    assert main(["dashboard", SWEEP, "--root", str(copy), "--out", str(tmp_path / "page")]) == 0
    printed = capsys.readouterr()
    said = " ".join((printed.err + printed.out).split())
    assert (tmp_path / "page" / "index.html").is_file()
    assert sorted(p.name for p in store.iterdir()) == before  # no server.log, nothing written
    # a folder of the user's own files is refused before anything is read (its index.html would be replaced); the
    # page's own folder (figures.json) is rendered again
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "index.html").write_text("my page")
    assert main(["dashboard", SWEEP, "--root", str(copy), "--out", str(mine)]) == 2
    assert f"--out: {mine} holds files a dashboard did not write (1: index.html); give a new or empty folder" in \
        capsys.readouterr().err
    assert (mine / "index.html").read_text() == "my page"
    assert main(["dashboard", SWEEP, "--root", str(copy), "--out", str(tmp_path / "page")]) == 0
    assert "read-only" in said, said
