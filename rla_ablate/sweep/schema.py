"""The sweep file: one YAML that names every job of an ablation study.

    name: smoke
    models:                      # the arms: presets (models/<scale>-<family>.yaml) or paths, with overrides
      - preset: tiny-rla
      - {preset: tiny-rdn, overrides: {clip: 0.5}}
    base: {train: {...}, data: {...}, eval: [...]}   # the rest of a JobConfig, shared by every job
    ablations: [no_fitting, {name: no_clip, families: [rdn]}]
    controls: [matched_state]
    grid: {train.lr: [1e-3, 3e-4]}
    zip: {train.lr: [...], train.warmup_tokens: [...]}
    seeds: [0, 1]
    resources: {gpus: 0.25, cpus: 1}
    search: {...}                # an Optuna study instead of the grid (see SearchConfig)
    evals: {tasks: [piqa, arc_easy], limit: 500}   # downstream accuracy after training (see EvalRequest)

Only the shape of the file is checked here; `rla_ablate.sweep.expand` resolves presets, ablations and
dotted keys against the model and training configs and reports problems at the line they come from.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rla_ablate.config.numbers import MAX_SEED, NumbersNotBools
from rla_ablate.errors import closest
from rla_ablate.evals.core import EvalRequest

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class _Strict(NumbersNotBools):
    model_config = ConfigDict(extra="forbid")


class ModelArm(_Strict):
    """One model of the study; every ablation, grid point and seed is applied to it."""

    preset: str
    """A preset name (`tiny-rla`, `1.5b-gdn`: models/<scale>-<family>.yaml) or a path to a preset file."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """ModelConfig fields that replace the preset's, e.g. `{num_layers: 2}`."""
    name: str | None = None
    """Short label used in job names; default: the preset name."""
    base: dict[str, Any] = Field(default_factory=dict)
    """This arm's own job sections over the sweep's `base`: `train` keys replace the shared ones key by key,
    `data` and `eval` replace the shared sections whole (a study with an MQAR arm and a text arm)."""

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, v: Any) -> Any:
        if isinstance(v, str):  # `- tiny-rla`: the preset's name alone
            raise ValueError(f"a model is a mapping with its preset: write {{preset: {v}}}")
        if isinstance(v, list):  # `- [tiny-rla, tiny-gdn]`: a flow list where each model is an entry
            names = [x for x in v if isinstance(x, str)]
            example = ", ".join(f"{{preset: {x}}}" for x in names) if names else "{preset: tiny-rla}"
            raise ValueError(f"a model is a mapping with its preset, not a list; give each model its own entry: "
                             f"models: [{example}]")
        if v is not None and not isinstance(v, dict):
            raise ValueError("a model is a mapping with its preset, e.g. {preset: tiny-rla}")
        return v

    @field_validator("base")
    @classmethod
    def _arm_sections(cls, v: dict) -> dict:
        extra = sorted(set(v) - {"train", "data", "eval"})
        if extra:
            raise ValueError(f"unknown section(s) {', '.join(extra)} in an arm's base; allowed: train, data, eval")
        if not isinstance(v.get("train", {}), dict):
            raise ValueError("an arm's base.train must be a mapping of train keys")
        return v


class AblationRef(_Strict):
    """An ablation from the registry (docs/MATH.md), optionally limited to some families."""

    name: str
    """Registry name: no_fitting, tied_gamma, no_output_gates, no_clip, no_norm, no_clip_no_norm, logcosh."""
    families: list[str] | None = None
    """Apply only to the models of these families (each must be one the ablation fits); default: all it fits."""


class ControlRef(_Strict):
    """A derived baseline for each residual model: the baseline family widened to a matched budget."""

    name: Literal["matched_state", "matched_params", "matched_wallclock"]
    """matched_state: baseline widened to the residual model's recurrent state; matched_params: to its params;
    matched_wallclock: the baseline of the same shape trained for the residual model's time (its token budget
    times the estimated tokens/s ratio, baseline over residual, from the calibration table; docs/SWEEPS.md)."""
    families: list[str] | None = None
    """Residual families to derive controls for (rla -> sgla, rdn -> gdn); default: every residual model."""
    axis: Literal["expand_v", "heads", "head_dim"] = "expand_v"
    """How the baseline is widened: value dim (dv' = 2 dv), heads (H' = 2 H) or key dim (dk' = 2 dk)."""
    speeds: dict[str, Any] | None = None
    """matched_wallclock only: the tokens/s per family that the budgets assume, instead of the calibration table's
    estimates ({rla: 165101, sgla: 181000}): a study pins them to expand the same jobs whatever table ships. Each
    residual family the control is derived for needs its own speed and its baseline's (checked at expansion)."""


