"""From a sweep's runs to what a spec draws: series of seeds, final values, curves, per-layer profiles.

A series is one experiment replicated over seeds: the runs whose resolved configs differ in nothing but the
seed (one `series` id, see `rla_ablate.sweep.identity`), within one panel. A spec's `series` keys only name,
order and colour series; they never merge two of them. Runs of one series are paired with their
counterparts by seed, and n counts seeds: two runs of one series with the same seed are an error, reported
and left out, never averaged.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field
from functools import cached_property

from rla_ablate.dashboard.selection import BUDGET, OLDER, VERSION, config_params
from rla_ablate.sweep.identity import ARM, CONTROL, POINT_PREFIX, PRESET, SERIES
from rla_ablate.tracking.read import RunRecord, SweepRuns
from rla_ablate.tracking.runs import value_text

FAMILY_NAMES = {"rla": "RLA", "rdn": "RDN", "sgla": "sGLA", "gdn": "GDN", "transformer": "Transformer"}
ABLATION_NAMES = {"none": "", "tied_gamma": "tied γ", "no_fitting": "no fitting", "no_output_gates": "no output gates",
                  "no_clip": "w/o clip", "no_norm": "w/o norm", "no_clip_no_norm": "w/o clip & norm",
                  "logcosh": "log-cosh", "matched_state": "matched state",
                  "no_fitting_no_clip": "no fitting, w/o clip", "learned_beta_base": "learned β, no R",
                  "matched_wallclock": "matched wall-clock"}
# Keys that always describe a series (besides its grid/zip point keys).
IDENTITY_KEYS = ("family", "ablations", CONTROL, ARM, PRESET, VERSION)
OLDER_LABEL = "older sweep version"


def spelled(value) -> str:
    """A spec value (YAML scalar) spelled like a tag or param: true, null, 0.05."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def same_value(actual: str | None, wanted) -> bool:
    """`actual` (a tag or param string) equals a spec value, numerically when both are numbers (1 == 1.0)."""
    if actual is None:
        return False
    want = spelled(wanted)
    if actual == want:
        return True
    try:
        return float(actual) == float(want)
    except ValueError:
        return False


def value_of(run: RunRecord, key: str) -> str | None:
    """A run's value of a spec key: a tag (family, arm, point.model.clip, ...) or a resolved config key
    (model.clip, train.lr: the run's params, which are its flattened config; a grid point's tag when the
    run has no params, e.g. a job not started yet whose job.json is missing)."""
    if key in run.tags:
        return run.tags[key]
    if key.startswith(POINT_PREFIX):
        return run.params.get(key[len(POINT_PREFIX):])
    if key in run.params:
        return run.params[key]
    return run.tags.get(POINT_PREFIX + key)


def _num_key(v: str | None) -> tuple:
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, v or "")


@dataclass
class Series:
    """The runs of one series (one config up to the seed) within one panel."""

    key: tuple[str, ...]
    """(series id, version): what makes it one series."""
    tags: dict[str, str]
    """Its identity (family, ablations, control, arm, preset, version, point.*), spec keys and panel value."""
    label: str
    runs: list[RunRecord] = field(default_factory=list)
    spec_key: tuple[str, ...] = ()
    """Its values of the spec's series keys (several series may share them; labels then say what differs)."""

    @property
    def stale(self) -> bool:
        return self.tags.get(VERSION) == OLDER

    @property
    def order(self) -> int:
        return min((r.order for r in self.runs), default=0)

    @cached_property
    def config(self) -> dict[str, str]:
        """Its resolved config without the seed (the params of any of its runs; read once runs are grouped)."""
        return config_params(self.runs[0].params) if self.runs else {}

    def value(self, key: str) -> str | None:
        if key in self.tags:
            return self.tags[key]
        return value_of(self.runs[0], key) if self.runs else None

    def seed(self, run: RunRecord) -> str:
        return run.tags.get("seed", run.run_id)

    @property
    def duplicates(self) -> dict[str, list[RunRecord]]:
        """Seeds with more than one run: an error (one config, one seed is one job), shown and left out."""
        by: dict[str, list[RunRecord]] = {}
        for r in self.runs:
            by.setdefault(self.seed(r), []).append(r)
        return {s: rs for s, rs in by.items() if len(rs) > 1}

    @property
    def unique(self) -> list[RunRecord]:
        """Its runs whose seed no other run of the series has."""
        dup = self.duplicates
        return [r for r in self.runs if self.seed(r) not in dup]

    @property
    def finished(self) -> list[RunRecord]:
        return [r for r in self.unique if r.finished]

    def by_seed(self) -> dict[str, RunRecord]:
        """seed -> its finished run (seeds with two runs left out)."""
        return {self.seed(r): r for r in self.finished}

    @property
    def seeds(self) -> list[str]:
        return sorted({self.seed(r) for r in self.runs}, key=_num_key)

    def state_note(self) -> str:
        """'' when every seed finished, else e.g. '1 of 3 seeds finished; 1 running, 1 diverged' (the job's own
        status where it has one: MLflow ends a diverged run as failed)."""
        if not self.runs:
            return "no run"
        notes = []
        dup = self.duplicates
        if dup:
            notes.append("; ".join(f"seed {s} has {len(rs)} runs ({', '.join(r.name for r in rs)}): left out"
                                   for s, rs in sorted(dup.items())))
        counts: dict[str, int] = {}
        for r in self.unique:
            counts[r.job_status] = counts.get(r.job_status, 0) + 1
        done = counts.pop("finished", 0)
        if counts:
            rest = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            notes.insert(0, f"{done} of {len(self.seeds)} seeds finished; {rest}")
        return "; ".join(notes)


