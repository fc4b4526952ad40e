"""Mechanism diagnostics (rla_ablate.models.diagnostics, docs/TRAINING.md): values on a case computed by hand and
against the float64 token recurrence, the wiring inside the layers, the diag/ aggregates, and training jobs that
log them at stats points only, never from a training step."""

from __future__ import annotations

import math

import pytest
import torch

from rla_ablate.models import ModelConfig, aggregate_diagnostics, build_model, load_preset, mixer_diagnostics
from rla_ablate.models import diagnostics as diagnostics_module
from rla_ablate.models import layers as layers_module
from rla_ablate.ops import ResidualSpec
from rla_ablate.ops.chunk import chunk_base_reads
from rla_ablate.train import JobConfig, TrainConfig, metric_series, read_jsonl, run_job

LAYER_NAMES_RESIDUAL = ("attn_out_norm", "S_norm", "R_norm", "residual_rms", "target_engaged", "mixer_rms",
                        "mixer_rms_over_sqrt_eps", "alpha_mean", "beta_mean", "gamma_mean")
LAYER_NAMES_BASELINE = ("attn_out_norm", "S_norm", "residual_rms", "mixer_rms", "mixer_rms_over_sqrt_eps",
                        "alpha_mean", "beta_mean")
DIAG_RESIDUAL = ("diag/residual_rms", "diag/target_engaged", "diag/mixer_rms_over_sqrt_eps", "diag/alpha_mean",
                 "diag/beta_mean", "diag/gamma_mean")


def old_reads_loop(k, v, g, beta, rule, S0=None):
    """S_{t-1} k_t by the token recurrence of docs/MATH.md, in float64: [B, T, H, V]."""
    k, v, g, beta = (x.double() for x in (k, v, g, beta))
    B, T, H, K = k.shape
    V = v.shape[-1]
    S = S0.double().clone() if S0 is not None else torch.zeros(B, H, V, K, dtype=torch.float64)
    out = torch.zeros(B, T, H, V, dtype=torch.float64)
    for t in range(T):
        k_t, v_t = k[:, t], v[:, t]
        a, b = g[:, t].exp()[..., None, None], beta[:, t][..., None, None]
        Sk = torch.einsum("bhvk,bhk->bhv", S, k_t)
        out[:, t] = Sk
        if rule == "additive":
            S = a * S + b * v_t[..., None] * k_t[..., None, :]
        else:
            S = a * (S - b * Sk[..., None] * k_t[..., None, :]) + b * v_t[..., None] * k_t[..., None, :]
    return out


def rms(x) -> float:
    return math.sqrt(sum(e * e for e in x) / len(x))


# One head, K = V = 2, four tokens, alpha = beta = 1/2, k_1 = k_3 = k_4 = e_1 and k_2 = e_2. By hand:
#   S_1 = b v_1 e_1^T                              -> x_1 = v_1, x_2 = v_2 - S_1 e_2 = v_2
#   S_2 e_1 = a b v_1 (both rules: k_2 _|_ e_1)     -> x_3 = v_3 - a b v_1
#   additive: S_3 e_1 = a^2 b v_1 + b v_3           -> x_4 = v_4 - a^2 b v_1 - b v_3
#   delta:    S_3 e_1 = a (1 - b) S_2 e_1 + b v_3   -> x_4 = v_4 - a^2 b (1 - b) v_1 - b v_3
HAND_K = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
HAND_V = [[2.0, -1.0], [0.5, 3.0], [1.0, 1.0], [-1.0, 0.25]]
HAND_X = {"additive": [2.0, -1.0, 0.5, 3.0, 0.5, 1.25, -1.75, -0.125],
          "delta": [2.0, -1.0, 0.5, 3.0, 0.5, 1.25, -1.625, -0.1875]}
HAND_GAMMA = [0.1, 0.2, 0.3, 0.4]
HAND_O = [1e-5, -1e-5, 2e-5, -2e-5, 1e-5, 1e-5, -3e-5, 3e-5]
# (target, c) -> elements the target changes, counted on HAND_X by hand:
#   clip 1.7: |x| > 1.7          additive 2, 3, -1.75 / delta 2, 3 (|-1.625| < 1.7)
#   tanh 4:   |x| > 0.174 * 4    2, -1, 3, 1.25 and the last token's first element, in both rules
#   identity: none
HAND_ENGAGED = {("clip", 1.7): {"additive": 3, "delta": 2}, ("tanh", 4.0): {"additive": 5, "delta": 5},
                ("identity", 1.0): {"additive": 0, "delta": 0}}


