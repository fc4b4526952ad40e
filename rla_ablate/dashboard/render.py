"""Render specs from a sweep's runs to PNG + SVG (matplotlib, Agg); tables also to rows for the HTML page.

Missing data never raises: a series without finished runs is listed in the figure's notes (and drawn
partially where that makes sense, e.g. the curve of a running job), a figure with no data at all says so.
A variant whose mechanism was off, or whose results equal its reference's, is drawn dotted / hatched / hollow
and named in a note printed on the figure itself; tables get a `mechanism` column. A spec's claims get their
verdicts printed under the figure or table. A spec with nothing to compare in the sweep (`coverage.drawable`) is not
drawn: `render` returns it with `drawn` false and its claims as not tested.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rla_ablate.dashboard import coverage as C  # noqa: E402
from rla_ablate.dashboard import data as D  # noqa: E402
from rla_ablate.dashboard import validity as V  # noqa: E402
from rla_ablate.dashboard.spec import (CurveSpec, FigureSpec, GainsSpec, LayersSpec, ScatterSpec,  # noqa: E402
                                       TableSpec, ValiditySpec)
from rla_ablate.dashboard.stats import mean_ci, paired_diff  # noqa: E402
from rla_ablate.dashboard.verdict import Verdict, evaluate  # noqa: E402
from rla_ablate.tracking.read import SweepRuns  # noqa: E402
from rla_ablate.outcome import Status  # noqa: E402

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
    verdicts: list[Verdict] = field(default_factory=list)
    """The verdict on each of the spec's claims."""
    single_seed: bool = False
    """Some value or difference it shows rests on one seed (a table's cell, a verdict): no interval exists."""
    per_seed: bool = False
    """A table's cells list each seed's value (a column's `per_seed`)."""
    not_applicable: bool = False
    """A table has n/a cells: rows whose runs do not log a column's metric (another task's)."""
    left_out: list[str] = field(default_factory=list)
    """A table's columns that no run of the sweep logs, left out of it: 'label (metric)'."""
    checks: dict[str, list[str]] = field(default_factory=dict)
    """The validity checks behind a table's mechanism column: each condition (`validity.Check.condition`), in order
    of first use, with every run it reads (`check_lines`)."""
    flagged: list[tuple[str, str, str]] = field(default_factory=list)
    """(state, label, detail) of each variant whose mechanism was off, identical or not measured."""
    fallbacks: list[str] = field(default_factory=list)
    """What was drawn instead of a metric no run has (a spec's `fallback`), printed on the figure."""
    mixed: list[str] = field(default_factory=list)
    """The lm-eval scores the figure draws from runs scored on different numbers of examples (`mixed_examples`)."""
    untested: list[C.Untested] = field(default_factory=list)
    """The spec's claims this sweep cannot test (no run of their treatment), or the spec itself when not drawn."""
    drawn: bool = True
    """False when the sweep has nothing this spec compares: no figure, no files, only `untested`."""

    @property
    def flagged_lines(self) -> list[str]:
        return [f"{label}: {V.MARK[state]}: {detail}" for state, label, detail in self.flagged]


def _color(i: int):
    return COLORS[i % len(COLORS)]


def _width(i: int, n: int) -> float:
    # Earlier series are drawn wider and underneath, so identical curves still show both colors.
    return 1.2 + 1.6 * (n - 1 - i) / max(n - 1, 1)


DIVERGED = "diverged"
FLAG_SUFFIX = {V.OFF: " [mechanism off]", V.IDENTICAL: " [identical to reference]"}


def _watermark(ax, states: list[str]) -> None:
    """Across a panel in which no series drawn is a valid comparison (every one's mechanism off, or identical to its
    reference): say so on the panel itself, where the curves are, not only in its legend and footer."""
    if not states or not all(st in FLAG_SUFFIX for st in states):
        return
    text = ("MECHANISM OFF" if all(st == V.OFF for st in states) else
            "IDENTICAL TO REFERENCE" if all(st == V.IDENTICAL for st in states) else "NOT A VALID COMPARISON")
    ax.text(0.5, 0.5, text + "\nnot a test of the ablation", transform=ax.transAxes, ha="center", va="center",
            fontsize=15, fontweight="bold", color="#8a4b00", alpha=0.28, rotation=18, zorder=1)


def _colors(spec, series: list[D.Series]) -> dict[tuple, tuple[tuple, int]]:
    """series key -> (colour, index within its colour): by the spec's `color` key, else one colour per series."""
    out, groups, counts = {}, {}, {}
    for s in series:
        group = s.value(spec.color) if spec.color else s.key
        idx = groups.setdefault(group, len(groups))
        out[s.key] = (_color(idx), counts.get(group, 0))
        counts[group] = counts.get(group, 0) + 1
    return out


