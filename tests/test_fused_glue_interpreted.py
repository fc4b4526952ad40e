"""FLA's own glue kernels in the models, on CPU through Triton's interpreter (TRITON_INTERPRET=1).

test_models.py checks the wiring with torch functions of FLA's semantics in place of the kernels; this file runs
FLA's real kernels (`causal_conv1d`, `l2norm`, `rms_norm_gated` in the mixers; the residual add + RMSNorm of
`fusion.AddRMSNorm` on `layer_norm_fwd`/`layer_norm_bwd` and `swiglu` in the blocks; `fused_linear_cross_entropy_loss`
for the training loss; forward and backward) inside the model, so a misread of their arguments, layouts or dtypes
fails here, before a GPU is involved. The op itself runs on `chunk`: `fusion.GPU_BACKENDS` and `fusion.DEVICES`
are pointed at it and at the CPU.

Each variant, logits, the training loss and every parameter's gradient (of the two together) against the float64 model with the plain-torch glue:
- float32: each tensor no further from float64 than the plain-torch glue's own float32 step (relative RMS error at
  most 2x its error plus 2e-5; float32 rounding is ~1e-5 in the summed gradients, a misread argument is of order 1);
- bf16 autocast: the median error over the tensors at most 3x the torch glue's plus 2e-3 (glue_checks.py says why
  not each tensor). The GPU test asks 1.5x; here Triton's interpreter rounds fp32 to bf16 by truncation, twice the
  error of the GPU's round-to-nearest (measured on 1,024 normal values), and FLA's kernels round in Triton while
  the torch glue rounds in torch: their median errors measured 0.7-2.2x the torch glue's.

The interpreter must be chosen before any kernel is defined, so the checks run in a fresh process (this file as a
script).
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
pytest.importorskip("fla")

VARIANTS = ("rla", "rdn", "sgla-learned-beta", "rdn-tanh-nogates-nonorm-ev", "gdn-noconv", "transformer")
# (factor, floor, per tensor) of the fused glue's allowed relative RMS error from float64, against the torch glue's in one dtype
TOLERANCES = {"fp32": (2.0, 2e-5, True), "bf16": (3.0, 2e-3, False)}


def check_all() -> None:
    from interpreter_checks import first_config_autotune

    first_config_autotune()
    import statistics

    import torch

    import rla_ablate.models.fusion as fusion
    from glue_checks import assert_no_worse, counting, expected_calls
    from rla_ablate.models import build_model
    from rla_ablate.ops.testing import rel_rms_error
    from test_models import make

    real = fusion.fused_glue()
    assert real is not None
    calls: list[str] = []
    fusion.fused_glue = lambda: counting(real, calls)
    fusion.GPU_BACKENDS, fusion.DEVICES = ("chunk",), ("cpu",)
    ids = torch.randint(0, 50, (2, 19), generator=torch.Generator().manual_seed(5))
    labels = ids.roll(-1, dims=1)
    labels[:, -1] = labels[0, 3] = fusion.IGNORE_INDEX

    def step(model, glue, dtype, autocast=False):
        """Logits, the training loss and the gradients of both (the loss through the fused head + cross-entropy)."""
        model.set_glue(glue)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, loss = model(ids), model(ids, labels=labels)
        (logits.to(dtype).square().mean() + loss.to(dtype) / ids.numel()).backward()
        return {"logits": logits.detach().double(), "loss": loss.detach().double()} | {
            name: p.grad.double() for name, p in model.named_parameters()}

    for variant in VARIANTS:
        cfg = make(variant)
        torch.manual_seed(0)
        ref_model = build_model(cfg).double().train()
        ref = step(ref_model, "torch", torch.float64)
        model = build_model(cfg).float().train()
        model.load_state_dict(ref_model.state_dict())
        for dtype in TOLERANCES:
            calls.clear()
            got = {glue: step(model, glue, torch.float32, autocast=dtype == "bf16") for glue in ("auto", "torch")}
            assert set(calls) == expected_calls(cfg, loss=True), (variant, calls)
            assert all(torch.isfinite(t).all() for t in got["auto"].values()), (variant, dtype)
            errors = {glue: {name: rel_rms_error(ref[name], got[glue][name]) for name in ref} for glue in got}
            assert_no_worse(errors["auto"], errors["torch"], f"{variant} {dtype}", *TOLERANCES[dtype])
            medians = [statistics.median(errors[glue].values()) for glue in ("auto", "torch")]
            print(f"ok {dtype} {variant}: median error fused glue {medians[0]:.2e}, torch glue {medians[1]:.2e}",
                  flush=True)


    # The residual add + RMSNorm with a bf16 sublayer output and the fp32 stream, as under autocast, on both of FLA's
    # kernels (rows of up to 512 in tiles, wider rows one by one): the stream's gradient stays fp32-exact.
    for D in (384, 768):
        gen = torch.Generator().manual_seed(D)
        h = torch.randn(2, 9, D, generator=gen).bfloat16().requires_grad_()
        residual = torch.randn(2, 9, D, generator=gen, dtype=torch.float32).requires_grad_()
        weight = (1 + 0.1 * torch.randn(D, generator=gen)).requires_grad_()
        dy, ds = torch.randn(2, 9, D, generator=gen), torch.randn(2, 9, D, generator=gen)
        y, stream = real.add_rms_norm(h, weight, residual, 1e-6)
        assert (y.dtype, stream.dtype) == (torch.bfloat16, torch.float32)
        torch.autograd.backward([y, stream], [dy.bfloat16(), ds])
        h64, r64, w64 = (t.detach().double().requires_grad_() for t in (h, residual, weight))
        s64 = r64 + h64
        y64 = s64 * torch.rsqrt(s64.square().mean(-1, keepdim=True) + 1e-6) * w64
        torch.autograd.backward([y64, s64], [dy.bfloat16().double(), ds.double()])
        assert rel_rms_error(r64.grad, residual.grad) <= 1e-5, rel_rms_error(r64.grad, residual.grad)
        assert rel_rms_error(w64.grad, weight.grad) <= 1e-5, rel_rms_error(w64.grad, weight.grad)
        assert rel_rms_error(s64.detach(), stream.detach()) <= 1e-6 and rel_rms_error(r64.grad, h.grad) <= 1e-2
        # the stream alone carried on (no gradient reaches the norm's output): the gradient is the stream's own
        h.grad = residual.grad = None
        real.add_rms_norm(h, weight, residual, 1e-6)[1].backward(ds)
        assert torch.equal(residual.grad, ds) and torch.equal(h.grad, ds.bfloat16())
        print(f"ok stream gradient D={D}", flush=True)


def test_flas_glue_kernels_in_the_model_match_the_torch_glue_under_the_interpreter():
    from interpreter_checks import run_interpreted

    run_interpreted(__file__, checks=2 * len(VARIANTS) + 2, timeout=900)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    check_all()