def short_key(key: str) -> str:
    """model.clip -> clip, point.train.lr -> lr: how a config key is named in a label."""
    return key.rsplit(".", 1)[-1]


def _part(spec, key: str, value: str | None) -> str:
    v = "?" if value is None else value
    if v in spec.labels:
        return spec.labels[v]
    if key == "family":
        return FAMILY_NAMES.get(v, v)
    if key == "ablations":
        names = [ABLATION_NAMES.get(a, a) for a in v.split("+")]
        return ", ".join(n for n in names if n)
    if key in (ARM, PRESET, CONTROL, SERIES):
        return "" if key == CONTROL and v == "none" else v
    return f"{short_key(key)}={value_text(v)}"


def distinguishing(members: list[Series]) -> list[str]:
    """The keys whose values tell these series apart: grid/zip points, arm, then other config keys."""
    def varies(get) -> bool:
        return len({get(s) for s in members}) > 1

    keys = sorted({k for s in members for k in s.tags if k.startswith(POINT_PREFIX)})
    out = [k for k in keys if varies(lambda s, k=k: s.tags.get(k))]
    swept = {k[len(POINT_PREFIX):] for k in out}
    if varies(lambda s: s.tags.get(ARM)):
        out.append(ARM)
    config_keys = sorted({k for s in members for k in s.config} - swept)
    rest = [k for k in config_keys if varies(lambda s, k=k: s.config.get(k))]
    # The arm usually explains its config keys; list them only when the arm does not tell the series apart.
    if ARM not in out or not rest:
        out += rest[:3]
    return out


def assign_labels(spec, panels: dict[str, list[Series]]) -> None:
    """Label each series by the spec's keys (and `labels`), plus what tells it apart from series sharing them."""
    for series in panels.values():
        groups: dict[tuple, list[Series]] = {}
        for s in series:
            groups.setdefault(s.spec_key, []).append(s)
        for members in groups.values():
            extra = distinguishing(members) if len(members) > 1 else []
            for s in members:
                # an arm the sweep named (one that changes its preset, as a rule) is named even when alone: its
                # family's name would pass for the preset's model
                named = (ARM not in extra and ARM not in spec.series and ARM != getattr(spec, "panels", None)
                         and s.tags.get(ARM) not in (None, "", s.tags.get(PRESET)))
                joined = "/".join(s.spec_key)
                if joined in spec.labels:
                    parts = [spec.labels[joined]]
                else:
                    parts = [_part(spec, k, s.value(k)) for k in spec.series]
                parts += [_part(spec, k, s.value(k)) for k in extra + ([ARM] if named else [])]
                text = ", ".join(p for p in parts if p)
                if not text:
                    text = "no ablation" if s.tags.get("ablations") == "none" else "all runs"
                budget = s.runs[0].tags.get(BUDGET) if s.runs else None
                if budget is not None:  # matched wall-clock: the token budget the speed ratio gave it
                    text += f" ({budget}x tokens)"
                if s.stale:
                    text += f" ({OLDER_LABEL})"
                s.label = text


