"""A search sweep's own part of its dashboard: the Optuna study's trials.

A grid sweep's figures compare ablations and controls; a search sweep's runs are trials of one study, so its page
opens with a note (how many trials ended how, the best one) and a section that draws the search: the metric by
trial number with the best value so far, and the metric against each searched parameter (log axes where the
parameter was drawn on a log scale, a category's choices side by side), then lists the trials best first.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rla_ablate.dashboard import validity as V
from rla_ablate.dashboard.render import COLORS, STYLE, Cell, Rendered, plt
from rla_ablate.sweep.state import SweepDir

NAME = "optuna_study"
"""The section's id and its figure's file name (no spec of dashboards/ has it)."""
KIND = "search"
"""The section's kind: the page puts it first and draws it with its table (rla_ablate.dashboard.html)."""
LISTED = 20
"""Trials listed in the section's table (best first); the figure draws every trial."""


@dataclass
class Search:
    note: str
    """The page's first note: the study's trials by state, the best one, where the paper's comparisons belong."""
    section: Rendered | None
    """The drawn search; None while no trial has a value."""


def search_part(sdir: SweepDir, out_dir: Path, run_url=lambda run_id: None,
                run_ids: dict[str, str] | None = None, off=lambda: set()) -> Search | None:
    """The note and the drawn section of a search sweep; None for a sweep without a study. `run_ids` maps job ids
    to MLflow run ids (the table's links); `off()`: the job ids whose mechanism was off (the validity panel), drawn
    hollow and counted in the note, the caption and the figure (asked only of a sweep with a study)."""
    from optuna.trial import TrialState

    from rla_ablate.sweep.search import INTERRUPTED, QUESTION, load_study, params_text

    study = load_study(sdir)
    if study is None:
        return None
    trials = study.get_trials(deepcopy=False)
    names = {r["job_id"]: r.get("name") for r in sdir.job_list()}
    # a trial a launch left running is told failed and its parameters asked again: interrupted, not an error
    interrupted = sum(t.state == TrialState.FAIL and bool(t.user_attrs.get(INTERRUPTED)) for t in trials)
    states = {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState}
    states["fail"] -= interrupted
    states["interrupted (run again)"] = interrupted
    ended = ", ".join(f"{n} {state}" for state, n in states.items() if n)
    note = f"a search sweep: its runs are the trials of one Optuna study ({len(trials)} trials: {ended or 'none'})"
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    best = study.best_trial if complete else None
    if best is not None:
        note += (f"; best: trial {best.number} (job {names.get(best.user_attrs.get('job_id'), '?')}), "
                 f"{best.value:.6g} with {params_text(best.params)}")
    off_ids = off() if complete else set()
    off_trials = {t.number for t in complete if t.user_attrs.get("job_id") in off_ids}
    warning = (f"MECHANISM OFF in {len(off_trials)} of {len(complete)} completed trials (drawn hollow; the validity "
               "panel says which check): their values rank training with the mechanism idle, not the searched "
               "parameters' effect through it") if off_trials else ""
    if warning:
        note += f"; {warning}"
    note += (". The figures compare ablations and controls, which a search file cannot hold: run those as a grid "
             "sweep (docs/SWEEPS.md)")
    question = study.user_attrs.get(QUESTION) or {}
    metric = question.get("metric", "the objective")
    minimize = study.direction.name == "MINIMIZE"
    for stale in (out_dir / f"{NAME}.png", out_dir / f"{NAME}.svg"):
        stale.unlink(missing_ok=True)
    if best is None:
        return Search(note, None)
    out = Rendered(NAME, f"The search: {metric} by trial and parameter",
                   f"{len(complete)} completed trials of {len(trials)} ({ended}); "
                   f"{'lower' if minimize else 'higher'} is better ({study.direction.name.lower()}). Left: each "
                   "completed trial's value by trial number, the best so far as a line, pruned trials at the last "
                   "value they reported. Then the value against each searched parameter; the best trial is the "
                   "star. Trials that failed or were interrupted have no value and are not drawn.", KIND)
    params = sorted({k for t in trials for k in t.params})
    drawn = [t for t in complete if math.isfinite(t.value)]
    if len(drawn) < len(complete):
        out.caption += (f" {len(complete) - len(drawn)} completed trials with an infinite value are listed, not "
                        "drawn.")
    if warning:
        out.caption += f" {warning}."
        out.flagged.append((V.OFF, "trials " + ", ".join(map(str, sorted(off_trials))),
                            "their values rank training with the mechanism idle"))
    with plt.rc_context(cast(Any, STYLE)):
        fig = _draw(trials, drawn or [best], best, params, metric, minimize, off_trials)
        if warning:
            fig.text(0.01, -0.01, textwrap.fill(f"⚠ {warning}", int(fig.get_figwidth() * 15)), ha="left", va="top",
                     fontsize=7, color="#8a4b00", transform=fig.transFigure)
        out_dir.mkdir(parents=True, exist_ok=True)
        out.png, out.svg = out_dir / f"{NAME}.png", out_dir / f"{NAME}.svg"
        fig.savefig(out.png, dpi=150, bbox_inches="tight")
        fig.savefig(out.svg, bbox_inches="tight")
        plt.close(fig)
    run_ids = run_ids or {}
    out.header = ["trial", "job", metric] + params
    ranked = sorted(complete, key=lambda t: t.value if minimize else -t.value)
    for t in ranked[:LISTED]:
        job = t.user_attrs.get("job_id")
        run = run_ids.get(job)
        out.rows.append([Cell(str(t.number), best=t.number == best.number),
                         Cell(names.get(job) or f"trial-{t.number:03d}", link=run_url(run) if run else None),
                         Cell(f"{t.value:.6g}")] + [Cell(_value_text(t.params.get(k))) for k in params])
        if run:
            out.runs.append((f"trial {t.number}", names.get(job) or "", run))
    if len(ranked) > LISTED:
        out.notes.append(f"the table lists the best {LISTED} of {len(ranked)} completed trials; "
                         "`rla-sweep results` lists every job")
    out.drawn = True
    return Search(note, out)