def hand_inputs(dtype):
    k = torch.tensor(HAND_K, dtype=dtype).view(1, 4, 1, 2)
    v = torch.tensor(HAND_V, dtype=dtype).view(1, 4, 1, 2)
    g = torch.full((1, 4, 1), math.log(0.5), dtype=dtype)
    beta = torch.full((1, 4, 1), 0.5, dtype=dtype)
    gamma = torch.tensor(HAND_GAMMA, dtype=dtype).view(1, 4, 1)
    o = torch.tensor(HAND_O, dtype=dtype).view(1, 4, 1, 2)
    return o, k, v, g, beta, gamma


@pytest.mark.parametrize("chunk_size", [64, 3, 1])
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_hand_computed_residuals(rule, chunk_size):
    _, k, v, g, beta, _ = hand_inputs(torch.float64)
    x = v - chunk_base_reads(k, v, g, beta, rule, chunk_size=chunk_size)
    assert x.flatten().tolist() == pytest.approx(HAND_X[rule], abs=1e-14)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("target_c", list(HAND_ENGAGED))
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_hand_computed_diagnostics(rule, target_c, dtype):
    target, c = target_c
    o, k, v, g, beta, gamma = hand_inputs(dtype)
    spec = ResidualSpec(rule=rule, fit="residual", target=target, clip=c)
    d = {name: float(t) for name, t in mixer_diagnostics(o, k, v, g, beta, gamma, spec=spec, norm_eps=1e-6,
                                                          chunk_size=3).items()}
    rel = 1e-12 if dtype == torch.float64 else 1e-6
    assert d["residual_rms"] == pytest.approx(rms(HAND_X[rule]), rel=rel)
    assert d["target_engaged"] == HAND_ENGAGED[target_c][rule] / 8
    # RMS of HAND_O: 1e-5 sqrt((1 + 1 + 4 + 4 + 1 + 1 + 9 + 9) / 8); sqrt(eps) = 1e-3.
    assert d["mixer_rms"] == pytest.approx(1e-5 * math.sqrt(30 / 8), rel=rel)
    assert d["mixer_rms_over_sqrt_eps"] == pytest.approx(1e-2 * math.sqrt(30 / 8), rel=rel)
    assert d["alpha_mean"] == pytest.approx(0.5, rel=rel)
    assert d["beta_mean"] == pytest.approx(0.5, rel=rel)
    assert d["gamma_mean"] == pytest.approx(0.25, rel=rel)


def test_baseline_has_no_target_or_gamma():
    o, k, v, g, beta, _ = hand_inputs(torch.float64)
    d = mixer_diagnostics(o, k, v, g, beta, None, spec=ResidualSpec(rule="delta", fit="off"), norm_eps=1e-6)
    assert sorted(d) == sorted(LAYER_NAMES_BASELINE[2:])
    assert float(d["residual_rms"]) == pytest.approx(rms(HAND_X["delta"]), rel=1e-12)


def test_engagement_rules_at_their_edges():
    x = torch.tensor([0.0, 0.17, -0.18, 0.999, -1.001, 5.0])
    assert ResidualSpec(target="clip", clip=1.0).target_changes(x).tolist() == [False, False, False, False, True,
                                                                                True]
    # tanh moves x by more than 1% from |x| = 0.1743 c on.
    assert ResidualSpec(target="tanh", clip=1.0).target_changes(x).tolist() == [False, False, True, True, True, True]
    assert ResidualSpec(target="tanh", clip=2.0).target_changes(x).tolist() == [False, False, False, True, True,
                                                                                True]
    assert not ResidualSpec(target="identity").target_changes(x * 100).any()