class Resources(_Strict):
    """What one job asks Ray for."""

    gpus: float | Literal["auto"] = 0.0
    """GPUs per job; fractions below 1 share a GPU (0.25 = four jobs per GPU), above 1 must be whole. `auto`: each
    job takes the share of one GPU its estimated peak memory needs (plus `memory_margin`), so Ray packs as many
    jobs on a GPU as fit; on a machine without GPUs, `auto` trains on the CPU."""
    memory_margin: float = Field(default=0.15, ge=0, le=1)
    """Head room on top of a job's estimated peak GPU memory when it is packed (`gpus: auto`) or its explicit share
    is checked at launch: 0.15 = 15% more than the estimate (jobs of one shape were measured to peak up to
    10% apart on an H200)."""
    cpus: float = 1.0
    """CPU cores per job (torch intra-op threads follow it)."""
    retries: int = Field(default=2, ge=0, le=20)
    """Times a failed job is rerun from its last checkpoint before the sweep reports it failed (diverged: never)."""
    assumed_tflops: float = Field(default=400.0, gt=0)
    """Sustained training TFLOP/s per GPU for the plan's GPU-hours of a family without a measured row in the
    calibration table (rla_ablate/sweep/calibration/); measured tokens/s take precedence."""

    @property
    def auto(self) -> bool:
        return self.gpus == "auto"

    @field_validator("gpus")
    @classmethod
    def _gpus_possible(cls, v: float | str) -> float | str:
        if v == "auto":
            return v
        if v < 0 or not math.isfinite(v):
            raise ValueError("must be >= 0")
        if v > 1 and v != int(v):
            raise ValueError("a job can share one GPU (0 < gpus <= 1) or use whole GPUs (2, 4, 8), not a fraction above 1")
        return v

    @field_validator("cpus")
    @classmethod
    def _cpus_possible(cls, v: float) -> float:
        if v <= 0 or not math.isfinite(v):
            raise ValueError("must be > 0")
        return v


def _swept_key(key: str) -> str:
    """A grid, zip or search key: a dotted key of the job's config under model., train. or data. (checked as the
    mapping's key, so that a problem is said at the key's own line)."""
    prefix, _, rest = key.partition(".")
    if prefix not in ("model", "train", "data") or not rest:
        close = closest(prefix, ["model", "train", "data"], 1)
        hint = f" (did you mean '{close[0]}.{rest}'?)" if close and rest else ""
        raise ValueError(f"a swept key is a dotted key of the job's config under model., train. or data. (e.g. "
                         f"model.clip, train.lr){hint}")
    return key


SweptKey = Annotated[str, AfterValidator(_swept_key)]


def _flow(values: list) -> str:
    """A list as YAML's flow form writes it: [0.5, 1.0, clip, true]."""
    return "[" + ", ".join("true" if v is True else "false" if v is False else str(v) for v in values) + "]"


class SearchParam(_Strict):
    """One searched config key."""

    type: Literal["float", "int", "categorical"]
    """How Optuna samples it."""
    low: float | None = None
    """Lower bound (float, int)."""
    high: float | None = None
    """Upper bound (float, int)."""
    log: bool = False
    """Sample on a log scale (float, int)."""
    choices: list[Any] | None = None
    """The values to choose from (categorical)."""
    step: float | None = None
    """Draw every step-th whole number from low (int, not with log): {type: int, low: 4, high: 16, step: 4}."""

    @model_validator(mode="before")
    @classmethod
    def _not_a_list(cls, data: Any) -> Any:
        """A list where a range belongs is a grid's spelling: say how a search writes it."""
        if isinstance(data, list):
            raise ValueError(f"a list, as a grid gives its values; a search draws from a range or from choices: "
                             f"{{type: categorical, choices: {_flow(data)}}}, or {{type: float, low: ..., high: ...}} "
                             "(or type: int)")
        return data

    @model_validator(mode="after")
    def _bounds(self) -> "SearchParam":
        given = self.model_fields_set
        foreign = (sorted(given & {"low", "high", "log", "step"}) if self.type == "categorical"
                   else ["choices"] if "choices" in given else [])
        if foreign:  # a key the draw would ignore: the search would not be the one written
            uses = "'choices'" if self.type == "categorical" else "'low' and 'high' (and 'log', 'step' for int)"
            raise ValueError(f"{', '.join(repr(k) for k in foreign)} {'is' if len(foreign) == 1 else 'are'} not for a "
                             f"{self.type} parameter, which takes {uses}")
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs a non-empty 'choices' list")
            seen = [c for i, c in enumerate(self.choices) if c in self.choices[:i]]
            if seen:  # a value listed twice is drawn twice as often: the study's trials would lean to it unasked
                raise ValueError(f"{seen[0]!r} is listed twice in 'choices'; give each value once")
            if len(self.choices) == 1:
                raise ValueError(f"one choice ({self.choices[0]!r}) is no search: set it in base: (or the model's "
                                 "overrides:) instead, or give more choices")
        else:
            if self.low is None or self.high is None:
                raise ValueError(f"a {self.type} parameter needs 'low' and 'high'")
            if self.low > self.high:
                raise ValueError(f"low ({self.low}) is above high ({self.high})")
            if self.low == self.high:
                raise ValueError(f"low and high are both {self.low:g}: one value is no search; set it in base: (or "
                                 "the model's overrides:) instead, or widen the range")
            if self.type == "int" and not (float(self.low).is_integer() and float(self.high).is_integer()):
                raise ValueError(f"an int parameter needs whole-number bounds (got low {self.low:g}, high "
                                 f"{self.high:g}); for fractional values use type: float")
            if self.log and self.low <= 0:
                raise ValueError("log scale needs low > 0")
        if self.step is not None:
            if self.type != "int":
                raise ValueError(f"'step' is for int parameters (this one is {self.type})")
            if self.step < 1 or not float(self.step).is_integer():
                raise ValueError(f"step must be a whole number, at least 1 (got {self.step:g})")
            self.step = int(self.step)
            if self.log:
                raise ValueError("'step' and 'log' do not go together (Optuna draws a log-scale int range at every "
                                 "whole number); give one of them")
            assert self.low is not None and self.high is not None
            if (self.high - self.low) % self.step:
                raise ValueError(f"high ({self.high:g}) must be low ({self.low:g}) plus a multiple of step "
                                 f"({self.step}): e.g. high: {self.low + (self.high - self.low) // self.step * self.step:g}")
        return self


