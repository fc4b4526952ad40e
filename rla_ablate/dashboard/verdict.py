"""Verdicts on the paper's claims: each claim of a spec (`claims:`) decided from paired differences by seed.

For each treatment series a claim selects, its reference series is found by applying the claim's `reference`
overrides (same grid point, nearest config), the final values of the claim's metric are paired by seed, and
d = treatment - reference gets its mean and 95% t-interval (`stats.paired_diff`). The verdict follows
`stats.classify`: confirmed, contradicted or unresolved; with one seed there is no interval and the verdict is
unresolved. A comparison whose mechanism was off, whose results are identical, or where neither model learned the
task (both within min_effect of the claim's `chance`), is unresolved whatever the numbers say (the experiment
could not test the claim); one whose diagnostics are missing is decided on the numbers and says "mechanism not
measured".

Divergence is an outcome, not missing data: a run that diverged (the divergence guard stopped it, status
`diverged`) has no final value, yet losing training is the worst result a model can have. When one side diverged
on every seed where the other finished (two seeds or more) and the other side never diverged, the claim is decided
by it: confirmed if the claim predicts that side to be the worse one (the metric's direction: `higher_is_better`),
contradicted otherwise. In any other case the diverged seeds are left out of the pairing and the reason names them.

Seeds needed: the fewest seeds n for which a two-sided paired t-test at level 0.05 has 80% power to detect a
difference of min_effect when the paired differences vary as observed (`stats.seeds_for_power`; noncentral t,
needs two or more seeds to estimate that spread). It is given only where more seeds are the remedy: a comparison
whose mechanism was off, whose results are identical, or where no model learned the task is invalid at any number
of seeds, so its power line says that seeds do not help until the mechanism is engaged (or the task learned)
instead of a count; one decided by divergence needs none.

Many claims: each verdict with a p-value (the paired t-test against zero, two seeds or more) also gets its
Benjamini-Hochberg q among all such verdicts of the dashboard (`adjust_for_many`), and the page's notes list the
verdicts resting on excluding zero whose q exceeds 0.05. The verdict itself stays the claim's pre-registered rule;
the q says whether it survives the family's false-discovery rate.

A claim whose treatment no run of the sweep matches gets no verdict: it is listed as not tested, with the runs it
needs (`rla_ablate.dashboard.coverage`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import SimpleNamespace

from rla_ablate.dashboard import coverage as C
from rla_ablate.dashboard import data as D
from rla_ablate.dashboard import validity as V
from rla_ablate.dashboard.spec import Claim
from rla_ablate.dashboard.stats import (ALPHA, CONFIRMED, CONTRADICTED, MAX_SEEDS, POWER, UNRESOLVED, PairedDiff,
                                        bh_adjust, classify, paired_diff, seeds_for_power)
from rla_ablate.outcome import Status


# Below this many paired seeds, a seed count rests on a spread estimated from few values (at 3 seeds, 2 degrees of
# freedom, the upper 95% confidence limit of the spread is 6.3 times the estimate): said beside it.
ROUGH_BELOW = 5
# A seed count above this is no practical advice: the power line then says how the spread compares with min_effect.
MANY_SEEDS = 100


@dataclass
class Verdict:
    spec: str
    claim: Claim
    treatment: str
    """Label of the treatment series ('' when no series matches)."""
    reference: str
    metric: str | None
    diff: PairedDiff | None
    verdict: str
    """confirmed | contradicted | unresolved."""
    reason: str
    seeds_needed: int | None
    mechanism: str
    """The comparison's validity state: engaged, off, identical, not measured or n/a."""
    mechanism_detail: str = ""
    no_power: str = ""
    """Why no seed count is given although seeds were paired: more seeds cannot make the comparison valid
    (mechanism off, identical results, task not learned) or divergence decided it; '' otherwise."""
    q: float | None = None
    """Its Benjamini-Hochberg adjusted p-value among the dashboard's claims that have one (`adjust_for_many`)."""
    caveats: tuple[str, ...] = ()
    """What the reason adds to the rule that decided it (a diverged seed, seeds left out, seeds that learned the
    task on one side only): the figure's footer repeats them."""

    def seeds_text(self) -> str:
        """The power line's value: a seed count, or '—' with why none is given."""
        if self.no_power:
            return f"— ({self.no_power})"
        if self.seeds_needed is None:
            n = self.diff.diff.n if self.diff is not None else 0
            if n == 0:
                return "— (no paired seeds)"
            if n == 1:
                return "unknown (1 paired seed; 2+ estimate the spread)"
            return "—"
        count = f"more than {MAX_SEEDS}" if self.seeds_needed > MAX_SEEDS else str(self.seeds_needed)
        n = self.diff.diff.n if self.diff is not None else 0
        if self.verdict in (CONFIRMED, CONTRADICTED):
            # not advice to run more: the count says how often a rerun would find the effect again
            return (f"{count} (decided at n={n}; a rerun with this many seeds detects an effect of min_effect 80% of "
                    "the time)")
        notes = [f"rough: the spread from {n} seeds"] if n < ROUGH_BELOW else []
        if self.seeds_needed > MANY_SEEDS and self.diff is not None and self.claim.min_effect > 0:
            # more seeds are not the practical remedy: say how far the spread is from the effect looked for
            spread = self.diff.diff.std
            notes.append(f"the paired differences spread {spread:.3g}, {spread / self.claim.min_effect:.0f}x "
                         "min_effect: longer training, or a min_effect the question can afford, needs fewer")
        return f"{count} ({'; '.join(notes)})" if notes else count

    def comparison(self) -> str:
        if not self.treatment:
            return "no matching series"
        return f"{self.treatment} − {self.reference or '(no reference)'}"

    def diff_text(self, digits: int = 4) -> str:
        if self.diff is None or self.diff.diff.n == 0:
            return "no paired seeds"
        return self.diff.format(digits) + (f", q={self.q:.3g}" if self.q is not None else "")

    def line(self) -> str:
        return (f"{self.verdict.upper()}: {self.claim.claim} | {self.comparison()}: Δ {self.metric or self.claim.metric}"
                f" = {self.diff_text()} | {self.reason} | seeds for {POWER:.0%} power at |Δ| = "
                f"{self.claim.min_effect:g}: {self.seeds_text()}")

    def as_dict(self) -> dict:
        d = self.diff.diff if self.diff is not None else None

        def num(x):
            return None if x is None or not math.isfinite(x) else x

        return {"spec": self.spec, "claim": self.claim.claim, "treatment": self.treatment, "reference": self.reference,
                "metric": self.metric, "expect": self.claim.expect, "min_effect": self.claim.min_effect,
                "n": d.n if d else 0, "mean": num(d.mean) if d else None, "lo": num(d.lo) if d else None,
                "hi": num(d.hi) if d else None, "p": num(self.diff.p_value) if self.diff else None, "q": self.q,
                "seeds": list(self.diff.seeds) if self.diff else [], "verdict": self.verdict, "reason": self.reason,
                "seeds_needed": self.seeds_needed, "seeds_note": self.seeds_text(), "power": POWER, "alpha": ALPHA,
                "mechanism": self.mechanism, "mechanism_detail": self.mechanism_detail}


