"""One self-contained HTML page: every figure embedded (PNG as data URI), tables, notes and run links."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence
from html import escape
from pathlib import Path

from rla_ablate.dashboard.coverage import Untested
from rla_ablate.dashboard.render import MECHANISM_CHECKS, Cell, Rendered, check_lines

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d1d1f;
       background: #fafafa; }
header { padding: 18px 28px; background: #fff; border-bottom: 1px solid #e3e3e3; }
header h1 { margin: 0 0 4px; font-size: 20px; }
header p { margin: 2px 0; color: #555; }
nav { padding: 8px 28px; background: #fff; border-bottom: 1px solid #e3e3e3; font-size: 13px; }
nav a { margin-right: 14px; color: #0b57d0; text-decoration: none; }
main { padding: 10px 28px 40px; max-width: 1400px; }
section { background: #fff; border: 1px solid #e3e3e3; border-radius: 6px; padding: 14px 18px; margin: 18px 0; }
section h2 { margin: 0 0 4px; font-size: 16px; }
.caption { color: #555; margin: 0 0 10px; }
figure { margin: 0; }
figure img { max-width: 100%; height: auto; }
table.results { border-collapse: collapse; margin: 8px 0; font-variant-numeric: tabular-nums; }
table.results th, table.results td { border-bottom: 1px solid #eee; padding: 5px 12px 5px 0; text-align: left; }
table.results th { border-bottom: 2px solid #ccc; }
td.best { font-weight: 600; }
table.verdicts, table.validity { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
table.verdicts th, table.verdicts td, table.validity th, table.validity td { border-bottom: 1px solid #eee;
       padding: 4px 10px 4px 0; text-align: left; vertical-align: top; }
.v-confirmed { color: #1a7f37; font-weight: 600; }
.v-contradicted { color: #b42318; font-weight: 600; }
.v-unresolved { color: #6b6b6b; font-weight: 600; }
tr.s-off td, tr.s-identical td { background: repeating-linear-gradient(135deg, #f2f2f2 0 6px, #e6e6e6 6px 12px);
       color: #555; }
tr.s-not-measured td { color: #8a4b00; }
ul.flagged { color: #8a4b00; margin: 8px 0 0; padding-left: 18px; }
p.page-notes { color: #8a4b00; }
ul.notes { color: #8a4b00; margin: 8px 0 0; padding-left: 18px; }
ul.untested { color: #555; margin: 6px 0 0; padding-left: 18px; font-size: 13px; }
details { margin-top: 8px; color: #444; font-size: 13px; }
a.file { font-size: 12px; color: #666; margin-right: 10px; }
"""


def _cell(c: Cell, tag: str = "td") -> str:
    text = escape(c.text).replace("\n", "<br>")  # a table cell's seeds under its mean
    if c.links:
        text = " ".join(f'<a href="{escape(url)}">{escape(t)}</a>' if url else escape(t) for t, url in c.links)
    elif c.link:
        text = f'<a href="{escape(c.link)}">{text}</a>'
    cls = ' class="best"' if c.best else ""
    return f"<{tag}{cls}>{text}</{tag}>"


