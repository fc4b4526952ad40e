"""The residual attention contract (docs/MATH.md): naive vs independent loops, chunk vs naive, FLA baselines."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from rla_ablate.ops import residual_attention
from rla_ablate.ops.chunk import chunk_residual_attention
from rla_ablate.ops.spec import ResidualSpec
from rla_ablate.ops.testing import assert_close
from op_combos import COMBOS, combo_id


def make_inputs(B=2, T=63, H=2, K=8, V=6, dtype=torch.float64, seed=42, with_state=True, requires_grad=True):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    inputs = {
        "q": rnd(B, T, H, K),
        "k": F.normalize(rnd(B, T, H, K), dim=-1),
        "v": rnd(B, T, H, V),
        "g": F.logsigmoid(rnd(B, T, H) + 2.0),
        "beta": torch.rand(B, T, H, generator=gen, dtype=dtype),
        "gamma": torch.rand(B, T, H, generator=gen, dtype=dtype),
    }
    if with_state:
        inputs["S0"] = rnd(B, H, V, K) * 0.5
        inputs["R0"] = rnd(B, H, V, K) * 0.5
    if requires_grad:
        for x in inputs.values():
            x.requires_grad_(True)
    return inputs


def run(inputs, backend, chunk_size=None, **switches):
    state = (inputs["S0"], inputs["R0"]) if "S0" in inputs else None
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "gamma")]
    if chunk_size is not None:
        # Small chunks make every test cross several chunk boundaries (T = 63 spans four chunks of 16).
        spec = ResidualSpec(**{n: switches[n] for n in ("rule", "fit", "target", "clip", "output_gates") if n in switches})
        gamma = None if spec.fit == "off" else args[5]
        scale = switches.get("scale") or args[0].shape[-1] ** -0.5
        return chunk_residual_attention(*args[:5], gamma, spec, scale, state, chunk_size=chunk_size)
    return residual_attention(*args, initial_state=state, backend=backend, **switches)


def independent_loops(inputs, rule, fit, target, og, clip=1.0, scale=None):
    """A second, deliberately different reading of the equations: per (batch, head), explicit matrices."""
    q, k, v, g, beta, gamma = (inputs[n].detach() for n in ("q", "k", "v", "g", "beta", "gamma"))
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    o = torch.zeros(B, T, H, V, dtype=q.dtype)
    finals = []
    for b, h in itertools.product(range(B), range(H)):
        S = inputs["S0"][b, h].detach().clone() if "S0" in inputs else torch.zeros(V, K, dtype=q.dtype)
        R = inputs["R0"][b, h].detach().clone() if "R0" in inputs else torch.zeros(V, K, dtype=q.dtype)
        eye = torch.eye(K, dtype=q.dtype)
        for t in range(T):
            kt, vt, qt = k[b, t, h][:, None], v[b, t, h][:, None], q[b, t, h][:, None] * scale
            alpha, bt, ct = torch.exp(g[b, t, h]), beta[b, t, h], gamma[b, t, h]
            err = vt - S @ kt
            if target == "clip":
                rt = torch.clamp(err, -clip, clip)
            elif target == "tanh":
                rt = clip * torch.tanh(err / clip)
            else:
                rt = err
            if rule == "additive":
                S_next = alpha * S + bt * vt @ kt.T
            else:
                S_next = alpha * S @ (eye - bt * kt @ kt.T) + bt * vt @ kt.T
            if fit == "off":
                o[b, t, h] = (S_next @ qt)[:, 0]
            else:
                if fit == "none":
                    R = rt @ kt.T
                elif rule == "additive":
                    R = alpha * R + ct * rt @ kt.T
                else:
                    R = alpha * R @ (eye - ct * kt @ kt.T) + ct * rt @ kt.T
                out = alpha * S @ qt + ct * R @ qt if og else S @ qt + R @ qt
                o[b, t, h] = out[:, 0]
            S = S_next
        finals.append((S, R))
    S_T = torch.stack([s for s, _ in finals]).reshape(B, H, V, K)
    R_T = torch.stack([r for _, r in finals]).reshape(B, H, V, K)
    return o, S_T, (None if fit == "off" else R_T)


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_naive_matches_independent_loops(combo):
    rule, fit, target, og = combo
    inputs = make_inputs(T=17, requires_grad=False)
    clip = 1.0 if fit == "off" else 0.7
    o, (S, R) = run(inputs, "naive", rule=rule, fit=fit, target=target, output_gates=og, clip=clip)
    o_ref, S_ref, R_ref = independent_loops(inputs, rule, fit, target, og, clip=clip)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=1e-12, atol=1e-12)
    if fit == "off":
        assert R is None
    else:
        torch.testing.assert_close(R, R_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("with_state", [True, False], ids=["h0", "no-h0"])
@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_chunk_matches_naive_outputs_states_gradients(combo, with_state):
    rule, fit, target, og = combo
    inputs = make_inputs(T=63, with_state=with_state)
    switches = dict(rule=rule, fit=fit, target=target, output_gates=og, clip=1.0 if fit == "off" else 0.5)
    gen = torch.Generator().manual_seed(7)
    results = {}
    for backend in ("naive", "chunk"):
        o, (S, R) = run(inputs, backend, chunk_size=16 if backend == "chunk" else None, **switches)
        do = torch.randn(o.shape, generator=gen, dtype=o.dtype)
        dS = torch.randn(S.shape, generator=gen, dtype=S.dtype)
        loss = (o * do).sum() + (S * dS).sum()
        if R is not None:
            loss = loss + (R * torch.randn(R.shape, generator=gen, dtype=R.dtype)).sum()
        names = [n for n, x in inputs.items() if not (fit == "off" and n in ("gamma", "R0"))]
        grads = torch.autograd.grad(loss, [inputs[n] for n in names], allow_unused=True)
        results[backend] = (o, S, R, dict(zip(names, grads)))
        gen.manual_seed(7)
    o1, S1, R1, g1 = results["naive"]
    o2, S2, R2, g2 = results["chunk"]
    tol = dict(ratio=1e-10, atol=1e-12)
    assert_close("o", o1, o2, **tol)
    assert_close("S_T", S1, S2, **tol)
    if R1 is not None:
        assert_close("R_T", R1, R2, **tol)
    for name, ref in g1.items():
        got = g2[name]
        if ref is None:
            assert got is None or got.abs().max() == 0, f"d{name} should be zero"
            continue
        assert_close(f"d{name}", ref, torch.zeros_like(ref) if got is None else got, **tol)


@pytest.mark.parametrize("chunk_size", [1, 16, 64, 100])
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_chunk_size_does_not_change_results(rule, chunk_size):
    inputs = make_inputs(T=130, requires_grad=False)
    spec = ResidualSpec(rule=rule)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "gamma")]
    o_ref, (S_ref, R_ref) = chunk_residual_attention(*args, spec, 8 ** -0.5, (inputs["S0"], inputs["R0"]), chunk_size=130)
    o, (S, R) = chunk_residual_attention(*args, spec, 8 ** -0.5, (inputs["S0"], inputs["R0"]), chunk_size=chunk_size)
    for name, a, b in (("o", o_ref, o), ("S", S_ref, S), ("R", R_ref, R)):
        assert_close(name, a, b, ratio=1e-11, atol=1e-12)


@pytest.mark.parametrize("backend", ["naive", "chunk"])
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_query_scale_never_touches_the_residual_read(rule, backend):
    # o is linear in the query scale only if the read S_{t-1} k_t that forms r_t is unscaled.
    inputs = make_inputs(requires_grad=False)
    o1, _ = run(inputs, backend, rule=rule, scale=0.3)
    o2, _ = run(inputs, backend, rule=rule, scale=0.6)
    assert_close("o(2s) vs 2 o(s)", 2 * o1, o2, ratio=1e-12)


def test_no_fitting_has_no_memory_of_R():
    inputs = make_inputs(requires_grad=False)
    o_a, (_, R_a) = run(inputs, "naive", fit="none")
    inputs["R0"] = inputs["R0"] * 10
    o_b, (_, R_b) = run(inputs, "naive", fit="none")
    torch.testing.assert_close(o_a, o_b, rtol=0, atol=0)
    torch.testing.assert_close(R_a, R_b, rtol=0, atol=0)


def test_targets_are_as_specified():
    x = torch.linspace(-5, 5, 101, dtype=torch.float64)
    assert torch.equal(ResidualSpec(target="clip", clip=2.0).apply_target(x), x.clamp(-2, 2))
    assert torch.equal(ResidualSpec(target="identity").apply_target(x), x)
    tanh = ResidualSpec(target="tanh", clip=2.0).apply_target(x)
    torch.testing.assert_close(tanh, 2.0 * torch.tanh(x / 2.0))
    # c*tanh(x/c) has slope 1 at 0 and saturates at +-c, like the clip it smooths
    assert tanh.abs().max() < 2.0


def _fla_inputs(T=45, B=2, H=3, K=16, V=12):
    inputs = make_inputs(B=B, T=T, H=H, K=K, V=V, dtype=torch.float32, requires_grad=False)
    return inputs


def test_additive_baseline_equals_fla_simple_gla():
    naive = pytest.importorskip("fla.ops.simple_gla.naive")
    inputs = _fla_inputs()
    ones = torch.ones_like(inputs["beta"])
    for backend in ("naive", "chunk"):
        o, (S, R) = residual_attention(inputs["q"], inputs["k"], inputs["v"], inputs["g"], ones, None, rule="additive",
                                       fit="off", initial_state=(inputs["S0"], None), backend=backend)
        o_ref, S_ref = naive.naive_recurrent_simple_gla(inputs["q"], inputs["k"], inputs["v"], inputs["g"],
                                                        initial_state=inputs["S0"].transpose(-1, -2),
                                                        output_final_state=True)
        assert R is None
        assert_close(f"{backend} o", o_ref, o, ratio=1e-5)
        assert_close(f"{backend} S", S_ref.transpose(-1, -2), S, ratio=1e-5)


def test_delta_baseline_equals_fla_gated_delta_rule():
    naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
    inputs = _fla_inputs()
    for backend in ("naive", "chunk"):
        o, (S, _) = residual_attention(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], None,
                                       rule="delta", fit="off", initial_state=(inputs["S0"], None), backend=backend)
        o_ref, S_ref = naive.naive_recurrent_gated_delta_rule(inputs["q"], inputs["k"], inputs["v"], inputs["beta"],
                                                              inputs["g"], initial_state=inputs["S0"].transpose(-1, -2),
                                                              output_final_state=True)
        assert_close(f"{backend} o", o_ref, o, ratio=1e-5)
        assert_close(f"{backend} S", S_ref.transpose(-1, -2), S, ratio=1e-5)


def test_low_precision_inputs_run_in_float32_and_return_input_dtype():
    inputs = make_inputs(dtype=torch.float64, requires_grad=False, with_state=False)
    bf = {n: x.to(torch.bfloat16) for n, x in inputs.items()}
    o_ref, _ = run(inputs, "naive", rule="delta")
    for backend in ("naive", "chunk"):
        o, (S, R) = run(bf, backend, rule="delta")
        assert o.dtype == torch.bfloat16 and S.dtype == torch.float32 and R.dtype == torch.float32
        assert_close(f"{backend} bf16", o_ref, o, ratio=2e-2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rule="gated"), "rule must be one of"),
        (dict(fit="partial"), "fit must be one of"),
        (dict(target="huber"), "target must be one of"),
        (dict(clip=0.0), "clip must be a positive"),
        (dict(fit="off", target="tanh"), "fit='off' has no residual path"),
        (dict(fit="off", output_gates=False), "fit='off' has no residual path"),
        (dict(backend="cuda-magic"), "unknown backend"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_invalid_switches_raise_clear_errors(kwargs, message):
    inputs = make_inputs(requires_grad=False, with_state=False)
    with pytest.raises(ValueError, match=message):
        run(inputs, kwargs.pop("backend", "naive"), **kwargs)


def test_invalid_shapes_and_dtypes_raise_clear_errors():
    i = make_inputs(requires_grad=False, with_state=False)
    q, k, v, g, beta, gamma = (i[n] for n in ("q", "k", "v", "g", "beta", "gamma"))
    with pytest.raises(ValueError, match="q and k must both be"):
        residual_attention(q, k[:, :-1], v, g, beta, gamma)
    with pytest.raises(ValueError, match="v must be"):
        residual_attention(q, k, v[:, :, :1], g, beta, gamma)
    with pytest.raises(ValueError, match="gamma must be"):
        residual_attention(q, k, v, g, beta, gamma[..., :1])
    with pytest.raises(ValueError, match="gamma is required"):
        residual_attention(q, k, v, g, beta, None, fit="residual")
    with pytest.raises(ValueError, match="floating-point"):
        residual_attention(q, k, v, g, beta.long(), gamma)
    with pytest.raises(ValueError, match="share one dtype"):
        residual_attention(q, k.float(), v.bfloat16(), g, beta, gamma)
    with pytest.raises(ValueError, match="initial_state S0 must be"):
        residual_attention(q, k, v, g, beta, gamma, initial_state=(torch.zeros(1, 2, 3, 4), None))


def _strong_decay_inputs(T, g_kind, dtype=torch.float64, seed=0):
    inputs = make_inputs(B=1, T=T, H=2, K=16, V=16, dtype=torch.float64, seed=seed, requires_grad=False)
    gen = torch.Generator().manual_seed(seed + 1)
    if g_kind == "uniform-20":
        inputs["g"] = -20 * torch.rand(inputs["g"].shape, generator=gen, dtype=torch.float64)
    else:  # "resets:<g>": 5% of tokens (nearly or exactly) erase the state
        reset = torch.rand(inputs["g"].shape, generator=gen, dtype=torch.float64) < 0.05
        inputs["g"] = torch.where(reset, torch.full_like(inputs["g"], float(g_kind.split(":")[1])), inputs["g"])
    return {n: x.to(dtype) for n, x in inputs.items()}


@pytest.mark.parametrize("rule", ["additive", "delta"])
@pytest.mark.parametrize("g_kind", ["uniform-20", "resets:-1e3", "resets:-1e5"])
def test_float32_chunk_matches_float64_naive_under_strong_decay(rule, g_kind):
    # Pairwise decays are summed per segment, never differenced from long cumulative sums (float32 cancellation).
    inputs64 = _strong_decay_inputs(300, g_kind)
    o_ref, (S_ref, R_ref) = run(inputs64, "naive", rule=rule)
    o, (S, R) = run({n: x.float() for n, x in inputs64.items()}, "chunk", rule=rule)
    # float32 naive itself lands at ~1.5e-7 on these inputs
    for name, ref, got in (("o", o_ref, o), ("S", S_ref, S), ("R", R_ref, R)):
        assert_close(name, ref, got, ratio=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_zero_retention_is_finite_and_matches_naive(rule, dtype):
    # alpha_t = 0 exactly (g = log 0 = -inf), as a sigmoid gate that underflows produces
    inputs = _strong_decay_inputs(150, "resets:-inf", dtype=dtype)
    results = {}
    for backend in ("naive", "chunk"):
        leaves = {n: x.clone().requires_grad_(True) for n, x in inputs.items()}
        o, (S, R) = run(leaves, backend, rule=rule)
        loss = o.pow(2).sum() + S.pow(2).sum() + R.pow(2).sum()
        results[backend] = [o, S, R, *torch.autograd.grad(loss, list(leaves.values()))]
    names = ["o", "S", "R"] + [f"d{n}" for n in inputs]
    for name, ref, got in zip(names, results["naive"], results["chunk"]):
        assert_close(name, ref, got, ratio=1e-5 if dtype == torch.float32 else 1e-10)


@pytest.mark.parametrize("backend", ["naive", "chunk"])
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_packed_sequences_equal_the_batched_call(rule, backend):
    # N equal-length sequences packed along time (B = 1, cu_seqlens) == the same N as a batch, gradients too.
    batched = make_inputs(B=3, T=21)
    o_b, (S_b, R_b) = run(batched, backend, rule=rule)
    grads_b = torch.autograd.grad(o_b.pow(2).sum() + S_b.sum() + R_b.sum(), list(batched.values()))
    packed = {n: (x.detach().reshape(1, -1, *x.shape[2:]) if n not in ("S0", "R0") else x.detach()).requires_grad_(True)
              for n, x in batched.items()}
    cu = torch.tensor([0, 21, 42, 63])
    o_p, (S_p, R_p) = residual_attention(*(packed[n] for n in ("q", "k", "v", "g", "beta", "gamma")), rule=rule,
                                         initial_state=(packed["S0"], packed["R0"]), backend=backend, cu_seqlens=cu)
    grads_p = torch.autograd.grad(o_p.pow(2).sum() + S_p.sum() + R_p.sum(), list(packed.values()))
    assert_close("o", o_b.reshape(1, 63, *o_b.shape[2:]), o_p, ratio=1e-12)
    assert_close("S_T", S_b, S_p, ratio=1e-12)
    assert_close("R_T", R_b, R_p, ratio=1e-12)
    for name, gb, gp in zip(batched, grads_b, grads_p):
        assert_close(f"d{name}", gb.reshape(gp.shape), gp, ratio=1e-12)


def test_packed_sequences_reject_bad_boundaries():
    i = make_inputs(B=1, T=10, requires_grad=False, with_state=False)
    args = [i[n] for n in ("q", "k", "v", "g", "beta", "gamma")]
    with pytest.raises(ValueError, match="rise from 0 to T = 10"):
        residual_attention(*args, cu_seqlens=torch.tensor([0, 4, 9]))
    with pytest.raises(ValueError, match="1-D integer tensor"):
        residual_attention(*args, cu_seqlens=torch.tensor([0.0, 10.0]))
    with pytest.raises(ValueError, match="initial_state S0 must be"):
        residual_attention(*args, cu_seqlens=torch.tensor([0, 4, 10]), initial_state=(torch.zeros(1, 2, 6, 8), None))
    two = make_inputs(B=2, T=10, requires_grad=False, with_state=False)
    with pytest.raises(ValueError, match="batch size must be 1"):
        residual_attention(*(two[n] for n in ("q", "k", "v", "g", "beta", "gamma")), cu_seqlens=torch.tensor([0, 10]))


def test_auto_takes_the_fused_backend_only_for_the_rule_whose_gpu_tests_passed():
    from rla_ablate.ops import BACKENDS, _load_gpu_backends, auto_order

    _load_gpu_backends()
    if not {"fla", "triton"} <= set(BACKENDS):
        pytest.skip("FLA / triton not importable here")
    assert auto_order("additive")[:2] == ["triton", "fla"]
    assert auto_order("delta")[:2] == ["triton", "fla"]
    assert auto_order("additive")[-1] == auto_order("delta")[-1] == "chunk"


def test_kernel_tag_names_the_implementation_that_runs():
    """One backend name, several implementations: the tag runs log names the one the inputs take."""
    from rla_ablate.ops import BACKENDS, _load_gpu_backends, kernel_tag

    assert kernel_tag("chunk", torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 1, 8), ResidualSpec()) == "chunk"
    _load_gpu_backends()
    if "triton" not in BACKENDS:
        pytest.skip("FLA / triton not importable here")
    from rla_ablate.ops.triton import backend as tb

    bf, q = torch.bfloat16, torch.zeros(2, 64, 4, 32)
    one = "triton/rdn-fused" if tb.RDN.one_function else "triton/rdn-reads+fla"  # the auxiliary pass with the base's
    cases = {("additive", "residual", bf): "triton/rla-fused", ("additive", "none", bf): "triton/rla-fused",
             ("delta", "residual", bf): one, ("delta", "none", bf): "triton/rdn-reads+fla",
             ("delta", "off", bf): "triton/fla+glue",
             ("additive", "off", bf): "triton/fla+glue", ("additive", "residual", torch.float32): "triton/fla+glue"}
    for (rule, fit, dtype), tag in cases.items():
        x = q.to(dtype)
        assert kernel_tag("triton", x, x, ResidualSpec(rule=rule, fit=fit)) == tag, (rule, fit, dtype)
    wide = torch.zeros(2, 64, 4, 256, dtype=bf)                 # heads over 128: the composition
    assert kernel_tag("triton", wide, wide, ResidualSpec()) == "triton/fla+glue"
    assert kernel_tag("triton", q[:, :0].to(bf), q[:, :0].to(bf), ResidualSpec()) == "triton/chunk"
