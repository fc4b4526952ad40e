"""Render specs from a sweep's runs to PNG + SVG (matplotlib, Agg); tables also to rows for the HTML page.

Missing data never raises: a series without finished runs is listed in the figure's notes (and drawn
partially where that makes sense, e.g. the curve of a running job), a figure with no data at all says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rla_ablate.dashboard import data as D  # noqa: E402
from rla_ablate.dashboard.spec import (CurveSpec, FigureSpec, GainsSpec, LayersSpec, ScatterSpec,  # noqa: E402
                                       TableSpec)
from rla_ablate.dashboard.stats import mean_ci, paired_diff  # noqa: E402
from rla_ablate.tracking.read import SweepRuns  # noqa: E402

COLORS = plt.get_cmap("tab10").colors
MARKERS = "osD^v<>Pp*"
STYLE = {"axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
         "font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8, "legend.frameon": False,
         "svg.fonttype": "none", "figure.dpi": 100}


@dataclass
class Cell:
    text: str
    link: str | None = None
    best: bool = False
    links: list[tuple[str, str | None]] = field(default_factory=list)
    """Several links in one cell (a row's runs, one per seed)."""


@dataclass
class Rendered:
    name: str
    title: str
    caption: str
    kind: str
    png: Path | None = None
    svg: Path | None = None
    notes: list[str] = field(default_factory=list)
    header: list[str] = field(default_factory=list)
    rows: list[list[Cell]] = field(default_factory=list)
    runs: list[tuple[str, str, str]] = field(default_factory=list)
    """(label, run name, run id) of every run the figure read."""


def _color(i: int):
    return COLORS[i % len(COLORS)]


def _width(i: int, n: int) -> float:
    # Earlier series are drawn wider and underneath, so identical curves still show both colors.
    return 1.2 + 1.6 * (n - 1 - i) / max(n - 1, 1)


def _panels_figure(n: int, width: float = 4.6, height: float = 3.4):
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.6), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _note_missing(out: Rendered, spec: FigureSpec, panel: str, series: list[D.Series]) -> None:
    for s in series:
        note = s.state_note()
        if note:
            where = f"{_panel_title(spec, panel)}: " if panel else ""
            out.notes.append(f"{where}{s.label}: {note}")


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _panel_title(spec: FigureSpec, panel: str) -> str:
    if not spec.panels:
        return ""
    return D.FAMILY_NAMES.get(panel, panel) if spec.panels == "family" else f"{spec.panels} = {panel}"


def _tokens_axis(ax) -> None:
    ax.set_xlabel("tokens seen")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_fmt_tokens))


def _fmt_tokens(x, _pos=None) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def _grouped_figure(spec, runs: SweepRuns):
    """The spec's runs grouped into panels, and a figure with one axis per panel (an empty note if none match)."""
    panels = D.group(spec, runs)
    fig, axes = _panels_figure(max(len(panels), 1))
    if not panels:
        _empty(axes[0], "no runs match this figure's filter")
    return panels, fig, axes


def render_curve(spec: CurveSpec, runs: SweepRuns, out: Rendered):
    panels, fig, axes = _grouped_figure(spec, runs)
    key = D.resolve_metric(spec.y, runs.jobs)
    for ax, (panel, series) in zip(axes, panels.items()):
        _note_missing(out, spec, panel, series)
        drawn = 0
        for i, s in enumerate(series):
            per_run = []
            for r in s.runs:
                if key is None or key not in r.metrics:
                    continue
                pts = runs.history(r.run_id, key)
                steps = [p[0] for p in pts]
                per_run.append((r, dict(zip(steps, D.ema([p[1] for p in pts], spec.smooth)))))
                out.runs.append((s.label, r.name, r.run_id))
            if not per_run:
                continue
            steps = sorted(set().union(*(d.keys() for _, d in per_run)))
            stats = [mean_ci([d[x] for _, d in per_run if x in d]) for x in steps]
            mean = np.array([st.mean for st in stats])
            lo = np.array([st.lo for st in stats])
            hi = np.array([st.hi for st in stats])
            n_done = sum(r.finished for r, _ in per_run)
            unfinished = len(per_run) - n_done
            label = f"{s.label} (n={len(per_run)}" + (f", {unfinished} unfinished)" if unfinished else ")")
            style = "-" if n_done == len(per_run) else "--"
            marker = "o" if len(steps) <= 12 else None
            ax.plot(steps, mean, style, color=_color(i), label=label, marker=marker, markersize=3,
                    linewidth=_width(i, len(series)), zorder=2 + i)
            if np.isfinite(lo).any():
                ax.fill_between(steps, lo, hi, color=_color(i), alpha=0.18, linewidth=0)
            drawn += 1
        if not drawn:
            _empty(ax, f"no data for {spec.y}" + ("" if series else " (no matching runs)"))
            continue
        _tokens_axis(ax)
        _finish_panel(ax, spec, panel, spec.ylabel or key)
    return fig