def _identity(run: RunRecord, spec) -> dict[str, str]:
    tags = {k: run.tags[k] for k in run.tags if k in IDENTITY_KEYS or k.startswith(POINT_PREFIX) or k == SERIES}
    for k in spec.series if spec is not None else ():
        v = value_of(run, k)
        if v is not None:
            tags[k] = v
    return tags


def group(spec, runs: SweepRuns) -> dict[str, list[Series]]:
    """panel value ('' without panels) -> series in a stable order; expected series without runs are kept empty."""
    panels: dict[str, dict[tuple, Series]] = {}
    for run in runs.jobs:
        if not spec.matches(run):
            continue
        panel = (value_of(run, spec.panels) or "?") if spec.panels else ""
        key = (run.tags.get(SERIES, run.run_id), run.tags.get(VERSION, ""))
        s = panels.setdefault(panel, {}).get(key)
        if s is None:
            tags = _identity(run, spec)
            if spec.panels:
                tags[spec.panels] = panel
            spec_key = tuple(value_of(run, t) or "?" for t in spec.series)
            s = panels[panel][key] = Series(key, tags, "", [], spec_key)
        s.runs.append(run)
    out = {p: sorted(panels[p].values(), key=lambda s: _series_order(spec, s))
           for p in sorted(panels, key=lambda p: _panel_order(spec, p))}
    assign_labels(spec, out)
    return out


def all_series(runs: SweepRuns) -> list[Series]:
    """Every series of the selection, without a spec's filter or panels (what validity looks references up in)."""
    from types import SimpleNamespace

    keys = ["family", "ablations"]
    by: dict[tuple, Series] = {}
    for run in runs.jobs:
        key = (run.tags.get(SERIES, run.run_id), run.tags.get(VERSION, ""))
        if key not in by:
            by[key] = Series(key, _identity(run, None), "", [], tuple(value_of(run, k) or "?" for k in keys))
        by[key].runs.append(run)
    out = sorted(by.values(), key=lambda s: s.order)
    assign_labels(SimpleNamespace(series=keys, labels={}), {"": out})
    return out


def _panel_order(spec, p: str) -> tuple:
    listed = [spelled(v) for v in spec.allowed(spec.panels) or []] if spec.panels else []
    return (listed.index(p) if p in listed else len(listed), _num_key(p))


def _series_order(spec, s: Series) -> tuple:
    # The order of the spec's filter lists (the parent model 'none' first otherwise), then older versions last,
    # then numeric grid values, then the sweep file's order.
    out = []
    for tag, v in zip(spec.series, s.spec_key):
        listed = [spelled(x) for x in spec.allowed(tag) or []]
        out.append((listed.index(v) if v in listed else len(listed), 0 if v == "none" else 1, _num_key(v)))
    points = tuple(_num_key(s.tags[k]) for k in sorted(s.tags) if k.startswith(POINT_PREFIX))
    return (tuple(out), s.stale, points, s.order)


def _preference(key: str) -> tuple:
    # The LM validation set first: "eval loss" in a paper means held-out text, not a recall probe. Then numbers in
    # their order, not the text's: mqar_kv8, mqar_kv16, mqar_kv32, mqar_kv48_t256.
    parts = key.split("/")
    natural = tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", key) if t)
    return (0 if any(p in ("val", "valid", "validation") for p in parts) else 1, natural, key)


def matching_metrics(pattern: str, runs: list[RunRecord]) -> list[str]:
    """Metric keys a (possibly glob) name refers to, validation sets first, then alphabetical with numbers in their
    order."""
    keys = {k for r in runs for k in r.metrics}
    if pattern in keys:
        return [pattern]
    return sorted((k for k in keys if fnmatch.fnmatchcase(k, pattern)), key=_preference)


def never_logged(pattern: str, runs: list[RunRecord]) -> str:
    """What to say of a metric (or glob) that no run logged: that, with the logged names closest to it (a verdict's
    reason, a figure's note)."""
    from rla_ablate.errors import did_you_mean

    logged = sorted({k for r in runs for k in r.metrics})
    return f"no run of this sweep logged {pattern}" + did_you_mean(pattern.replace("*", ""), logged, n=3)


def resolve_metric(pattern: str, runs: list[RunRecord]) -> str | None:
    """The one metric a name refers to: itself, or the preferred matching key (see `matching_metrics`)."""
    hits = matching_metrics(pattern, runs)
    return hits[0] if hits else None