def _flag(out: Rendered, index: V.ValidityIndex, s: D.Series, ref: D.Series | None = None,
          where: str = "") -> str:
    """The comparison state of a series (against `ref`, else its own validity); notes it when not sound. A series
    that diverged on every seed is `diverged`: it has no final diagnostics, and losing training is its result."""
    if s.unique and all(r.job_status == Status.DIVERGED for r in s.unique):
        return DIVERGED
    if ref is not None:
        state, detail = V.comparison(index, s, ref)
    else:
        v = index.of(s)
        state, detail = (v.state, v.detail()) if v is not None else (V.NO_CHECK, "")
    if state == V.OFF:
        # The values below their thresholds, not the per-seed account (that is the validity panel's).
        detail = V.off_summary(index, s, ref) or detail
    if state in V.MARK:
        item = (state, f"{where}{s.label}", detail)
        if item not in out.flagged:
            out.flagged.append(item)
    return state


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


def _validity_reference(spec, s: D.Series, series: list[D.Series]) -> D.Series | None:
    """The series a figure compares `s` with: the spec's `reference` overrides applied to it (by default the
    same model without ablation), among the series it draws."""
    return D.reference_of(s, spec.reference, series, keys=_keys(spec))


def _keys(spec) -> tuple[str, ...]:
    return tuple(spec.series) + ((spec.panels,) if spec.panels else ())