class SearchConfig(_Strict):
    """An Optuna study run through Ray: each trial is one job of the sweep and one MLflow child run."""

    params: dict[SweptKey, SearchParam]
    """Dotted config keys to search (`train.lr`, `model.num_heads`) and how to sample each."""
    n_trials: int = Field(gt=0, le=100_000)
    """Trials to complete (pruned trials count) before the study stops; at most 100,000, as a grid's jobs
    (`expand.MAX_JOBS`)."""
    metric: str = "eval/val/loss"
    """The logged metric to optimize; intermediate values of it drive pruning."""
    direction: Literal["minimize", "maximize"] = "minimize"
    """Optimization direction of `metric`."""
    sampler: Literal["tpe", "random"] = "tpe"
    """Optuna sampler."""
    pruner: Literal["median", "hyperband", "none"] = "median"
    """Optuna pruner fed with intermediate values of `metric` (step = tokens seen)."""
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    """Sampler seed, 0 to 2**32 - 1 (the study is reproducible given the same completion order)."""

    @field_validator("params")
    @classmethod
    def _keys_dotted(cls, v: dict) -> dict:
        if not v:
            raise ValueError("a search needs at least one parameter to search (e.g. train.lr: {type: float, low: "
                             "1.0e-4, high: 1.0e-2, log: true})")
        for key in v:
            if key == "train.seed":  # trials would differ by their noise, and the study rank it
                raise ValueError("'train.seed' is not searched: a search tunes one model with one seed (`seeds:`); "
                                 "to measure the spread over seeds, run the best trial's parameters as a grid sweep "
                                 "with several `seeds:`")
        return v


