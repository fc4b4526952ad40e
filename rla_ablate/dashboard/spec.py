"""Figure and table specs: one YAML file each in `dashboards/`, validated with file:line: key errors.

A spec selects runs (`runs`), names, orders and colours series by any key (`series`, `color`), optionally
splits them into panels by a key, and says what to draw. A series is always one experiment up to the seed
(`rla_ablate.dashboard.data`): keys never pool two configs. Keys are run tags (family, ablations, arm, ...),
grid/zip point tags (point.model.clip) or resolved config keys (model.clip, train.lr). Metric names may be
globs (`eval/*/loss`): the alphabetically first key present in the runs is used. A spec may also state the
paper's claims it tests (`claims`, each with a verdict rule) and the thresholds of its mechanism checks
(`validity`).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Optional, Literal, Union

from pydantic import ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from rla_ablate.config import load_yaml, validate
from rla_ablate.config.numbers import NumbersNotBools
from rla_ablate.errors import UserError, did_you_mean

KINDS = ("curve", "layers", "gains", "table", "scatter", "validity")
# Tags a spec may filter or group by (set by rla_ablate.tracking for every job run, the identity tags by the
# launcher, version by the dashboard: current or older).
TAGS = ("family", "ablations", "seed", "sweep", "job_id", "kernel_backend", "glue", "host", "git_commit", "arm",
        "preset", "control", "series", "version")
CONFIG_SECTIONS = ("model", "train", "data", "eval")
Scalar = Union[str, bool, int, float, None]
KEY_HELP = (f"allowed: {', '.join(TAGS)}, point.<grid/zip key> (point.model.clip), or a resolved config key "
            "(model.<field>, train.<field>, data.<field>, eval.<i>.<field>)")


def _config_fields(section: str) -> list[str] | None:
    """The fields of a config section whose keys can be checked (model, train); None: any key (data, eval)."""
    if section == "model":
        from rla_ablate.models.config import ModelConfig

        return sorted(ModelConfig.model_fields)
    if section == "train":
        from rla_ablate.train.config import TrainConfig

        return sorted(TrainConfig.model_fields)
    return None


def check_key(key: str, *, where: str = "", seed: bool = True) -> str:
    """A key a spec may use: a tag, point.<config key>, or a resolved config key; ValueError says what is allowed."""
    place = f" in {where}" if where else ""
    if key in TAGS:
        if key == "seed" and not seed:
            raise ValueError(f"key 'seed' is not allowed{place} (seeds are aggregated); "
                             + KEY_HELP.replace("seed, ", ""))
        return key
    dotted = key[len("point."):] if key.startswith("point.") else key
    section, _, rest = dotted.partition(".")
    if section in CONFIG_SECTIONS and rest:
        fields = _config_fields(section)
        name = rest.split(".")[0]
        if fields is not None and name not in fields:
            hint = did_you_mean(name, fields, prefix=f"{section}.")
            raise ValueError(f"unknown config key '{dotted}'{place}{hint}; {section}.* keys: {', '.join(fields)}")
        return key
    raise ValueError(f"unknown tag '{key}'{place}{did_you_mean(key, TAGS)}; {KEY_HELP}")


def _as_list(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def check_values(filters: dict, where: str) -> None:
    """The values of `family`, `ablations`, `control` and `version` in a filter are names those closed sets hold: a
    misspelt one matched nothing, and the spec then asked for a sweep edit that adds it. ValueError with a
    did-you-mean otherwise."""
    from rla_ablate.dashboard.selection import CURRENT, OLDER
    from rla_ablate.models.ablations import ABLATIONS, CONTROL_NAMES
    from rla_ablate.models.budget import AXES
    from rla_ablate.models.config import FAMILIES

    # a control widened on another axis is tagged by it: matched_state[heads]
    controls = (*CONTROL_NAMES, *(f"{c}[{a}]" for c in CONTROL_NAMES if c != "matched_wallclock" for a in AXES))
    known = {"family": FAMILIES, "ablations": ("none", *ABLATIONS, *CONTROL_NAMES),
             "control": ("none", *controls), "version": (CURRENT, OLDER)}
    whats = {"ablations": "ablation or control", "control": "derived control", "version": "version of the sweep file"}
    for key, names in known.items():
        for value in _as_list(filters.get(key, [])):
            # a run's ablations tag joins stacked ablations with '+' (no_clip+no_norm)
            for part in str(value).split("+") if key == "ablations" else [str(value)]:
                if part not in names:
                    shown = [n for n in names if "[" not in n] + (
                        [f"matched_state[<axis>] or matched_params[<axis>] (axis {' or '.join(AXES)})"]
                        if key == "control" else [])
                    raise ValueError(f"{key} '{part}' in {where} is no {whats.get(key, key)}"
                                     f"{did_you_mean(part, names)}; allowed: {', '.join(shown)}")


def _matches(filters: dict, run_or_tags) -> bool:
    from rla_ablate.dashboard.data import same_value, value_of

    if hasattr(run_or_tags, "tags"):
        def get(k):
            return value_of(run_or_tags, k)
    else:
        def get(k):
            return run_or_tags.get(k)
    return all(any(same_value(get(k), v) for v in _as_list(vals)) for k, vals in filters.items())


class _Strict(NumbersNotBools):
    # as the sweep file's numbers: `min_effect: true` is not 1, `.inf` is no effect size
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ValidityThresholds(_Strict):
    """Thresholds of the mechanism checks (rla_ablate.dashboard.validity) used by this figure or table."""

    target_engaged_min: float = Field(0.001, ge=0)
    """Clip-type ablations (no_clip, no_clip_no_norm, logcosh): the reference's diag/target_engaged must reach it."""
    mixer_rms_over_sqrt_eps_min: float = Field(1.0, ge=0)
    """Every comparison of mixers: diag/mixer_rms_over_sqrt_eps of the job and of its reference must reach it."""


