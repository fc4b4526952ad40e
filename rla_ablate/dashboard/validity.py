"""Was the mechanism an ablation tests engaged? A comparison of variants means something only if it was.

At small scale an ablation can change nothing: if no residual element ever leaves [-c, c], removing the clip
target computes the same model; if the mixer output is far below the per-head output RMSNorm's sqrt(eps),
the norm's epsilon swamps whatever the output gates do. The diagnostics logged at eval points say which:

    diag/target_engaged           fraction of residual elements the clip/tanh target changes (mean over layers)
    diag/mixer_rms_over_sqrt_eps  mixer output RMS before the output RMSNorm over sqrt(eps) (min over layers)

Checks (thresholds from the spec's `validity:`; defaults below), on the final value of each run:

    target   clip-type ablations (no_clip, no_clip_no_norm, logcosh, no_fitting_no_clip) change what the clip target does, so the
             reference (the unablated model, same seed) must have diag/target_engaged >= 0.001
    mixer    every comparison of linear-attention mixers (no_output_gates, and any other ablation or control)
             needs diag/mixer_rms_over_sqrt_eps >= 1.0 on the job and on its reference

Per run the state is `engaged` (every check passed), `off` (a check measured below its threshold),
`not measured` (a diagnostic is absent: runs older than the diagnostics; never reported as engaged), or
`identical`: its final results equal its reference's to float precision (a few float32 ulps) on that seed,
whatever the diagnostics say. A series takes the worst state of its seeds (identical only if every seed is).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

from rla_ablate.dashboard import data as D
from rla_ablate.tracking.read import RunRecord

TARGET_METRIC = "diag/target_engaged"
MIXER_METRIC = "diag/mixer_rms_over_sqrt_eps"
CLIP_TYPE = ("no_clip", "no_clip_no_norm", "logcosh", "no_fitting_no_clip")
# A few float32 ulps: runs that compute the same model agree to this, a real effect at any scale does not.
IDENTICAL_RTOL = 4 * 2.0 ** -23
RESULT_METRICS = ("eval/*/loss", "eval/*/ppl", "eval/*/acc", "train/loss")

ENGAGED, OFF, NOT_MEASURED, IDENTICAL, NO_CHECK = "engaged", "off", "not measured", "identical", "n/a"
# Worst first: what a series or a comparison reports when its parts disagree.
SEVERITY = (IDENTICAL, OFF, NOT_MEASURED, ENGAGED, NO_CHECK)


@dataclass(frozen=True)
class Check:
    name: str
    """target | mixer."""
    metric: str
    threshold: float
    on: tuple[str, ...]
    """Which runs it reads: ('reference',) or ('job', 'reference')."""
    mechanism: str
    """What it tells, in words."""

    def condition(self) -> str:
        """e.g. 'target_engaged >= 0.001'."""
        return f"{self.metric.removeprefix('diag/')} >= {self.threshold:g}"

    def describe(self) -> str:
        """e.g. 'target_engaged >= 0.001 (reference)'."""
        return f"{self.condition()} ({', '.join(self.on)})"


def checks_for(ablations: str, family: str, thresholds) -> list[Check]:
    """The checks a job of this family with these ablations (its `ablations` tag) needs."""
    from rla_ablate.models.config import LINEAR_FAMILIES

    if family not in LINEAR_FAMILIES:
        return []
    names = [a for a in (ablations or "none").split("+") if a and a != "none"]
    out = []
    if any(a in CLIP_TYPE for a in names):
        out.append(Check("target", TARGET_METRIC, thresholds.target_engaged_min, ("reference",),
                         "the reference's clip target changed some residuals"))
    out.append(Check("mixer", MIXER_METRIC, thresholds.mixer_rms_over_sqrt_eps_min,
                     ("job", "reference") if names else ("job",),
                     "the mixer output is above the output norm's sqrt(eps)"))
    return out


def worst(states) -> str:
    states = list(states)
    return min(states, key=SEVERITY.index) if states else NO_CHECK


@dataclass
class Measured:
    check: Check
    values: dict[str, float | None]
    """'job' / 'reference' -> the final value (None: not logged)."""

    @property
    def state(self) -> str:
        vals = [self.values.get(w) for w in self.check.on]
        known = [v for v in vals if v is not None and math.isfinite(v)]
        # one side measured below the threshold is off, whether or not the other side was measured (a derived
        # control has no run of its reference's)
        if any(v < self.check.threshold for v in known):
            return OFF
        return NOT_MEASURED if len(known) < len(vals) else ENGAGED

    def text(self) -> str:
        """e.g. 'target_engaged: reference 0 (< 0.001)'; '—' for a value not logged."""
        shown = []
        for w in self.check.on:
            v = self.values.get(w)
            mark = "" if v is None or v >= self.check.threshold else f" (< {self.check.threshold:g})"
            shown.append(f"{w} {'—' if v is None else f'{v:.4g}'}{mark}")
        return f"{self.check.metric.removeprefix('diag/')}: {', '.join(shown)}"


@dataclass
class SeedValidity:
    """One job (a series at one seed) against its reference at the same seed."""

    seed: str
    run: RunRecord | None
    reference: RunRecord | None
    measured: list[Measured] = field(default_factory=list)
    identical: bool = False

    @property
    def state(self) -> str:
        if self.identical:
            return IDENTICAL
        return worst(m.state for m in self.measured)


@dataclass
class Validity:
    """A series against its reference (the same model without ablation), seed by seed."""

    series: D.Series
    reference: D.Series | None
    checks: list[Check]
    seeds: list[SeedValidity] = field(default_factory=list)

    @property
    def state(self) -> str:
        if not self.checks:
            return NO_CHECK
        if not self.seeds:
            return NOT_MEASURED
        if self.reference is not None and all(s.identical for s in self.seeds):
            return IDENTICAL
        # Some seeds identical, others not: the diagnostics decide (the detail lists the identical seeds).
        return worst(worst(m.state for m in s.measured) for s in self.seeds)

    def detail(self) -> str:
        """One line: the state per group of seeds, with the failing values and thresholds."""
        st = self.state
        if st == NO_CHECK:
            return "no mechanism check for this model"
        if not self.seeds:
            return "no finished run"
        if st == IDENTICAL:
            return (f"final results identical to {self.reference.label if self.reference else 'the reference'} "
                    f"on every seed ({', '.join(s.seed for s in self.seeds)})")
        groups: dict[str, list[SeedValidity]] = {}
        for sv in self.seeds:
            groups.setdefault(sv.state, []).append(sv)
        parts = []
        for state in sorted(groups, key=SEVERITY.index):
            members = groups[state]
            seeds = ", ".join(sv.seed for sv in members)
            if state == OFF:
                why = _ranges(members, lambda m, w, v: v is not None and v < m.check.threshold, " < ")
            elif state == NOT_MEASURED:
                missing = sorted({f"{m.check.metric} of the {w}" for sv in members for m in sv.measured
                                  for w in m.check.on if m.values.get(w) is None})
                why = "no " + ", ".join(missing)
            elif state == IDENTICAL:
                why = "final results identical to the reference"
            else:
                why = _ranges(members, lambda m, w, v: v is not None, " >= ")
            parts.append(f"{state} on seed{'s' if len(members) > 1 else ''} {seeds}: {why}")
        return "; ".join(parts)


def _ranges(members: list[SeedValidity], keep, relation: str) -> str:
    """'diag/target_engaged of the reference 0-0.0004 < 0.001' over the seeds' values that `keep` selects."""
    found: dict[tuple, list[float]] = {}
    for sv in members:
        for m in sv.measured:
            for w in m.check.on:
                v = m.values.get(w)
                if keep(m, w, v):
                    found.setdefault((m.check.metric, w, m.check.threshold), []).append(v)
    out = []
    for (metric, who, thr), vals in sorted(found.items()):
        lo, hi = (_under(v, thr, 3) if "<" in relation else f"{v:.3g}" for v in (min(vals), max(vals)))
        shown = lo if lo == hi else f"{lo}–{hi}"
        out.append(f"{metric} of the {who} {shown}{relation}{thr:g}")
    return ", ".join(out)


