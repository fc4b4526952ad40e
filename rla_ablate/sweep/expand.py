"""Expansion: a sweep file becomes a flat, ordered list of fully resolved jobs before anything is scheduled.

Order (deterministic): model arm, grid/zip point, variant (unablated first, then ablations in file order),
seed; then the derived controls in the same order. Every problem is a `UserError` naming the line of the
sweep file it comes from: unknown presets, ablations and config keys, an ablation that does not fit a
family, values a config rejects.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from rla_ablate.config import LocatedYAML, load_yaml
from rla_ablate.config.dotted import KeyPathError, set_dotted
from rla_ablate.config.yamlio import count_problems, format_validation_error, user_loc, validation_message
from rla_ablate.errors import UserError, did_you_mean
from rla_ablate.sweep.identity import series_id_from_sections
from rla_ablate.sweep.ids import hash_text, join_sections, section_json
from rla_ablate.sweep.schema import AblationRef, ControlRef, SweepConfig

if TYPE_CHECKING:
    from rla_ablate.train.job import JobConfig


@dataclass
class ResolvedJob:
    """One job of a sweep: a resolved `JobConfig` and how it came about."""

    job_id: str
    name: str
    family: str
    ablations: list[str]
    seed: int
    job: BaseModel
    """The resolved `rla_ablate.train.JobConfig`."""
    point: dict[str, Any] = field(default_factory=dict)
    """The grid/zip/search values that produced it."""
    control_of: str | None = None
    """For a derived control: the name of the residual job whose budget it matches."""
    control_report: dict[str, Any] | None = None
    """For a derived control: what else moved when the baseline was widened."""
    arm: int = 0
    """Index of the model arm (in `models:`) it comes from."""
    arm_label: str = ""
    """The arm's label: its `name:`, else its preset."""
    preset: str = ""
    """The arm's preset (name or path)."""
    control: str | None = None
    """For a derived control: its name as in the job name (matched_state, matched_state[heads], ...)."""
    series: str = ""
    """The series id: the hash of the resolved config without the seed (`rla_ablate.sweep.identity`)."""

    @property
    def tokens_target(self) -> int:
        """The tokens the job trains on: `train.tokens` rounded up to whole batches (a matched wall-clock control's
        budget, the reference's tokens times a speed ratio, is seldom a whole number of batches)."""
        return int(self.job.train.total_tokens)

    def identity_tags(self) -> dict[str, str]:
        """The tags that name this job's series in MLflow: arm, preset, control, point.<key>, series."""
        from rla_ablate.sweep.identity import identity_tags

        return identity_tags(arm=self.arm_label, preset=self.preset, control=self.control, series=self.series,
                             point=self.point)

    def describe(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "name": self.name, "family": self.family, "ablations": list(self.ablations),
                "seed": self.seed, "point": dict(self.point), "control_of": self.control_of,
                "control_report": self.control_report, "arm": self.arm_label, "preset": self.preset,
                "control": self.control, "series": self.series}


@dataclass
class Sweep:
    """A validated sweep file and its expansion."""

    config: SweepConfig
    source: LocatedYAML
    jobs: list[ResolvedJob]

    @property
    def name(self) -> str:
        return self.config.name


# More jobs than any sweep means to run: a typo in a grid (a list of 1000 values) would otherwise spend minutes
# and gigabytes expanding before anything is said.
MAX_JOBS = 100_000


def count_jobs(cfg: SweepConfig) -> tuple[int, list[tuple[str, int]]]:
    """An upper bound on the jobs `expand` makes (deduplication can only lower it), counted without expanding,
    and the factors that multiply to it: (key, count)."""
    factors = [("models", len(cfg.models))]
    factors += [(f"grid.{k}", len(v)) for k, v in cfg.grid.items()]
    if cfg.zip:
        factors.append((f"zip ({', '.join(cfg.zip)})", min(len(v) for v in cfg.zip.values())))
    variants = 1 + len(cfg.ablations) + len(cfg.controls)
    factors += [("variants (1 + ablations + controls)", variants), ("seeds", len(cfg.seeds))]
    total = 1
    for _, n in factors:
        total *= n
    return total, factors


def check_job_count(cfg: SweepConfig, located: LocatedYAML) -> None:
    total, factors = count_jobs(cfg)
    if total > MAX_JOBS:
        big = max(factors, key=lambda f: f[1])[0]
        path = (("grid", big[len("grid."):]) if big.startswith("grid.") else ("zip",) if big.startswith("zip")
                else ("ablations",) if big.startswith("variants") else (big,))
        product = " x ".join(f"{n:,} {key}" for key, n in factors if n != 1)
        raise _err(located, path,
                   f"the sweep expands to up to {total:,} jobs ({product}), more than {MAX_JOBS:,}; shrink the "
                   "largest of these")


def check_sweep_file(path: str | Path) -> None:
    """A UserError unless `path` is a file (`check_file`); a sweep's name given where its file belongs (`plan
    smoke`) is pointed at the file of that name."""
    from rla_ablate.config.yamlio import check_file

    path = Path(path)
    if not path.exists() and path.suffix not in (".yaml", ".yml"):
        near = [p for p in (path.with_suffix(".yaml"), Path("sweeps") / f"{path.name}.yaml") if p.is_file()]
        if near:
            raise UserError(f"no such file (did you mean {near[0]}? plan and launch take a sweep file; status, "
                            "results and dashboard also take a sweep's name)", file=str(path))
    check_file(path, "a sweep file (YAML), e.g. sweeps/smoke.yaml")