@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_old_reads_equal_the_token_recurrence(rule):
    gen = torch.Generator().manual_seed(5)
    B, T, H, K, V = 2, 37, 3, 5, 4
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    g = -2 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    S0 = torch.randn(B, H, V, K, generator=gen, dtype=torch.float64)
    want = old_reads_loop(k, v, g, beta, rule, S0)
    assert want.abs().max() > 0.1
    for chunk_size in (8, 64):
        got = chunk_base_reads(k, v, g, beta, rule, S0, chunk_size=chunk_size)
        assert got.dtype == torch.float64
        assert ((got - want).norm() / want.norm()).item() < 1e-12
    got32 = chunk_base_reads(*(x.float() for x in (k, v, g, beta)), rule, S0.float(), chunk_size=8)
    assert got32.dtype == torch.float32
    assert ((got32.double() - want).norm() / want.norm()).item() < 1e-5


SHAPE = dict(vocab_size=50, hidden_size=32, num_layers=2, intermediate_size=48, num_heads=2, head_dim=8,
             init_std=0.25)
LAYER_VARIANTS = {
    "rla": dict(family="rla", clip=0.05),
    "rdn-tanh": dict(family="rdn", target="tanh", clip=0.05),
    "rla-none-tied-identity": dict(family="rla", fit="none", tied_gamma=True, target="identity"),
    "rdn-noconv-nonorm": dict(family="rdn", use_short_conv=False, qk_norm="none", clip=0.2),
    "sgla": dict(family="sgla"),
    "gdn": dict(family="gdn", norm_eps=1e-4),
}


def engaged_by_hand(x, target, c) -> float:
    if target == "clip":
        return (x.abs() > c).double().mean().item()
    if target == "tanh":
        return ((c * torch.tanh(x / c) - x).abs() > 0.01 * x.abs()).double().mean().item()
    return 0.0


def spy_on_layers(monkeypatch, model):
    """Records each layer's op inputs and the tensor its output norm receives."""
    seen = {"op": [], "o": []}
    real = layers_module.residual_attention

    def spy(*args, **kwargs):
        seen["op"].append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(layers_module, "residual_attention", spy)
    for layer in model.layers:
        layer.attn.o_norm.register_forward_pre_hook(lambda mod, args: seen["o"].append(args[0]))
    return seen


@pytest.mark.parametrize("variant", list(LAYER_VARIANTS))
def test_layer_stats_are_the_diagnostics_of_the_ops_inputs(variant, monkeypatch):
    cfg = ModelConfig(**{**SHAPE, **LAYER_VARIANTS[variant]})
    torch.manual_seed(0)
    model = build_model(cfg).double().eval()
    seen = spy_on_layers(monkeypatch, model)
    model.track_stats(True)
    with torch.no_grad():
        model(torch.randint(0, 50, (2, 70), generator=torch.Generator().manual_seed(1)))
    stats = model.layer_stats()
    names = LAYER_NAMES_RESIDUAL if cfg.is_residual else LAYER_NAMES_BASELINE
    if cfg.is_residual and cfg.fit == "none":
        assert "layer_00/R_norm" in stats
    assert sorted(stats) == sorted(f"layer_{i:02d}/{n}" for i in range(2) for n in names)
    assert all(math.isfinite(v) for v in stats.values()), stats
    for i, ((args, _kwargs), o) in enumerate(zip(seen["op"], seen["o"])):
        q, k, v, g, beta, gamma = args
        x = v.double() - old_reads_loop(k, v, g, beta, cfg.rule)
        layer = {n: stats[f"layer_{i:02d}/{n}"] for n in names}
        assert layer["residual_rms"] == pytest.approx(x.square().mean().sqrt().item(), rel=1e-10)
        mixer_rms = o.double().square().mean().sqrt().item()
        assert layer["mixer_rms"] == pytest.approx(mixer_rms, rel=1e-12)
        assert layer["mixer_rms_over_sqrt_eps"] == pytest.approx(mixer_rms / math.sqrt(cfg.norm_eps), rel=1e-12)
        assert layer["alpha_mean"] == pytest.approx(g.exp().mean().item(), rel=1e-12)
        assert layer["beta_mean"] == pytest.approx(beta.mean().item(), rel=1e-12)
        if cfg.family == "sgla":
            assert layer["beta_mean"] == 1.0
        if cfg.is_residual:
            want = engaged_by_hand(x, cfg.target, cfg.clip)
            assert layer["target_engaged"] == pytest.approx(want, abs=1e-12)
            if cfg.target != "identity":
                # The small clips above put the mechanism on for part of the elements: the check has teeth.
                assert 0 < layer["target_engaged"] < 1
            assert layer["gamma_mean"] == pytest.approx(gamma.mean().item(), rel=1e-12)
            if cfg.tied_gamma:
                assert layer["gamma_mean"] == layer["beta_mean"]