def _labelled(spec, series: list[D.Series]) -> dict[tuple, str]:
    """Labels for series of several families and grid points (copies: the shared series keep theirs)."""
    keys = list(dict.fromkeys(["family", *spec.series]))
    fake = SimpleNamespace(series=keys, labels=spec.labels)
    copies = [D.Series(s.key, dict(s.tags), "", s.runs, tuple(s.value(k) or "?" for k in keys)) for s in series]
    D.assign_labels(fake, {"": copies})
    return {c.key: c.label for c in copies}


def _not_learned(claim: Claim, treated: dict, reference: dict) -> str:
    """Why the comparison cannot test the claim because neither model learned the task ('' when it can)."""
    if claim.chance is None or not treated or not reference:
        return ""
    means = [sum(v.values()) / len(v) for v in (treated, reference)]
    if all(abs(m - claim.chance) < claim.min_effect for m in means):
        return (f"not learned: both series end within {claim.min_effect:g} of chance ({claim.chance:g}; means "
                f"{means[0]:.4g}, {means[1]:.4g}): the comparison cannot test the claim")
    return ""


def _learned_note(claim: Claim, treated: dict, reference: dict) -> str:
    """With a chance level: the paired seeds on which each side learned the task (ended at least `min_effect`
    from chance), when the two sides differ. A difference between a run that learned and one that did not measures
    whether the task was learned, not how well: e.g. MQAR, where recall emerges suddenly or not at all within a
    budget, seed by seed ('' when every paired seed learned on both sides or on neither)."""
    if claim.chance is None:
        return ""
    paired = [s for s in treated if s in reference]

    def learned(finals: dict) -> set[str]:
        return {s for s in paired if abs(finals[s] - claim.chance) >= claim.min_effect}

    lt, lr = learned(treated), learned(reference)
    if lt == lr:
        return ""
    return (f"learned the task (at least {claim.min_effect:g} from chance) on {_seeds_phrase(lt)} of the treatment "
            f"and {_seeds_phrase(lr)} of the reference: the difference mixes whether the task was learned with how "
            "well")


