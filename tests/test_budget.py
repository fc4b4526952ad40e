"""Analytic accounting and matched budgets: exact integers, checked against built models and hand counts."""

from __future__ import annotations

import itertools

import pytest

from rla_ablate.errors import UserError
from rla_ablate.models import (
    ModelConfig, build_model, count_params, flops_per_token, load_preset, matched_params, matched_state,
    state_elements_per_layer,
)
from rla_ablate.models.accounting import CHUNK_SIZE

SMALL = dict(vocab_size=37, hidden_size=24, num_layers=3, intermediate_size=40, num_heads=4, head_dim=6)


def _linear_variants():
    for family, tie, conv, tied, ev in itertools.product(
            ("sgla", "gdn", "rla", "rdn"), (False, True), (False, True), (False, True), (1.0, 1.5)):
        if tied and family in ("sgla", "gdn"):
            continue
        yield dict(family=family, tie_embeddings=tie, use_short_conv=conv, tied_gamma=tied, expand_v=ev,
                   conv_size=3)


VARIANTS = list(_linear_variants()) + [
    dict(family="transformer", num_kv_heads=kv, tie_embeddings=tie) for kv in (1, 2, 4) for tie in (False, True)
] + [dict(family="rdn", fit="none", output_gates=False, target="tanh")]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()))
def test_count_params_equals_numel(variant):
    cfg = ModelConfig(**{**SMALL, **variant})
    model = build_model(cfg)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())


def test_state_elements():
    kw = dict(SMALL, expand_v=1.5)
    H, K, V = 4, 6, 9
    assert state_elements_per_layer(ModelConfig(family="sgla", **kw)) == H * K * V
    assert state_elements_per_layer(ModelConfig(family="gdn", **kw)) == H * K * V
    assert state_elements_per_layer(ModelConfig(family="rla", **kw)) == 2 * H * K * V
    # no fitting: R_t = r_t k_t^T is rebuilt each token, only S is carried between tokens
    assert state_elements_per_layer(ModelConfig(family="rdn", fit="none", **kw)) == H * K * V
    assert state_elements_per_layer(ModelConfig(family="transformer", num_kv_heads=2, **SMALL)) == 2 * 2 * 6


def test_flops_per_token_by_hand():
    D, L, I, Vocab, H, K = 24, 3, 40, 37, 4, 6
    T = CHUNK_SIZE  # one full chunk
    sgla = ModelConfig(family="sgla", **SMALL)
    dense = L * (3 * D * H * K + 2 * D * H * K + D * H + 3 * D * I) + Vocab * D  # q k v, g o, gk, MLP; head
    recurrence = L * H * (T * T * K + T * T * K + 2 * T * K * K) / T  # q k^T, scores @ v, q S_0, carry
    assert flops_per_token(sgla, T) == 6 * (dense + recurrence)

    tf = ModelConfig(family="transformer", num_kv_heads=2, **SMALL)
    dense_tf = L * (2 * D * H * K + 2 * D * 2 * K + 3 * D * I) + Vocab * D
    for seq_len in (1, 100, 4096):
        assert flops_per_token(tf, seq_len) == 6 * (dense_tf + L * H * K * (seq_len + 1))

    # Ordering the paper's Fig. 2 implies: the residual path and the delta rule each cost extra.
    costs = {f: flops_per_token(ModelConfig(family=f, **SMALL), 2048) for f in ("sgla", "gdn", "rla", "rdn")}
    assert costs["sgla"] < costs["rla"] and costs["gdn"] < costs["rdn"] and costs["sgla"] < costs["gdn"]
    # A linear model's cost per token does not grow with the context (whole chunks).
    assert flops_per_token(sgla, 64) == flops_per_token(sgla, 64 * 50)
    with pytest.raises(ValueError):
        flops_per_token(sgla, 0)


