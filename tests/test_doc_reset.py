"""Resetting the recurrent state at document boundaries (`train.reset_state_at_documents`).

A packed batch (cu_seqlens over the batch flattened to one row) must compute, for every family, exactly what
running each document alone computes, forward and gradient; without the option nothing changes; the data stream
finds the documents where the EOS falls; the job id changes only when the option is on.

The inputs are drawn afresh on every run (the seed is in each failure message; RLA_TEST_SEED repeats one).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from rla_ablate.data import cu_seqlens_from_starts, make_eval_batches, make_train_stream
from rla_ablate.data.config import EvalConfig, MQARData, StdlibData
from rla_ablate.data.sources import open_source
from rla_ablate.models import ModelConfig, build_model
from rla_ablate.ops.testing import assert_close
from rla_ablate.train import TrainConfig

SEED = int(os.environ.get("RLA_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
SHAPE = dict(vocab_size=50, hidden_size=32, num_layers=2, intermediate_size=48, num_heads=2, head_dim=8,
             init_std=0.25)
VARIANTS = {
    "transformer-gqa": dict(family="transformer", num_heads=4, num_kv_heads=2),
    "sgla": dict(family="sgla"),
    "gdn": dict(family="gdn"),
    "rla": dict(family="rla"),
    "rdn": dict(family="rdn"),
    "rla-noconv": dict(family="rla", use_short_conv=False),
    "rdn-relative-identityconv": dict(family="rdn", clip_mode="relative", clip=0.3, conv_init="identity"),
}
B, T = 3, 11


def packed_batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
    """ids [B, T], doc_starts [B, T] and the documents as (row, start, end): random cuts, at least one of length 1
    and one row that is a single document."""
    ids = torch.randint(0, SHAPE["vocab_size"], (B, T), generator=gen)
    starts = torch.rand(B, T, generator=gen) < 0.3
    starts[:, 0] = True
    starts[0, 1:] = False  # row 0: one document
    starts[1, 4] = starts[1, 5] = True  # row 1: a document of one token
    docs = []
    for b in range(B):
        cuts = starts[b].nonzero().flatten().tolist() + [T]
        docs += [(b, s, e) for s, e in zip(cuts, cuts[1:])]
    return ids, starts, docs


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_packed_batch_equals_each_document_alone(variant):
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    model = build_model(ModelConfig(**{**SHAPE, **VARIANTS[variant]})).double().eval()
    ids, starts, docs = packed_batch(gen)
    cu = cu_seqlens_from_starts(starts)
    assert cu.dtype == torch.int32 and cu[-1].item() == B * T and len(cu) == len(docs) + 1
    weights = torch.randn(B, T, SHAPE["vocab_size"], generator=gen, dtype=torch.float64)

    packed = model(ids, cu_seqlens=cu)
    (packed * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    alone = torch.zeros_like(packed)
    for b, s, e in docs:
        out = model(ids[b:b + 1, s:e])
        (out * weights[b:b + 1, s:e]).sum().backward()
        alone[b, s:e] = out[0].detach()

    assert_close(f"{variant} packed forward (seed {SEED})", alone, packed.detach(), ratio=1e-12)
    for name, p in model.named_parameters():
        assert_close(f"{variant} grad {name} (seed {SEED})", p.grad, grads[name], ratio=1e-10, atol=1e-13)
    # And without the offsets the documents do mix: the test would see a missing reset.
    assert not torch.allclose(model(ids), packed.detach())


@pytest.mark.parametrize("variant", ["transformer-gqa", "rla"])
def test_row_starts_only_is_the_plain_batch(variant):
    torch.manual_seed(SEED)
    model = build_model(ModelConfig(**{**SHAPE, **VARIANTS[variant]})).double().eval()
    ids = torch.randint(0, SHAPE["vocab_size"], (B, T), generator=torch.Generator().manual_seed(SEED))
    rows = torch.arange(0, B * T + 1, T, dtype=torch.int32)
    assert torch.equal(model(ids, cu_seqlens=rows), model(ids))
    with pytest.raises(ValueError, match="row start"):
        model(ids, cu_seqlens=torch.tensor([0, 2 * T, B * T], dtype=torch.int32))


def test_short_conv_reads_no_earlier_document():
    from rla_ablate.models.layers import ShortConvolution

    conv = ShortConvolution(5, 4).double()
    x = torch.randn(1, 9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(SEED))
    cu = torch.tensor([0, 2, 3, 9], dtype=torch.int32)
    packed, _ = conv(x, cu_seqlens=cu)
    alone = torch.cat([conv(x[:, a:b])[0] for a, b in [(0, 2), (2, 3), (3, 9)]], dim=1)
    assert_close("short conv", alone, packed, ratio=1e-14)


def test_stream_marks_the_token_after_each_eos():
    cfg = StdlibData()
    eos = open_source(cfg).eos_id
    plain = next(make_train_stream(cfg, 512, 4, seed=3))
    stream = make_train_stream(cfg, 512, 4, seed=3, documents=True)
    batch = next(stream)
    assert plain.doc_starts is None
    assert torch.equal(plain.input_ids, batch.input_ids) and torch.equal(plain.labels, batch.labels)
    # The position is the same number with or without boundaries (resume across the option).
    assert stream.state_dict() == make_train_stream(cfg, 512, 4, seed=3).state_dict() | {"samples_seen": 4}
    # Windows of 512 bytes over files of ~20 KB: about one row in 40 holds a boundary.
    for _ in range(100):
        ids, starts = batch.input_ids.numpy(), batch.doc_starts.numpy()
        assert starts.dtype == np.bool_ and starts[:, 0].all()
        assert np.array_equal(starts[:, 1:], ids[:, :-1] == eos)
        if starts[:, 1:].any():
            break
        batch = next(stream)
    assert starts[:, 1:].any()
    cu = batch.cu_seqlens().tolist()
    assert cu[0] == 0 and cu[-1] == 4 * 512 and {0, 512, 1024, 1536} <= set(cu) and len(cu) > 5

    val = make_eval_batches(EvalConfig(name="v", data={"kind": "stdlib", "split": "validation"}, tokens=4096),
                            512, 4, documents=True)
    assert all(b.doc_starts is not None and b.doc_starts.shape == b.input_ids.shape for b in val)
    mqar = next(make_train_stream(MQARData(vocab_size=64, num_kv_pairs=2, seq_len=16), 16, 2, 0, documents=True))
    assert mqar.doc_starts[:, 0].all() and not mqar.doc_starts[:, 1:].any()


def test_option_is_in_the_job_id_only_when_on():
    from rla_ablate.sweep.ids import canonical_json

    small = dict(tokens=4096, seq_len=64, micro_batch_size=4, batch_tokens=256)
    off, on = TrainConfig(**small), TrainConfig(**small, reset_state_at_documents=True)
    assert "reset_state_at_documents" not in off.model_dump()
    assert canonical_json(off) == canonical_json(TrainConfig(**small, reset_state_at_documents=False))
    assert canonical_json(on) != canonical_json(off)
    assert TrainConfig.model_validate(on.model_dump()).reset_state_at_documents


def test_a_training_run_with_resets(tmp_path):
    from rla_ablate.models import load_preset
    from rla_ablate.train import JobConfig, read_jsonl, run_job

    def job(model, **extra):
        return JobConfig.model_validate({
            "model": load_preset(model).replace(vocab_size=257).model_dump(),
            "train": dict(tokens=1024, seq_len=128, micro_batch_size=4, batch_tokens=512, lr=3e-3,
                          eval_every_tokens=1024, cpu_threads=1, **extra),
            "data": {"kind": "stdlib"},
            "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 512}],
        })

    for model in ("tiny-rla", "tiny-transformer"):
        on, off = job(model, reset_state_at_documents=True), job(model)
        assert on.canonical_json() != off.canonical_json()
        result = run_job(on, tmp_path / model)
        assert result.status == "finished", result.error
        losses = [r["values"]["train/loss"] for r in read_jsonl(tmp_path / model / "metrics.jsonl")
                  if r["type"] == "metrics" and "train/loss" in r["values"]]
        assert len(losses) == 2 and all(np.isfinite(losses))