class _Oriented:
    """Which way a spec's metric is better: its `higher_is_better` where the spec sets it, else by the metric's name
    (`rla_ablate.train.job.better_direction`: accuracies, their areas and the training speed higher, the rest
    lower), the same rule for a claim, a table column and a gains figure."""

    @property
    def better_is_higher(self) -> bool:
        given = self.higher_is_better
        if given is not None:
            return bool(given)
        from rla_ablate.train.job import better_direction

        return better_direction(self.metric) == "maximize"


class Claim(_Oriented, _Strict):
    """A claim of the paper and the rule that decides it from the paired difference treatment - reference."""

    claim: str
    """The claim in words, e.g. 'persistent R helps: without fitting the eval loss rises (Table 4)'."""
    metric: str = "eval/*/loss"
    """Metric whose final value is compared (glob allowed: the validation set is preferred)."""
    treatment: dict[str, Union[Scalar, list[Scalar]]]
    """Which series the claim is about (a filter like `runs`), e.g. {ablations: no_fitting}; one verdict each."""
    reference: dict[str, Scalar]
    """Key overrides that turn a treatment series into the series it is compared with, e.g. {ablations: none}."""
    expect: Literal["higher", "lower"]
    """What the claim predicts for treatment - reference, paired by seed: higher (> 0) or lower (< 0)."""
    min_effect: float = Field(ge=0)
    """The smallest |difference| worth reporting, in the metric's units; also the effect the seed count is for."""
    chance: Optional[float] = None
    """The metric's value when the task is not learned (MQAR accuracy: about 0; a loss: ln of the vocabulary). When
    both series end within min_effect of it, the comparison cannot test the claim: unresolved, "not learned"."""
    higher_is_better: Optional[bool] = None
    """Whether a larger value of the metric is the better model; by default true for accuracies (a metric whose
    last part is `acc`, `accuracy` or `acc_norm`, or one of these with `_area`) and the training speed, false
    otherwise (losses; `rla_ablate.train.job.better_direction`). A run
    that diverged counts as the worse side."""

    @field_validator("metric")
    @classmethod
    def _metric_named(cls, v: str) -> str:
        # eval/val/* would be decided on whichever of acc, loss, ppl sorts first
        if any(c in v.rsplit("/", 1)[-1] for c in "*?["):
            raise ValueError(f"'{v}': a glob may stand for an eval set or task (eval/*/loss), not for what is "
                             "measured; name the metric (e.g. eval/val/loss, eval/*/acc)")
        return v

    @field_validator("treatment", "reference")
    @classmethod
    def _keys(cls, v):
        if not v:
            raise ValueError("give at least one key, e.g. {ablations: none}")
        for key in v:
            check_key(key, where="a claim")
        check_values(v, "a claim")
        return v

    @model_validator(mode="after")
    def _reference_changes_something(self):
        # a reference that only restates the treatment's own values compares each series with itself
        from rla_ablate.dashboard.data import same_value, spelled

        treated = {k: [spelled(x) for x in _as_list(v)] for k, v in self.treatment.items()}
        if all(k in treated and len(treated[k]) == 1 and same_value(treated[k][0], v) for k, v in self.reference.items()):
            raise ValueError("reference: its values are the treatment's own, so each series would be compared with "
                             "itself; give the values the treatment is compared with (e.g. {ablations: none} for a "
                             "treatment {ablations: tied_gamma})")
        return self

    def selects(self, run_or_tags) -> bool:
        return _matches(self.treatment, run_or_tags)