def _value_text(value: Any) -> str:
    from rla_ablate.sweep.search import value_text

    return "–" if value is None else value_text(value)


def _draw(trials, complete, best, params: list[str], metric: str, minimize: bool,
          off: frozenset[int] | set[int] = frozenset()):
    from matplotlib import ticker
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    cols = min(1 + len(params), 4)
    rows = math.ceil((1 + len(params)) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows + 0.5), squeeze=False)
    flat = [ax for row in axes for ax in row]
    ax = flat[0]
    xs = [t.number for t in complete]
    ys = [t.value for t in complete]
    on = [t for t in complete if t.number not in off]
    if on:
        ax.scatter([t.number for t in on], [t.value for t in on], s=18, color=COLORS[0], label="completed", zorder=3)
    if len(on) < len(complete):
        hollow = [t for t in complete if t.number in off]
        ax.scatter([t.number for t in hollow], [t.value for t in hollow], s=18, facecolors="none",
                   edgecolors=COLORS[0], label="completed, mechanism off", zorder=3)
    pruned = [(t.number, t.intermediate_values[max(t.intermediate_values)]) for t in trials
              if t.state == TrialState.PRUNED and t.intermediate_values]
    if pruned:
        ax.scatter(*zip(*pruned), s=22, marker="x", color="0.55", label="pruned (last report)", zorder=2)
    so_far, line = None, []
    for x, y in sorted(zip(xs, ys)):
        so_far = y if so_far is None else (min(so_far, y) if minimize else max(so_far, y))
        line.append((x, so_far))
    last = max(t.number for t in trials)
    if line[-1][0] < last:  # the best so far holds to the last trial drawn
        line.append((last, line[-1][1]))
    ax.step(*zip(*line), where="post", color=COLORS[1], label="best so far", zorder=4)
    # the best trial's star is hollow, as every trial's marker, where its mechanism was off: a winner drawn solid
    # would read as a valid one
    star = dict(marker="*", s=140, zorder=5, edgecolors=COLORS[3],
                facecolors="none" if best.number in off else COLORS[3])
    ax.scatter([best.number], [best.value], label="best, mechanism off" if best.number in off else "best", **star)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.margins(x=0.06, y=0.12)  # the best trial's star and the edge trials' markers whole, not cut by the frame
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title("by trial")
    ax.legend(loc="best")
    for ax, name in zip(flat[1:], params):
        have = [t for t in complete if name in t.params]
        dist = next((t.distributions[name] for t in have if name in t.distributions), None)
        values = [t.params[name] for t in have]
        if isinstance(dist, CategoricalDistribution) or any(isinstance(v, (str, bool)) or v is None for v in values):
            choices = list(dist.choices) if isinstance(dist, CategoricalDistribution) else sorted({str(v) for v in values})
            where = {str(c): i for i, c in enumerate(choices)}
            xs_p = [where.get(str(v), 0) for v in values]
            ax.set_xticks(range(len(choices)), [str(c) for c in choices])
            best_x = where.get(str(best.params.get(name)))
        else:
            xs_p = values
            if getattr(dist, "log", False):
                ax.set_xscale("log")
            # a few short labels: within a decade a log axis falls back to linear ticks that ran into each other
            wide = bool(getattr(dist, "log", False) and values) and max(values) >= 10 * min(values) > 0
            ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)) if wide else ticker.MaxNLocator(3))
            ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
            best_x = best.params.get(name)
        ax.scatter(xs_p, [t.value for t in have], s=18, zorder=3, edgecolors=COLORS[0],
                   facecolors=["none" if t.number in off else COLORS[0] for t in have])
        if best_x is not None:
            ax.scatter([best_x], [best.value], **star)
        ax.margins(x=0.08, y=0.12)
        ax.set_xlabel(name)
        ax.set_title(f"against {name}")
    for ax in flat[1 + len(params):]:
        ax.axis("off")
    fig.suptitle(f"The search: {metric} ({'minimized' if minimize else 'maximized'})", fontsize=11)
    fig.tight_layout()
    return fig
