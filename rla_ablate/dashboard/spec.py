"""Figure and table specs: one YAML file each in `dashboards/`, validated with file:line: key errors.

A spec selects runs by tags (`runs`), groups them into series by tags (`series`; seeds are always
aggregated: mean and 95% t-interval), optionally splits them into panels by a tag, and says what to
draw. Metric names may be globs (`eval/*/loss`): the alphabetically first key present in the runs is used.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from rla_ablate.config import load_yaml, validate
from rla_ablate.errors import UserError

KINDS = ("curve", "layers", "gains", "table", "scatter")
# Tags a spec may filter or group by (set by rla_ablate.tracking for every job run).
TAGS = ("family", "ablations", "seed", "sweep", "job_id", "kernel_backend", "host", "git_commit")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str
    """What to draw: curve | layers | gains | table | scatter."""
    title: str
    """Title shown above the figure or table."""
    caption: str = ""
    """One or two sentences under it: what it shows and which figure or table of the paper it mirrors."""
    runs: dict[str, Union[str, list[str]]] = Field(default_factory=dict)
    """Tag filters: tag -> allowed value or values (e.g. {family: [rla, rdn], ablations: [none, tied_gamma]})."""
    series: list[str] = Field(default_factory=lambda: ["family", "ablations"])
    """Tags whose values identify one line, bar group, point or table row."""
    panels: str | None = None
    """Tag with one subplot per value (e.g. family), or none."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Display names for series, keyed by their tag values joined with '/' (e.g. 'rla/tied_gamma': 'RLA, tied γ')."""
    _name: str = PrivateAttr("")

    @property
    def name(self) -> str:
        """The spec's file name without .yaml: names its output files."""
        return self._name

    @field_validator("runs")
    @classmethod
    def _known_filter_tags(cls, v):
        for tag in v:
            if tag not in TAGS:
                raise ValueError(f"unknown tag '{tag}' in runs; allowed: {', '.join(TAGS)}")
        return v

    @field_validator("series")
    @classmethod
    def _known_series_tags(cls, v):
        for tag in v:
            if tag not in TAGS or tag == "seed":
                raise ValueError(f"series tag '{tag}' is not allowed (seeds are aggregated); allowed: "
                                 f"{', '.join(t for t in TAGS if t != 'seed')}")
        return v

    @field_validator("panels")
    @classmethod
    def _known_panel_tag(cls, v):
        if v is not None and v not in TAGS:
            raise ValueError(f"unknown tag '{v}'; allowed: {', '.join(TAGS)}")
        return v

    def allowed(self, tag: str) -> list[str] | None:
        v = self.runs.get(tag)
        return None if v is None else ([v] if isinstance(v, str) else list(v))

    def matches(self, tags: dict[str, str]) -> bool:
        return all(tags.get(t) in vals for t in self.runs if (vals := self.allowed(t)) is not None)


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


class GainsSpec(_Spec):
    """Paired gain of each series over its reference, averaged within task categories (Fig. 3b)."""

    kind: Literal["gains"]
    metric: str
    """Per-eval-set metric with {set} for the set name, e.g. eval/{set}/loss."""
    categories: dict[str, list[str]]
    """Category -> eval-set name globs; sets matching none go to 'other'."""
    reference: dict[str, str] = Field(default_factory=lambda: {"ablations": "none"})
    """Tag overrides that turn a series into its reference (paired by seed)."""
    higher_is_better: bool = False
    """Gain = treatment - reference if true, reference - treatment if false (losses)."""
    ylabel: str | None = None
    """Axis label."""

    @field_validator("metric")
    @classmethod
    def _has_set(cls, v):
        if "{set}" not in v:
            raise ValueError("must contain {set}, e.g. eval/{set}/loss")
        return v

    def category(self, eval_set: str) -> str:
        for name, globs in self.categories.items():
            if any(fnmatch.fnmatchcase(eval_set, g) for g in globs):
                return name
        return "other"


class Column(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str
    """Metric whose final value fills the column (glob allowed)."""
    label: str | None = None
    """Column header; defaults to the metric name."""
    digits: int = Field(3, ge=0, le=8)
    """Decimals shown."""
    higher_is_better: bool = False
    """Marks the best mean in bold and orients the difference."""


class TableSpec(_Spec):
    """Final metrics per series: mean ± 95% CI over seeds and the paired difference to the reference (Tables 4, 5)."""

    kind: Literal["table"]
    columns: list[Column] = Field(min_length=1)
    """One column per metric."""
    reference: dict[str, str] = Field(default_factory=lambda: {"ablations": "none"})
    """Tag overrides that turn a row into its reference row (paired by seed); a row equal to it has no difference."""


class Axis(BaseModel):
    model_config = ConfigDict(extra="forbid")

    param: str
    """Run param giving x (e.g. accounting.state_elements_per_layer, accounting.params)."""
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


SPEC_TYPES: dict[str, type[_Spec]] = {"curve": CurveSpec, "layers": LayersSpec, "gains": GainsSpec,
                                      "table": TableSpec, "scatter": ScatterSpec}
FigureSpec = Union[CurveSpec, LayersSpec, GainsSpec, TableSpec, ScatterSpec]


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
    return spec


def spec_dir() -> Path:
    """The committed specs: `dashboards/` at the repository root."""
    return Path(__file__).resolve().parents[2] / "dashboards"


def load_specs(directory: str | Path | None = None) -> list[FigureSpec]:
    directory = Path(directory) if directory else spec_dir()
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise UserError(f"no dashboard specs (*.yaml) in {directory}")
    return [load_spec(f) for f in files]
