"""FLA's own glue kernels in the linear layers, on CPU through Triton's interpreter (TRITON_INTERPRET=1).

test_models.py checks the layer's wiring with torch functions of FLA's semantics in place of the kernels; this file
runs FLA's real `causal_conv1d`, `l2norm` and `rms_norm_gated` (forward and backward kernels) inside the model, so a
misread of their arguments, layouts or dtypes fails here, before a GPU is involved. The op itself runs on `chunk`
(FLA's glue is taken where the op's backend is listed in `GPU_BACKENDS`).

Each variant, logits and every parameter's gradient against the float64 model with the plain-torch glue:
- float32: each tensor no further from float64 than the plain-torch glue's own float32 step (relative RMS error at
  most 2x its error plus 2e-5; float32 rounding is ~1e-5 in the summed gradients, a misread argument is of order 1);
- bf16 autocast: the median error over the tensors at most 1.5x the torch glue's plus 2e-3 (glue_checks.py says why
  not each tensor), as in the GPU test.

The interpreter must be chosen before any kernel is defined, so the checks run in a fresh process (this file as a
script).
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
pytest.importorskip("fla")

VARIANTS = ("rla", "rdn", "sgla-learned-beta", "rdn-tanh-nogates-nonorm-ev", "gdn-noconv")
# (factor, floor, per tensor) of the fused glue's allowed relative RMS error from float64, against the torch glue's in one dtype
TOLERANCES = {"fp32": (2.0, 2e-5, True), "bf16": (1.5, 2e-3, False)}


def check_all() -> None:
    from interpreter_checks import first_config_autotune

    first_config_autotune()
    import torch

    import rla_ablate.models.layers as layers
    from glue_checks import assert_no_worse, counting
    from rla_ablate.models import build_model
    from rla_ablate.ops.testing import rel_rms_error
    from test_models import make

    real = layers.fused_glue()
    assert real is not None
    calls: list[str] = []
    layers.fused_glue = lambda: counting(real, calls)
    layers.GPU_BACKENDS = ("chunk",)
    ids = torch.randint(0, 50, (2, 19), generator=torch.Generator().manual_seed(5))

    def step(model, glue, dtype, autocast=False):
        for layer in model.layers:
            layer.attn.glue = glue
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids)
        logits.to(dtype).square().mean().backward()
        return {"logits": logits.detach().double()} | {
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
            expected = {"norm_gate"} | ({"conv"} if cfg.use_short_conv else set()) | (
                {"l2norm"} if cfg.qk_norm == "l2" else set())
            assert set(calls) == expected, (variant, calls)
            assert all(torch.isfinite(t).all() for t in got["auto"].values()), (variant, dtype)
            errors = {glue: {name: rel_rms_error(ref[name], got[glue][name]) for name in ref} for glue in got}
            assert_no_worse(errors["auto"], errors["torch"], f"{variant} {dtype}", *TOLERANCES[dtype])
            print(f"ok {dtype} {variant}", flush=True)


def test_flas_glue_kernels_in_the_layer_match_the_torch_glue_under_the_interpreter():
    from interpreter_checks import run_interpreted

    run_interpreted(__file__, checks=2 * len(VARIANTS), timeout=900)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    check_all()
