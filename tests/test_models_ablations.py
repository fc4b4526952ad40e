"""The ablation registry of docs/MATH.md: names, families, what each changes, and the errors a sweep sees."""

from __future__ import annotations

import pytest

from rla_ablate.errors import UserError
from rla_ablate.models import ABLATIONS, apply_ablation, load_preset
from rla_ablate.models.ablations import check

EXPECTED = {
    "no_fitting": {"fit": "none"},
    "tied_gamma": {"tied_gamma": True},
    "no_output_gates": {"output_gates": False},
    "no_clip": {"target": "identity"},
    "no_norm": {"qk_norm": "none"},
    "no_clip_no_norm": {"target": "identity", "qk_norm": "none"},
    "logcosh": {"target": "tanh"},
    "no_fitting_no_clip": {"fit": "none", "target": "identity"},
}


def test_registry_names_and_evidence():
    assert set(ABLATIONS) == set(EXPECTED) | {"learned_beta_base"}
    for ablation in ABLATIONS.values():
        assert ablation.evidence and ablation.change and set(ablation.families) <= {"sgla", "gdn", "rla", "rdn"}


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("family", ["rla", "rdn"])
def test_each_ablation_changes_exactly_its_switches(name, family):
    ref = load_preset(f"tiny-{family}")
    out = ABLATIONS[name].apply(ref)
    before, after = ref.model_dump(), out.model_dump()
    assert {k: after[k] for k in after if after[k] != before[k]} == EXPECTED[name]


@pytest.mark.parametrize("name", ["matched_state", "matched_params", "matched_wallclock"])
def test_a_control_is_not_an_ablation(name):
    # One way to ask for a control (`controls:`), so two spellings never make two jobs of one model.
    assert name not in ABLATIONS
    with pytest.raises(UserError, match=f"'{name}' is a control, not an ablation: list it under `controls:`"):
        apply_ablation(name, load_preset("tiny-rdn"))


def test_control_names_match_the_sweep_schema():
    from typing import get_args

    from rla_ablate.models.ablations import CONTROL_NAMES
    from rla_ablate.sweep.schema import ControlRef

    assert get_args(ControlRef.model_fields["name"].annotation) == CONTROL_NAMES


def test_learned_beta_base_is_rla_without_r_and_gamma():
    ref = load_preset("proxy-mqar-rla")
    out = apply_ablation("learned_beta_base", ref)
    before, after = ref.model_dump(), out.model_dump()
    # The shape and the proxy options (init, conv) stay; the residual path and its switches go (clip_mode back to
    # absolute, which the dump leaves out); beta stays learned, which sGLA's dump spells out.
    assert {k: after.get(k) for k in set(after) | set(before) if after.get(k) != before.get(k)} == {
        "family": "sgla", "fit": "off", "clip": 1.0, "clip_mode": None, "beta": "learned"}
    assert out.beta == "learned" and load_preset("proxy-mqar-sgla").beta == "fixed"
    with pytest.raises(UserError, match="it applies to: rla"):
        apply_ablation("learned_beta_base", load_preset("tiny-rdn"))


def test_no_norm_fits_baselines_too():
    assert apply_ablation("no_norm", load_preset("tiny-gdn")).qk_norm == "none"


@pytest.mark.parametrize("name", ["no_fitting", "tied_gamma", "logcosh", "no_clip"])
@pytest.mark.parametrize("family", ["sgla", "gdn", "transformer"])
def test_wrong_family_lists_the_families_it_fits(name, family):
    with pytest.raises(UserError) as err:
        ABLATIONS[name].apply(load_preset(f"tiny-{family}"))
    assert f"does not apply to family '{family}'" in str(err.value)
    assert "it applies to: rla, rdn" in str(err.value)


def test_unknown_ablation_suggests_a_name():
    with pytest.raises(UserError, match="did you mean 'no_clip'"):
        check("no_clips", "rla")
    with pytest.raises(UserError, match="allowed: no_fitting, tied_gamma"):
        apply_ablation("bogus", load_preset("tiny-rla"))