def load_sweep(path: str | Path) -> Sweep:
    """Load, validate and expand a sweep file; raises `UserError` on any problem, before anything runs."""
    located = load_yaml(path)
    if not isinstance(located.data, dict):
        raise UserError("a sweep file is a mapping with at least 'name' and 'models'", file=located.file, line=1)
    cfg, problems = _sweep_config(located)
    if cfg.search is not None:
        for key, bad in (("models", len(cfg.models) != 1), ("seeds", len(cfg.seeds) != 1), ("grid", bool(cfg.grid)),
                         ("zip", bool(cfg.zip)), ("ablations", bool(cfg.ablations)), ("controls", bool(cfg.controls))):
            if bad:
                raise _err(located, (key,), "a search sweep tunes one model with one seed: give exactly one model "
                                            "and one seed, and no grid, zip, ablations or controls")
    problems += _first_jobs_problems(cfg, located)
    if problems:
        raise one_report(problems, located.file)
    check_job_count(cfg, located)
    jobs = expand(cfg, located)
    check_vocab(jobs, located)
    check_device(cfg, located, jobs)
    if cfg.search is not None:
        check_search(cfg, located)
    return Sweep(config=cfg, source=located, jobs=jobs)


def _sweep_config(located: LocatedYAML) -> tuple[SweepConfig, list[UserError]]:
    """The validated sweep config, and the problems to report with what the jobs' checks find. Where the file's
    only problems are unknown top-level keys, the rest of it is read without them, so that a misspelt section and
    a bad value elsewhere are said in one report rather than one run each; so are the problems of sections the
    jobs' checks do not read (ablations, controls, resources, search)."""
    try:
        return SweepConfig.model_validate(located.data), []
    except ValidationError as exc:
        first = format_validation_error(exc, SweepConfig, located)
        wrong = {err["loc"][0] for err in exc.errors() if err["loc"]}
    except ValueError as exc:
        raise UserError(str(exc), file=located.file) from None
    # what the jobs' checks read is left whole: a problem there (or of the file as a whole) is the report
    if not wrong or wrong & {"name", "models", "base", "grid", "zip", "seeds"}:
        raise first
    try:
        cfg = SweepConfig.model_validate({k: v for k, v in located.data.items() if k not in wrong})
    except (ValidationError, ValueError):
        raise first from None
    return cfg, [first]


def _first_jobs_problems(cfg: SweepConfig, located: LocatedYAML) -> list[UserError]:
    """What each arm's first job has wrong, every independent problem at once: the arm itself (its preset and
    overrides), the swept model keys at the first grid point, the job built from the base (with the arm's own
    base) at that point's other keys, and a search's metric against that job. `expand` stops at the first problem;
    this sees the ones it would meet one run after another."""
    r = _Resolver(cfg, located)
    problems: list[UserError] = []
    point = grid_points(cfg)[0]
    families = []
    for i in range(len(cfg.models)):
        try:
            model_cfg = r.arm(i)
        except UserError as exc:
            problems.append(exc)
            continue
        families.append(str(model_cfg.family))
        try:
            model_cfg = r.model(i, model_cfg, point, None)
        except UserError as exc:  # the job is then checked with the arm's own model
            problems.append(exc)
        try:
            job, _, _ = r.job(model_cfg, point, cfg.seeds[0], i)
            if cfg.search is not None:
                check_search_metric(cfg, located, job)
        except UserError as exc:
            problems.append(exc)
    if len(families) == len(cfg.models):
        try:
            check_ablations(cfg, located, families, r.M.ABLATIONS)
        except UserError as exc:
            problems.append(exc)
    return problems  # the arms that share a base meet its problems each: `one_report` says them once


def one_report(problems: list[UserError], file: str) -> UserError:
    """One UserError for several: the one itself, or 'N problems' and a line each, in the file's order (a problem
    that is itself a report of several gives its lines). A problem met twice (the base two arms share) is said once,
    and so is one line of the file read twice (a YAML anchor that two arms' `base:` share), at its first key."""
    lines: list[tuple[int | None, str, UserError | None]] = []
    for p in problems:
        head, _, body = p.message.partition("\n")
        if body and head.endswith(" problems"):
            for text in body.splitlines():
                number = text[len(file) + 1:].split(":", 1)[0] if text.startswith(file + ":") else ""
                lines.append((int(number) if number.isdigit() else None, text, None))
        else:
            lines.append((p.line, str(p), p))
    said: set[tuple[int | None, str]] = set()
    kept = []
    for number, text, source in lines:
        # the same problem of the same key, whichever arm's: without the file:line and the arm's number (a problem
        # without a line: its whole text)
        what = text if number is None else re.sub(r"^models\.\d+\.", "models.*.", text.split(": ", 1)[-1])
        if (number, what) not in said:
            kept.append((number, text, source))
        said.add((number, what))
    if len(kept) == 1:
        number, text, source = kept[0]
        return source if source is not None else UserError(text.split(": ", 1)[-1], file=file, line=number)
    kept.sort(key=lambda item: (item[0] is None, item[0] or 0))
    return UserError(f"{len(kept)} problems\n" + "\n".join(text for _, text, _ in kept), file=file)


def device_line(located: LocatedYAML, field: str = "device") -> int | None:
    """The first line of the sweep file that sets train.<field> (in base, an arm, a grid), else the base's train."""
    lines = sorted(ln for path, ln in located.lines.items()
                   if path[-2:] == ("train", field) or (path and path[-1] == f"train.{field}"))
    return lines[0] if lines else located.line(("base", "train", field))


def refuse_cuda_jobs(jobs: list[ResolvedJob], located: LocatedYAML, reason: str) -> None:
    """A UserError where any of `jobs` needs CUDA: 'N job(s) need CUDA (...) (the first's name, ...) <reason>', at
    the line of the train field that asks for it (device where a job sets device cuda, else cuda_graphs)."""
    named = [j.name for j in jobs if j.job.train.needs_cuda]
    if not named:
        return
    field = "device" if any(j.job.train.device == "cuda" for j in jobs) else "cuda_graphs"
    raise UserError(f"{len(named)} job(s) need CUDA (train.device cuda or train.cuda_graphs) "
                    f"({named[0]}{', ...' if len(named) > 1 else ''}) {reason}",
                    file=located.file, line=device_line(located, field), key=f"train.{field}")