class SweepConfig(_Strict):
    """A whole sweep file."""

    KEYS_ELSEWHERE: ClassVar[dict[str, str]] = {
        "train": "did you mean base.train?", "data": "did you mean base.data?", "eval": "did you mean base.eval?",
        "model": "a model's keys go in models: [{preset: ..., overrides: {...}}]"}
    """Keys of a job's config written at the top of a sweep file: where they belong (`yamlio._describe`)."""

    name: str
    """Sweep name: the MLflow experiment and the folder under --root (letters, digits, '_', '-', '.')."""
    description: str = ""
    """Free text, logged on the parent MLflow run."""
    models: list[ModelArm] = Field(min_length=1)
    """The model arms."""
    base: dict[str, Any] = Field(default_factory=dict)
    """The JobConfig sections shared by every job: train, data, eval."""
    ablations: list[str | AblationRef] = Field(default_factory=list)
    """Ablation variants added next to each model's unablated job, for the families they fit."""
    controls: list[ControlRef | Literal["matched_state", "matched_params", "matched_wallclock"]] = Field(
        default_factory=list)
    """Derived equal-budget baselines for the residual models (docs/MATH.md; the paper's open question)."""
    grid: dict[SweptKey, list[Any]] = Field(default_factory=dict)
    """Dotted key -> values; every combination runs."""
    zip: dict[SweptKey, list[Any]] = Field(default_factory=dict)
    """Dotted key -> values; the i-th values run together (all lists the same length)."""
    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field(default_factory=lambda: [0])
    """Training seeds (train.seed, 0 to 2^63 - 1); each job runs once per seed."""
    resources: Resources = Field(default_factory=Resources)
    """What each job asks Ray for."""
    search: SearchConfig | None = None
    """An Optuna study over the base job instead of a fixed grid."""
    evals: EvalRequest | None = None
    """Downstream accuracy of every finished job after training (lm-evaluation-harness tasks)."""

    @field_validator("models", mode="before")
    @classmethod
    def _models_a_list(cls, v: Any) -> Any:
        if isinstance(v, str):  # `models: tiny-rla`
            raise ValueError(f"takes a list of models, each a mapping with its preset: write "
                             f"models: [{{preset: {v}}}] (or '- {{preset: {v}}}' on a line of its own below)")
        return v

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not NAME_RE.match(v):
            first = ("; it must start with a letter or digit ('_' names the shared server's folder, ROOT/_server, "
                     "and '.' a path of its own)" if v and not v[0].isalnum() else "")
            raise ValueError(f"use letters, digits, '_', '-' and '.' (it names a folder and an MLflow experiment)"
                             f"{first}")
        return v

    @field_validator("base")
    @classmethod
    def _base_sections(cls, v: dict) -> dict:
        extra = sorted(set(v) - {"train", "data", "eval"})
        if extra:
            raise ValueError(f"unknown section(s) {', '.join(extra)} in base; allowed: train, data, eval "
                             "(the model comes from 'models:')")
        train = v.get("train")
        if isinstance(train, dict) and "seed" in train:  # `seeds:` sets it for every job, over what base says
            raise ValueError(f"'train.seed' is not set in base: list the seeds under 'seeds:' (seeds: "
                             f"[{train['seed']}]); each job runs once per seed")
        return v

    @field_validator("ablations")
    @classmethod
    def _ablations_once(cls, v: list) -> list:
        names = [a if isinstance(a, str) else a.name for a in v]
        repeated = [n for n in dict.fromkeys(names) if names.count(n) > 1]
        if repeated:  # the second would be the same jobs again, or its families would contradict the first's
            raise ValueError(f"ablation{'s' if len(repeated) > 1 else ''} {', '.join(repeated)} listed more than "
                             "once; list each once (with families: [...] to limit it)")
        return v

    @field_validator("grid", "zip")
    @classmethod
    def _dotted(cls, v: dict) -> dict:
        for key, values in v.items():
            if not values:
                raise ValueError(f"'{key}' has no values")
            if key == "train.seed":  # `seeds:` sets it for every job, over whatever a point says
                raise ValueError(f"'train.seed' is not swept here: list the seeds under 'seeds:' (seeds: "
                                 f"{list(values)}); each job runs once per seed")
        return v

    @field_validator("grid")
    @classmethod
    def _grid_values_once(cls, v: dict) -> dict:
        # a repeated value would be one job listed twice (expansion keeps one): said, as for seeds. zip rows may
        # repeat a value of one key beside different values of another.
        import json

        def same(x):  # 1 and 1.0 are one value to a config's hash: one job
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                return float(x)
            if isinstance(x, list):
                return [same(y) for y in x]
            if isinstance(x, dict):
                return {k: same(y) for k, y in x.items()}
            return x

        for key, values in v.items():
            canon = [json.dumps(same(x), sort_keys=True) for x in values]
            repeated = [c for c in dict.fromkeys(canon) if canon.count(c) > 1]
            if repeated:  # each repeated value as the file spells it: "0.5", or "1 (as 1 and 1.0)"
                said = []
                for c in repeated:
                    spelled = list(dict.fromkeys(json.dumps(x, sort_keys=True) for x, c2 in zip(values, canon)
                                                 if c2 == c))
                    said.append(spelled[0] if len(spelled) == 1 else f"{spelled[0]} (as {' and '.join(spelled)})")
                raise ValueError(f"'{key}' lists {', '.join(said)} more than once; each value runs once")
        return v

    @field_validator("zip")
    @classmethod
    def _zip_lengths(cls, v: dict) -> dict:
        lengths = {k: len(vals) for k, vals in v.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError("zip lists must have the same length; got "
                             + ", ".join(f"{k}: {n}" for k, n in lengths.items()))
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("give at least one seed")
        repeated = sorted({s for s in v if v.count(s) > 1})
        if repeated:
            raise ValueError(f"seed{'s' if len(repeated) > 1 else ''} {', '.join(map(str, repeated))} "
                             "listed more than once; each seed runs once per job")
        return v

    @field_validator("zip")
    @classmethod
    def _not_in_grid(cls, v: dict, info: ValidationInfo) -> dict:
        # at zip's line (grid comes first in the file's fields): said where the second listing is
        both = set(info.data.get("grid") or {}) & set(v)
        if both:
            raise ValueError(f"key(s) {', '.join(sorted(both))} are in both grid and zip; list each in one of them")
        # a search with a grid or zip at all is refused at that section's line (expand: one model, one seed)
        return v