def test_decoding_stats_read_the_carried_state(monkeypatch):
    cfg = ModelConfig(**{**SHAPE, "family": "rdn"})
    torch.manual_seed(0)
    model = build_model(cfg).double().eval()
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(2))
    seen = spy_on_layers(monkeypatch, model)
    with torch.no_grad():
        model(ids)
        args, _ = seen["op"][0]
        x_full = args[2].double() - old_reads_loop(args[1], args[2], args[3], args[4], "delta")
        cache = model.new_cache()
        model(ids[:, :6], cache=cache)
        model.track_stats(True)
        model.step(ids[:, 6], cache)
    # Token 6 alone: its residual reads S_5, which only the carried state holds.
    want = x_full[:, 6].square().mean().sqrt().item()
    assert want > 0
    assert model.layer_stats()["layer_00/residual_rms"] == pytest.approx(want, rel=1e-10)


def test_no_tracking_no_diagnostic_pass(monkeypatch):
    calls = []
    real = diagnostics_module.chunk_base_reads

    def counting(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(diagnostics_module, "chunk_base_reads", counting)
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**SHAPE, "family": "rla"}))
    ids = torch.randint(0, 50, (2, 20))
    model(ids).logsumexp(-1).mean().backward()
    assert calls == [] and model.layer_stats() == {}
    model.track_stats(True)
    model(ids).logsumexp(-1).mean().backward()
    # Even inside a differentiable forward the pass runs without gradients, once per layer.
    assert calls == [False, False]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_aggregates_over_layers():
    stats = {"layer_00/residual_rms": 1.0, "layer_01/residual_rms": 3.0,
             "layer_00/target_engaged": 0.0, "layer_01/target_engaged": 0.5,
             "layer_00/mixer_rms_over_sqrt_eps": 2.0, "layer_01/mixer_rms_over_sqrt_eps": 0.5,
             "layer_00/mixer_rms": 2e-3, "layer_01/mixer_rms": 5e-4,
             "layer_00/alpha_mean": 0.9, "layer_01/alpha_mean": 0.7, "layer_00/beta_mean": 0.2,
             "layer_01/beta_mean": 0.4, "layer_00/S_norm": 7.0, "layer_00/attn_out_norm": 1.0}
    assert aggregate_diagnostics(stats) == pytest.approx({
        "diag/residual_rms": 2.0, "diag/target_engaged": 0.25, "diag/mixer_rms_over_sqrt_eps": 0.5,
        "diag/alpha_mean": 0.8, "diag/beta_mean": 0.3})
    assert aggregate_diagnostics({"layer_00/attn_out_norm": 1.0}) == {}
    # NaN in any layer, first or last, makes the aggregate NaN (a plain min would depend on the order).
    for first, second in ((math.nan, 1.0), (1.0, math.nan)):
        agg = aggregate_diagnostics({"layer_00/mixer_rms_over_sqrt_eps": first,
                                     "layer_01/mixer_rms_over_sqrt_eps": second,
                                     "layer_00/residual_rms": first, "layer_01/residual_rms": second})
        assert math.isnan(agg["diag/mixer_rms_over_sqrt_eps"]) and math.isnan(agg["diag/residual_rms"])


def small_job(family: str = "rla", evals: bool = True, **train) -> JobConfig:
    """6 steps of 512 tokens (one micro batch of 8 x 64); evals every 2 steps."""
    settings = dict(tokens=3072, seq_len=64, micro_batch_size=8, batch_tokens=512, lr=3e-3, min_lr=3e-4,
                    warmup_tokens=512, eval_every_tokens=1024, checkpoint_every_tokens=None, cpu_threads=1, seed=0)
    settings.update(train)
    return JobConfig.model_validate({
        "model": load_preset(f"tiny-{family}").replace(vocab_size=257).model_dump(),
        "train": TrainConfig(**settings).model_dump(exclude_unset=True),
        "data": {"kind": "stdlib"},
        "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 1024}] if evals else [],
    })


