"""From a sweep's runs to what a spec draws: series of seeds, final values, curves, per-layer profiles."""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field

from rla_ablate.dashboard.spec import _Spec
from rla_ablate.tracking.read import RunRecord, SweepRuns

FAMILY_NAMES = {"rla": "RLA", "rdn": "RDN", "sgla": "sGLA", "gdn": "GDN", "transformer": "Transformer"}
ABLATION_NAMES = {"none": "", "tied_gamma": "tied γ", "no_fitting": "no fitting", "no_output_gates": "no output gates",
                  "no_clip": "w/o clip", "no_norm": "w/o norm", "no_clip_no_norm": "w/o clip & norm",
                  "logcosh": "log-cosh", "matched_state": "matched state"}


@dataclass
class Series:
    """The runs (one per seed) of one series value within one panel."""

    key: tuple[str, ...]
    tags: dict[str, str]
    label: str
    runs: list[RunRecord] = field(default_factory=list)

    @property
    def finished(self) -> list[RunRecord]:
        return [r for r in self.runs if r.finished]

    def seed(self, run: RunRecord) -> str:
        return run.tags.get("seed", run.run_id)

    def state_note(self) -> str:
        """'' when every run finished, else e.g. '1 of 3 seeds finished; 1 running, 1 failed'."""
        if not self.runs:
            return "no run"
        counts: dict[str, int] = {}
        for r in self.runs:
            counts[r.status] = counts.get(r.status, 0) + 1
        done = counts.pop("finished", 0)
        if not counts:
            return ""
        rest = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return f"{done} of {len(self.runs)} seeds finished; {rest}"


def series_label(spec: _Spec, tags: dict[str, str]) -> str:
    key = "/".join(tags.get(t, "") for t in spec.series)
    if key in spec.labels:
        return spec.labels[key]
    parts = []
    for t in spec.series:
        v = tags.get(t, "?")
        if t == "family":
            parts.append(FAMILY_NAMES.get(v, v))
        elif t == "ablations":
            names = [ABLATION_NAMES.get(a, a) for a in v.split("+")]
            text = ", ".join(n for n in names if n)
            parts.append(text or ("" if "family" in spec.series else "paper default"))
        else:
            parts.append(f"{t}={v}")
    return ", ".join(p for p in parts if p) or "all runs"


def group(spec: _Spec, runs: SweepRuns) -> dict[str, list[Series]]:
    """panel value ('' without panels) -> series in a stable order; expected series without runs are kept empty."""
    panels: dict[str, dict[tuple, Series]] = {}
    for run in runs.jobs:
        if not spec.matches(run.tags):
            continue
        panel = run.tags.get(spec.panels, "?") if spec.panels else ""
        key = tuple(run.tags.get(t, "?") for t in spec.series)
        tags = {t: run.tags.get(t, "?") for t in spec.series}
        if spec.panels:
            tags[spec.panels] = panel
        s = panels.setdefault(panel, {}).setdefault(key, Series(key, tags, series_label(spec, tags)))
        s.runs.append(run)
    panel_values = spec.allowed(spec.panels) if spec.panels else None
    order = {v: i for i, v in enumerate(panel_values or [])}
    return {p: sorted(panels[p].values(), key=lambda s: _series_order(spec, s))
            for p in sorted(panels, key=lambda p: (order.get(p, len(order)), p))}


def _series_order(spec: _Spec, s: Series) -> tuple:
    # The order of the spec's filter lists (the parent model 'none' first otherwise), then alphabetical.
    out = []
    for tag, v in zip(spec.series, s.key):
        listed = spec.allowed(tag) or []
        out.append((listed.index(v) if v in listed else len(listed), 0 if v == "none" else 1, v))
    return tuple(out)


def _preference(key: str) -> tuple:
    # The LM validation set first: "eval loss" in a paper means held-out text, not a recall probe.
    parts = key.split("/")
    return (0 if any(p in ("val", "valid", "validation") for p in parts) else 1, key)


def matching_metrics(pattern: str, runs: list[RunRecord]) -> list[str]:
    """Metric keys a (possibly glob) name refers to, validation sets first, then alphabetical."""
    keys = {k for r in runs for k in r.metrics}
    if pattern in keys:
        return [pattern]
    return sorted((k for k in keys if fnmatch.fnmatchcase(k, pattern)), key=_preference)


def resolve_metric(pattern: str, runs: list[RunRecord]) -> str | None:
    """The one metric a name refers to: itself, or the preferred matching key (see `matching_metrics`)."""
    hits = matching_metrics(pattern, runs)
    return hits[0] if hits else None


def glob_part(pattern: str, key: str) -> str:
    """What the single '*' of `pattern` matched in `key` ('val' for eval/*/loss and eval/val/loss)."""
    if pattern.count("*") != 1:
        return key
    head, tail = pattern.split("*")
    return key[len(head):len(key) - len(tail)] if key.startswith(head) and key.endswith(tail) else key


def final_by_seed(series: Series, key: str | None) -> dict[str, float]:
    """seed -> final value of `key` in the finished runs that logged it."""
    if key is None:
        return {}
    return {series.seed(r): r.metrics[key] for r in series.finished if key in r.metrics}


def _keys_matching(pattern: str, placeholder: str, group: str, runs: list[RunRecord]) -> dict[str, str]:
    """{captured value: metric key} for metric keys matching `pattern` with `placeholder` as the regex `group`."""
    head, tail = pattern.split(placeholder, 1)
    rx = re.compile(re.escape(head) + group + re.escape(tail) + "$")
    found = {}
    for r in runs:
        for k in r.metrics:
            m = rx.match(k)
            if m:
                found[m.group(1)] = k
    return found


def layer_keys(pattern: str, runs: list[RunRecord]) -> list[tuple[int, str]]:
    """(layer index, metric key) of a pattern like layer_{layer}/attn_out_norm, sorted by layer."""
    return sorted((int(layer), k) for layer, k in _keys_matching(pattern, "{layer}", r"(\d+)", runs).items())


def eval_sets(pattern: str, runs: list[RunRecord]) -> list[tuple[str, str]]:
    """(set name, metric key) of a pattern like eval/{set}/loss."""
    return sorted(_keys_matching(pattern, "{set}", r"([^/]+)", runs).items())


def ema(values: list[float], weight: float) -> list[float]:
    if weight <= 0:
        return list(values)
    out, acc = [], None
    for v in values:
        acc = v if acc is None or not math.isfinite(acc) else weight * acc + (1 - weight) * v
        out.append(acc)
    return out


def reference_of(series: Series, overrides: dict[str, str], all_series: list[Series]) -> Series | None:
    """The series whose tags equal this one's with `overrides` applied (None if absent or itself)."""
    want = {**series.tags, **{k: v for k, v in overrides.items() if k in series.tags}}
    if want == series.tags:
        return None
    for other in all_series:
        if other.tags == want:
            return other
    return None