class _Spec(_Strict):
    kind: str
    """What to draw: curve | layers | gains | table | scatter | validity."""
    title: str
    """Title shown above the figure or table."""
    caption: str = ""
    """One or two sentences under it: what it shows and which figure or table of the paper it mirrors."""
    runs: dict[str, Union[Scalar, list[Scalar]]] = Field(default_factory=dict)
    """Filters: key -> allowed value or values (e.g. {family: [rla, rdn], ablations: [none, tied_gamma],
    model.clip: [0.05, 0.2]}); numbers compare as numbers (1 == 1.0)."""
    series: list[str] = Field(default_factory=lambda: ["family", "ablations"])
    """Keys that name and order series (e.g. [ablations, model.clip]). They never merge two configs: series
    sharing these values are told apart in their labels by what differs (arm, grid values, other config)."""
    panels: str | None = None
    """Key with one subplot per value (e.g. family, model.clip), or none."""
    color: str | None = None
    """Key whose value picks the colour (series sharing it share a colour, with different markers); default:
    one colour per series."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Display names keyed by the series' values of `series` joined with '/' (e.g. 'rla/tied_gamma': 'RLA, tied γ'),
    or by a single value (e.g. 'none: independent γ')."""
    reference: dict[str, Scalar] = Field(default_factory=lambda: {"ablations": "none"})
    """Key overrides that turn a series into the one it is compared with, paired by seed, e.g. {ablations: none}
    or {model.clip: 1.0}: tables' Δ column, gains, and the 'identical' / mechanism marks of every figure."""
    claims: list[Claim] = Field(default_factory=list)
    """The paper's claims this figure or table tests, each with its verdict rule (see Claim)."""
    validity: ValidityThresholds = Field(default_factory=ValidityThresholds)
    """Thresholds of the mechanism checks that mark variants whose mechanism was off."""
    _name: str = PrivateAttr("")

    @property
    def name(self) -> str:
        """The spec's file name without .yaml: names its output files."""
        return self._name

    @field_validator("runs")
    @classmethod
    def _known_filter_keys(cls, v):
        for key in v:
            check_key(key, where="runs")
        check_values(v, "runs")
        return v

    @field_validator("reference", "series")
    @classmethod
    def _known_keys_but_seed(cls, v, info: ValidationInfo):
        for key in v:
            check_key(key, where=info.field_name, seed=False)
        if isinstance(v, dict):
            check_values(v, str(info.field_name))
        return v

    @field_validator("panels", "color")
    @classmethod
    def _known_key(cls, v):
        if v is not None:
            check_key(v, seed=False)
        return v

    def allowed(self, key: str) -> list | None:
        v = self.runs.get(key)
        return None if v is None else _as_list(v)

    def matches(self, run_or_tags) -> bool:
        """Whether a run (or a plain tag dict) passes the `runs` filters."""
        return _matches(self.runs, run_or_tags)


class CurveSpec(_Spec):
    """A metric against tokens seen, one line per series with a 95% CI band over seeds (Fig. 3a, 4b)."""

    kind: Literal["curve"]
    y: str
    """Metric to plot (glob allowed), e.g. eval/*/loss or train/loss."""
    ylabel: str | None = None
    """Axis label; defaults to the metric name."""
    smooth: float = Field(0.0, ge=0.0, lt=1.0)
    """EMA smoothing weight applied to each run before averaging seeds (0 = none)."""
    logy: bool = False
    """Log scale on the y axis."""