def test_matched_state_1p5b_rla_by_hand():
    rla = load_preset("1.5b-rla")
    ctl = matched_state(rla)
    D, H, L, W = 2048, 16, 16, 4
    assert ctl.config.family == "sgla" and ctl.config.expand_v == 2.0 and ctl.config.head_v_dim == 256
    assert ctl.changed == {"expand_v": (1.0, 2.0)}
    assert ctl.state_elements_per_layer == ctl.reference_state_elements_per_layer == 2 * 16 * 128 * 128
    assert ctl.state_delta == 0
    # v, g and o projections grow by D * H * 128 each, the v conv by H * 128 * W, o_norm by 128;
    # the residual model's b_proj and c_proj (D * H each) are gone.
    per_layer = 3 * D * H * 128 + H * 128 * W + 128 - 2 * D * H
    assert ctl.params_delta == L * per_layer == 200_411_136
    assert ctl.params - ctl.reference_params == ctl.params_delta
    assert ctl.flops_delta == flops_per_token(ctl.config, 2048) - flops_per_token(rla, 2048)


@pytest.mark.parametrize("axis, field, value", [("expand_v", "head_v_dim", 64), ("heads", "num_heads", 4),
                                                ("head_dim", "head_dim", 64)])
@pytest.mark.parametrize("preset", ["tiny-rla", "tiny-rdn"])
def test_matched_state_every_axis(preset, axis, field, value):
    ref = load_preset(preset)  # 2 heads x 32, dv 32
    ctl = matched_state(ref, axis=axis)
    assert ctl.config.family == {"rla": "sgla", "rdn": "gdn"}[ref.family]
    assert getattr(ctl.config, field) == value
    assert state_elements_per_layer(ctl.config) == state_elements_per_layer(ref) == 2 * 2 * 32 * 32
    if axis == "head_dim":
        assert ctl.config.head_v_dim == 32  # values unchanged, keys doubled
    assert ctl.params == count_params(ctl.config) == sum(p.numel() for p in build_model(ctl.config).parameters())
    summary = ctl.summary()
    assert summary["state_delta"] == 0 and summary["reference_family"] == ref.family


def test_matched_state_keeps_shared_switches_and_drops_residual_ones():
    ref = load_preset("tiny-rdn").replace(tied_gamma=True, target="tanh", qk_norm="none", use_short_conv=False)
    ctl = matched_state(ref, baseline_family="sgla")
    assert ctl.config.family == "sgla"
    assert (ctl.config.tied_gamma, ctl.config.target, ctl.config.fit) == (False, "clip", "off")
    assert (ctl.config.qk_norm, ctl.config.use_short_conv) == ("none", False)


@pytest.mark.parametrize("preset", ["tiny-rla", "100m-rdn", "1.5b-rla"])
@pytest.mark.parametrize("axis", ["expand_v", "heads", "head_dim"])
def test_matched_params_is_the_nearest_integer_width(preset, axis):
    ref = load_preset(preset)
    ctl = matched_params(ref, axis=axis)
    assert ctl.state_delta == 0
    per_unit = 3 * ref.hidden_size * ref.num_layers
    assert abs(ctl.params_delta) * 2 <= per_unit
    for step in (-1, 1):
        neighbour = ctl.config.replace(intermediate_size=ctl.config.intermediate_size + step)
        assert abs(count_params(neighbour) - count_params(ref)) >= abs(ctl.params_delta)
    assert ctl.changed["intermediate_size"][0] == ref.intermediate_size


def test_matched_params_1p5b_rla_by_hand():
    ctl = matched_params(load_preset("1.5b-rla"))
    # 200,411,136 extra params / (3 * 2048 * 16) per unit of MLP width = 2038.7 -> 2039 narrower.
    assert ctl.config.intermediate_size == 8192 - 2039
    assert ctl.params_delta == 200_411_136 - 2039 * 3 * 2048 * 16 == -30_720


def test_matched_controls_reject_baselines_and_bad_axes():
    for fn in (matched_state, matched_params):
        with pytest.raises(UserError, match="derived from a residual model"):
            fn(load_preset("tiny-gdn"))
        with pytest.raises(ValueError, match="axis must be one of expand_v, heads, head_dim"):
            fn(load_preset("tiny-rla"), axis="width")
        with pytest.raises(ValueError, match="baseline_family must be one of sgla, gdn"):
            fn(load_preset("tiny-rla"), baseline_family="transformer")
    tiny = load_preset("tiny-rla")
    with pytest.raises(ValueError, match="intermediate_size"):
        matched_params(tiny.replace(intermediate_size=1, num_layers=1), axis="heads")
