"""Series identity: what makes two jobs of a sweep replicates of one experiment.

A *series* is every job whose resolved config equals this one's in everything but `train.seed`: the same
family, arm (preset and overrides), grid/zip point, ablation and control. Its id is the first 12 hex digits
of sha256 over the canonical JSON of the resolved config with `train.seed` removed (the job id without the
seed), so it is stable across processes and key order, and it changes exactly when a job id changes for any
reason other than the seed.

Every MLflow child run carries the identity as tags (`identity_tags`), so that the dashboards can pair runs
by seed and the MLflow UI can filter on them:

    arm       the arm's label (its `name:`, else its preset)
    preset    the arm's preset (name or path)
    control   the derived control (matched_state, matched_params, matched_state[heads], ...) or none
    point.K   one tag per grid/zip/search key K, e.g. point.model.clip = 0.05
    series    the series id above
"""

from __future__ import annotations

from typing import Any

from rla_ablate.sweep.ids import canonical_json, hash_text, section_json

ARM, PRESET, CONTROL, SERIES = "arm", "preset", "control", "series"
POINT_PREFIX = "point."
NO_CONTROL = "none"
IDENTITY_TAGS = (ARM, PRESET, CONTROL, SERIES)


def point_tag(key: str) -> str:
    """The tag naming a grid/zip/search key: `model.clip` -> `point.model.clip`."""
    return POINT_PREFIX + key


def tag_value(value: Any) -> str:
    """A config value as a tag, spelled as `rla_ablate.tracking.flatten` spells it as a param (0.05, true, null),
    so that a point tag and the run's config param read the same."""
    from rla_ablate.tracking.runs import param_value

    return param_value(value)


def train_without_seed(train: dict) -> dict:
    return {k: v for k, v in train.items() if k != "seed"}


def series_id(config: Any) -> str:
    """The series id of a resolved job config (a pydantic model or its JSON dump, e.g. a job's job.json)."""
    if hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    data = dict(config)
    if isinstance(data.get("train"), dict):
        data["train"] = train_without_seed(data["train"])
    return hash_text(canonical_json(data))


def series_id_from_sections(sections: dict[str, str], train: dict) -> str:
    """`series_id` from the per-section canonical JSON a planner already holds (no second dump of the config)."""
    from rla_ablate.sweep.ids import join_sections

    return hash_text(join_sections(dict(sections, train=section_json(train_without_seed(train)))))


def identity_tags(*, arm: str, preset: str, control: str | None, series: str, point: dict[str, Any]) -> dict[str, str]:
    """The MLflow tags naming a job's series (see the module docstring)."""
    tags = {ARM: arm, PRESET: preset, CONTROL: control or NO_CONTROL, SERIES: series}
    for key, value in point.items():
        tags[point_tag(key)] = tag_value(value)
    return tags