def _final(run: RunRecord | None, key: str) -> float | None:
    if run is None or key not in run.metrics:
        return None
    return run.metrics[key]


def identical_results(a: RunRecord, b: RunRecord) -> bool:
    """Final eval and train results equal to float precision (at least one result metric on both sides)."""
    keys = [k for k in a.metrics if k in b.metrics and any(fnmatch.fnmatchcase(k, p) for p in RESULT_METRICS)]
    if not keys:
        return False
    for k in keys:
        x, y = a.metrics[k], b.metrics[k]
        if not (math.isfinite(x) and math.isfinite(y)):
            if not (math.isnan(x) and math.isnan(y)) and x != y:
                return False
            continue
        if abs(x - y) > IDENTICAL_RTOL * max(abs(x), abs(y)):
            return False
    return True


REFERENCE = {"ablations": "none", "control": "none"}


def assess(series: D.Series, everything: list[D.Series], thresholds, reference: D.Series | None = None) -> Validity:
    """The validity of one series: its reference is the same model without ablation or control (nearest
    config, same seed), looked up among `everything` (every series of the sweep, not only those a figure shows);
    or `reference` itself where given (the run a comparison pairs it with, `comparison`)."""
    family = series.value("family") or ""
    ablations = series.value("ablations") or "none"
    is_variant = ablations != "none"
    # A derived control (sGLA widened to RLA's state) is compared with the plain baseline of its family.
    if reference is None and is_variant:
        reference = D.reference_of(series, REFERENCE, everything, keys=("family",))
    checks = checks_for(ablations, family, thresholds)
    v = Validity(series, reference, checks)
    if not checks:
        return v
    mine = series.by_seed()
    theirs = reference.by_seed() if reference is not None else {}
    for seed in sorted(mine, key=D._num_key):
        run, ref = mine[seed], theirs.get(seed)
        sv = SeedValidity(seed, run, ref)
        for c in checks:
            sv.measured.append(Measured(c, {"job": _final(run, c.metric), "reference": _final(ref, c.metric)}))
        sv.identical = ref is not None and identical_results(run, ref)
        v.seeds.append(sv)
    return v


