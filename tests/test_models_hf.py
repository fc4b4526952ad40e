"""Hugging Face classes: save_pretrained / AutoModelForCausalLM.from_pretrained round trip."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rla_ablate.models import build_model, load_preset
from rla_ablate.models.hf import RLASweepConfig, RLASweepForCausalLM


@pytest.mark.parametrize("preset, tie", [("tiny-rdn", False), ("tiny-transformer", True)])
def test_save_and_load_with_auto_classes(tmp_path, preset, tie):
    cfg = load_preset(preset).replace(tie_embeddings=tie)
    torch.manual_seed(0)
    model = build_model(cfg)
    RLASweepForCausalLM.from_model(model).save_pretrained(tmp_path)

    assert isinstance(AutoConfig.from_pretrained(tmp_path), RLASweepConfig)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(loaded, RLASweepForCausalLM) and loaded.model.cfg == cfg
    assert (loaded.model.lm_head.weight is loaded.model.embed.weight) == tie
    ids = torch.randint(0, 256, (2, 9))
    out = loaded(ids, labels=ids)
    with torch.no_grad():
        assert torch.equal(out.logits, model(ids))
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, cfg.vocab_size), ids[:, 1:].reshape(-1))
    assert out.loss.item() == pytest.approx(expected.item())
