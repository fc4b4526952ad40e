"""The LM on CUDA: the GPU backend that `auto` picks agrees with the CPU float64 model, decoding agrees with the
parallel forward, and bf16 autocast trains. Skipped without CUDA.

Tolerances (relative RMS error of logits, a written decision): fp32 1e-2, since FLA's kernels run fp32 operands as
tf32 (tests/test_ops_gpu.py allows 5e-3 per op) and two layers compound it.
"""

from __future__ import annotations

import pytest
import torch

from glue_checks import assert_no_worse, counting, expected_calls
from rla_ablate.models import ModelConfig, build_model
from rla_ablate.ops.testing import assert_close, rel_rms_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SHAPE = dict(vocab_size=64, hidden_size=128, num_layers=2, intermediate_size=256, num_heads=2, head_dim=64,
             init_std=0.1)
FAMILIES = ["sgla", "gdn", "rla", "rdn", "transformer"]


# The 100m presets' width (over 512: FLA's row kernels of the norms) and a vocabulary over 65,536 (its cross-entropy
# splits each row), in two layers.
WIDE = dict(hidden_size=768, intermediate_size=2048, num_heads=6, head_dim=128, vocab_size=70_000, init_std=0.02)


def make(family: str, **extra) -> ModelConfig:
    return ModelConfig(**{**SHAPE, **extra}, family=family, **({"num_kv_heads": 1} if family == "transformer" else {}))


@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_model_matches_cpu_float64(family):
    torch.manual_seed(0)
    cpu = build_model(make(family)).double().eval()
    gpu = build_model(make(family)).cuda().eval()
    gpu.load_state_dict(cpu.state_dict())
    ids = torch.randint(0, 64, (2, 100), generator=torch.Generator().manual_seed(42))
    with torch.no_grad():
        ref = cpu(ids)
        got = gpu(ids.cuda())
    # auto: our kernels for the additive rule (sGLA's baseline call is FLA's either way), FLA for the delta rule
    assert gpu.backend_used == ("sdpa" if family == "transformer" else "triton")
    # float32 tiles do not fit the fused kernels: the composition runs, and the logged tag says so
    assert gpu.kernel_used == ("sdpa" if family == "transformer" else "triton/fla+glue")
    assert_close(f"{family} logits", ref, got.double().cpu(), ratio=1e-2)


@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_decoding_equals_parallel(family):
    torch.manual_seed(0)
    model = build_model(make(family)).cuda().eval()
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache()
        pieces = [model(ids[:, :17], cache=cache)]
        for t in range(17, ids.shape[1]):
            pieces.append(model.step(ids[:, t], cache)[:, None])
    assert_close(f"{family} decoding", full, torch.cat(pieces, dim=1), ratio=1e-2)


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_autocast_trains(family):
    torch.manual_seed(0)
    model = build_model(make(family)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 64, (4, 128), generator=torch.Generator().manual_seed(2)).cuda()
    losses = []
    for _ in range(5):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, 64), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.parametrize("preset", ["proxy-lm-rla", "proxy-lm-rdn", "proxy-mqar-rla", "proxy-lm-sgla"])
def test_a_training_step_after_the_hand_over_never_waits_for_the_gpu(preset):
    # Packed jobs share a GPU by turns: every host sync inside a step waits for the others' turns. After the
    # trainer's hand-over of the relative clip's running RMS, forward and backward must not sync at all.
    from rla_ablate.models import load_preset

    torch.manual_seed(0)
    cfg = load_preset(preset)
    model = build_model(cfg).cuda().train()
    ids = torch.randint(0, cfg.vocab_size, (4, 256), device="cuda")

    def step():
        # the training loop's loss: the model's own, on FLA's fused head + cross-entropy
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids.roll(-1, dims=1))
        loss.backward()

    step()  # kernels compile (and FLA's autotuning syncs)
    model.hand_over_clip_rms()  # on the device, as the trainer's read_and_hand_over makes it
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# Packing changes the mixers' kernels and the convolution (which keeps the torch glue), not the norms or the loss
# that the wide shape is there for: packed runs at the small shape only (each new shape costs a fresh node minutes
# of FLA's autotuning).
GLUE_CASES = [(False, "small"), (True, "small"), (False, "wide")]