def _diverged(series: D.Series) -> set[str]:
    """Seeds whose run in `series` diverged."""
    return {series.seed(r) for r in series.unique if r.job_status == Status.DIVERGED}


def _seeds_text(seeds: set[str]) -> str:
    return ", ".join(sorted(seeds, key=D._num_key))


def _seeds_phrase(seeds: set[str]) -> str:
    """'seed 2', 'seeds 0, 1' or 'no seed'."""
    return f"seed{'s' if len(seeds) != 1 else ''} {_seeds_text(seeds)}" if seeds else "no seed"


def _by_divergence(claim: Claim, t: D.Series, ref: D.Series, treated: dict, reference: dict) -> tuple[str, str] | None:
    """(verdict, reason) when divergence decides the comparison, else None with the diverged seeds named by
    `_divergence_note`; `treated` and `reference` are the finished seeds' final values."""
    div_t, div_r = _diverged(t), _diverged(ref)
    lost_t = div_t & set(reference)                          # the treatment diverged where the reference finished
    lost_r = div_r & set(treated)
    worse_sign = -1 if claim.better_is_higher else 1         # the sign of treatment - reference when it is worse
    sign = 1 if claim.expect == "higher" else -1
    for lost, other_div, side, worse in ((lost_t, div_r, "treatment", sign == worse_sign),
                                         (lost_r, div_t, "reference", sign != worse_sign)):
        if len(lost) >= 2 and not other_div and not set(treated) & set(reference):
            seeds = _seeds_text(lost)
            what = f"the {side} diverged on every seed ({seeds}) where the other finished"
            return (CONFIRMED, what) if worse else (CONTRADICTED, f"{what}: the claim predicts the opposite")
    return None


def _divergence_note(t: D.Series, ref: D.Series) -> str:
    notes = [f"{side} diverged on seed{'s' if len(div) > 1 else ''} {_seeds_text(div)} (left out)"
             for side, div in (("treatment", _diverged(t)), ("reference", _diverged(ref))) if div]
    return "; ".join(notes)


def _seeds_note(t: D.Series, ref: D.Series, treated: dict, reference: dict) -> str:
    """Which seeds each side finished, when they do not pair up: what the comparison is missing."""
    complete = set(t.seeds) == set(treated) and set(ref.seeds) == set(reference)
    if set(treated) == set(reference) and (complete or len(treated) >= 2):
        return ""                    # every seed paired (or enough to pair): nothing to say about missing ones

    def have(series: D.Series, finals: dict) -> str:
        missing = set(series.seeds) - set(finals)
        if not finals:
            return f"none of its {_seeds_phrase(missing)}" if missing else "no seed"
        return _seeds_phrase(set(finals)) + (f", not {_seeds_text(missing)}" if missing else "")

    return f"seeds finished with the metric: {t.label or 'treatment'}: {have(t, treated)}; " \
           f"{ref.label or 'reference'}: {have(ref, reference)}"