def run_counting(job, out, monkeypatch):
    """Runs `job`; returns its metric records and, per diagnostic pass, (grad enabled, batch, tokens)."""
    calls = []
    real = diagnostics_module.chunk_base_reads

    def counting(k, *args, **kwargs):
        calls.append((torch.is_grad_enabled(), k.shape[0], k.shape[1]))
        return real(k, *args, **kwargs)

    monkeypatch.setattr(diagnostics_module, "chunk_base_reads", counting)
    result = run_job(job, out)
    assert result.status == "finished", result.error
    return [r for r in read_jsonl(out / "metrics.jsonl") if r["type"] == "metrics"], calls


def check_record(values: dict, layer_names, diag_names):
    for name in layer_names:
        for i in range(2):
            assert math.isfinite(values[f"layer_{i:02d}/{name}"]), name
    assert sorted(k for k in values if k.startswith("diag/")) == sorted(diag_names)
    for key in diag_names:
        name = key.removeprefix("diag/")
        per_layer = [values[f"layer_{i:02d}/{name}"] for i in range(2)]
        want = min(per_layer) if name == "mixer_rms_over_sqrt_eps" else sum(per_layer) / 2
        assert values[key] == pytest.approx(want, rel=1e-12), key
        assert math.isfinite(values[key])


def test_job_logs_diagnostics_at_eval_points_only(tmp_path, monkeypatch):
    records, calls = run_counting(small_job(), tmp_path, monkeypatch)
    eval_steps = [1024, 2048, 3072]
    assert [s for s, _ in metric_series(records, "eval/val/loss")] == eval_steps
    for key in DIAG_RESIDUAL + ("layer_00/residual_rms", "layer_01/target_engaged", "layer_00/mixer_rms",
                                "layer_01/mixer_rms_over_sqrt_eps", "layer_00/gamma_mean", "layer_01/S_norm",
                                "layer_00/R_norm", "layer_00/attn_out_norm"):
        series = metric_series(records, key)
        assert [s for s, _ in series] == eval_steps, key
        assert all(math.isfinite(v) for _, v in series), key
    for r in records:
        if "diag/target_engaged" in r["values"]:
            check_record(r["values"], LAYER_NAMES_RESIDUAL, DIAG_RESIDUAL)
    # Two layers, three stats points, one eval batch (8 x 64) each, and never with gradients: no training step.
    assert calls == [(False, 8, 64)] * 6
    # The tiny model is in the regime the diagnostics exist to flag: the clip at 1 never acts.
    assert metric_series(records, "diag/target_engaged")[-1][1] < 1e-3


def test_stats_between_evals_and_without_eval_sets(tmp_path, monkeypatch):
    records, calls = run_counting(small_job(stats_every_tokens=1536), tmp_path / "between", monkeypatch)
    # Stats points at 1536 and 3072 (the end); 1536 is no eval point and pays one eval-batch forward of its own.
    assert [s for s, _ in metric_series(records, "diag/mixer_rms_over_sqrt_eps")] == [1536, 3072]
    assert [s for s, _ in metric_series(records, "eval/val/loss")] == [1024, 2048, 3072]
    assert calls == [(False, 8, 64)] * 4

    records, calls = run_counting(small_job("gdn", evals=False), tmp_path / "no-eval", monkeypatch)
    # No eval set: the step's last training micro batch, forwarded again without gradients after the step.
    steps = [1024, 2048, 3072]
    baseline_diag = ("diag/residual_rms", "diag/mixer_rms_over_sqrt_eps", "diag/alpha_mean", "diag/beta_mean")
    for key in baseline_diag + ("layer_00/residual_rms",):
        assert [s for s, _ in metric_series(records, key)] == steps, key
    for r in records:
        if "diag/residual_rms" in r["values"]:
            check_record(r["values"], LAYER_NAMES_BASELINE, baseline_diag)
    assert calls == [(False, 8, 64)] * 6