class LayersSpec(_Spec):
    """A per-layer statistic at the end of training: x = layer index (Fig. 4a)."""

    kind: Literal["layers"]
    y: str
    """Per-layer metric with {layer} where the two-digit index goes, e.g. layer_{layer}/attn_out_norm."""
    ylabel: str | None = None
    """Axis label; defaults to the metric name."""
    logy: bool = False
    """Log scale on the y axis."""

    @field_validator("y")
    @classmethod
    def _has_layer(cls, v):
        if "{layer}" not in v:
            raise ValueError("must contain {layer}, e.g. layer_{layer}/attn_out_norm")
        return v


def _with_set(metric: str) -> str:
    """A per-eval-set metric names where the set goes."""
    if "{set}" not in metric:
        raise ValueError("must contain {set}, e.g. eval/{set}/loss")
    return metric


class GainsSpec(_Oriented, _Spec):
    """Paired gain of each series over its reference, averaged within task categories (Fig. 3b)."""

    kind: Literal["gains"]
    metric: str
    """Per-eval-set metric with {set} for the set name, e.g. eval/{set}/loss."""
    categories: dict[str, list[str]]
    """Category -> eval-set name globs; sets matching none go to 'other'."""
    higher_is_better: Optional[bool] = None
    """Gain = treatment - reference if true, reference - treatment if false; by default by the metric's name, as a
    claim's (accuracies true, losses false)."""
    ylabel: str | None = None
    """Axis label."""
    fallback: "GainsFallback | None" = None
    """What to draw when no run has `metric` for a set of a named category (e.g. task accuracies not scored yet:
    eval loss instead); the figure then says so. With a fallback, sets in no category are left out of `metric`."""

    @field_validator("metric")
    @classmethod
    def _has_set(cls, v):
        return _with_set(v)

    def category(self, eval_set: str) -> str:
        for name, globs in self.categories.items():
            if any(fnmatch.fnmatchcase(eval_set, g) for g in globs):
                return name
        return "other"


class GainsFallback(_Oriented, _Strict):
    """The metric and categories a gains figure falls back to (written on the figure)."""

    metric: str
    """Per-eval-set metric with {set}, e.g. eval/{set}/loss."""
    categories: dict[str, list[str]]
    """Category -> eval-set name globs."""
    higher_is_better: Optional[bool] = None
    """Orientation of the gain, as in the figure's own (by default by the metric's name)."""
    ylabel: str | None = None
    """Axis label."""

    @field_validator("metric")
    @classmethod
    def _has_set(cls, v):
        return _with_set(v)


class Column(_Oriented, _Strict):

    metric: str
    """Metric whose final value fills the column (glob allowed)."""
    label: str | None = None
    """Column header; defaults to the metric name."""
    digits: int = Field(3, ge=0, le=8)
    """Decimals shown."""
    higher_is_better: Optional[bool] = None
    """Marks the best mean in bold and orients the difference; by default by the metric's name, as a claim's
    (accuracies true, losses false)."""
    per_seed: bool = False
    """Also list each seed's value under the mean: for a bounded or bimodal metric (an accuracy that some seeds
    learn and others do not) whose t-interval at a few seeds says little."""
    sets: list[str] | None = None
    """Globs the '*' of a glob metric must match (e.g. [piqa, arc_*] for eval/*/acc: task accuracies, not the
    training eval sets' argmax accuracy); default: any."""
    fallback: "Column | None" = None
    """The column shown when no run has `metric` (e.g. eval loss while task accuracies are not scored); the
    table then says so."""


class TableSpec(_Spec):
    """Final metrics per series: mean ± 95% CI over seeds and the paired difference to the reference (Tables 4, 5)."""

    kind: Literal["table"]
    columns: list[Column] = Field(min_length=1)
    """One column per metric."""