class ValidityIndex:
    """Validity of every series of a selection under one set of thresholds, looked up by series key."""

    def __init__(self, runs, thresholds):
        self.everything = D.all_series(runs)
        self.thresholds = thresholds
        # A reference shares family, grid point and version with its variant: look it up in that bucket only,
        # so that a sweep of thousands of series does not compare every pair.
        buckets: dict[tuple, list[D.Series]] = {}
        for s in self.everything:
            buckets.setdefault(self._bucket(s), []).append(s)
        self._by_key = {s.key: assess(s, buckets[self._bucket(s)], thresholds) for s in self.everything}
        # A derived control without a plain run of its baseline in the sweep (controls of RLA, no sGLA arm) is
        # checked against the residual model it is derived from, as every comparison of it is (`comparison`): the
        # validity panel and the tables then give it one state.
        # the plain series of each arm, at each version and grid point: what a control there is derived from
        plain = {(s.value(D.ARM), *self._bucket(s)[1:]): s for s in self.everything
                 if (s.value(D.CONTROL) or "none") == "none" and (s.value("ablations") or "none") == "none"}
        for s in self.everything:
            v = self._by_key[s.key]
            if v.reference is None and v.checks and (s.value(D.CONTROL) or "none") != "none":
                source = plain.get((s.value(D.ARM), *self._bucket(s)[1:]))
                if source is not None and source.value("family") != s.value("family"):
                    self._by_key[s.key] = assess(s, [], thresholds, reference=source)

    @staticmethod
    def _bucket(s: D.Series) -> tuple:
        return (s.value("family"), s.value(D.VERSION),
                tuple(sorted((k, v) for k, v in s.tags.items() if k.startswith(D.POINT_PREFIX))))

    def of(self, series: D.Series) -> Validity | None:
        return self._by_key.get(series.key)

    def __iter__(self):
        return iter(self._by_key.values())


MARK = {OFF: "mechanism off", IDENTICAL: "identical to reference", NOT_MEASURED: "mechanism not measured"}


def comparison(index: ValidityIndex, a: D.Series, b: D.Series | None) -> tuple[str, str]:
    """(state, detail) of comparing series `a` with series `b`, paired by seed: identical when their final
    results agree on every paired seed; else the worst state of the two series' own checks."""
    va, vb = index.of(a), index.of(b) if b is not None else None
    if b is not None:
        # A series whose own reference has no run in the sweep (a derived control without a plain run of its
        # baseline) is checked against the run it is compared with, which its checks then read as the reference:
        # both sides' mixers measured is a measured comparison, not one missing its reference.
        va, vb = _against(va, b, index.thresholds), _against(vb, a, index.thresholds)
        mine, theirs = a.by_seed(), b.by_seed()
        paired = [s for s in mine if s in theirs]
        if paired and all(identical_results(mine[s], theirs[s]) for s in paired):
            return IDENTICAL, f"final results identical to {b.label or 'the reference'} on every paired seed " \
                              f"({', '.join(sorted(paired, key=D._num_key))})"
    parts = [(f"{s.label or s.value('family')}: ", v.state, v.detail())
             for s, v in ((a, va), (b, vb)) if v is not None and v.state != NO_CHECK]
    radius = _radius_check(index, a, b)
    if radius is not None:
        parts.append(("clip radius: ", *radius))
    if not parts:
        return NO_CHECK, "no mechanism check for these models"
    state = worst(st for _, st, _ in parts)
    return state, "; ".join(f"{who}{detail}" for who, st, detail in parts if st == state)