def _finish_panel(ax, spec, panel, ylabel: str) -> None:
    """y label, optional log scale, title and legend: the common end of every line-plot panel."""
    ax.set_ylabel(ylabel)
    if spec.logy:
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
    ax.set_title(_panel_title(spec, panel))
    ax.legend()


def render_layers(spec: LayersSpec, runs: SweepRuns, out: Rendered):
    panels, fig, axes = _grouped_figure(spec, runs)
    layers = D.layer_keys(spec.y, runs.jobs)
    for ax, (panel, series) in zip(axes, panels.items()):
        _note_missing(out, spec, panel, series)
        drawn = 0
        for i, s in enumerate(series):
            xs, st = [], []
            for layer, key in layers:
                values = list(D.final_by_seed(s, key).values())
                if values:
                    xs.append(layer)
                    st.append(mean_ci(values))
            if not xs:
                continue
            out.runs.extend((s.label, r.name, r.run_id) for r in s.finished)
            mean = np.array([x.mean for x in st])
            err = np.array([x.half_width if x.n >= 2 else 0.0 for x in st])
            ax.errorbar(xs, mean, yerr=err, color=_color(i), marker=MARKERS[i % len(MARKERS)], markersize=5, capsize=3,
                        linewidth=_width(i, len(series)), zorder=2 + i, label=f"{s.label} (n={max(x.n for x in st)})")
            drawn += 1
        if not drawn:
            _empty(ax, f"no finished run logged {spec.y.format(layer='XX')}")
            continue
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        _finish_panel(ax, spec, panel, spec.ylabel or spec.y.format(layer="XX"))
    return fig


def render_gains(spec: GainsSpec, runs: SweepRuns, out: Rendered):
    panels, fig, axes = _grouped_figure(spec, runs)
    sets = D.eval_sets(spec.metric, runs.jobs)
    categories = sorted({spec.category(name) for name, _ in sets}, key=lambda c: (c == "other", c))
    sign = 1.0 if spec.higher_is_better else -1.0
    for ax, (panel, series) in zip(axes, panels.items()):
        _note_missing(out, spec, panel, series)
        pairs = [(s, ref) for s in series if (ref := D.reference_of(s, spec.reference, series)) is not None]
        width = min(0.8 / max(len(pairs), 1), 0.3)
        drawn = 0
        for i, (s, ref) in enumerate(pairs):
            means, errs, xs = [], [], []
            for c_idx, cat in enumerate(categories):
                # Per seed: the average gain over the category's eval sets, then mean and CI over seeds.
                per_seed: dict[str, list[float]] = {}
                for name, key in sets:
                    if spec.category(name) != cat:
                        continue
                    t, r = D.final_by_seed(s, key), D.final_by_seed(ref, key)
                    for seed in t.keys() & r.keys():
                        per_seed.setdefault(seed, []).append(sign * (t[seed] - r[seed]))
                st = mean_ci([float(np.mean(v)) for v in per_seed.values()])
                if st.n:
                    xs.append(c_idx + (i - (len(pairs) - 1) / 2) * width)
                    means.append(st.mean)
                    errs.append(st.half_width if st.n >= 2 else 0.0)
            if not xs:
                out.notes.append(f"{s.label} vs {ref.label}: no seed finished on both sides")
                continue
            out.runs.extend((s.label, r.name, r.run_id) for r in s.finished + ref.finished)
            bars = ax.bar(xs, means, width=width * 0.95, yerr=errs, capsize=3, color=_color(i),
                          label=f"{s.label} − {ref.label}" if spec.higher_is_better else f"{ref.label} − {s.label}")
            ax.bar_label(bars, labels=[f"{m:+.3f}" for m in means], padding=2, fontsize=7)
            drawn += 1
        if not drawn:
            _empty(ax, "no paired finished runs (treatment and reference, same seed)")
            continue
        ax.axhline(0, color="0.3", linewidth=0.8)
        ax.set_xlim(-0.6, len(categories) - 0.4)
        ax.margins(y=0.15)
        ax.set_xticks(range(len(categories)))
        ax.set_xticklabels([f"{c}\n({', '.join(n for n, _ in sets if spec.category(n) == c)})" for c in categories])
        ax.set_ylabel(spec.ylabel or ("gain in " + spec.metric.format(set="*")))
        ax.set_title(_panel_title(spec, panel))
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    return fig


