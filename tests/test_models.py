"""Layers and the LM: step-by-step decoding == parallel forward, batch consistency, switches that reach the op,
stats and backends, and the config's validation. (The op itself is covered by tests/test_ops.py.)"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from rla_ablate.models import ABLATIONS, ModelConfig, build_model
from glue_checks import counting, expected_calls, glue_with_flas_semantics
from rla_ablate.ops.testing import assert_close

# A large init std makes every path carry signal (at 0.006 the logits barely depend on the mixers).
SHAPE = dict(vocab_size=50, hidden_size=32, num_layers=2, intermediate_size=48, num_heads=2, head_dim=8,
             init_std=0.25)
VARIANTS = {
    "transformer": dict(family="transformer", num_heads=4, num_kv_heads=2),
    "transformer-mha": dict(family="transformer"),
    "sgla": dict(family="sgla"),
    "gdn": dict(family="gdn"),
    "rla": dict(family="rla"),
    "rdn": dict(family="rdn"),
    "rla-none-tied-noconv": dict(family="rla", fit="none", tied_gamma=True, use_short_conv=False),
    "rdn-tanh-nogates-nonorm-ev": dict(family="rdn", target="tanh", output_gates=False, qk_norm="none",
                                       expand_v=1.5),
    "gdn-noconv": dict(family="gdn", use_short_conv=False),
    # The proxies' switches (docs/MATH.md, "Small-scale proxies"): in eval the relative radius is a constant.
    "rla-relative-identityconv": dict(family="rla", clip_mode="relative", clip=0.5, conv_init="identity"),
    "rdn-relative": dict(family="rdn", clip_mode="relative", clip=0.3),
    "sgla-learned-beta": dict(family="sgla", beta="learned"),
}


def make(variant: str, **extra) -> ModelConfig:
    return ModelConfig(**{**SHAPE, **VARIANTS[variant], **extra})


def built(cfg: ModelConfig, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(cfg).double().eval()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decoding_equals_parallel(variant):
    model = built(make(variant))
    ids = torch.randint(0, 50, (2, 13), generator=torch.Generator().manual_seed(42))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache()
        # Prefill an odd-length prompt, then one token at a time.
        pieces = [model(ids[:, :5], cache=cache)]
        for t in range(5, ids.shape[1]):
            pieces.append(model.step(ids[:, t], cache)[:, None])
        decoded = torch.cat(pieces, dim=1)
        # Two prefills of different lengths exercise the cache with T > 1 (the transformer's offset mask).
        cache2 = model.new_cache()
        two = torch.cat([model(ids[:, :7], cache=cache2), model(ids[:, 7:], cache=cache2)], dim=1)
    assert_close(f"{variant} step", full, decoded, ratio=1e-12)
    assert_close(f"{variant} two prefills", full, two, ratio=1e-12)
    # Decoding must really depend on the carried state, not only on the current token.
    with torch.no_grad():
        fresh = model(ids[:, -1:])
    assert (fresh[:, 0] - full[:, -1]).abs().max() > 1e-3


@pytest.mark.parametrize("variant", ["transformer", "rla", "rdn"])
def test_right_padded_batch_matches_each_sequence(variant):
    model = built(make(variant))
    gen = torch.Generator().manual_seed(7)
    lengths = [9, 4]
    ids = torch.randint(0, 50, (2, 9), generator=gen)
    ids[1, 4:] = 0
    with torch.no_grad():
        batch = model(ids)
        for i, n in enumerate(lengths):
            alone = model(ids[i:i + 1, :n])
            assert_close(f"{variant} seq {i}", alone[0], batch[i, :n], ratio=1e-12)


def test_backend_and_stats():
    rla = built(make("rla"))
    rla.track_stats(True)
    rla(torch.zeros(1, 6, dtype=torch.long))
    assert rla.backend_used == rla.kernel_used == "chunk"
    stats = rla.layer_stats()
    residual_names = ("attn_out_norm", "S_norm", "R_norm", "residual_rms", "target_engaged", "mixer_rms",
                      "mixer_rms_over_sqrt_eps", "alpha_mean", "beta_mean", "gamma_mean")
    assert sorted(stats) == sorted(f"layer_{i:02d}/{k}" for i in range(2) for k in residual_names)
    assert all(isinstance(v, float) and math.isfinite(v) for v in stats.values())
    # Every norm and mean is positive; only target_engaged may be 0.
    assert all(v > 0 for k, v in stats.items() if not k.endswith("target_engaged"))
    rla.track_stats(False)
    rla(torch.zeros(1, 6, dtype=torch.long))
    assert rla.layer_stats() == {}

    gdn = built(make("gdn"))
    gdn.track_stats(True)
    gdn(torch.zeros(1, 3, dtype=torch.long))
    baseline_names = ("attn_out_norm", "S_norm", "residual_rms", "mixer_rms", "mixer_rms_over_sqrt_eps", "alpha_mean",
                      "beta_mean")
    assert sorted(gdn.layer_stats()) == sorted(f"layer_{i:02d}/{k}" for i in range(2) for k in baseline_names)

    tf = built(make("transformer"))
    tf.track_stats(True)
    tf(torch.zeros(1, 3, dtype=torch.long))
    assert tf.backend_used == "sdpa"
    assert sorted(tf.layer_stats()) == ["layer_00/attn_out_norm", "layer_01/attn_out_norm"]


def test_attn_out_norm_is_the_op_output_norm():
    model = built(make("rdn"))
    model.track_stats(True)
    captured = {}
    layer = model.layers[0].attn
    hook = layer.o_norm.register_forward_pre_hook(lambda mod, args: captured.setdefault("o", args[0]))
    model(torch.arange(10)[None] % 50)
    hook.remove()
    expected = captured["o"].flatten(2).norm(dim=-1).mean().item()
    assert model.layer_stats()["layer_00/attn_out_norm"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("family", ["rla", "rdn"])
def test_naive_backend_agrees_with_chunk(family):
    ids = torch.randint(0, 50, (2, 70), generator=torch.Generator().manual_seed(3))
    chunk = built(make(family))
    naive = built(make(family, backend="naive"))
    naive.load_state_dict(chunk.state_dict())
    with torch.no_grad():
        assert_close(family, chunk(ids), naive(ids), ratio=1e-12)
    assert naive.backend_used == "naive"


def test_families_share_everything_but_their_gates():
    def mixer_params(cfg):
        return {k.split(".attn.")[1] for k in build_model(cfg).state_dict() if k.startswith("layers.0.attn.")}

    sgla, gdn, rla, rdn = (mixer_params(make(f)) for f in ("sgla", "gdn", "rla", "rdn"))
    shared = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv1d.weight", "k_conv1d.weight",
              "v_conv1d.weight", "g_proj.weight", "o_norm.weight", "o_proj.weight"}
    assert sgla == shared | {"gk_proj.weight", "gk_proj.bias"}
    assert gdn == shared | {"a_proj.weight", "A_log", "dt_bias", "b_proj.weight"}
    assert rla == sgla | {"b_proj.weight", "c_proj.weight"}
    assert rdn == gdn | {"c_proj.weight"}
    assert mixer_params(make("rla", tied_gamma=True)) == rla - {"c_proj.weight"}


@pytest.mark.parametrize("name", list(ABLATIONS))
@pytest.mark.parametrize("family", ["rla", "rdn"])
def test_every_ablation_switch_reaches_the_output(name, family):
    if family not in ABLATIONS[name].families:
        pytest.skip(f"{name} applies to {', '.join(ABLATIONS[name].families)}")
    ref_cfg = make(family)
    abl_cfg = ABLATIONS[name].apply(ref_cfg)
    ref, abl = built(ref_cfg), built(abl_cfg)
    missing, unexpected = abl.load_state_dict(ref.state_dict(), strict=False)
    assert not missing
    ids = torch.randint(0, 50, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ref(ids) - abl(ids)).abs().max() > 1e-6, f"{name} changed nothing"


@pytest.mark.parametrize("variant", ["transformer", "sgla", "rla", "rdn"])
def test_backward_reaches_every_parameter(variant):
    model = built(make(variant))
    model.train()
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(5))
    logits = model(ids)
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), ids[:, 1:].reshape(-1)).backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not no_grad


def test_relative_clip_scales_the_radius_by_the_residual_rms():
    from rla_ablate.ops.chunk import chunk_base_reads

    # One layer: the absolute twin below gives every layer the one radius measured here.
    cfg = make("rla", clip_mode="relative", clip=0.5, num_layers=1)
    model = built(cfg).train()
    mixer = model.layers[0].attn
    seen = {}
    # The (clip, scale) the op receives, and the k, v, g, beta they are measured from.
    original = mixer._clip_radius

    def spy(k, v, g, beta, S0, cu_seqlens=None):
        seen["inputs"] = (k, v, g, beta)
        clip, scale = original(k, v, g, beta, S0, cu_seqlens)
        seen["radius"] = clip * (1.0 if scale is None else scale.item())  # eval: the radius itself
        return clip, scale

    mixer._clip_radius = spy
    ids = torch.randint(0, 50, (2, 13), generator=torch.Generator().manual_seed(1))
    logits = model(ids)
    k, v, g, beta = seen["inputs"]
    rms = (v - chunk_base_reads(k, v, g, beta, "additive")).square().mean().sqrt().item()
    assert seen["radius"] == pytest.approx(0.5 * rms, rel=1e-12)
    # The first training forward sets the running RMS; eval then uses it, without gradients through it.
    assert mixer.residual_rms_ema.item() == pytest.approx(rms, rel=1e-12) and mixer.residual_rms_updates.item() == 1
    logits.sum().backward()
    assert all(p.grad is not None for p in mixer.parameters())
    # The same radius as an absolute clip computes the same model.
    absolute = built(make("rla", clip=seen["radius"], num_layers=1)).train()
    absolute.load_state_dict({k: t for k, t in model.state_dict().items() if "residual_rms" not in k})
    assert_close("relative == absolute at the same radius", absolute(ids), logits.detach(), ratio=1e-12)
    model.eval()
    model(ids)
    assert mixer.residual_rms_updates.item() == 1


def test_relative_clip_after_the_first_forward_uses_the_running_rms():
    from rla_ablate.models.layers import RESIDUAL_RMS_MOMENTUM
    from rla_ablate.ops.chunk import chunk_base_reads

    cfg = make("rla", clip_mode="relative", clip=0.5, num_layers=2)
    model = built(cfg).train()
    mixers = [layer.attn for layer in model.layers]
    seen: list = []
    for mixer in mixers:
        original = mixer._clip_radius

        def spy(k, v, g, beta, S0, cu_seqlens=None, original=original):
            clip, scale = original(k, v, g, beta, S0, cu_seqlens)
            seen.append((clip * scale.item(), v, chunk_base_reads(k, v, g, beta, "additive")))
            return clip, scale

        mixer._clip_radius = spy
    gen = torch.Generator().manual_seed(1)
    model(torch.randint(0, 50, (2, 13), generator=gen))
    first = [mixer.residual_rms_ema.item() for mixer in mixers]
    seen.clear()
    # Without a hand-over, a training forward reads the running mean itself; the batch's RMS only updates it.
    model(torch.randint(0, 50, (2, 13), generator=gen))
    for mixer, before, (radius, v, pred) in zip(mixers, first, seen):
        rms = (v - pred).square().mean().sqrt().item()
        assert radius == 0.5 * before
        assert mixer.residual_rms_ema.item() == pytest.approx(
            RESIDUAL_RMS_MOMENTUM * before + (1 - RESIDUAL_RMS_MOMENTUM) * rms, rel=1e-12)
        assert mixer.residual_rms_updates.item() == 2
    # The trainer hands the running means over once per step: every training forward until the next uses them.
    assert [t.item() for t in model.relative_clip_rms()] == [m.residual_rms_ema.item() for m in mixers]
    model.hand_over_clip_rms([0.25, 4.0])
    seen.clear()
    model(torch.randint(0, 50, (2, 13), generator=gen))
    model(torch.randint(0, 50, (2, 13), generator=gen))
    assert [radius for radius, _, _ in seen] == [0.125, 2.0, 0.125, 2.0]
    with pytest.raises(ValueError, match="1 values for 2 relative-clip layers"):
        model.hand_over_clip_rms([1.0])
    # The trainer's read: its own values back as floats; the running means handed over on the device, unread.
    assert model.read_and_hand_over(torch.tensor(1.5), torch.tensor(2.5, dtype=torch.float64)) == [1.5, 2.5]
    assert [m.handed_rms.item() for m in mixers] == [m.residual_rms_ema.item() for m in mixers]
    # None: that layer's forwards use their running mean again
    model.hand_over_clip_rms([None, 4.0])
    running = mixers[0].residual_rms_ema.item()
    seen.clear()
    model(torch.randint(0, 50, (2, 13), generator=gen))
    assert math.isnan(mixers[0].handed_rms.item()) and [radius for radius, _, _ in seen] == [0.5 * running, 2.0]


# The aten ops that make a CUDA host wait: reading a value (item, tolist, float(tensor)), data-dependent shapes, and
# a tensor built from host values (torch.tensor(x, device=...)), a host-to-device copy.
SYNCING_OPS = {"_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "masked_select", "lift_fresh",
               "lift_fresh_copy"}


@pytest.mark.parametrize("preset", ["proxy-mqar-rla", "proxy-mqar-rdn", "proxy-mqar-sgla", "proxy-mqar-gdn"])
def test_a_training_step_asks_the_host_for_nothing(preset):
    # The CPU side of the GPU test of the same name: packed jobs take turns on a GPU, and every host sync inside a
    # step waits for the others' turns. On the CPU the ops that would sync there are caught by name (the model's
    # glue, the relative clip's running RMS and the torch chunk path; the Triton and FLA paths are the GPU test's).
    import traceback

    from torch.utils._python_dispatch import TorchDispatchMode

    from rla_ablate.models import load_preset

    class Probe(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.hits: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in SYNCING_OPS:
                self.hits.append(f"{func}:\n{''.join(traceback.format_stack(limit=6)[:-1])}")
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    cfg = load_preset(preset)
    model = build_model(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (1, 80))  # two chunks of 64, the second partial

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids)
        F.cross_entropy(logits.float().flatten(0, 1), ids.flatten()).backward()

    # the relative clip's radius never leaves the device: not in the first forward (the batch's own RMS), not in
    # the hand-over, not after it
    probe = Probe()
    with probe:
        step()
        model.hand_over_clip_rms()
        step()
    assert not probe.hits, probe.hits[0]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_relative_clip_of_a_blown_up_state_leaves_the_verdict_to_the_guard():
    # The delta rule without the q/k norm can blow its state up: the batch's residual RMS is not finite. The layer
    # still runs (the loss is not finite and the divergence guard skips the step), the running RMS stays finite.
    cfg = make("rdn", clip_mode="relative", clip=0.5, num_layers=1, qk_norm="none")
    model = built(cfg).train()
    mixer = model.layers[0].attn
    ids = torch.randint(0, 50, (2, 13), generator=torch.Generator().manual_seed(1))
    model(ids)
    before = mixer.residual_rms_ema.item()
    with torch.no_grad():
        mixer.v_proj.weight.fill_(float("inf"))
    logits = model(ids)
    assert not torch.isfinite(logits).all()
    assert mixer.residual_rms_ema.item() == before and mixer.residual_rms_updates.item() == 1


def test_identity_conv_init_passes_the_current_token():
    model = built(make("rla", conv_init="identity"))
    w = model.layers[0].attn.q_conv1d.weight
    assert torch.equal(w[:, 0, -1], torch.ones_like(w[:, 0, -1])) and not w[:, :, :-1].any()


def test_init_std_from_config():
    model = build_model(ModelConfig(**{**SHAPE, "family": "rla", "hidden_size": 256, "init_std": 0.006}))
    std = model.layers[0].mlp.up_proj.weight.std().item()
    assert std == pytest.approx(0.006, rel=0.05)
    A = build_model(make("gdn")).layers[0].attn.A_log.exp()
    assert torch.all((A > 0) & (A <= 16))


@pytest.mark.parametrize("bad, message", [
    (dict(family="sgla", tied_gamma=True), "only to residual families"),
    (dict(family="gdn", target="identity"), "only to residual families"),
    (dict(family="rla", fit="off"), "use family 'sgla'"),
    (dict(family="gdn", fit="none"), "fit must be 'off'"),
    (dict(family="rla", num_kv_heads=1), "num_kv_heads is for the transformer"),
    (dict(family="transformer", qk_norm="l2"), "transformer uses qk_norm='none'"),
    (dict(family="transformer", num_heads=3, num_kv_heads=2), "multiple of num_kv_heads"),
    (dict(family="transformer", head_dim=7), "even head_dim"),
    (dict(family="rdn", expand_v=1.3), "head_dim * expand_v must be a positive integer"),
    (dict(family="rdn", fit="partial"), "fit"),
    (dict(family="rdn", colour="red"), "colour"),
    (dict(family="rdn", backend="cuda"), "not one of auto, naive, chunk, fla, triton"),
    (dict(family="sgla", clip_mode="relative"), "only to residual families"),
    (dict(family="rla", beta="fixed"), "only sgla may fix it"),
    (dict(family="transformer", beta="learned"), "the transformer has no write gate"),
    (dict(family="gdn", use_short_conv=False, conv_init="identity"), "needs the short convolution"),
])
def test_invalid_configs_are_rejected(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig(**{**SHAPE, **bad})


def test_unset_switches_resolve_per_family():
    rla, sgla, tf = make("rla"), make("sgla"), make("transformer")
    assert (rla.fit, rla.qk_norm, rla.use_short_conv, rla.rule) == ("residual", "l2", True, "additive")
    assert (sgla.fit, make("gdn").rule) == ("off", "delta")
    assert (tf.fit, tf.qk_norm, tf.use_short_conv, tf.num_kv_heads) == ("off", "none", False, 2)
    # The resolved JSON (what job ids hash) validates back to the same config.
    assert ModelConfig.model_validate_json(rla.model_dump_json()) == rla
    assert rla.replace(family="sgla").fit == "off"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
@pytest.mark.parametrize("variant", ["rla", "sgla"])
def test_autocast_hands_the_op_one_dtype(variant, device, monkeypatch):
    """Under bf16 autocast q and k leave the L2 norm in the activation dtype, as v (CUDA autocasts rsqrt to fp32)."""
    import rla_ablate.models.layers as layers

    seen = []
    real = layers.residual_attention

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(layers, "residual_attention", spy)
    torch.manual_seed(0)
    model = build_model(make(variant, qk_norm="l2")).to(device)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(3)).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        model(ids).float().sum().backward()
    assert seen and all(d == (torch.bfloat16,) * 3 for d in seen), seen


def test_l2norm_keeps_the_dtype_and_float64_precision():
    from rla_ablate.models.layers import L2_EPS, _l2norm

    x = torch.randn(3, 5, 2, 16, dtype=torch.float64)
    assert _l2norm(x.bfloat16()).dtype == torch.bfloat16
    assert_close("float64 l2norm", x / (x.square().sum(-1, keepdim=True) + L2_EPS).sqrt(), _l2norm(x), ratio=1e-14)


def test_short_convolution_is_causal_streams_and_hands_on_rows():
    from rla_ablate.models.layers import ShortConvolution

    torch.manual_seed(0)
    conv = ShortConvolution(6, 4)
    x = torch.randn(2, 9, 6)
    y, cache = conv(x)
    assert y.is_contiguous()  # the heads' kernels read rows of the last dimension
    padded = torch.cat([torch.zeros(2, 3, 6), x], dim=1)
    want = torch.stack([(padded[:, t:t + 4] * conv.weight[:, 0].t()).sum(1) for t in range(9)], dim=1)
    torch.testing.assert_close(y, F.silu(want))
    first, c = conv(x[:, :5])
    rest, _ = conv(x[:, 5:], c)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), y)
    torch.testing.assert_close(cache, x[:, -3:])


def test_shared_input_projections_are_the_linears():
    """`fusion.SharedInput`: outputs and gradients of every reader of one input equal separate linears' (float64),
    wide and narrow readers mixed, a narrow one with a bias, an output left unused, a frozen weight; under autocast
    the outputs come in autocast's dtype, as F.linear's."""
    import rla_ablate.models.fusion as fusion

    torch.manual_seed(0)
    D = 40
    widths = [(96, False), (6, True), (80, False), (6, False), (3, False)]
    linears = [torch.nn.Linear(D, w, bias=b).double() for w, b in widths]
    linears[2].weight.requires_grad_(False)
    x = torch.randn(3, 7, D, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    got = fusion.project(x, linears, shared=True)
    want = [lin(x_ref) for lin in linears]
    for i, (a, b) in enumerate(zip(want, got)):
        assert b.shape == a.shape
        assert_close(f"output {i}", a, b, ratio=1e-13)
    seeds = [torch.randn_like(y) for y in want]
    used = [0, 1, 2, 4]  # reader 3's output goes unused: its gradient is None
    grads = []
    for outs, inp in ((want, x_ref), (got, x)):
        for lin in linears:
            lin.zero_grad()
        sum((outs[i] * seeds[i]).sum() for i in used).backward()
        grads.append([inp.grad] + [p.grad.clone() if p.grad is not None else None for lin in linears
                                   for p in lin.parameters()])
    for i, (a, b) in enumerate(zip(*grads)):
        if a is None:
            assert b is None, i
            continue
        assert_close(f"gradient {i}", a, b, ratio=1e-13)
    assert linears[2].weight.grad is None and linears[3].weight.grad is None

    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = fusion.project(x.float(), [lin.float() for lin in linears], shared=True)
        plain = [lin(x.float()) for lin in linears]
    assert [y.dtype for y in outs] == [y.dtype for y in plain] == [torch.bfloat16] * len(linears)
    for i, (a, b) in enumerate(zip(plain, outs)):
        assert_close(f"autocast output {i}", a.double(), b.double(), ratio=1e-2)
    assert not fusion.shares_inputs(x, "torch") and not fusion.shares_inputs(x, "auto")  # the CPU: plain linears


@pytest.mark.parametrize("variant", ["rla", "rdn", "sgla-learned-beta", "rdn-tanh-nogates-nonorm-ev", "gdn-noconv",
                                     "transformer"])
def test_fused_glue_branch_is_the_torch_glue(variant, monkeypatch):
    """The model hands FLA's glue the right tensors, weights and eps: with functions of FLA's semantics in their
    place, outputs and every parameter's gradient equal the plain-torch glue's (float64). Decoding and packed
    sequences keep the torch conv; mixers take the fused branch only where the op runs on a GPU backend, blocks
    only on the devices of `fusion.DEVICES`."""
    import rla_ablate.models.fusion as fusion

    torch.manual_seed(0)
    ref = build_model(make(variant)).double().train()
    ref.set_glue("torch")  # the reference, also once the fused branch is routed to the CPU below
    fused = build_model(make(variant)).double().train()
    fused.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 50, (2, 11), generator=torch.Generator().manual_seed(5))
    ref(ids).square().sum().backward()
    assert fused.glue == "auto"

    calls: list[str] = []
    counted = counting(glue_with_flas_semantics(), calls)
    monkeypatch.setattr(fusion, "fused_glue", lambda: counted)
    monkeypatch.setattr(fusion, "GPU_BACKENDS", ("chunk",))
    with torch.no_grad():
        fused(ids)
    assert set(calls) == expected_calls(make(variant)) - {"add_rms_norm", "swiglu"}, "blocks take it only on CUDA"
    calls.clear()
    monkeypatch.setattr(fusion, "DEVICES", ("cpu",))
    # the readers of one input share a backward (fusion.SharedInput) where the blocks take the glue: here q, k, v and
    # the MLP's two are wide readers and the gates narrow ones, as at 100M (all tiny otherwise)
    monkeypatch.setattr(fusion, "NARROW", 8)
    shared, apply = [], fusion.SharedInput.apply
    monkeypatch.setattr(fusion.SharedInput, "apply", lambda *a: shared.append(a[1]) or apply(*a))
    fused(ids).square().sum().backward()
    assert set(calls) == expected_calls(make(variant)), calls
    assert len(shared) == 2 * len(fused.layers) and shared[1] == 2, shared  # each mixer's readers, each MLP's two
    with torch.no_grad():
        assert_close(f"{variant} logits", ref(ids), fused(ids), ratio=1e-12)
    for (name, a), (_, b) in zip(ref.named_parameters(), fused.named_parameters()):
        assert b.grad is not None, name
        assert_close(f"{variant} d{name}", a.grad, b.grad, ratio=1e-11)

    # the training loss (labels given): the fused head + cross-entropy, some labels not scored
    labels = ids.roll(-1, dims=1)
    labels[:, -1] = labels[0, 3] = fusion.IGNORE_INDEX
    calls.clear()
    losses = []
    for model in (ref, fused):
        model.zero_grad()
        losses.append(model(ids, labels=labels))
        losses[-1].backward()
    assert set(calls) == expected_calls(make(variant), loss=True), calls
    with torch.no_grad():
        plain = F.cross_entropy(ref(ids).flatten(0, 1), labels.flatten(), reduction="sum")
    assert_close(f"{variant} loss", plain, losses[0].detach(), ratio=1e-12)
    assert_close(f"{variant} fused loss", plain, losses[1].detach(), ratio=1e-12)
    for (name, a), (_, b) in zip(ref.named_parameters(), fused.named_parameters()):
        assert_close(f"{variant} loss d{name}", a.grad, b.grad, ratio=1e-11)

    # glue "torch" never takes the fused branch; a mode that is not one is refused
    calls.clear()
    fused.set_glue("torch")
    with torch.no_grad():
        fused(ids)
    assert calls == [] and fused.glue == "torch"
    with pytest.raises(ValueError, match="glue must be one of"):
        fused.set_glue("fused")


def test_a_missing_preset_file_is_named_with_the_folder_it_was_read_from(tmp_path, monkeypatch):
    from rla_ablate.errors import UserError
    from rla_ablate.models.presets import load_preset

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as info:
        load_preset("sub/nosuch.yaml")
    assert f"{tmp_path / 'sub' / 'nosuch.yaml'} does not exist" in str(info.value)
    assert f"read from the current folder, {tmp_path}" in str(info.value)