def _against(v: Validity | None, other: D.Series, thresholds) -> Validity | None:
    """`v`, or for a variant without a reference run in the sweep, its validity with `other` as the reference."""
    if v is None or v.reference is not None or not v.checks or (v.series.value("ablations") or "none") == "none":
        return v
    return assess(v.series, [], thresholds, reference=other)


def _under(value: float, threshold: float, least: int = 2) -> str:
    """`value` (below `threshold`) to `least` significant digits, or as many more as it takes not to print as the
    threshold or above it (0.9951 under 1 is '0.995', not '1')."""
    for digits in range(least, 10):
        text = f"{value:.{digits}g}"
        if float(text) < threshold:
            return text
    return repr(value)


def off_summary(index: ValidityIndex, a: D.Series, b: D.Series | None) -> str:
    """The measured values below their thresholds when comparing `a` with `b`, one range per check and per series
    the runs belong to, e.g. 'diag/mixer_rms_over_sqrt_eps 0.092–0.97 < 1 in 5 runs' (a's own) or '... 0.3 < 1 in 1
    run of sGLA' (b's; 'of its reference' for the run a's validity compares it with, if not b's); '' when none is
    below."""
    found: dict[tuple[str, float, str], list[float]] = {}
    seen = set()
    own = {r.run_id for r in a.runs}
    theirs = {r.run_id for r in b.runs} if b is not None else set()
    for s in (a, b):
        v = index.of(s) if s is not None else None
        for sv in v.seeds if v is not None else ():
            for m in sv.measured:
                for who in m.check.on:
                    run = sv.run if who == "job" else sv.reference
                    val = m.values.get(who)
                    if run is None or val is None or val >= m.check.threshold or (run.run_id, m.check.metric) in seen:
                        continue
                    seen.add((run.run_id, m.check.metric))
                    whose = ("" if run.run_id in own else f" of {b.label}" if b is not None and run.run_id in theirs
                             else " of its reference" if s is a else f" of {b.label}'s reference")
                    found.setdefault((m.check.metric, m.check.threshold, whose), []).append(val)
    parts = []
    for (metric, thr, whose), vals in sorted(found.items()):
        lo, hi = _under(min(vals), thr), _under(max(vals), thr)
        shown = lo if lo == hi else f"{lo}–{hi}"
        parts.append(f"{metric} {shown} < {thr:g} in {len(vals)} run{'s' if len(vals) > 1 else ''}{whose}")
    radius = _radius_check(index, a, b)
    if radius is not None and radius[0] == OFF:
        seeds = radius[1].split(":")[0].removeprefix(f"{OFF} on ")
        parts.append(f"{TARGET_METRIC} < {index.thresholds.target_engaged_min:g} at both radii ({seeds})")
    return "; ".join(parts)


def _radius_check(index: ValidityIndex, a: D.Series, b: D.Series | None) -> tuple[str, str] | None:
    """Comparing two clip radii (model.clip differs) tests the clip target: it must have changed some residuals
    on at least one side (diag/target_engaged >= threshold), seed by seed. None when the radius is the same, or
    when either side has no residual path (a baseline's `model.clip` is unused: sGLA against RLA compares R, not
    two radii)."""
    from rla_ablate.models.config import RESIDUAL_FAMILIES

    if b is None or a.value("model.clip") is None or D.same_value(a.value("model.clip"), b.value("model.clip")):
        return None
    if a.value("family") not in RESIDUAL_FAMILIES or b.value("family") not in RESIDUAL_FAMILIES:
        return None
    thr = index.thresholds.target_engaged_min
    mine, theirs = a.by_seed(), b.by_seed()
    states = {}
    for seed in (s for s in mine if s in theirs):
        x, y = _final(mine[seed], TARGET_METRIC), _final(theirs[seed], TARGET_METRIC)
        states[seed] = NOT_MEASURED if x is None or y is None else (OFF if max(x, y) < thr else ENGAGED)
    if not states:
        return NOT_MEASURED, "no paired seeds"
    state = worst(states.values())
    seeds = ", ".join(s for s, st in states.items() if st == state)
    return state, f"{state} on seeds {seeds}: {TARGET_METRIC} on either side vs {thr:g}"