def render_curve(spec: CurveSpec, runs: SweepRuns, out: Rendered, index: V.ValidityIndex):
    panels, fig, axes = _grouped_figure(spec, runs)
    key = D.resolve_metric(spec.y, runs.jobs)
    for ax, (panel, series) in zip(axes, panels.items()):
        _note_missing(out, spec, panel, series)
        colors = _colors(spec, series)
        drawn, states = 0, []
        for i, s in enumerate(series):
            per_run = []
            for r in s.unique:
                if key is None or key not in r.metrics:
                    continue
                pts = runs.history(r.run_id, key)
                steps = [p[0] for p in pts]
                per_run.append((r, dict(zip(steps, D.ema([p[1] for p in pts], spec.smooth)))))
                out.runs.append((s.label, r.name, r.run_id))
            if not per_run:
                continue
            state = _flag(out, index, s, _validity_reference(spec, s, series), _where(spec, panel))
            states.append(state)
            steps = sorted(set().union(*(d.keys() for _, d in per_run)))
            stats = [mean_ci([d[x] for _, d in per_run if x in d]) for x in steps]
            mean = np.array([st.mean for st in stats])
            lo = np.array([st.lo for st in stats])
            hi = np.array([st.hi for st in stats])
            if D.fraction_metric(key):
                lo, hi = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
            n_done = sum(r.finished for r, _ in per_run)
            unfinished = len(per_run) - n_done
            out.single_seed |= len(per_run) == 1
            label = f"{s.label} (n={len(per_run)}" + (f", {unfinished} unfinished)" if unfinished else ")")
            label += FLAG_SUFFIX.get(state, "")
            style = ":" if state in FLAG_SUFFIX else ("-" if n_done == len(per_run) else "--")
            color, shade = colors[s.key]
            marker = MARKERS[shade % len(MARKERS)] if (spec.color or len(steps) <= 12) else None
            ax.plot(steps, mean, style, color=color, label=label, marker=marker, markersize=3,
                    markevery=max(1, len(steps) // 12), linewidth=_width(i, len(series)), zorder=2 + i)
            if np.isfinite(lo).any():
                ax.fill_between(steps, lo, hi, color=color, alpha=0.18, linewidth=0,
                                hatch="//" if state in FLAG_SUFFIX else None)
            drawn += 1
        if not drawn:
            _empty(ax, f"no data for {spec.y}" + ("" if series else " (no matching runs)"))
            continue
        _tokens_axis(ax)
        _finish_panel(ax, spec, panel, spec.ylabel or key)
        _watermark(ax, states)
    return fig


def _where(spec, panel: str) -> str:
    return f"{_panel_title(spec, panel)}: " if panel else ""


def _finish_panel(ax, spec, panel, ylabel: str) -> None:
    """y label, optional log scale, title and legend: the common end of every line-plot panel."""
    ax.set_ylabel(ylabel)
    if spec.logy:
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
    ax.set_title(_panel_title(spec, panel))
    ax.legend()


def render_layers(spec: LayersSpec, runs: SweepRuns, out: Rendered, index: V.ValidityIndex):
    panels, fig, axes = _grouped_figure(spec, runs)
    layers = D.layer_keys(spec.y, runs.jobs)
    for ax, (panel, series) in zip(axes, panels.items()):
        _note_missing(out, spec, panel, series)
        colors = _colors(spec, series)
        drawn, states = 0, []
        for i, s in enumerate(series):
            xs, st = [], []
            for layer, key in layers:
                values = list(D.final_by_seed(s, key).values())
                if values:
                    xs.append(layer)
                    st.append(mean_ci(values))
            if not xs:
                continue
            state = _flag(out, index, s, _validity_reference(spec, s, series), _where(spec, panel))
            states.append(state)
            out.runs.extend((s.label, r.name, r.run_id) for r in s.finished)
            mean = np.array([x.mean for x in st])
            err = np.array([x.half_width if x.n >= 2 else 0.0 for x in st])
            color, shade = colors[s.key]
            marker = MARKERS[(i if not spec.color else shade) % len(MARKERS)]
            flagged = state in FLAG_SUFFIX
            out.single_seed |= max(x.n for x in st) == 1
            ax.errorbar(xs, mean, yerr=err, color=color, marker=marker, markersize=5, capsize=3,
                        linestyle=":" if flagged else "-", markerfacecolor="none" if flagged else color,
                        linewidth=_width(i, len(series)), zorder=2 + i,
                        label=f"{s.label} (n={max(x.n for x in st)})" + FLAG_SUFFIX.get(state, ""))
            drawn += 1
        if not drawn:
            _empty(ax, f"no finished run logged {spec.y.format(layer='XX')}")
            continue
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        _finish_panel(ax, spec, panel, spec.ylabel or spec.y.format(layer="XX"))
        _watermark(ax, states)
    return fig


def _gains_source(spec: GainsSpec, runs: SweepRuns, out: Rendered) -> tuple[GainsSpec, list[tuple[str, str]]]:
    """The spec to draw and its (set, key) pairs: the primary metric's sets of named categories, or the fallback."""
    sets = D.eval_sets(spec.metric, runs.jobs)
    if spec.fallback is None:
        return spec, sets
    named = [(n, k) for n, k in sets if spec.category(n) != "other"]
    if named:
        return spec, named
    fb = spec.fallback
    note = (f"FALLBACK: no run has {spec.metric.format(set='<task>')} for the categories "
            f"({', '.join(spec.categories)}); showing {fb.metric.format(set='*')} instead")
    out.fallbacks.append(note)
    out.notes.append(note)
    drawn = spec.model_copy(update={"metric": fb.metric, "categories": fb.categories,
                                    "higher_is_better": fb.better_is_higher, "ylabel": fb.ylabel, "fallback": None})
    return drawn, D.eval_sets(fb.metric, runs.jobs)


def render_gains(spec: GainsSpec, runs: SweepRuns, out: Rendered, index: V.ValidityIndex):
    panels, fig, axes = _grouped_figure(spec, runs)
    spec, sets = _gains_source(spec, runs, out)
    categories = sorted({spec.category(name) for name, _ in sets}, key=lambda c: (c == "other", c))
    sign = 1.0 if spec.better_is_higher else -1.0
    for ax, (panel, series) in zip(axes, panels.items()):
        _note_missing(out, spec, panel, series)
        pairs = [(s, ref) for s in series if (ref := D.reference_of(s, spec.reference, series, _keys(spec))) is not None]
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
                out.single_seed |= st.n == 1
                if st.n:
                    xs.append(c_idx + (i - (len(pairs) - 1) / 2) * width)
                    means.append(st.mean)
                    errs.append(st.half_width if st.n >= 2 else 0.0)
            if not xs:
                out.notes.append(f"{s.label} vs {ref.label}: no seed finished on both sides")
                continue
            out.runs.extend((s.label, r.name, r.run_id) for r in s.finished + ref.finished)
            state = _flag(out, index, s, ref, _where(spec, panel))
            flagged = state in FLAG_SUFFIX
            name = f"{s.label} − {ref.label}" if spec.better_is_higher else f"{ref.label} − {s.label}"
            bars = ax.bar(xs, means, width=width * 0.95, yerr=errs, capsize=3, color=_color(i),
                          hatch="///" if flagged else None, alpha=0.45 if flagged else 1.0,
                          edgecolor="0.2" if flagged else None, label=name + FLAG_SUFFIX.get(state, ""))
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
        # under the panel; long labels (a grid's values in each) one per row, or the panels' legends run together
        long = max(len(t) for t in ax.get_legend_handles_labels()[1]) > 30
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1 if long else 2)
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


def render_scatter(spec: ScatterSpec, runs: SweepRuns, out: Rendered, index: V.ValidityIndex):
    panels = D.group(spec, runs)
    series = [s for p in panels.values() for s in p]
    for p, ss in panels.items():
        _note_missing(out, spec, p, ss)
    key = D.resolve_metric(spec.y, runs.jobs)
    colors = _family_colors(series) if not spec.color else {}
    by_color = _colors(spec, series) if spec.color else {}
    variants = list(dict.fromkeys(s.tags.get("ablations", "") for s in series))
    fig, axes = _panels_figure(len(spec.x), width=5.6, height=4.0)
    for ax, axis in zip(axes, spec.x):
        drawn = 0
        notes = []
        lines: dict[object, tuple[tuple, list[tuple[float, float]]]] = {}
        for i, s in enumerate(series):
            finals = D.final_by_seed(s, key)
            xs = [float(v) for r in s.finished if (v := D.value_of(r, axis.param)) is not None and D.is_number(v)]
            if not finals or not xs:
                continue
            state = _flag(out, index, s, _validity_reference(spec, s, series))
            flagged = state in FLAG_SUFFIX
            st = mean_ci(list(finals.values()))
            out.single_seed |= st.n == 1
            x = float(np.median(xs))
            if spec.color:
                color, shade = by_color[s.key]
                marker = MARKERS[shade % len(MARKERS)]
            else:
                color = colors.get(s.tags.get("family", ""), _color(i))
                marker = MARKERS[variants.index(s.tags.get("ablations", "")) % len(MARKERS)]
            half = st.half_width if st.n >= 2 else 0.0
            below, above = half, half
            if D.fraction_metric(key):          # the interval stops at 0 and 1
                below, above = min(half, max(st.mean, 0.0)), min(half, max(1.0 - st.mean, 0.0))
            ax.errorbar([x], [st.mean], yerr=[[below], [above]], fmt=marker, color=color,
                        capsize=3, markersize=6, markerfacecolor="none" if flagged else color,
                        label=f"{s.label} (n={st.n})" + FLAG_SUFFIX.get(state, ""))
            notes.append(ax.annotate(s.label, (x, st.mean), textcoords="offset points",
                                     xytext=(7, -3 + 8 * (drawn % 2)), fontsize=7, color=color))
            lines.setdefault(s.value(spec.color) if spec.color else s.key, (color, []))[1].append((x, st.mean))
            drawn += 1
        if not drawn:
            _empty(ax, f"no finished run has param {axis.param} and metric {spec.y}")
            continue
        if spec.connect:
            for color, pts in lines.values():
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=color, alpha=0.6, linewidth=1, zorder=1)
        if axis.log:
            ax.set_xscale("log")
            _log_axis(ax.xaxis)
        else:
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_fmt_tokens))
        ax.margins(x=0.25)
        ax.autoscale_view()
        to_axes = ax.transData + ax.transAxes.inverted()
        for note in notes:  # a point in the right part labelled on its left: its text stays inside the panel
            if to_axes.transform(note.xy)[0] > 0.6:
                note.set_horizontalalignment("right")
                note.xyann = (-7, note.xyann[1])
        _unstack(fig, notes)
        ax.set_xlabel(axis.label or axis.param)
        ax.set_ylabel(spec.ylabel or key)
    out.runs.extend((s.label, r.name, r.run_id) for s in series for r in s.finished)
    handles, labels = axes[-1].get_legend_handles_labels()
    if handles:
        axes[-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


def _unstack(fig, notes: list) -> None:
    """Move point labels that would print over one another apart, downwards, from the highest point: series at one
    x and close values (a matched-state control sits at its reference's state by construction) stay readable."""
    renderer = fig.canvas.get_renderer()
    placed: list = []
    for note in sorted(notes, key=lambda n: -n.get_window_extent(renderer).y1):
        for _ in range(len(notes)):
            box = note.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            note.xyann = (note.xyann[0], note.xyann[1] - box.height * 72 / fig.dpi - 1)
        placed.append(note.get_window_extent(renderer))


def _column_keys(c, jobs: list) -> list[str]:
    """The metrics a column reads in these runs: its glob's matches, limited to `sets` when the column names them."""
    keys = D.matching_metrics(c.metric, jobs)
    if c.sets is not None:
        keys = [k for k in keys if any(fnmatch.fnmatchcase(D.glob_part(c.metric, k), g) for g in c.sets)]
    return keys


NOT_APPLICABLE = "n/a"
# what a table's mechanism column tests, said under it: activity, not learning
MECHANISM_CHECKS = ("engaged when each check holds in the final diagnostics; they show that the mechanism acted, "
                    "not that the model learned (a run at chance can pass)")


def _note_check(checks: dict[str, list[str]], check: V.Check) -> None:
    """Add a check to a table's, once per metric and threshold with every run it reads ('target_engaged >= 0.001'
    on the reference and on (job, reference) is one line, '(job, reference)')."""
    sides = checks.setdefault(check.condition(), [])
    sides += [side for side in check.on if side not in sides]


def check_lines(checks: dict[str, list[str]]) -> list[str]:
    """'condition (runs it reads)' of each check noted by `_note_check`, in order of first use."""
    return [f"{condition} ({', '.join(sides)})" for condition, sides in checks.items()]


def _absent(s: D.Series, c, key: str | None, eval_sets: set[str]) -> str:
    """What a table cell without a value says: n/a where the series' finished runs log no metric of the column at
    all (an LM row under an MQAR column: none matches its glob), or where the cell's metric is of an eval set that
    other runs of the sweep evaluate and these are not configured to (an LM row under `eval loss (mqar_kv8)` of an
    `eval/*/loss` column; `eval_sets`: every run's eval-set names); else missing (no finished run, a value that is
    not a number, or a set of the column's not logged where the runs evaluate it, or a task not scored)."""
    done = list(s.by_seed().values())
    if not done or key is None:
        return "missing"
    if not _column_keys(c, done):
        return NOT_APPLICABLE
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "eval" and parts[1] in eval_sets and parts[1] not in D.eval_set_names(done):
        return NOT_APPLICABLE
    return "missing"


def table_rows(spec: TableSpec, runs: SweepRuns, out: Rendered, run_url, index: V.ValidityIndex) -> None:
    panels = D.group(spec, runs)
    # A glob column becomes one column per matching metric (eval/*/loss -> eval loss (val), eval loss (mqar)).
    columns = []
    # A column no run of the sweep logs (another task's, in a sweep of one task; or a misspelt metric) is left out,
    # unless every column is: a sweep that runs part of a study reads as what it measured. The note of `unlogged`
    # names its metric.
    unlogged = [c for c in spec.columns if not _column_keys(c, runs.jobs)
                and (c.fallback is None or not _column_keys(c.fallback, runs.jobs))]
    for c in spec.columns:
        if len(unlogged) < len(spec.columns) and any(c is u for u in unlogged):
            out.left_out.append(f"{c.label} ({c.metric})" if c.label else c.metric)
            continue
        keys = _column_keys(c, runs.jobs)
        if not keys and c.fallback is not None:
            note = f"FALLBACK: no run has {c.metric}; column {c.fallback.label or c.fallback.metric} shown instead"
            out.fallbacks.append(note)
            out.notes.append(note)
            c = c.fallback
            keys = _column_keys(c, runs.jobs)
        keys = keys or [None]
        for key in keys:
            label = c.label or c.metric
            if key is not None and "*" in c.metric:  # which match: the task or eval set, also when it is the only one
                label += f" ({D.glob_part(c.metric, key)})"
            # which way is better: a loss's Δ > 0 is worse, an accuracy's better
            columns.append((c, key, label + (" ↑" if c.better_is_higher else " ↓")))
    out.header = ["model"] + [h for _, _, label in columns for h in (label, f"Δ {label}")] + ["mechanism", "runs"]
    eval_sets = D.eval_set_names(runs.jobs)
    for panel, series in panels.items():
        _note_missing(out, spec, panel, series)
        summaries = {id(s): [mean_ci(list(D.final_by_seed(s, k).values())) for _, k, _ in columns] for s in series}
        out.single_seed |= any(st.n == 1 for sts in summaries.values() for st in sts)
        # the best mean of a column is among rows of one task (the eval sets their runs are configured with): an
        # LM's train loss and an MQAR model's are not ranked together
        task = {id(s): frozenset(D.eval_set_names(s.runs)) for s in series}
        best: list[dict[frozenset, float]] = []
        for j, (c, _, _) in enumerate(columns):
            means: dict[frozenset, list[float]] = {}
            for s in series:
                if summaries[id(s)][j].n:
                    means.setdefault(task[id(s)], []).append(summaries[id(s)][j].mean)
            best.append({t: max(m) if c.better_is_higher else min(m) for t, m in means.items()})
        refs = [r for o in series if (r := D.reference_of(o, spec.reference, series, _keys(spec))) is not None]
        for s in series:
            ref = D.reference_of(s, spec.reference, series, _keys(spec))
            label = s.label + (f" [{s.state_note()}]" if s.state_note() else "")
            row = [Cell(label)]
            for j, (c, key, _) in enumerate(columns):
                st = summaries[id(s)][j]
                if not st.n:
                    absent = _absent(s, c, key, eval_sets)
                    out.not_applicable |= absent == NOT_APPLICABLE
                    is_ref = ref is None and any(s is r for r in refs)
                    row += [Cell(absent), Cell("reference" if is_ref else
                                                NOT_APPLICABLE if absent == NOT_APPLICABLE else "—")]
                    continue
                text = st.format(c.digits)
                if c.per_seed and st.n > 1:
                    # each seed's value, named, in seed order; those the mean leaves out (not a number) too
                    finals = D.final_by_seed(s, key)
                    text += "\n" + "  ".join(f"s{seed} {finals[seed]:.{c.digits}f}"
                                             for seed in sorted(finals, key=D._num_key))
                    out.per_seed = True
                row.append(Cell(text, best=st.mean == best[j].get(task[id(s)])))
                if ref is None:
                    row.append(Cell("reference" if any(s is r for r in refs) else "—"))
                else:
                    d = paired_diff(D.final_by_seed(s, key), D.final_by_seed(ref, key))
                    row.append(Cell(d.format(c.digits) if d.diff.n else "no paired seeds"))
            state = _flag(out, index, s, ref, _where(spec, panel))
            for v in (index.of(s), index.of(ref) if ref is not None else None):
                for c in v.checks if v is not None else []:
                    _note_check(out.checks, c)
            row.append(Cell(state + ("*" if state in V.MARK else "")))
            links = [(f"seed {s.seed(r)}", run_url(r.run_id) if r.run_id else None) for r in s.runs]
            row.append(Cell(" ".join(t for t, _ in links) or "no run", links=links))
            out.rows.append(row)
            out.runs.extend((s.label, r.name, r.run_id) for r in s.runs)


def render_table(spec: TableSpec, out: Rendered):
    # The PNG stacks each value over its difference (two lines a cell) to stay half as wide as the HTML table.
    metrics = out.header[1:-2:2]
    cols = ["model"] + metrics + ["mechanism"]
    cells, bold = [], []
    for row in out.rows:
        line = [row[0].text.replace(" [", "\n[")]
        marks = [False]
        for j in range(len(metrics)):
            value, diff = row[1 + 2 * j], row[2 + 2 * j]
            below = {"—": "", NOT_APPLICABLE: "", "reference": "\nreference"}.get(diff.text, f"\nΔ {diff.text}")
            line.append(value.text + below)
            marks.append(value.best)
        line.append(row[-2].text)
        marks.append(False)
        cells.append(line)
        bold.append(marks)
    if not cells:
        cells, bold = [["no runs match this table's filter"] + [""] * len(metrics)], [[False] * len(cols)]
    # rows as tall as their most lines (a value, its seeds, its Δ), at least two; the header two
    weights = [2] + [max(2, *(1 + str(t).count("\n") for t in line)) for line in cells]
    fig, ax = plt.subplots(figsize=(max(6.0, 2.3 * len(cols)), 0.25 * sum(weights) + 0.9))
    ax.axis("off")
    table = ax.table(cellText=cells, colLabels=cols, loc="upper center", cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.auto_set_column_width(list(range(len(cols))))
    for (r, c), cell in table.get_celld().items():
        cell.set_edgecolor("0.85")
        cell.set_height(0.9 * weights[r] / sum(weights))
        if r == 0 or bold[r - 1][c]:
            cell.set_text_props(weight="bold")
        if r > 0 and cells[r - 1][-1].rstrip("*") in (V.OFF, V.IDENTICAL):
            # The row of a variant whose mechanism was off, or that changed nothing: greyed and hatched.
            cell.set_facecolor("0.93")
            cell.set_hatch("//")
            cell.set_text_props(color="0.35")
    return fig


def validity_rows(spec: ValiditySpec, runs: SweepRuns, out: Rendered, run_url, index: V.ValidityIndex) -> None:
    """One row per job (a series at one seed): which checks it needs, the values, the thresholds, the state."""
    out.header = ["job", "seed", "checks: diag/... >= threshold (on)", "measured (final value)", "state", "run"]
    panels = D.group(spec, runs)
    for panel, series in panels.items():
        for s in series:
            v = index.of(s)
            if v is None:
                continue
            checks = "; ".join(c.describe() for c in v.checks) or "none (no linear-attention mixer)"
            by_seed = {sv.seed: sv for sv in v.seeds}
            for r in s.runs:
                seed = s.seed(r)
                sv = by_seed.get(seed)
                if sv is not None and sv.run is r:
                    state = sv.state
                    measured = "; ".join(m.text() for m in sv.measured)
                    if v.reference is not None and v.reference.value("family") != s.value("family"):
                        # a derived control without a run of its baseline: checked against the model it derives from
                        measured += f"; reference: {v.reference.label}, the model it is derived from"
                    if sv.identical:
                        measured += f"; final results identical to {v.reference.label if v.reference else 'reference'}"
                elif not v.checks:
                    state, measured = V.NO_CHECK, ""
                else:
                    state = V.NOT_MEASURED
                    measured = f"run {r.job_status}" if not r.finished else f"seed {seed} has more than one run"
                where = _where(spec, panel)
                if state in V.MARK:
                    out.flagged.append((state, f"{where}{s.label}, seed {seed}", measured))
                out.rows.append([Cell(f"{where}{s.label}"), Cell(seed), Cell(checks), Cell(measured or "—"),
                                 Cell(state), Cell(r.name, link=run_url(r.run_id) if r.run_id else None)])
                out.runs.append((s.label, r.name, r.run_id))


def render_rows_png(out: Rendered, widths: tuple[float, ...] = ()):
    """A plain PNG of a row table (the validity panel): one line per row, greyed where the state is not sound."""
    cells = [[c.text for c in row] for row in out.rows] or [["no runs match this panel's filter"]
                                                             + [""] * (len(out.header) - 1)]
    fig, ax = plt.subplots(figsize=(14, 0.2 * len(cells) + 0.8))
    ax.axis("off")
    table = ax.table(cellText=cells, colLabels=out.header, loc="upper center", cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.auto_set_column_width(list(range(len(out.header))))
    state_col = out.header.index("state") if "state" in out.header else None
    for (r, _c), cell in table.get_celld().items():
        # matplotlib pads a cell by a tenth of its width on each side: in a wide column that reads as an empty one
        cell.PAD = 0.02
        cell.set_edgecolor("0.85")
        if r == 0:
            cell.set_text_props(weight="bold")
        elif state_col is not None and cells[r - 1][state_col] in (V.OFF, V.IDENTICAL, V.NOT_MEASURED):
            cell.set_facecolor("0.93")
            if cells[r - 1][state_col] != V.NOT_MEASURED:
                cell.set_hatch("//")
    return fig


def _caveats(v) -> str:
    """What a verdict's reason adds to the rule that decided it (seeds that learned a task on one side only, seeds
    left out, a diverged seed), in parentheses after its line."""
    return f" ({'; '.join(v.caveats)})" if v.caveats else ""


def _footer(fig, out: Rendered) -> None:
    """Print the flagged variants and the verdicts on the figure itself, under its axes."""
    lines = [f"⚠ {note}" for note in out.fallbacks] + [f"⚠ NOT COMPARABLE: {line}" for line in out.mixed]
    if out.single_seed or any(v.diff is not None and v.diff.diff.n == 1 for v in out.verdicts):
        lines.append("⚠ ONE SEED: where n=1 no interval or test exists; a Δ there is one pair of runs, which seed "
                     "noise alone can give either sign")
    for state, what in ((V.OFF, "MECHANISM OFF (the comparison cannot test the ablation)"),
                        (V.IDENTICAL, "IDENTICAL to the reference (same final results on every seed)"),
                        (V.NOT_MEASURED,
                         "mechanism not measured (a diag/* metric, or the run it is compared with, is missing)")):
        labels = list(dict.fromkeys(label for st, label, _ in out.flagged if st == state))
        if labels:
            lines.append(f"⚠ {what}: {', '.join(labels)}")
    off = [f"  {label}: {detail}" for st, label, detail in out.flagged if st == V.OFF]
    lines += off[:6] + ([f"  ... {len(off) - 6} more in the validity panel"] if len(off) > 6 else [])
    if out.kind == "table" and out.rows:
        lines.append("Cells: mean ± the 95% t-interval's half-width over n seeds"
                     + (", then each seed's value (s0 = seed 0)" if out.per_seed else "")
                     + "; Δ: the row minus its reference, paired by seed; ↑ / ↓: higher / lower is better; bold: the "
                     "best mean of a column" + ("; n/a: the row's runs do not log that metric (another task's)"
                                                if out.not_applicable else "") + ".")
        if out.checks:
            lines.append(f"mechanism: {MECHANISM_CHECKS} ({'; '.join(check_lines(out.checks))}).")
        if out.left_out:
            lines.append(f"Columns left out, no run of this sweep logs them: {', '.join(out.left_out)}.")
    if out.verdicts:
        lines.append("Verdicts (paired by seed, 95% t-interval; q: false-discovery rate over the sweep's claims):")
        lines += [f"  {v.verdict.upper()}: {v.claim.claim} [{v.comparison()}: Δ = {v.diff_text()}; "
                  f"seeds for 80% power: {v.seeds_text()}]" + _caveats(v) for v in out.verdicts]
    if out.untested:
        lines.append("Not tested by this sweep (no runs of the treatment):")
        lines += [f"  {u.claim}: needs runs with {u.needs}" for u in out.untested]
    if not lines:
        return
    import textwrap

    width = int(fig.get_figwidth() * 15)
    wrapped = [w for line in lines for w in textwrap.wrap(line, width, subsequent_indent="      ") or [""]]
    # under everything drawn so far: legends and tick labels may reach below the figure's bottom edge, and the
    # notes must not hide under them (nor hide them)
    drawn = fig.get_tightbbox(fig.canvas.get_renderer())
    top = min(0.0, drawn.y0 / fig.get_figheight() - 0.02)
    fig.text(0.01, top, "\n".join(wrapped), ha="left", va="top", fontsize=7, color="#8a4b00",
             family="DejaVu Sans", transform=fig.transFigure)


def validity_index(spec: FigureSpec, runs: SweepRuns, cache: dict | None = None) -> V.ValidityIndex:
    """The validity of every series under the spec's thresholds; `cache` shares it between specs with equal ones."""
    key = tuple(sorted(spec.validity.model_dump().items()))
    cache = cache if cache is not None else {}
    return cache.get(key) or cache.setdefault(key, V.ValidityIndex(runs, spec.validity))


def has_comparison(spec: FigureSpec, runs: SweepRuns, index: V.ValidityIndex) -> bool:
    """Whether the sweep has something this spec compares (`coverage.drawable`); specs without are not drawn."""
    return C.drawable(spec, runs, index.everything)


def _metric_patterns(spec: FigureSpec) -> list[tuple[str, list[str]]]:
    """(metric pattern, fallbacks that stand in for it) of each metric the spec draws (globs for placeholders)."""
    if isinstance(spec, (CurveSpec, ScatterSpec)):
        return [(spec.y, [])]
    if isinstance(spec, LayersSpec):
        return [(spec.y.replace("{layer}", "*"), [])]
    if isinstance(spec, GainsSpec):
        return [(spec.metric.replace("{set}", "*"),
                 [spec.fallback.metric.replace("{set}", "*")] if spec.fallback else [])]
    if isinstance(spec, TableSpec):
        return [(c.metric, [c.fallback.metric] if c.fallback else []) for c in spec.columns]
    return []


def mixed_examples(spec: FigureSpec, runs: SweepRuns) -> list[str]:
    """A line for each lm-eval task score the figure draws from runs scored on different numbers of its examples
    (`eval/<task>/examples`): their differences mix example sets, which the figure must not leave unsaid."""
    if isinstance(spec, ValiditySpec):
        return []
    shown = [r for r in runs.jobs if spec.matches(r)]
    lines = []
    for pattern, fallbacks in _metric_patterns(spec):
        for key in [k for p in (pattern, *fallbacks) for k in D.matching_metrics(p, shown)]:
            counts = D.mixed_examples(key, shown)
            if counts:
                lines.append(f"{key}: scored on different numbers of examples ({', '.join(map(str, counts))}) in "
                             f"the runs shown: its differences mix example sets; {D.MIXED_EXAMPLES_FIX}")
    return lines


def unlogged(spec: FigureSpec, runs: SweepRuns) -> list[str]:
    """Notes for the metrics and params a spec reads that no run of the sweep has (a misspelt name draws an empty
    panel or a 'missing' column, which alone reads like missing data): each with the closest names the runs have."""
    from rla_ablate.errors import did_you_mean

    jobs = runs.jobs
    params = sorted({k for r in jobs for k in r.params})
    notes = []
    for pattern, fallbacks in _metric_patterns(spec):
        if D.matching_metrics(pattern, jobs) or any(D.matching_metrics(f, jobs) for f in fallbacks):
            continue
        notes.append(D.never_logged(pattern, jobs))
    for axis in spec.x if isinstance(spec, ScatterSpec) else []:
        if axis.param not in params:
            notes.append(f"no run of this sweep has param {axis.param}" + did_you_mean(axis.param, params, n=3))
    notes += unmatched_labels(spec, runs)
    return notes


def unmatched_labels(spec: FigureSpec, runs: SweepRuns) -> list[str]:
    """Notes for `labels` keys that name no series (a misspelt key leaves its series under the default name, with
    nothing to say the label was not used). A key names a series when it is the '/'-joined values of the spec's
    series keys, or one value, that some run has (a tag or a config value, as labels are looked up) or that the
    spec's own `runs` filter allows: a shipped spec labels every value it filters for, which a sweep may lack."""
    from rla_ablate.errors import did_you_mean

    if not spec.labels:
        return []
    jobs = runs.jobs
    allowed = {k: {D.spelled(v) for v in (f if isinstance(f, list) else [f])} for k, f in spec.runs.items()}
    for r in jobs:
        for k in spec.series:
            allowed.setdefault(k, set()).add(D.value_of(r, k) or "?")
    series_values = {v for k in spec.series for v in allowed.get(k, ())}
    values = series_values | {v for r in jobs for v in (*r.tags.values(), *r.params.values()) if isinstance(v, str)}
    joined = {"/".join(D.value_of(r, k) or "?" for k in spec.series) for r in jobs}

    def names_a_series(key: str) -> bool:
        if key in joined or key in values:  # as a run has it (a value may hold '/' itself: a file path)
            return True
        parts = key.split("/")
        return len(parts) == len(spec.series) > 1 and all(p in allowed.get(k, ()) for p, k in zip(parts, spec.series))

    shown = sorted(joined | series_values)
    return [f"labels: '{key}' names no series of this sweep" + did_you_mean(key, shown, n=3)
            for key in spec.labels if not names_a_series(key)]


def render(spec: FigureSpec, runs: SweepRuns, out_dir: Path, run_url=lambda run_id: None,
           validity_cache: dict | None = None, drawn: bool | None = None,
           evaluated: tuple[list, list] | None = None) -> Rendered:
    """Render one spec; `validity_cache` shares the validity of every series between specs with equal thresholds.
    `drawn`: `has_comparison` when the caller has it already (None: decided here). `evaluated`: the spec's
    (verdicts, untested) when the caller has them already, with each verdict's q among the dashboard's claims
    (`adjust_for_many`), which the footer then prints (None: evaluated here, without q)."""
    out = Rendered(spec.name, spec.title, spec.caption, spec.kind)
    with plt.rc_context(STYLE):
        try:
            index = validity_index(spec, runs, validity_cache)
            out.drawn = has_comparison(spec, runs, index) if drawn is None else drawn
            out.verdicts, out.untested = evaluated if evaluated is not None else evaluate(spec, runs, index,
                                                                                         drawn=out.drawn)
            if not out.drawn:
                if not spec.claims:
                    out.untested = [C.for_figure(spec, runs)]
                for stale in (out_dir / f"{spec.name}.png", out_dir / f"{spec.name}.svg"):
                    stale.unlink(missing_ok=True)       # an earlier dashboard's figure of it
                return out
            out.notes += unlogged(spec, runs)
            out.mixed = mixed_examples(spec, runs)
            out.notes += out.mixed
            if isinstance(spec, TableSpec):
                table_rows(spec, runs, out, run_url, index)
                fig = render_table(spec, out)
            elif isinstance(spec, ValiditySpec):
                validity_rows(spec, runs, out, run_url, index)
                fig = render_rows_png(out)
            else:
                fig = {CurveSpec: render_curve, LayersSpec: render_layers, GainsSpec: render_gains,
                       ScatterSpec: render_scatter}[type(spec)](spec, runs, out, index)
        except Exception as exc:  # noqa: BLE001 - one broken figure must not take the whole dashboard down
            out.notes.append(f"could not render: {type(exc).__name__}: {exc}")
            fig, ax = plt.subplots(figsize=(6, 2))
            _empty(ax, f"could not render: {type(exc).__name__}: {exc}")
        fig.suptitle(spec.title, fontsize=11)
        fig.tight_layout()
        if not isinstance(spec, ValiditySpec):
            _footer(fig, out)
        out_dir.mkdir(parents=True, exist_ok=True)
        out.png, out.svg = out_dir / f"{spec.name}.png", out_dir / f"{spec.name}.svg"
        fig.savefig(out.png, dpi=150, bbox_inches="tight")
        fig.savefig(out.svg, bbox_inches="tight")
        plt.close(fig)
    return out