def is_number(v: str) -> bool:
    """Whether a tag, param or spec value reads as a finite number."""
    try:
        return math.isfinite(float(v))
    except ValueError:
        return False


def eval_set_names(runs: list[RunRecord]) -> set[str]:
    """The names of the eval sets the runs are configured with (their `eval.<i>.name` params): what `eval/<set>/...`
    metrics they log during training (lm-eval tasks scored after it are not among them)."""
    return {v for r in runs for k, v in r.params.items() if k.startswith("eval.") and k.endswith(".name")
            and k.count(".") == 2}


def glob_part(pattern: str, key: str) -> str:
    """What the single '*' of `pattern` matched in `key` ('val' for eval/*/loss and eval/val/loss)."""
    if pattern.count("*") != 1:
        return key
    head, tail = pattern.split("*")
    return key[len(head):len(key) - len(tail)] if key.startswith(head) and key.endswith(tail) else key


def mixed_examples(key: str | None, runs: list[RunRecord]) -> list[int]:
    """The different numbers of examples (`eval/<task>/examples`) the finished runs' final `key` scores of an lm-eval
    task were scored on, when there are several (else []): such scores are of different example sets (`--limit`
    takes a task's first examples), and their differences mix the sets in."""
    from rla_ablate.evals.core import examples_key

    count = examples_key(key) if key else None
    if count is None:
        return []
    seen = sorted({int(r.metrics[count]) for r in runs if r.finished and key in r.metrics and count in r.metrics})
    return seen if len(seen) > 1 else []


def fraction_metric(key: str | None) -> bool:
    """Whether a metric is a fraction in [0, 1] (an accuracy, its area, an exact match): an interval drawn for it
    stops at the ends, where a t-interval over few seeds would reach past them."""
    return bool(key) and key.rsplit("/", 1)[-1].startswith(("acc", "exact_match"))


MIXED_EXAMPLES_FIX = "score every job on the same examples: `rla-sweep eval SWEEP --tasks ... [--limit N] --force`"


def final_by_seed(series: Series, key: str | None) -> dict[str, float]:
    """seed -> final value of `key` in the finished runs that logged it (one run per seed)."""
    if key is None:
        return {}
    return {seed: r.metrics[key] for seed, r in series.by_seed().items() if key in r.metrics}


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


def config_distance(a: Series, b: Series) -> int:
    """How many resolved config keys differ between two series."""
    ca, cb = a.config, b.config
    return sum(ca.get(k) != cb.get(k) for k in set(ca) | set(cb))


def changes_nothing(series: Series, overrides: dict, keys=()) -> bool:
    """Whether `overrides` leave this series as it is: it would be its own reference (a claim's reference
    {ablations: none} for a treatment that selects the plain model)."""
    return _fits(series, _wanted(series, overrides, keys))


def _fits(s: Series, want: dict) -> bool:
    return all((s.value(k) is None and v is None) or same_value(s.value(k), v) for k, v in want.items())


def reference_of(series: Series, overrides: dict, candidates: list[Series], keys=()) -> Series | None:
    """The series this one is compared with: the one whose values equal this one's with `overrides` applied.

    Compared are the `keys` given (a spec's series and panel keys), the override keys, every grid/zip point key
    and the sweep version. Among several matches (e.g. two arms of the family) the nearest wins: the same
    arm first (a matched-state control's arm is the residual arm it is derived from), then the fewest differing
    config keys. None when absent, or when the overrides change nothing (the series is its own reference)."""
    want = _wanted(series, overrides, keys)
    if _fits(series, want):
        return None
    hits = [c for c in candidates if c is not series and _fits(c, want)]
    if not hits:
        return None
    return min(hits, key=lambda c: (c.tags.get(ARM) != series.tags.get(ARM), config_distance(series, c), c.order))


def _wanted(series: Series, overrides: dict, keys=()) -> dict[str, object]:
    """The values a reference of `series` has: its own at `keys`, its grid/zip point and version, `overrides`."""
    want: dict[str, object] = {}
    for k in (*keys, *(k for k in series.tags if k.startswith(POINT_PREFIX)), VERSION):
        want[k] = series.value(k)
    for k, v in overrides.items():
        want[k] = v
        if POINT_PREFIX + k in want:
            want[POINT_PREFIX + k] = v
        if k.startswith(POINT_PREFIX) and k[len(POINT_PREFIX):] in want:
            want[k[len(POINT_PREFIX):]] = v
    return want