@pytest.mark.parametrize("packed, shape", GLUE_CASES, ids=["batch-small", "packed-small", "batch-wide"])
@pytest.mark.parametrize("family", ["sgla", "gdn", "rla", "rdn", "transformer"])
def test_fused_glue_trains_as_exactly_as_the_torch_glue(family, packed, shape, monkeypatch):
    """FLA's fused glue (rla_ablate/models/fusion.py: the blocks' residual add + RMSNorm and SwiGLU, the mixers' short
    conv, q/k L2 norm, output norm and gate; the fused head + cross-entropy of the training loss) in a bf16-autocast
    training step: logits, loss and every parameter's gradient against the float64 CPU model, no further from it
    than the plain-torch glue on the same GPU (median relative RMS error over the tensors at most 1.5x the torch
    glue's plus 2e-3: glue_checks.py), logits within 5e-2. Packed sequences keep the torch conv and take the rest.
    At a small shape, batched and packed, and a wide one (`WIDE`), batched."""
    import rla_ablate.models.fusion as fusion

    extra = WIDE if shape == "wide" else {}
    real = fusion.fused_glue()
    assert real is not None, "FLA is installed wherever the GPU tests run"
    calls: list[str] = []
    counted = counting(real, calls)
    monkeypatch.setattr(fusion, "fused_glue", lambda: counted)
    torch.manual_seed(0)
    ref_model = build_model(make(family, **extra)).double().train()
    # labels over the whole vocabulary: WIDE's reach past the first 65,536 entries (the second split of each row)
    ids = torch.randint(0, make(family, **extra).vocab_size, (2, 200), generator=torch.Generator().manual_seed(7))
    cu = torch.tensor([0, 70, 200, 333, 400]) if packed else None
    labels = ids.roll(-1, dims=1)
    labels[:, -1] = labels[0, 3] = fusion.IGNORE_INDEX

    def step(model, ids, labels, cu, autocast):
        """Logits, the training loss and the gradients of both (the loss through the fused head + cross-entropy)."""
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits, loss = model(ids, cu_seqlens=cu), model(ids, cu_seqlens=cu, labels=labels)
        (logits.double().square().mean() + loss.double() / ids.numel()).backward()
        return {"logits": logits.detach().double().cpu(), "loss": loss.detach().double().cpu()} | {
            name: p.grad.double().cpu() for name, p in model.named_parameters()}

    ref = step(ref_model, ids, labels, cu, autocast=False)
    errors = {}
    for glue in ("auto", "torch"):
        model = build_model(make(family, **extra)).cuda().train()
        model.load_state_dict(ref_model.state_dict())
        model.set_glue(glue)
        got = step(model, ids.cuda(), labels.cuda(), None if cu is None else cu.cuda(), autocast=True)
        assert family == "transformer" or model.backend_used in fusion.GPU_BACKENDS
        assert all(torch.isfinite(t).all() for t in got.values()), (family, glue)
        errors[glue] = {name: rel_rms_error(ref[name], got[name]) for name in ref}
    assert errors["auto"]["logits"] <= 5e-2, errors["auto"]["logits"]
    assert set(calls) == expected_calls(make(family, **extra), packed, loss=True), calls
    assert_no_worse(errors["auto"], errors["torch"], family, factor=1.5, floor=2e-3, per_tensor=False)
    # and no single tensor far off (a wrong head or norm-weight gradient would hide in the median)
    assert_no_worse(errors["auto"], errors["torch"], family, factor=5.0, floor=1e-2, per_tensor=True)
