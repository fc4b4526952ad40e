"""What a sweep can test: which specs have something to compare, which claims have runs to decide them.

A spec is drawn when the sweep has runs of what it compares: the treatment of one of its claims, or both a series
its `reference` overrides would change (a variant) and one they would not (what variants are compared with). A
spec that declares no comparison and states no claim (the validity panel, a table listing runs) is drawn when any
run matches its filter. A claim is decided when the sweep has runs of its treatment. The others are not drawn as empty panels or
"unresolved" verdicts: each is one line saying which runs it needs (`Untested.line`), so a sweep of two families
and one ablation is not buried under the verdicts of every other claim of the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

from rla_ablate.dashboard import data as D
from rla_ablate.errors import did_you_mean

NOT_TESTED = "not tested"


def as_list(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def filters_text(filters: dict) -> str:
    """{family: rla, ablations: [no_clip, no_norm]} -> 'family=rla, ablations=no_clip|no_norm'."""
    return ", ".join(f"{k}={'|'.join(D.spelled(x) for x in as_list(v))}" for k, v in filters.items())


def _add_arm(families: list[str]) -> str:
    return f"add a {' or '.join(families)} arm to models:"


def _runs_have(values: list[str], have: list[str]) -> str:
    """' (the runs have a, b, c (did you mean 'b'?))': the values the runs have of a key, and the one closest to the
    first asked for when it is a word (relativ is a typo; a number close to another is a value); '' for none."""
    if not have:
        return ""
    close = "" if D.is_number(values[0]) else did_you_mean(values[0], have)
    return f" (the runs have {', '.join(have[:6])}{', ...' if len(have) > 6 else ''}{close})"


def sweep_file_hint(filters: dict, families: set[str] | None = None, present: set[str] | None = None,
                    seen=None) -> str:
    """What a sweep file adds to produce such runs, in words ('add logcosh to ablations:'; no brackets, so that the
    line prints as it is through rich markup). A family is named when none of its values is among `families`
    (those the sweep has; None: never); a control's family by the residual arm it is derived from. A control
    among `present` (the ablations and controls the sweep's runs have) is not asked for again, nor a config value
    some run of the sweep already has (`seen(key)`: the values its runs have of a key; data.kind = stdlib in a sweep
    of stdlib data); a value none has is named with those the runs have, and the one closest to it (a typo)."""
    from rla_ablate.models.ablations import CONTROL_NAMES
    from rla_ablate.models.config import BASELINE_OF

    parts: list[str] = []
    config: dict[bool, list[str]] = {True: [], False: []}  # model keys, train and data keys
    for key, v in filters.items():
        values = [D.spelled(x) for x in as_list(v) if D.spelled(x) != "none"]
        if not values:
            continue
        if key == "family":
            derived = {D.spelled(x) for x in as_list(filters.get("ablations", []))} & set(CONTROL_NAMES)
            if families is not None and not set(values) & families and not derived:
                parts.append(_add_arm(values))
            elif families is not None and derived:
                # a control's runs come from a residual arm: without one of those, no control of this family
                residual = sorted(r for r, base in BASELINE_OF.items() if base in values)
                if residual and not set(residual) & families:
                    parts.append(f"{_add_arm(residual)} ({' or '.join(sorted(derived))} derives "
                                 f"{' or '.join(values)} from it)")
        elif key == "ablations":
            ablations = [a for a in values if a not in CONTROL_NAMES and (present is None or a not in present)]
            controls = [a for a in values if a in CONTROL_NAMES and (present is None or a not in present)]
            if ablations:
                parts.append(f"add {' or '.join(ablations)} to ablations:")
            if controls:
                parts.append(f"add {' or '.join(controls)} to controls:")
        elif (section := key.removeprefix("point.").split(".")[0]) in ("model", "train", "data"):
            have = sorted(seen(key)) if seen is not None else []
            if set(values) & set(have):
                continue
            config[section == "model"].append(f"{key.removeprefix('point.')} = {' or '.join(values)}"
                                              f"{_runs_have(values, have)}")
        elif seen is not None:
            # a tag (arm, preset, ...): a value no run has is a name the sweep does not use, or a typo of one
            have = sorted(seen(key))
            if not set(values) & set(have):
                where = f": an arm named {' or '.join(values)} in models:" if key == "arm" else ""
                parts.append(f"{key} = {' or '.join(values)}{where}{_runs_have(values, have)}")
    # where a sweep file sets such a value: model keys in an arm's overrides:, train and data keys in base: or an
    # arm's base: (an arm's overrides: takes model keys only); any of them in grid:
    for model, where in ((True, "an arm's overrides:"), (False, "base: or an arm's base:")):
        if config[model]:
            parts.append(f"{' and '.join(config[model])} in grid: or {where}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Untested:
    """A claim (or a figure without claims) this sweep cannot test: it has no run of what it compares."""

    spec: str
    claim: str | None
    """The claim in words; None for a figure or table without claims."""
    needs: str
    """The runs it needs, as filters: 'family=rla, ablations=logcosh'."""
    against: str
    """What they are compared with, paired by seed: 'ablations=none'."""
    hint: str
    """What the sweep file adds to run them: 'ablations: [logcosh]' ('' when nothing simple says it)."""
    drawn: bool
    """Whether the spec is drawn anyway (other series of it are in the sweep)."""
    fix_in: str = "sweep file"
    """Where `hint` is to be acted on: the sweep file, or the spec (its `runs:` filter leaves the runs out)."""

    def text(self) -> str:
        """The claim and the runs it needs: 'claim: needs runs with ..., compared with ... (sweep file: ...)'."""
        what = f"{self.claim}" if self.claim else "(no claims; not drawn)"
        against = f", compared with {self.against}" if self.against else ""
        hint = f" ({self.fix_in}: {self.hint})" if self.hint else ""
        return f"{what}: needs runs with {self.needs}{against}{hint}"

    def line(self) -> str:
        return f"{self.spec}: {self.text()}"

    def as_dict(self) -> dict:
        return {"spec": self.spec, "claim": self.claim, "verdict": NOT_TESTED, "needs": self.needs,
                "compared_with": self.against, "sweep_file": self.hint if self.fix_in == "sweep file" else "",
                **({"spec": self.hint} if self.fix_in == "spec" else {}), "drawn": self.drawn,
                # what keeps it from a verdict: runs the sweep lacks, or the spec's own wording
                "reason": f"no run with {self.needs} in this sweep" if self.fix_in != "spec" else self.hint}


def for_claim(spec, claim, drawn: bool = True, families: set[str] | None = None,
              present: set[str] | None = None, seen=None) -> Untested:
    """The line of a claim whose treatment no run of the sweep matches (`families`: those the sweep has; `present`:
    the ablations and controls its runs have; `seen`: see `sweep_file_hint`). The hint also names a reference
    family the sweep lacks."""
    hints = [sweep_file_hint(claim.treatment, families, present, seen)]
    reference = [D.spelled(x) for x in as_list(claim.reference.get("family", [])) if D.spelled(x) != "none"]
    # a reference arm the treatment's hint already asks for is not asked for twice
    if families is not None and reference and not set(reference) & families and _add_arm(reference) not in hints[0]:
        hints.append(_add_arm(reference))
    # the reference's own config values (train.lr = 0.02 on the reference side), where no run has them
    hints.append(sweep_file_hint({k: v for k, v in claim.reference.items() if k not in ("family", "ablations")},
                                 families, present, seen))
    hint = "; ".join(h for h in dict.fromkeys(hints) if h)
    if not hint and seen is not None:
        # every value is in the sweep, but no run has them together (an ablation its arm's family does not get)
        hint = "the sweep has runs with each of these values, but none with all of them together"
    return Untested(spec.name, claim.claim, filters_text(claim.treatment), filters_text(claim.reference), hint,
                    drawn)


def differs(series: D.Series, overrides: dict) -> bool:
    """Whether a series is a variant the overrides turn into another one (not its own reference)."""
    return any(not D.same_value(series.value(k), v) for k, v in overrides.items())


def sides(spec, runs) -> tuple[list[D.Series], list[D.Series]]:
    """The spec's series split into variants (a series its `reference` overrides change) and the series they are
    compared with; for the validity panel every series is a variant."""
    series = [s for panel in D.group(spec, runs).values() for s in panel]
    if spec.kind == "validity":
        return series, []
    return ([s for s in series if differs(s, spec.reference)],
            [s for s in series if not differs(s, spec.reference)])


DEFAULT_REFERENCE = {"ablations": "none"}


def declares_comparison(spec) -> bool:
    """Whether a spec says what it compares: a `reference` other than the default, or a filter that lists, for a
    reference key, values other than the reference's (fig. 4a's ablations: [none, no_clip, ...]). A spec that does
    neither (and the validity panel) is a listing of the runs its filter selects."""
    if spec.kind == "validity":
        return False
    if dict(spec.reference) != DEFAULT_REFERENCE:
        return True
    return any(k in spec.runs and any(not D.same_value(D.spelled(x), v) for x in as_list(spec.runs[k]))
               for k, v in spec.reference.items())


def drawable(spec, runs, everything: list[D.Series]) -> bool:
    """Whether the sweep has something the spec compares: runs of a claim's treatment, or both sides of its
    reference relation (a variant and a series it is compared with); for a listing (`declares_comparison` false,
    no claims), any run it selects."""
    if any(claim.selects(s.runs[0]) for claim in spec.claims for s in everything if s.runs):
        return True
    variants, references = sides(spec, runs)
    if variants and references:
        return True
    return not spec.claims and not declares_comparison(spec) and bool(variants or references)


def for_figure(spec, runs) -> Untested:
    """The line of a spec without claims that has nothing to compare: the side of its comparison the sweep lacks
    (for a listing: the runs its filter selects)."""
    if not declares_comparison(spec):
        return Untested(spec.name, None, filters_text(spec.runs) or "any run", "", "", False)
    variants, _ = sides(spec, runs)
    needs: dict[str, list] = {}
    other: list[str] = []
    for key, v in spec.runs.items():
        if key in spec.reference and variants:          # the variants are there: the compared-with side is missing
            needs[key] = [spec.reference[key]]
            continue
        kept = [x for x in as_list(v) if key not in spec.reference or not D.same_value(D.spelled(x),
                                                                                       spec.reference[key])]
        if kept:
            needs[key] = kept
    for key, v in spec.reference.items():
        if key not in spec.runs:
            if variants:
                needs[key] = [v]
            else:
                other.append(f"{key} other than {D.spelled(v)}")
    needs_text = ", ".join([filters_text(needs)] * bool(needs) + other)
    if variants:
        needs_text += ": what the series of this sweep are compared with"
    return Untested(spec.name, None, needs_text or "any run", "" if variants else filters_text(spec.reference),
                    sweep_file_hint(needs), False)
