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


@pytest.mark.parametrize("preset", ["tiny-rla", "tiny-rdn", "tiny-transformer"])
def test_a_padded_batch_gives_each_row_what_it_gives_alone(preset):
    """attention_mask with padding, left (what `generate` needs) or right: each row's tokens score and generate as
    the row alone does; a mask whose tokens are not one run is refused."""
    torch.manual_seed(0)
    hf = RLASweepForCausalLM.from_model(build_model(load_preset(preset))).eval()
    long, short = torch.randint(0, 256, (1, 9)), torch.randint(0, 256, (1, 4))
    pad = torch.zeros(1, 5, dtype=torch.long)
    with torch.no_grad():
        alone = hf(short).logits[0]
        for ids, mask, real in ((torch.cat([pad, short], 1), [0] * 5 + [1] * 4, slice(5, 9)),
                                (torch.cat([short, pad], 1), [1] * 4 + [0] * 5, slice(0, 4))):
            batch = torch.cat([long, ids])
            masks = torch.tensor([[1] * 9, mask])
            out = hf(batch, attention_mask=masks).logits
            torch.testing.assert_close(out[1, real], alone, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out[0], hf(long).logits[0], rtol=1e-5, atol=1e-5)
        # greedy generation of the left-padded batch: each row continues as it does alone
        batch = torch.cat([long, torch.cat([pad, short], 1)])
        masks = torch.tensor([[1] * 9, [0] * 5 + [1] * 4])
        options = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, output_scores=True,
                       return_dict_in_generate=True)
        together = hf.generate(batch, attention_mask=masks, **options)
        for row, ids in enumerate((long, short)):
            apart = hf.generate(ids, attention_mask=torch.ones_like(ids), **options)
            assert together.sequences[row, -4:].tolist() == apart.sequences[0, -4:].tolist()
            for step, scores in enumerate(apart.scores):  # each step's logits, not only their argmax
                torch.testing.assert_close(together.scores[step][row], scores[0], rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="attention_mask row 0 has its tokens in 2 runs"):
            hf(short, attention_mask=torch.tensor([[1, 0, 1, 1]]))
        # padding on both sides
        both = hf(torch.cat([pad[:, :2], short, pad[:, :3]], 1),
                  attention_mask=torch.tensor([[0, 0] + [1] * 4 + [0] * 3]))
        torch.testing.assert_close(both.logits[0, 2:6], alone, rtol=1e-5, atol=1e-5)