def _family_colors(series: list[D.Series]) -> dict[str, tuple]:
    families = list(dict.fromkeys(s.tags.get("family", "") for s in series))
    return {f: _color(i) for i, f in enumerate(families)}


def _log_axis(axis) -> None:
    # Plain numbers (16K, 0.002) on log axes; minor ticks get labels only within one decade, else they pile up.
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(_fmt_tokens))
    lo, hi = axis.get_view_interval()
    narrow = lo > 0 and hi / lo < 10
    minor = matplotlib.ticker.FuncFormatter(_fmt_tokens) if narrow else matplotlib.ticker.NullFormatter()
    axis.set_minor_formatter(minor)


def render_scatter(spec: ScatterSpec, runs: SweepRuns, out: Rendered):
    panels = D.group(spec, runs)
    series = [s for p in panels.values() for s in p]
    for p, ss in panels.items():
        _note_missing(out, spec, p, ss)
    key = D.resolve_metric(spec.y, runs.jobs)
    colors = _family_colors(series)
    variants = list(dict.fromkeys(s.tags.get("ablations", "") for s in series))
    fig, axes = _panels_figure(len(spec.x), width=5.6, height=4.0)
    for ax, axis in zip(axes, spec.x):
        drawn = 0
        for i, s in enumerate(series):
            finals = D.final_by_seed(s, key)
            xs = [float(r.params[axis.param]) for r in s.finished if axis.param in r.params]
            if not finals or not xs:
                continue
            st = mean_ci(list(finals.values()))
            x = float(np.median(xs))
            color = colors.get(s.tags.get("family", ""), _color(i))
            marker = MARKERS[variants.index(s.tags.get("ablations", "")) % len(MARKERS)]
            ax.errorbar([x], [st.mean], yerr=[st.half_width if st.n >= 2 else 0.0], fmt=marker, color=color,
                        capsize=3, markersize=6, label=f"{s.label} (n={st.n})")
            ax.annotate(s.label, (x, st.mean), textcoords="offset points", xytext=(7, -3 + 8 * (drawn % 2)),
                        fontsize=7, color=color)
            drawn += 1
        if not drawn:
            _empty(ax, f"no finished run has param {axis.param} and metric {spec.y}")
            continue
        if axis.log:
            ax.set_xscale("log")
            _log_axis(ax.xaxis)
        else:
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_fmt_tokens))
        ax.margins(x=0.25)
        ax.set_xlabel(axis.label or axis.param)
        ax.set_ylabel(spec.ylabel or key)
    out.runs.extend((s.label, r.name, r.run_id) for s in series for r in s.finished)
    handles, labels = axes[-1].get_legend_handles_labels()
    if handles:
        axes[-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


def table_rows(spec: TableSpec, runs: SweepRuns, out: Rendered, run_url) -> None:
    panels = D.group(spec, runs)
    # A glob column becomes one column per matching metric (eval/*/loss -> eval loss (val), eval loss (mqar)).
    columns = []
    for c in spec.columns:
        keys = D.matching_metrics(c.metric, runs.jobs) or [None]
        for key in keys:
            label = c.label or c.metric
            if len(keys) > 1:
                label += f" ({D.glob_part(c.metric, key)})"
            columns.append((c, key, label))
    out.header = ["model"] + [h for _, _, label in columns for h in (label, f"Δ {label}")] + ["runs"]
    for panel, series in panels.items():
        _note_missing(out, spec, panel, series)
        summaries = {id(s): [mean_ci(list(D.final_by_seed(s, k).values())) for _, k, _ in columns] for s in series}
        best = []
        for j, (c, _, _) in enumerate(columns):
            means = [summaries[id(s)][j].mean for s in series if summaries[id(s)][j].n]
            best.append((max(means) if c.higher_is_better else min(means)) if means else None)
        refs = [r for o in series if (r := D.reference_of(o, spec.reference, series)) is not None]
        for s in series:
            ref = D.reference_of(s, spec.reference, series)
            label = s.label + (f" [{s.state_note()}]" if s.state_note() else "")
            row = [Cell(label)]
            for j, (c, key, _) in enumerate(columns):
                st = summaries[id(s)][j]
                row.append(Cell(st.format(c.digits) if st.n else "missing", best=st.n > 0 and st.mean == best[j]))
                if ref is None:
                    row.append(Cell("reference" if any(s is r for r in refs) else "—"))
                else:
                    d = paired_diff(D.final_by_seed(s, key), D.final_by_seed(ref, key))
                    row.append(Cell(d.format(c.digits) if d.diff.n else "no paired seeds"))
            links = [(f"seed {s.seed(r)}", run_url(r.run_id) if r.run_id else None) for r in s.runs]
            row.append(Cell(" ".join(t for t, _ in links) or "no run", links=links))
            out.rows.append(row)
            out.runs.extend((s.label, r.name, r.run_id) for r in s.runs)


def render_table(spec: TableSpec, out: Rendered):
    # The PNG stacks each value over its difference (two lines a cell) to stay half as wide as the HTML table.
    metrics = out.header[1:-1:2]
    cols = ["model"] + metrics
    cells, bold = [], []
    for row in out.rows:
        line = [row[0].text.replace(" [", "\n[")]
        marks = [False]
        for j in range(len(metrics)):
            value, diff = row[1 + 2 * j], row[2 + 2 * j]
            below = {"—": "", "reference": "\nreference"}.get(diff.text, f"\nΔ {diff.text}")
            line.append(value.text + below)
            marks.append(value.best)
        cells.append(line)
        bold.append(marks)
    if not cells:
        cells, bold = [["no runs match this table's filter"] + [""] * len(metrics)], [[False] * len(cols)]
    fig, ax = plt.subplots(figsize=(max(6.0, 2.3 * len(cols)), 0.5 * len(cells) + 0.9))
    ax.axis("off")
    table = ax.table(cellText=cells, colLabels=cols, loc="upper center", cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.auto_set_column_width(list(range(len(cols))))
    for (r, c), cell in table.get_celld().items():
        cell.set_edgecolor("0.85")
        cell.set_height(0.9 / (len(cells) + 1) * (1.0 if r == 0 else 1.0))
        if r == 0 or bold[r - 1][c]:
            cell.set_text_props(weight="bold")
    return fig


def render(spec: FigureSpec, runs: SweepRuns, out_dir: Path, run_url=lambda run_id: None) -> Rendered:
    out = Rendered(spec.name, spec.title, spec.caption, spec.kind)
    with plt.rc_context(STYLE):
        try:
            if isinstance(spec, TableSpec):
                table_rows(spec, runs, out, run_url)
                fig = render_table(spec, out)
            else:
                fig = {CurveSpec: render_curve, LayersSpec: render_layers, GainsSpec: render_gains,
                       ScatterSpec: render_scatter}[type(spec)](spec, runs, out)
        except Exception as exc:  # noqa: BLE001 - one broken figure must not take the whole dashboard down
            out.notes.append(f"could not render: {type(exc).__name__}: {exc}")
            fig, ax = plt.subplots(figsize=(6, 2))
            _empty(ax, f"could not render: {type(exc).__name__}: {exc}")
        fig.suptitle(spec.title, fontsize=11)
        fig.tight_layout()
        out_dir.mkdir(parents=True, exist_ok=True)
        out.png, out.svg = out_dir / f"{spec.name}.png", out_dir / f"{spec.name}.svg"
        fig.savefig(out.png, dpi=150, bbox_inches="tight")
        fig.savefig(out.svg, bbox_inches="tight")
        plt.close(fig)
    return out