def _schedule_note(key: str, t: D.Series, ref: D.Series) -> str:
    """An area under an accuracy curve (eval/<set>/acc_area) averages each evaluation's value over the tokens since
    the one before, up to the run's last evaluation: runs evaluated at other tokens or trained for other budgets (a
    matched wall-clock control) average over other grids, which the paired difference would mix in."""
    if not key.endswith("_area"):
        return ""
    plans = set()
    for series in (t, ref):
        for r in series.runs:
            if r.finished:
                every = r.params.get("train.eval_every_tokens")
                plans.add((f"every {every} tokens" if every not in (None, "", "null", "None")
                           else "10 evaluations a run", r.steps.get(key)))
    if len(plans) < 2:
        return ""
    spelled = "; ".join(every + (f" to {last:,}" if last is not None else "")
                        for every, last in sorted(plans, key=str))
    return (f"the areas average over different evaluation schedules or budgets ({spelled}): compare runs evaluated "
            "at the same tokens")


def _settling_note(runs, key: str, t: D.Series, ref: D.Series, min_effect: float) -> str:
    """How the mean paired difference moved over the evaluations both sides share (runs of one budget and schedule,
    their last at the same tokens), where the verdict should say it ('' otherwise, or where the runs' histories
    cannot be read):
    - it changed sign between the last two: the verdict judges a comparison still turning, which more training may
      turn back;
    - it shrank to half or less over the second half of the run, from at least `min_effect`: the gap is closing,
      so the verdict holds for this budget and a longer run may narrow it further (small proxies often learn
      faster early, and the difference of an early lead fades)."""
    read = getattr(runs, "history", None)
    if read is None:
        return ""

    def history(run_id: str, key: str) -> list[tuple[int, float]]:
        try:
            return read(run_id, key)
        except Exception:  # an unreadable history (a store gone mid-render) costs the note, not the page
            return []

    mine, theirs = t.by_seed(), ref.by_seed()
    diffs: list[dict[int, float]] = []
    for seed in [s for s in mine if s in theirs]:
        a, b = (dict(history(r.run_id, key)) if r.run_id else {} for r in (mine[seed], theirs[seed]))
        if not a or not b or max(a) != max(b):
            return ""  # another budget or schedule (a wall-clock control): its evaluations are at other tokens
        diffs.append({step: a[step] - b[step] for step in set(a) & set(b)})
    common = sorted(set.intersection(*(set(d) for d in diffs))) if diffs else []
    if len(common) < 2:
        return ""
    mean = {step: sum(d[step] for d in diffs) / len(diffs) for step in common}
    (before, prev), (last, final) = ((step, mean[step]) for step in common[-2:])
    if prev * final < 0:
        return (f"the mean difference changed sign over the last evaluation interval ({prev:+.4g} at {before:,} "
                f"tokens, {final:+.4g} at {last:,}): the comparison is still turning, and more training may turn "
                "it back")
    half = [step for step in common if step <= last / 2]
    if not half:
        return ""
    middle, then = half[-1], mean[half[-1]]
    if then != 0 and abs(then) >= min_effect and then * final >= 0 and abs(final) <= abs(then) / 2:
        return (f"the gap is closing: the mean difference shrank from {then:+.4g} at {middle:,} tokens to "
                f"{final:+.4g} at {last:,}, so the verdict holds for this budget and a longer run may narrow it "
                "further")
    return ""


OFF_NO_POWER = "more seeds do not help until the mechanism is engaged"
NO_POWER = {V.OFF: OFF_NO_POWER, V.IDENTICAL: "more seeds do not help: the results are identical",
            "not learned": "more seeds do not help until a model learns the task",
            "divergence": "decided by divergence", "never logged": "no run logs the metric",
            "examples": "more seeds do not help until every run is scored on the same examples"}