def check_device(cfg: SweepConfig, located: LocatedYAML, jobs: list[ResolvedJob]) -> None:
    """Jobs that train on cuda need a GPU share: with `resources.gpus: 0` their tasks would hold none and fail."""
    res = cfg.resources
    if not res.auto and float(res.gpus) == 0:
        refuse_cuda_jobs(jobs, located, "but resources.gpus is 0, so their tasks hold no GPU; allowed: resources.gpus "
                         "auto or above 0, or train.device auto or cpu and train.cuda_graphs false")


def _fractional_point(low: float, high: float) -> float:
    """A point strictly inside (low, high) that is not a whole number."""
    for frac in (0.381966, 0.5, 0.25, 0.75):
        x = low + (high - low) * frac
        if low < x < high and not float(x).is_integer():
            return x
    return low + (high - low) * 0.381966


INSIDE_CHECKED = 64  # an int range of at most this many values is checked at every one, a wider one at 16 points


def _check_inside(cfg: SweepConfig, located: LocatedYAML, key: str, low: int, high: int, step: int = 1) -> None:
    """The values an int range's trials draw between its ends (every step-th from low) build valid jobs (a batch
    size whose ends divide the batch and whose inside values do not): a trial that draws a refused value has no job
    to run. Names the first refused value and, for a range checked at every value, the choices that work."""
    n = (high - low) // step  # the values drawn are low + i * step, i = 0 .. n
    if n < 2:
        return
    whole = n + 1 <= INSIDE_CHECKED
    inside = [low + i * step for i in (range(1, n) if whole else sorted({n * j // 17 for j in range(1, 17)} - {0, n}))]
    refused: dict[int, str] = {}
    for value in inside:
        try:
            expand(cfg, located, points=[{key: value}])
        except UserError as exc:
            refused[value] = exc.message
    if not refused:
        return
    first = min(refused)
    works = [v for v in range(low, high + 1, step) if v not in refused] if whole else None
    drawn = "every whole number" if step == 1 else f"every {step}th whole number from low"
    raise _err(located, ("search", "params", key),
               f"its ends validate, but the trials draw {drawn} between them, and {key} = {first} is "
               f"refused ({refused[first]})"
               + (f"; list the values that work instead: {{type: categorical, choices: [{', '.join(map(str, works))}]}}"
                  if works else "; narrow the range, give it a step, or list the values that work: type: "
                  "categorical, choices: [...]"))


JOINT_CHECKED = 64  # a search's keys are checked together at every combination of their choices and ends up to this


def _check_search_key(cfg: SweepConfig, located: LocatedYAML, key: str, p: Any, ends: list[dict[str, Any]]) -> None:
    """One search key alone: its choices, or its range at both ends, inside (int) and at a fraction (float)."""
    values = list(p.choices or []) if p.type == "categorical" else [ends[0][key], ends[1][key]]
    for value in values:
        try:
            expand(cfg, located, points=[{key: value}])
        except UserError as exc:
            if (exc.key or "").startswith("search."):  # said at the search's key already
                raise
            # said at the search's key, where the value is written, and with the key the job refused it at
            at = f" ({exc.key})" if exc.key and exc.key != key else ""
            raise _err(located, ("search", "params", key),
                       f"the trials would draw {key} = {value!r}, which is refused{at}: {exc.message}") from None
    if p.type == "int":
        _check_inside(cfg, located, key, int(ends[0][key]), int(ends[1][key]), p.step or 1)
    if p.type == "float" and p.low is not None and p.high is not None and p.low < p.high:
        x = _fractional_point(p.low, p.high)
        try:
            expand(cfg, located, points=[{key: x}])
        except UserError as exc:
            raise _err(located, ("search", "params", key, "type"),
                       f"its ends validate, but the trials draw fractions such as {x:.4g} from the range, and "
                       f"{key} refuses them ({exc.message}); use type: int") from None


def check_search(cfg: SweepConfig, located: LocatedYAML) -> None:
    """A search's keys and ranges build valid jobs (its metric: `check_search_metric`): caught here, by `plan` and
    before a launch starts anything, not when the first trial is asked for or after every trial has run."""
    assert cfg.search is not None
    params = cfg.search.params
    ends: list[dict[str, Any]] = [{}, {}]
    for key, p in params.items():
        if p.type == "categorical":
            assert p.choices  # SearchParam requires a non-empty list
            ends[0][key], ends[1][key] = p.choices[0], p.choices[-1]
        else:
            cast = int if p.type == "int" else float
            ends[0][key], ends[1][key] = cast(p.low), cast(p.high)
    # Each key alone first, so that a bad value is reported at its own key and line: every categorical choice, the
    # numeric ranges at both ends, each float range also at a point inside it with a fraction (its ends may be whole
    # numbers that an int key accepts, and the trials' draws are not); then all keys together at both ends. The
    # keys' own problems are independent of each other: one report says them all.
    problems: list[UserError] = []
    for key, p in params.items():
        try:
            _check_search_key(cfg, located, key, p, ends)
        except UserError as exc:
            problems.append(exc)
    if problems:
        raise one_report(problems, located.file)
    # then all keys together: refused where no combination of their choices and range ends builds a job (every one
    # of them up to JOINT_CHECKED, else the two corners: every low end or first choice, every high end or last).
    # Some combinations may fail in a space whose others work (a batch size against a sequence length), and the
    # order of a key's choices is no order of the space: a trial that draws a combination no job takes fails and
    # the search goes on (`search.py`)
    sides = [list(p.choices or []) if p.type == "categorical" else [ends[0][k], ends[1][k]] for k, p in params.items()]
    combos = [dict(zip(params, values)) for values in itertools.product(*sides)]
    points = combos if len(combos) <= JOINT_CHECKED else ends
    refused = []
    for point in points:
        try:
            expand(cfg, located, points=[point])
            break
        except UserError as exc:
            refused.append((point, exc))
    if len(refused) == len(points):
        point, exc = refused[0]
        drawn = ", ".join(f"{k} = {v!r}" for k, v in point.items())
        which = "combination of their choices and range ends" if points is combos else "corner of the space"
        raise _err(located, ("search", "params"),
                   f"the searched keys together build no job at any {which}; at {drawn}: "
                   f"{exc.message}{f' ({exc.key})' if exc.key else ''}")


def check_search_metric(cfg: SweepConfig, located: LocatedYAML, base: JobConfig) -> None:
    """A search's metric is one its trials log (`base`: the first trial's JobConfig), and its direction seeks the
    better model. Checked with the file's other problems (`_first_jobs_problems`): it needs the job, not the whole
    expansion."""
    from rla_ablate.train.job import GPU_METRICS

    assert cfg.search is not None
    metric, device = cfg.search.metric, base.train.device
    on_cpu = device == "cpu" or (cfg.resources.gpus == 0 and device != "cuda")
    if on_cpu and metric in GPU_METRICS:
        raise _err(located, ("search", "metric"),
                   f"'{metric}' is logged by jobs on a GPU only, and this sweep's trials train on the CPU "
                   f"({'train.device cpu' if device == 'cpu' else 'resources.gpus 0'}): no trial "
                   "would report a value")
    allowed = base.logged_metrics(on_gpu=not on_cpu)
    if metric not in allowed:
        raise _err(located, ("search", "metric"),
                   f"no trial logs '{metric}'{did_you_mean(metric, allowed)}; the trials log: {', '.join(allowed)}")
    from rla_ablate.train.job import better_direction

    better = better_direction(metric)
    if better is not None and cfg.search.direction != better:
        raise _err(located, ("search", "direction"),  # the search's line where the file leaves it at its default
                   f"{cfg.search.direction}{'' if 'direction' in cfg.search.model_fields_set else ' (the default)'} "
                   f"{metric}, which is {'higher' if better == 'maximize' else 'lower'}"
                   f" for a better model: the search would look for the worst one; allowed: direction: {better}")


def check_vocab(jobs: list[ResolvedJob], located: LocatedYAML) -> None:
    """Every model's vocabulary covers its data's token ids, and every eval set's text is tokenized as its training
    data's (caught here, not in a worker an hour later)."""
    from rla_ablate.data import tokenizer_mismatch, vocab_size
    from rla_ablate.sweep.ids import canonical_json

    def cached(fn):
        """`fn` of data configs, once per config: jobs share their data objects, and distinct objects with equal
        configs share the answer (a tokenizer file is read once)."""
        by_json: dict[tuple, Any] = {}
        by_object: dict[tuple, Any] = {}

        def call(*data: BaseModel):
            ids = tuple(id(d) for d in data)
            if ids not in by_object:
                key = tuple(canonical_json(d) for d in data)
                if key not in by_json:
                    by_json[key] = fn(*data)
                by_object[ids] = by_json[key]
            return by_object[ids]

        return call

    need, mismatch = cached(vocab_size), cached(tokenizer_mismatch)
    for job in jobs:
        want = max([need(job.job.data)] + [need(e.data) for e in job.job.eval])
        if job.job.model.vocab_size < want:
            raise _err(located, ("models", job.arm),
                       f"the model's vocab_size is {job.job.model.vocab_size} but the data needs {want} token ids "
                       f"(bytes + end-of-document = 257); add `overrides: {{vocab_size: {want}}}`")
        for i, e in enumerate(job.job.eval):
            why = mismatch(job.job.data, e.data)
            if why:
                data = located.data if isinstance(located.data, dict) else {}
                arms = data.get("models")
                arm = arms[job.arm] if isinstance(arms, list) and job.arm is not None and job.arm < len(arms) else {}
                own = isinstance(arm, dict) and isinstance(arm.get("base"), dict) and "eval" in arm["base"]
                shared = isinstance(data.get("base"), dict) and "eval" in data["base"]
                if not own and not shared:  # the built-in eval set, which reads the embedded corpus as bytes
                    raise _err(located, ("base",),
                               f"job {job.name}: the file gives no eval: and the built-in eval set reads UTF-8 bytes, "
                               "while the training data has another tokenizer: add base: eval: [{name: val, data: "
                               "{...}}] with data tokenized as the training data's")
                raise _err(located, ("models", job.arm, "base", "eval", i) if own else ("base", "eval", i),
                           f"job {job.name}, eval set '{e.name}': {why}")


def _err(located: LocatedYAML, path: tuple, message: str) -> UserError:
    return UserError(message, file=located.file, line=located.line(path), key=".".join(str(p) for p in path))


def grid_points(cfg: SweepConfig) -> list[dict[str, Any]]:
    """Every combination of `grid` crossed with the rows of `zip` (one empty point when both are empty)."""
    grid_keys = list(cfg.grid)
    combos = list(itertools.product(*(cfg.grid[k] for k in grid_keys))) or [()]
    zip_keys = list(cfg.zip)
    rows = list(zip(*(cfg.zip[k] for k in zip_keys))) if zip_keys else [()]
    points = []
    for combo in combos:
        for row in rows:
            point = dict(zip(grid_keys, combo))
            point.update(zip(zip_keys, row))
            points.append(point)
    return points


def _one_job_twice(cfg: SweepConfig, located: LocatedYAML, first: dict[str, Any], again: dict[str, Any]) -> UserError:
    """Two grid points (or zip rows) that validate to one job, as 1 and 1.0, or true and 1 for a switch: said
    rather than run once silently, as an exact repeat is (schema)."""
    import json

    def spelled(x: Any) -> str:
        return json.dumps(x, sort_keys=True)

    keys = [k for k in again if spelled(again[k]) != spelled(first[k])]
    if not keys:  # identical zip rows
        key = next(iter(cfg.zip))
        return _err(located, ("zip", key), "two rows are the same; each row runs once")
    section = "grid" if keys[0] in cfg.grid else "zip"
    values = " and ".join(", ".join(spelled(p[k]) for k in keys) for p in (first, again))
    what = values if len(keys) == 1 else f"{', '.join(keys)} = {values}"
    return _err(located, (section, keys[0]), f"{what} make one job (the config reads them as the same value); list "
                                             "each value once")


def _point_label(point: dict[str, Any]) -> str:
    return ",".join(f"{k.split('.', 1)[1]}={v}" for k, v in point.items())


class _Resolver:
    """Builds JobConfigs, caching model configs (they do not depend on seed or train keys: 10,000 jobs plan fast)."""

    def __init__(self, cfg: SweepConfig, located: LocatedYAML):
        from rla_ablate import models as M
        from rla_ablate.train import JobConfig

        self.cfg, self.located, self.M, self.JobConfig = cfg, located, M, JobConfig
        self._model_cache: dict[tuple, BaseModel] = {}
        self._job_cache: dict[tuple, tuple[BaseModel, dict[str, str]]] = {}

    def arm(self, i: int) -> BaseModel:
        arm = self.cfg.models[i]
        try:
            base = self.M.load_preset(arm.preset)
        except UserError as exc:
            raise _err(self.located, ("models", i, "preset"), str(exc)) from None
        except (FileNotFoundError, KeyError, ValueError):
            names = list(self.M.list_presets())
            raise _err(self.located, ("models", i, "preset"),
                       f"unknown preset '{arm.preset}'{did_you_mean(arm.preset, names)}; available: "
                       f"{', '.join(names)} or a path to a .yaml file") from None
        if not arm.overrides:
            return base
        data = base.model_dump()
        for key, value in arm.overrides.items():
            try:
                set_dotted(data, key, value)
            except KeyPathError as exc:
                raise _err(self.located, ("models", i, "overrides", key), str(exc)) from None
        try:
            return type(base).model_validate(data)
        except ValidationError as exc:
            # a problem of one overridden key is said at that key's line; others (a check across keys) at overrides:
            keys = {str(e["loc"][0]) for e in exc.errors() if e.get("loc")}
            at = keys.pop() if len(keys) == 1 and next(iter(keys)) in arm.overrides else None
            where = ("models", i, "overrides", at) if at else ("models", i, "overrides")
            raise _err(self.located, where, validation_message(exc, type(base), at=at)) from None

    def model(self, i: int, arm_cfg: BaseModel, point: dict[str, Any], ablation: str | None) -> BaseModel:
        model_keys = tuple((k, repr(v)) for k, v in point.items() if k.startswith("model."))
        cache_key = (i, model_keys, ablation)
        if cache_key in self._model_cache:
            return self._model_cache[cache_key]
        cfg = arm_cfg
        if model_keys:
            data = cfg.model_dump()
            for k, v in point.items():
                if k.startswith("model."):
                    try:
                        set_dotted(data, k.split(".", 1)[1], v)
                    except KeyPathError as exc:
                        raise _err(self.located, self._key_path(k), str(exc)) from None
            try:
                cfg = type(cfg).model_validate(data)
            except ValidationError as exc:
                key = next(k for k in point if k.startswith("model."))
                raise _err(self.located, self._key_path(key),
                           validation_message(exc, type(cfg), "model.", at=key)) from None
        if ablation is not None:
            cfg = self.M.ABLATIONS[ablation].apply(cfg)
        self._model_cache[cache_key] = cfg
        return cfg

    def job(self, model_cfg: BaseModel, point: dict[str, Any], seed: int,
            arm: int | None = None) -> tuple[BaseModel, str, str]:
        """The resolved JobConfig, its id and its series id. Validated in full once per model and point; seeds
        vary `train.seed` on a copy (no validator reads it), and the id re-encodes only the train section. The
        series id does not depend on the seed, so it is hashed once per model and point."""
        rest = tuple((k, repr(v)) for k, v in point.items() if not k.startswith("model."))
        own = arm is not None and bool(self.cfg.models[arm].base)
        key = (id(model_cfg), rest, arm if own else None)
        hit = self._job_cache.get(key)
        if hit is None:
            job = self._validate_job(model_cfg, point, seed, arm if own else None)
            dump = job.model_dump(mode="json")
            sections = {k: section_json(v) for k, v in dump.items()}
            hit = self._job_cache[key] = (job, sections, series_id_from_sections(sections, dump["train"]))
        job, sections, series = hit
        if job.train.seed != seed:
            job = job.model_copy(update={"train": job.train.model_copy(update={"seed": seed})})
            sections = dict(sections, train=section_json(job.train.model_dump(mode="json")))
        return job, hash_text(join_sections(sections)), series

    def _validate_job(self, model_cfg: BaseModel, point: dict[str, Any], seed: int,
                      arm: int | None = None) -> BaseModel:
        data = copy.deepcopy(self.cfg.base)
        if not isinstance(data.setdefault("train", {}), dict):
            train = data["train"]
            got = "nothing" if train is None else type(train).__name__
            raise _err(self.located, ("base", "train"),
                       f"must be a mapping of train keys, e.g. {{tokens: 8192, lr: 3.0e-3}} (got {got})")
        if arm is not None:
            own = copy.deepcopy(self.cfg.models[arm].base)
            data["train"].update(own.pop("train", {}))
            data.update(own)
        for k, v in point.items():
            if not k.startswith("model."):
                try:
                    set_dotted(data, k, v)
                except KeyPathError as exc:
                    raise _err(self.located, self._key_path(k), str(exc)) from None
        data["train"]["seed"] = seed
        data["model"] = model_cfg
        try:
            return self.JobConfig.model_validate(data)
        except ValidationError as exc:
            raise self._job_error(exc, arm) from None

    def _key_path(self, key: str) -> tuple:
        """Where a swept key sits in the sweep file."""
        if key in self.cfg.grid:
            return ("grid", key)
        if key in self.cfg.zip:
            return ("zip", key)
        return ("search", "params", key)

    def _job_error(self, exc: ValidationError, arm: int | None = None) -> UserError:
        """Point at the sweep line the bad value came from: a grid/zip key, the arm's own base, or the base."""
        loc = user_loc(exc, self.JobConfig)
        swept = list(itertools.chain(self.cfg.grid, self.cfg.zip,
                                     (self.cfg.search.params if self.cfg.search else {})))

        def swept_key(at: tuple) -> str | None:
            """The swept key a problem is at or under ('train.lr' is not under 'train.l', nor 'train.lrr' under
            'train.lr')."""
            dotted = ".".join(str(p) for p in at)
            hits = [key for key in swept if dotted == key or dotted.startswith(key + ".")]
            return max(hits, key=len) if hits else None

        def section(at: tuple) -> tuple:
            return ("models", arm, "base") if arm is not None and self._arm_sets(arm, at) else ("base",)

        def source(at: tuple) -> tuple:
            """Where in the file a problem's value comes from: its swept key's line, else its section's key."""
            key = swept_key(at)
            return self._key_path(key) if key is not None else section(at) + at

        if count_problems(exc, self.JobConfig) > 1:  # a line each, at the line it comes from
            return format_validation_error(exc, self.JobConfig, self.located, where=source)
        key = swept_key(loc)
        if key is not None:
            return _err(self.located, self._key_path(key), validation_message(exc, self.JobConfig, at=key))
        where = section(loc)
        dotted = ".".join(str(p) for p in loc)
        prefix = ".".join(str(p) for p in where) + "."
        at = prefix + dotted if dotted else prefix.rstrip(".")  # a check of the whole job: reported at its section
        return _err(self.located, where + loc, validation_message(exc, self.JobConfig, prefix, at=at))

    def _arm_sets(self, arm: int, loc: tuple) -> bool:
        """Whether the value at `loc` of an arm's jobs comes from the arm's own `base:` (whose `train` keys join the
        sweep's base train section, and whose other sections replace the base's)."""
        own = self.cfg.models[arm].base or {}
        if not loc or loc[0] not in own:
            return False
        return loc[0] != "train" or (len(loc) > 1 and loc[1] in (own.get("train") or {}))


def _ablation_refs(cfg: SweepConfig) -> list[AblationRef]:
    return [AblationRef(name=a) if isinstance(a, str) else a for a in cfg.ablations]


def _control_refs(cfg: SweepConfig) -> list[ControlRef]:
    return [ControlRef(name=c) if isinstance(c, str) else c for c in cfg.controls]


def check_ablations(cfg: SweepConfig, located: LocatedYAML, arm_families: list[str], registry: dict) -> dict[int, list[str]]:
    """For each ablation (by position): the arm families it will be applied to. Errors name the line."""
    from rla_ablate.models.ablations import not_an_ablation
    from rla_ablate.models.config import FAMILIES

    present = sorted(set(arm_families))
    out: dict[int, list[str]] = {}
    for j, ref in enumerate(_ablation_refs(cfg)):
        path = ("ablations", j)
        if (control := not_an_ablation(ref.name)) is not None:
            raise _err(located, path, control)
        if ref.name not in registry:
            names = sorted(registry)
            raise _err(located, path, f"unknown ablation '{ref.name}'{did_you_mean(ref.name, names)}; "
                                      f"allowed: {', '.join(names)}")
        fits = list(registry[ref.name].families)
        if ref.families is not None:
            for fam in ref.families:
                if fam not in FAMILIES:
                    raise _err(located, path + ("families",), f"'{fam}' is not a family{did_you_mean(fam, FAMILIES)}; "
                                                              f"allowed: {', '.join(FAMILIES)}")
                if fam not in fits:
                    raise _err(located, path + ("families",),
                               f"ablation '{ref.name}' does not apply to family '{fam}'; it applies to {', '.join(fits)}")
                if fam not in present:
                    raise _err(located, path + ("families",),
                               f"family '{fam}' has no model in this sweep; models here: {', '.join(present)}")
            out[j] = list(ref.families)
        else:
            hit = [f for f in present if f in fits]
            if not hit:
                raise _err(located, path, f"ablation '{ref.name}' applies to {', '.join(fits)}; "
                                          f"this sweep's models are {', '.join(present)}")
            out[j] = hit
    return out


def expand(cfg: SweepConfig, located: LocatedYAML, points: list[dict[str, Any]] | None = None) -> list[ResolvedJob]:
    """The sweep's jobs, in a fixed order, each with its id; `points` replaces the grid (used by search)."""
    r = _Resolver(cfg, located)
    arms = [r.arm(i) for i in range(len(cfg.models))]
    labels = [a.name or a.preset for a in cfg.models]
    if len(set(labels)) != len(labels):
        dup = next(lab for lab in labels if labels.count(lab) > 1)
        raise _err(located, ("models",), f"two models are labelled '{dup}'; give one a 'name:'")
    families = [str(a.family) for a in arms]
    ablation_refs = _ablation_refs(cfg)
    targets = check_ablations(cfg, located, families, r.M.ABLATIONS)
    controls = _control_refs(cfg)
    check_controls(controls, located, families, r.M.BASELINE_OF)
    from_grid = points is None
    if points is None:
        points = grid_points(cfg)

    jobs: list[ResolvedJob] = []
    seen: dict[str, str] = {}
    made_by: dict[tuple[int, str], dict[str, Any]] = {}  # (arm, job id) -> the grid point of that plain job

    def add(job: ResolvedJob) -> None:
        # Two routes to one config (e.g. an ablation that changes nothing for this preset) run once.
        if job.job_id in seen:
            return
        seen[job.job_id] = job.name
        jobs.append(job)

    for i, arm_cfg in enumerate(arms):
        for point in points:
            variants: list[str | None] = [None] + [ref.name for j, ref in enumerate(ablation_refs)
                                                   if families[i] in targets[j]]
            for ablation in variants:
                model_cfg = r.model(i, arm_cfg, point, ablation)
                for seed in cfg.seeds:
                    job, jid, series = r.job(model_cfg, point, seed, i)
                    # a control derived from two points may well be one job (its baseline ignores a residual
                    # setting): only an arm's plain jobs are checked
                    if from_grid and ablation is None and made_by.setdefault((i, jid), point) is not point:
                        raise _one_job_twice(cfg, located, made_by[(i, jid)], point)
                    name = "/".join(p for p in (labels[i], ablation, _point_label(point), f"seed{seed}") if p)
                    add(ResolvedJob(job_id=jid, name=name, family=str(model_cfg.family),
                                    ablations=[ablation] if ablation else [], seed=seed, job=job, point=dict(point),
                                    arm=i, arm_label=labels[i], preset=cfg.models[i].preset, series=series))

    for j, ref in enumerate(controls):
        check_speeds(ref, j, located)
        if ref.name == "matched_wallclock":
            for job in _wallclock_controls(r, cfg, j, ref, arms, families, labels, points):
                add(job)
            continue
        derive = r.M.matched_state if ref.name == "matched_state" else r.M.matched_params
        for i, arm_cfg, baseline in _control_targets(ref, arms, families):
            for point in points:
                target_cfg = r.model(i, arm_cfg, point, None)
                try:
                    derived = derive(target_cfg, baseline, axis=ref.axis)
                except ValueError as exc:
                    raise _err(located, ("controls", j), f"cannot derive {ref.name} for '{labels[i]}': {exc}") from None
                model_cfg, report = derived.config, derived.summary()
                for seed in cfg.seeds:
                    job, jid, series = r.job(model_cfg, point, seed, i)
                    target_name = "/".join(p for p in (labels[i], _point_label(point)) if p)
                    tag = ref.name if ref.axis == "expand_v" else f"{ref.name}[{ref.axis}]"
                    name = "/".join(p for p in (f"{baseline}~{tag}({labels[i]})", _point_label(point),
                                                f"seed{seed}") if p)
                    # A control's arm is the residual arm it is derived from: the pairing of matched-state
                    # claims prefers it when several arms of that family exist.
                    add(ResolvedJob(job_id=jid, name=name, family=baseline, ablations=[ref.name], seed=seed,
                                    job=job, point=dict(point), control_of=target_name, control_report=report,
                                    arm=i, arm_label=labels[i], preset=cfg.models[i].preset, control=tag,
                                    series=series))
    return jobs


def check_controls(controls: list[ControlRef], located: LocatedYAML, families: list[str],
                   baseline_of: dict[str, str]) -> None:
    """Each control names residual families this sweep has, asks an axis only where it widens a baseline, and asks
    no (control, axis, family) another entry already asked (it would be merged without a word)."""
    from rla_ablate.models.config import FAMILIES

    residual, present = sorted(baseline_of), sorted(set(families))
    asked: dict[tuple[str, str, str], int] = {}
    for j, ref in enumerate(controls):
        path = ("controls", j)
        for fam in ref.families or ():
            where = path + ("families",)
            if fam not in FAMILIES:
                raise _err(located, where, f"'{fam}' is not a family{did_you_mean(fam, FAMILIES)}; allowed: "
                                           f"{', '.join(residual)}")
            if fam not in baseline_of:
                raise _err(located, where, f"'{fam}' has no {ref.name} control: controls are derived from residual "
                                           f"models; allowed: {', '.join(residual)}")
            if fam not in present:
                raise _err(located, where, f"family '{fam}' has no model in this sweep; models here: "
                                           f"{', '.join(present)}")
        wanted = ref.families if ref.families is not None else [f for f in present if f in baseline_of]
        if not wanted:
            raise _err(located, path, f"control '{ref.name}' is derived from residual models ({', '.join(residual)}); "
                                      f"this sweep's models are {', '.join(present)}")
        if ref.name == "matched_wallclock" and "axis" in ref.model_fields_set:
            raise _err(located, path + ("axis",), "matched_wallclock trains the baseline at the residual model's own "
                                                  "shape: it takes no axis (matched_state and matched_params do)")
        for fam in wanted:
            key = (ref.name, ref.axis if ref.name != "matched_wallclock" else "", fam)
            if key in asked:
                axis = f" along {ref.axis}" if key[1] else ""
                raise _err(located, path, f"controls.{asked[key]} already asks {ref.name}{axis} for {fam}: "
                                          "list each control once")
            asked[key] = j


def check_speeds(ref: ControlRef, j: int, located: LocatedYAML) -> None:
    """A control's pinned `speeds`: matched_wallclock's only, a positive tokens/s per known family."""
    from rla_ablate.models.config import BASELINE_OF

    if ref.speeds is None:
        return
    if ref.name != "matched_wallclock":
        raise _err(located, ("controls", j, "speeds"), f"speeds applies to matched_wallclock only, not to {ref.name}")
    known = sorted(set(BASELINE_OF) | set(BASELINE_OF.values()))
    for family, speed in ref.speeds.items():
        if family not in known:
            raise _err(located, ("controls", j, "speeds", family),
                       f"unknown family '{family}'; allowed: {', '.join(known)}{did_you_mean(family, known)}")
        try:  # YAML reads 1e5 (no dot) as a string: a number written so is one
            value = math.nan if isinstance(speed, bool) else float(speed)
        except (TypeError, ValueError):
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise _err(located, ("controls", j, "speeds", family),
                       f"a speed is a positive, finite number of tokens/s (e.g. 165101), not {speed!r}")


def _budget(record: dict | None) -> tuple[int, int] | None:
    """(tokens, reference tokens) of a matched wall-clock control as they train (whole batches; the budgets before
    rounding for records written without them), from its `describe()` record; None for other jobs."""
    report = (record or {}).get("control_report") or {}
    if "speed_ratio" not in report:
        return None
    for mine, theirs in (("tokens_trained", "reference_tokens_trained"), ("tokens", "reference_tokens")):
        if report.get(mine) and report.get(theirs):
            return report[mine], report[theirs]
    return None


def budget_ratio(record: dict | None) -> float | None:
    """A matched wall-clock control's tokens over its reference job's, as they train; None for other jobs."""
    budget = _budget(record)
    return budget[0] / budget[1] if budget else None


def budget_lines(records: list[dict]) -> list[str]:
    """One line per matched wall-clock control of an expansion (its seeds share it), sorted: how its budget was set
    (plan's caption, the dashboard's notes)."""
    lines = set()
    for record in records:
        budget = _budget(record)
        if budget is None:
            continue
        report, base = record["control_report"], str(record.get("name", "")).rsplit("/seed", 1)[0]
        mine, theirs = budget
        speeds = (f"{report.get('tokens_per_s', 0):,.0f} tokens/s for it, {report.get('speed_source')}; "
                  f"{report.get('reference_tokens_per_s', 0):,.0f} for {record.get('control_of')}, "
                  f"{report.get('reference_speed_source')}")
        lines.add(f"{base}: {mine / theirs:.2f}x the tokens of {record.get('control_of')} ({mine:,} against "
                  f"{theirs:,} as trained; speed ratio {report['speed_ratio']:.4g}: {speeds})"
                  + ("" if report["speed_ratio"] >= 1 else
                     "; the baseline was estimated slower than the residual model (speed ratio below 1): "
                     + (f"in the residual model's time it trains on fewer tokens ({mine / theirs:.2f}x)"
                        if mine < theirs else "its budget, rounded up to whole batches, is the residual model's: "
                        "this control trains the baseline on the same tokens")))
    return sorted(lines)


def _control_targets(ref: ControlRef, arms: list, families: list[str]):
    """(arm index, arm config, baseline family) of each residual arm a control is derived for."""
    from rla_ablate.models.config import BASELINE_OF

    wanted = ref.families if ref.families is not None else list(BASELINE_OF)
    for i, arm_cfg in enumerate(arms):
        if families[i] in wanted:
            yield i, arm_cfg, BASELINE_OF[families[i]]


def _wallclock_controls(r: _Resolver, cfg: SweepConfig, j: int, ref: ControlRef, arms: list, families: list[str],
                        labels: list[str], points: list[dict[str, Any]]) -> list[ResolvedJob]:
    """matched_wallclock: each residual arm's plain baseline (same shape, no R) trained for the residual job's time.

    The rule: tokens(control) = ceil(tokens(residual) * v_base / v_res), with v the tokens/s that
    `calibration.estimate_speed` gives each job alone on one GPU (measured rows of the calibration table, or
    `resources.assumed_tflops` for a family without one), priced as replayed from CUDA graphs whatever the jobs'
    train.cuda_graphs: rows measured with graphs where the table has them (the GPU's time, which repeats within
    1.5%), eager rows elsewhere (there a small model's step is the host's launches, which vary 1.4x between two
    nodes and favour the family with fewer kernels). A control only differs from its reference in R (and gamma)
    and in the budget, so it answers whether the residual path beats spending its cost on more tokens.
    `ref.speeds` (the sweep file's pinned tokens/s per family) replaces the estimates."""
    from rla_ablate.models.budget import plain_baseline
    from rla_ablate.sweep.calibration import SpeedEstimate, estimate_speed

    def gpu_time(job):
        if ref.speeds is not None:
            return SpeedEstimate(float(ref.speeds[job.model.family]), "pinned in the sweep file")
        return estimate_speed(job.model_copy(update={"train": job.train.model_copy(update={"cuda_graphs": True})}),
                              cfg.resources.assumed_tflops)

    out: list[ResolvedJob] = []
    for i, arm_cfg, baseline in _control_targets(ref, arms, families):
        missing = [f for f in (families[i], baseline) if ref.speeds is not None and f not in ref.speeds]
        if missing:
            raise _err(r.located, ("controls", j, "speeds"),
                       f"matched_wallclock for '{labels[i]}' needs the pinned speeds of {families[i]} and {baseline}; "
                       f"missing: {', '.join(missing)} (allowed: tokens/s per family, e.g. {{{families[i]}: 165101, "
                       f"{baseline}: 181000}}, or no speeds: the calibration table's estimates)")
        for point in points:
            target_cfg = r.model(i, arm_cfg, point, None)
            base_cfg = plain_baseline(target_cfg, baseline)
            target_job = r.job(target_cfg, point, cfg.seeds[0], i)[0]
            v_res = gpu_time(target_job)
            v_base = gpu_time(r.job(base_cfg, point, cfg.seeds[0], i)[0])
            ratio = v_base.tokens_per_s / v_res.tokens_per_s
            tokens = math.ceil(target_job.train.tokens * ratio)
            trained = r.job(base_cfg, {**point, "train.tokens": tokens}, cfg.seeds[0], i)[0].train.total_tokens
            # train.tokens is rounded up to whole batches when it trains: the budget as trained is what compares
            report = {"tokens": tokens, "reference_tokens": target_job.train.tokens, "speed_ratio": ratio,
                      "tokens_trained": trained, "reference_tokens_trained": target_job.train.total_tokens,
                      "tokens_per_s": v_base.tokens_per_s, "reference_tokens_per_s": v_res.tokens_per_s,
                      "speed_source": v_base.source, "reference_speed_source": v_res.source}
            for seed in cfg.seeds:
                job, jid, series = r.job(base_cfg, {**point, "train.tokens": tokens}, seed, i)
                target_name = "/".join(p for p in (labels[i], _point_label(point)) if p)
                name = "/".join(p for p in (f"{baseline}~matched_wallclock({labels[i]})", _point_label(point),
                                            f"seed{seed}") if p)
                out.append(ResolvedJob(job_id=jid, name=name, family=baseline, ablations=[ref.name], seed=seed,
                                       job=job, point=dict(point), control_of=target_name, control_report=report,
                                       arm=i, arm_label=labels[i], preset=cfg.models[i].preset,
                                       control=ref.name, series=series))
    return out