class Axis(_Strict):
    param: str
    """Run param giving x: a resolved config key (model.clip, train.lr) or accounting.state_elements_per_layer,
    accounting.params, accounting.flops_per_token."""
    label: str | None = None
    """Axis label; defaults to the param name."""
    log: bool = False
    """Log scale."""


class ScatterSpec(_Spec):
    """Final metric against a budget (state size, params), one panel per x (the matched-budget plot)."""

    kind: Literal["scatter"]
    y: str
    """Metric whose final value is y (glob allowed)."""
    ylabel: str | None = None
    """Axis label; defaults to the metric name."""
    x: list[Axis] = Field(min_length=1)
    """One panel per axis."""
    connect: bool = False
    """Join the points of one colour (see `color`) by a line, in order of x (e.g. loss against model.clip)."""


class ValiditySpec(_Spec):
    """The validity panel: per job, whether the mechanism its ablation tests was engaged, and the threshold used."""

    kind: Literal["validity"]


GainsSpec.model_rebuild()
Column.model_rebuild()

SPEC_TYPES: dict[str, type[_Spec]] = {"curve": CurveSpec, "layers": LayersSpec, "gains": GainsSpec,
                                      "table": TableSpec, "scatter": ScatterSpec, "validity": ValiditySpec}
FigureSpec = Union[CurveSpec, LayersSpec, GainsSpec, TableSpec, ScatterSpec, ValiditySpec]


def load_spec(path: str | Path) -> FigureSpec:
    """Load and validate one spec; errors name file:line: key and the allowed values."""
    located = load_yaml(path)
    data = located.data
    if not isinstance(data, dict):
        raise UserError("a dashboard spec must be a mapping with at least kind and title", file=located.file, line=1)
    kind = data.get("kind")
    if kind not in SPEC_TYPES:
        line = located.line(("kind",))
        if kind is None:
            raise UserError(f"missing; allowed: {', '.join(KINDS)}", file=located.file, line=line, key="kind")
        raise UserError(f"{kind!r} is not allowed; allowed: {', '.join(KINDS)}", file=located.file, line=line,
                        key="kind")
    spec = validate(SPEC_TYPES[kind], located)
    spec._name = Path(path).stem
    # a claim stated twice would be one more test among those the q-values correct for, and one more verdict
    from rla_ablate.dashboard.data import spelled

    def values(filters: dict) -> tuple:
        return tuple(sorted((k, tuple(sorted(spelled(x) for x in _as_list(v)))) for k, v in filters.items()))

    seen: dict[tuple, int] = {}
    for i, c in enumerate(spec.claims):
        rule = c.model_dump(exclude={"claim", "treatment", "reference"})
        key = (values(c.treatment), values(c.reference), tuple(sorted((k, repr(v)) for k, v in rule.items())))
        if key in seen:
            raise UserError(f"repeats claims.{seen[key]} (the same comparison and rule, in other words); state each "
                            "claim once", file=located.file, line=located.line(("claims", i)), key=f"claims.{i}")
        seen[key] = i
    return spec


def spec_dir() -> Path:
    """The committed specs: `dashboards/` at the repository root (bundled in the wheel)."""
    from rla_ablate.resources import bundled_dir

    return bundled_dir("dashboards")


def load_specs(directory: str | Path | None = None) -> list[FigureSpec]:
    directory = Path(directory) if directory else spec_dir()
    if not directory.is_dir():
        what = "is a file; --specs names a folder of specs (*.yaml)" if directory.exists() else "no such folder"
        raise UserError(what, key="--specs", file=str(directory))
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    if not files:
        raise UserError(f"no dashboard specs (*.yaml, *.yml) in {directory}", key="--specs")
    stems: dict[str, Path] = {}
    for f in files:  # a spec's figures are named after its file
        if f.stem in stems:
            raise UserError(f"two specs named {f.stem!r}: {stems[f.stem].name} and {f.name}; rename one",
                            key="--specs", file=str(directory))
        stems[f.stem] = f
    # every spec's problem in one report: a folder of specs is fixed in one pass, not one file a run
    specs, problems = [], []
    for f in files:
        try:
            specs.append(load_spec(f))
        except UserError as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise UserError(f"{len(problems)} specs have problems\n" + "\n".join(map(str, problems)), key="--specs",
                        file=str(directory))
    return specs