def evaluate(spec, runs, index: V.ValidityIndex, drawn: bool = True) -> tuple[list[Verdict], list[C.Untested]]:
    """One verdict per claim of `spec` and treatment series it selects; a claim whose treatment no series matches,
    or none of whose treatments has a reference series, is not tested (second list: what it needs). `drawn`:
    whether the spec itself is drawn."""
    # a claim compares the series its spec shows: the spec's `runs` filter holds for treatment and reference alike
    everything = [s for s in index.everything if s.runs and spec.matches(s.runs[0])]
    out: list[Verdict] = []
    untested: list[C.Untested] = []
    # what the sweep has, for the hints of the claims it cannot test
    families = {str(s.value("family")) for s in index.everything}
    present = {D.spelled(x) for s in index.everything for x in C.as_list(s.value("ablations"))}
    for claim in spec.claims:
        treatments = [s for s in everything if s.runs and claim.selects(s.runs[0])]
        keys = ("family", "ablations", "control")
        # A treatment series the reference leaves as it is would be compared with itself: the reference of a claim
        # over {family: [sgla, rla]} with reference {family: rla}, not a treatment of it.
        own = [t for t in treatments if D.changes_nothing(t, claim.reference, keys)]
        if own and len(own) == len(treatments):
            # e.g. treatment {family: sgla}, reference {ablations: none}: the plain sGLA runs are their own reference
            untested.append(C.Untested(
                spec.name, claim.claim, C.filters_text(claim.treatment), C.filters_text(claim.reference),
                f"its reference changes nothing for the runs its treatment selects ({_labelled(spec, own)[own[0].key]}"
                f"{' and others' if len(own) > 1 else ''}), so each would be compared with itself: give the "
                "reference a value those runs do not have, or the treatment one the reference does not",
                drawn, fix_in="spec"))
            continue
        treatments = [t for t in treatments if not any(t is o for o in own)]
        pairs = [(t, D.reference_of(t, claim.reference, everything, keys=keys)) for t in treatments]
        labels = _labelled(spec, [s for pair in pairs for s in pair if s is not None])
        sweep_key = D.resolve_metric(claim.metric, runs.jobs)
        if all(ref is None for _, ref in pairs):
            # no treatment, or no series to compare any with (e.g. a gdn arm without the rdn it is the base of):
            # what the sweep lacks, not a verdict
            missing = C.for_claim(spec, claim, drawn, families, present, seen=lambda key: {
                D.spelled(v) for s in index.everything if (v := s.value(key)) is not None})
            if not treatments and any(s.runs and claim.selects(s.runs[0]) for s in index.everything):
                # the runs exist: the spec's own `runs:` filter leaves them out of what it compares
                missing = replace(missing, fix_in="spec", hint=f"its treatment's runs are in the sweep, but the "
                                  f"spec's runs: filter ({C.filters_text(spec.runs)}) leaves them out")
            untested.append(missing)
            continue
        for t, ref in pairs:
            if ref is None:
                out.append(Verdict(spec.name, claim, labels[t.key], "", sweep_key, None, UNRESOLVED,
                                   f"no reference series: no run of {labels[t.key]} with "
                                   f"{C.filters_text(claim.reference)} in this sweep", None, V.NO_CHECK))
                continue
            state, detail = V.comparison(index, t, ref)  # the runs' own checks, whatever the metric
            if sweep_key is None:
                # no run of the sweep logged the claim's metric (a misspelt name, or one this sweep never logs)
                out.append(Verdict(spec.name, claim, labels[t.key], labels[ref.key], None, None, UNRESOLVED,
                                   D.never_logged(claim.metric, runs.jobs), None, state, detail,
                                   no_power=NO_POWER["never logged"]))
                continue
            # A glob is resolved for the pair's own runs: in a sweep of several tasks (an LM arm and an MQAR arm)
            # the sweep's preferred match (eval/val/loss) is one the other task's runs never log.
            key = D.resolve_metric(claim.metric, [*t.runs, *ref.runs])
            if key is None:
                out.append(Verdict(spec.name, claim, labels[t.key], labels[ref.key], None, None, UNRESOLVED,
                                   f"neither {labels[t.key]} nor {labels[ref.key]} logs a metric matching "
                                   f"{claim.metric} (other runs of the sweep log {sweep_key})", None, state,
                                   detail, no_power=NO_POWER["never logged"]))
                continue
            treated, reference = D.final_by_seed(t, key), D.final_by_seed(ref, key)
            d = paired_diff(treated, reference)
            sign = 1 if claim.expect == "higher" else -1
            verdict, reason = classify(d.diff, sign, claim.min_effect)
            floor = _not_learned(claim, treated, reference)
            no_power = ""
            mixed = D.mixed_examples(key, [*t.runs, *ref.runs])
            if mixed:
                verdict, no_power = UNRESOLVED, NO_POWER["examples"]
                reason = (f"scored on different numbers of examples ({', '.join(map(str, mixed))}): the difference "
                          f"mixes example sets; {D.MIXED_EXAMPLES_FIX}")
            elif floor:
                verdict, reason, no_power = UNRESOLVED, floor, NO_POWER["not learned"]
            elif state in (V.OFF, V.IDENTICAL):
                verdict, no_power = UNRESOLVED, NO_POWER[state]
                off = V.off_summary(index, t, ref) if state == V.OFF else ""
                reason = (f"mechanism off{f' ({off})' if off else ''}: the comparison cannot test the claim"
                          if state == V.OFF else "identical results: the ablation changed nothing at this scale")
            elif state == V.NOT_MEASURED:
                reason += " (mechanism not measured)"
            needed = seeds_for_power(d.diff.std, claim.min_effect) if d.diff.n >= 2 and not no_power else None
            decided = _by_divergence(claim, t, ref, treated, reference)
            caveats: list[str] = []
            if decided is not None:
                (verdict, reason), needed, no_power = decided, None, NO_POWER["divergence"]
                # The diverged side has no final diagnostics, and needs none: losing training is the outcome.
                state, detail = V.NO_CHECK, "decided by divergence (a diverged run has no final diagnostics)"
            else:
                caveats = [note for note in (_divergence_note(t, ref), _seeds_note(t, ref, treated, reference),
                                             _schedule_note(key, t, ref),
                                             _settling_note(runs, key, t, ref, claim.min_effect),
                                             "" if floor else _learned_note(claim, treated, reference)) if note]
                reason = "; ".join([reason, *caveats])
            out.append(Verdict(spec.name, claim, labels[t.key], labels[ref.key], key, d, verdict, reason, needed,
                               state, detail, no_power, caveats=tuple(caveats)))
    return out, untested


