"""Series identity at expansion: one series per config up to the seed, for grids, arms with overrides, ablations
and controls; the identity tags a launch puts on each run; spec keys that may group by it. No MLflow here."""

from __future__ import annotations

import json
import textwrap

import pytest

from rla_ablate.dashboard.spec import check_key, load_spec
from rla_ablate.errors import UserError
from rla_ablate.sweep.expand import load_sweep
from rla_ablate.sweep.identity import series_id
from rla_ablate.sweep.ids import job_id

CLIP = """\
name: clip
models: [{preset: tiny-rla}]
base: {train: {tokens: 1024, seq_len: 64, micro_batch_size: 2, batch_tokens: 128}, data: {kind: stdlib}}
grid: {model.clip: [0.05, 0.2, 1.0]}
ablations: [no_fitting]
seeds: [0, 1]
"""

ARMS = """\
name: arms
models:
  - {preset: tiny-rdn}
  - {preset: tiny-rdn, overrides: {clip: 0.5}, name: rdn-c05}
base: {train: {tokens: 1024, seq_len: 64, micro_batch_size: 2, batch_tokens: 128}, data: {kind: stdlib}}
ablations: [no_fitting]
controls: [matched_state]
seeds: [0, 1]
"""


def sweep(tmp_path, text, name="s.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return load_sweep(path)


def by_series(jobs):
    out = {}
    for j in jobs:
        out.setdefault(j.series, []).append(j)
    return out


def test_grid_points_and_ablations_are_separate_series_seeds_are_not(tmp_path):
    s = sweep(tmp_path, CLIP)
    groups = by_series(s.jobs)
    # 3 clip values x (none, no_fitting): six series of two seeds each, never pooled across clip values.
    assert len(s.jobs) == 12 and len(groups) == 6
    for members in groups.values():
        assert sorted(j.seed for j in members) == [0, 1]
        assert len({(j.job.model.clip, tuple(j.ablations)) for j in members}) == 1
    assert len({(j.job.model.clip, tuple(j.ablations)) for j in s.jobs}) == 6


def test_series_id_is_the_config_without_the_seed(tmp_path):
    s = sweep(tmp_path, CLIP)
    for j in s.jobs:
        dump = json.loads(j.job.model_dump_json())
        # Recomputed from the job.json a launch writes: the dashboard does this for runs without tags.
        assert series_id(dump) == j.series == series_id(j.job)
        other_seed = dict(dump, train=dict(dump["train"], seed=dump["train"]["seed"] + 7))
        assert series_id(other_seed) == j.series and job_id(other_seed) != j.job_id
        other_lr = dict(dump, train=dict(dump["train"], lr=dump["train"]["lr"] * 2))
        assert series_id(other_lr) != j.series


def test_identity_tags_name_arm_preset_point_control_and_series(tmp_path):
    s = sweep(tmp_path, CLIP)
    j = next(j for j in s.jobs if j.job.model.clip == 0.2 and j.ablations == ["no_fitting"] and j.seed == 1)
    assert j.identity_tags() == {"arm": "tiny-rla", "preset": "tiny-rla", "control": "none", "series": j.series,
                                 "point.model.clip": "0.2"}
    # jobs.json carries the identity too, so a job not started yet groups like its runs.
    rec = j.describe()
    assert {k: rec[k] for k in ("arm", "preset", "control", "series")} == {
        "arm": "tiny-rla", "preset": "tiny-rla", "control": None, "series": j.series}


def test_arms_with_overrides_and_controls_are_their_own_series(tmp_path):
    s = sweep(tmp_path, ARMS)
    groups = by_series(s.jobs)
    arms = {(j.arm_label, tuple(j.ablations), j.control) for j in s.jobs}
    assert ("rdn-c05", (), None) in arms and ("tiny-rdn", (), None) in arms
    assert len(groups) == len(arms) and all(len(m) == 2 for m in groups.values())
    base = {j.arm_label: j for j in s.jobs if not j.ablations and j.seed == 0}
    assert base["rdn-c05"].series != base["tiny-rdn"].series
    assert base["rdn-c05"].identity_tags()["preset"] == "tiny-rdn"
    # A control carries the arm it is derived from (its matched-state claim pairs it with that arm). GDN has no
    # clip, so both arms derive the same widened GDN: one config, one series, run once (for the first arm).
    controls = [j for j in s.jobs if j.control]
    assert {j.control for j in controls} == {"matched_state"} and len(by_series(controls)) == 1
    assert {j.arm_label for j in controls} == {"tiny-rdn"} and sorted(j.seed for j in controls) == [0, 1]
    assert all(j.family == "gdn" and j.identity_tags()["control"] == "matched_state" for j in controls)


@pytest.mark.parametrize("key, ok", [("model.clip", True), ("train.lr", True), ("point.model.clip", True),
                                     ("arm", True), ("data.kind", True), ("eval.0.tokens", True),
                                     ("model.clp", False), ("train.learning_rate", False), ("colour", False)])
def test_spec_keys_any_resolved_config_key_or_identity_tag(key, ok):
    if ok:
        assert check_key(key) == key
    else:
        with pytest.raises(ValueError):
            check_key(key)


def test_spec_grouping_by_config_key_is_allowed_and_typos_name_line_and_key(tmp_path):
    path = tmp_path / "clip.yaml"
    path.write_text("kind: table\ntitle: t\nseries: [ablations, model.clip]\ncolumns: [{metric: eval/val/loss}]\n")
    assert load_spec(path).series == ["ablations", "model.clip"]
    path.write_text("kind: table\ntitle: t\nruns: {family: rla}\nseries: [ablations, model.clp]\n"
                    "columns: [{metric: eval/val/loss}]\n")
    with pytest.raises(UserError) as err:
        load_spec(path)
    assert f"{path}:4: series" in str(err.value) and "did you mean 'model.clip'" in str(err.value)
    path.write_text("kind: table\ntitle: t\ncolumns: [{metric: eval/val/loss}]\nclaims:\n"
                    "  - {claim: c, treatment: {ablations: x}, reference: {ablations: none}, expect: up, "
                    "min_effect: 0.01}\n")
    with pytest.raises(UserError) as err:
        load_spec(path)
    assert ":5: claims.0.expect" in str(err.value) and "allowed: higher, lower" in str(err.value)