def _verdict_table(verdicts, with_spec: bool = False) -> str:
    head = (["figure"] if with_spec else []) + ["verdict", "claim", "comparison", "Δ (95% CI, n seeds)",
                                                 "min effect", "why", "seeds for 80% power", "mechanism"]
    rows = []
    for v in verdicts:
        cells = ([f'<a href="#{escape(v.spec)}">{escape(v.spec)}</a>'] if with_spec else []) + [
            f'<span class="v-{escape(v.verdict)}">{escape(v.verdict)}</span>', escape(v.claim.claim),
            escape(v.comparison()), escape(f"{v.metric or v.claim.metric}: {v.diff_text()}"),
            escape(f"{v.claim.min_effect:g} ({v.claim.expect})"), escape(v.reason), escape(v.seeds_text()),
            f'<span title="{escape(v.mechanism_detail)}">{escape(v.mechanism)}</span>']
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return ('<table class="verdicts"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _untested_list(untested: Sequence[Untested], with_spec: bool = False) -> str:
    items = []
    for u in untested:
        where = ""
        if with_spec:
            where = (f'<a href="#{escape(u.spec)}">{escape(u.spec)}</a>' if u.drawn else escape(u.spec)) + ": "
        items.append(f"<li>{where}{escape(u.text())}</li>")
    return '<ul class="untested">' + "".join(items) + "</ul>"


def _validity_table(r: Rendered) -> str:
    state_col = r.header.index("state")
    rows = []
    for row in r.rows:
        cls = "s-" + row[state_col].text.replace(" ", "-").replace("/", "")
        rows.append(f'<tr class="{escape(cls)}">' + "".join(_cell(c) for c in row) + "</tr>")
    return ('<table class="validity"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in r.header)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _section(r: Rendered, run_url) -> str:
    parts = [f'<section id="{escape(r.name)}" data-kind="{escape(r.kind)}">', f"<h2>{escape(r.title)}</h2>"]
    if r.caption:
        parts.append(f'<p class="caption">{escape(r.caption)}</p>')
    if r.kind == "search":
        # the study drawn, then its trials best first (the best marked), each linked to its run
        if r.png is not None and r.png.exists():
            data = base64.b64encode(r.png.read_bytes()).decode()
            parts.append(f'<figure><img alt="{escape(r.title)}" src="data:image/png;base64,{data}"></figure>')
        parts.append('<table class="results"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in r.header)
                     + "</tr></thead><tbody>")
        parts += ["<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in r.rows]
        parts.append("</tbody></table>")
    elif r.kind == "validity":
        # The panel is a figure too (its PNG), then the same rows as a table with links.
        if r.png is not None and r.png.exists():
            data = base64.b64encode(r.png.read_bytes()).decode()
            parts.append(f'<figure><img alt="{escape(r.title)}" src="data:image/png;base64,{data}"></figure>')
        if r.rows:
            parts.append(_validity_table(r))
    elif r.rows:
        parts.append('<table class="results"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in r.header)
                     + "</tr></thead><tbody>")
        parts += ["<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in r.rows]
        parts.append("</tbody></table>")
        parts.append('<p class="caption">mean ± 95% t-interval over seeds (n seeds)'
                     + (", then each seed's value (s0 = seed 0)" if r.per_seed else "")
                     + "; Δ = row − reference, paired by seed, with its 95% interval and paired t-test p"
                     + ("; a value n/a: the row's runs do not log that metric (another task's)"
                        if r.not_applicable else "")
                     + ". mechanism: engaged, off, identical (results equal the reference's), not measured (a "
                     "diagnostic, or the run it is compared with, is missing), n/a; * see the notes"
                     + (f"; {MECHANISM_CHECKS}: {escape('; '.join(check_lines(r.checks)))}" if r.checks else "") + ".</p>")
    elif r.png is not None and r.png.exists():
        data = base64.b64encode(r.png.read_bytes()).decode()
        parts.append(f'<figure><img alt="{escape(r.title)}" src="data:image/png;base64,{data}"></figure>')
    if r.verdicts:
        parts.append(_verdict_table(r.verdicts))
    if r.untested:
        parts.append("<p>Not tested by this sweep (no run of the treatment):</p>" + _untested_list(r.untested))
    if r.flagged and r.kind != "validity":
        parts.append('<ul class="flagged">' + "".join(f"<li>⚠ {escape(n)}</li>" for n in r.flagged_lines)
                     + "</ul>")
    if r.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in r.notes) + "</ul>")
    files = [p for p in (r.png, r.svg) if p is not None]
    if files:
        parts.append("<p>" + "".join(f'<a class="file" href="{escape(p.name)}">{escape(p.name)}</a>' for p in files)
                     + "</p>")
    seen = set()
    links = []
    for label, name, run_id in r.runs:
        if (run_id, name) in seen:
            continue
        seen.add((run_id, name))
        url = run_url(run_id) if run_id else None
        links.append(f'<li>{escape(label)}: <a href="{escape(url)}">{escape(name)}</a></li>' if url
                     else f"<li>{escape(label)}: {escape(name)}</li>")
    if links:
        parts.append(f"<details><summary>{len(links)} runs</summary><ul>{''.join(links)}</ul></details>")
    parts.append("</section>")
    return "\n".join(parts)


def write_page(path: Path, sweep: str, rendered: list[Rendered], *, tracking: str, ui_hint: str, run_url,
               n_runs: dict[str, int], notes: Sequence[str] = (), untested: Sequence[Untested] = ()) -> Path:
    counts = ", ".join(f"{n} {s}" for s, n in sorted(n_runs.items())) or "no job runs"
    # a search sweep's study leads its page: its runs are trials, not the ablations the verdicts need
    lead = [r for r in rendered if r.kind == "search"]
    rest = [r for r in rendered if r.kind != "search"]
    nav = ("".join(f'<a href="#{escape(r.name)}">{escape(r.title)}</a>' for r in lead)
           + '<a href="#verdicts">Verdicts</a>' + ('<a href="#untested">Not tested</a>' if untested else "")
           + "".join(f'<a href="#{escape(r.name)}">{escape(r.title)}</a>' for r in rest))
    verdicts = [v for r in rendered for v in r.verdicts]
    summary = ('<section id="verdicts" data-kind="verdicts"><h2>Verdicts on the paper\'s claims</h2>'
               '<p class="caption">Each claim\'s rule is in its spec (claims:). Δ = treatment − reference, paired '
               "by seed, 95% t-interval. confirmed: the interval lies on the claimed side and |mean| reaches the "
               "minimum effect; contradicted: the interval excludes every effect of the minimum size in the claimed "
               "direction; unresolved: anything else, one seed, or a comparison whose mechanism was off or whose "
               "results are identical. Seeds for 80% power: two-sided paired t-test at 0.05 detecting the minimum "
               "effect with the observed spread (a test that tells that effect from zero: at exactly the minimum "
               "effect the confirmed rule, which also needs the mean to reach it, holds about half the time); none "
               "is given where more seeds cannot help (mechanism off, identical results, task not learned). q: the "
               "p-value adjusted for the many claims on this page (Benjamini-Hochberg); a decided verdict whose q "
               "exceeds 0.05 may be one of the chance findings expected among them (listed in the notes).</p>"
               + (_verdict_table(verdicts, with_spec=True) if verdicts
                  else "<p>No claim has runs of its treatment in this sweep.</p>" if untested
                  else "<p>No spec states a claim.</p>")
               + (f'<h3 id="untested">Not tested by this sweep ({sum(u.claim is not None for u in untested)} '
                  "claims)</h3><p class=\"caption\">No run of the sweep is what these compare, so they get no "
                  "verdict, and specs with nothing to compare are not drawn. Each line names the runs it needs; add "
                  "them to the sweep file and relaunch (only the new jobs run).</p>"
                  + _untested_list(untested, with_spec=True) if untested else "")
               + "</section>")
    body = "\n".join([_section(r, run_url) for r in lead] + [summary] + [_section(r, run_url) for r in rest])
    page_notes = "".join(f'<p class="page-notes">{escape(n)}</p>' for n in notes)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rla-sweep dashboard: {escape(sweep)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>
<body><header><h1>Sweep <code>{escape(sweep)}</code></h1>
<p>Runs: {escape(counts)}. Rendered {stamp} from {escape(tracking)}.</p>
<p>Run links open in the MLflow UI: {escape(ui_hint)}</p>{page_notes}</header>
<nav>{nav}</nav><main>
{body}
</main></body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path