def rests_on_zero(v: Verdict) -> bool:
    """Whether a decided verdict rests on its interval excluding zero (confirmed; contradicted with the effect
    reversed), the test a q-value adjusts. A 'negligible' contradiction rests on the interval excluding the minimum
    effect instead: its p (against zero) says nothing of it."""
    if v.verdict not in (CONFIRMED, CONTRADICTED) or v.diff is None or v.diff.diff.n < 2:
        return False
    sign = 1 if v.claim.expect == "higher" else -1
    lo, hi = sorted((sign * v.diff.diff.lo, sign * v.diff.diff.hi))
    return lo > 0 if v.verdict == CONFIRMED else hi < 0


def adjust_for_many(verdicts: list[Verdict], alpha: float = ALPHA) -> list[str]:
    """Give each verdict with a p-value (two or more paired seeds; the paired t-test against zero) its
    Benjamini-Hochberg q among them, and say in lines which verdicts that rest on rejecting zero keep q <= alpha. The
    verdicts themselves follow each claim's own rule: a study that tests many claims at 0.05 expects some decided by
    chance, and the q-values say which survive the family."""
    tested = [v for v in verdicts if v.diff is not None and v.diff.diff.n >= 2 and math.isfinite(v.diff.p_value)]
    for v, q in zip(tested, bh_adjust([v.diff.p_value for v in tested])):
        v.q = q  # one claim tested: q = p
    if len(tested) < 2:
        return []
    decided = [v for v in tested if rests_on_zero(v)]
    kept = [v for v in decided if v.q <= alpha]
    head = f"{len(tested)} claims tested against zero at {alpha:g} each (Benjamini-Hochberg q beside each p)"
    if not decided:
        return [f"{head}; no verdict rests on excluding zero, so none needs q <= {alpha:g}"]
    lines = [f"{head}; at a {alpha:.0%} false-discovery rate over them {len(kept)} of the {len(decided)} verdicts "
             f"that rest on excluding zero keep q <= {alpha:g}"]
    lines += [f"  q > {alpha:g}: {v.verdict} {v.spec}: {v.claim.claim} (p={v.diff.p_value:.2g}, q={v.q:.3g})"
              for v in decided if v.q > alpha]
    return lines
