"""Hugging Face classes, as FLA registers its models: a checkpoint loads with `AutoModelForCausalLM`.

    from rla_ablate.models.hf import RLASweepForCausalLM      # importing registers model_type "rla_sweep"
    hf = RLASweepForCausalLM.from_model_config(cfg)           # or wrap a trained CausalLM: from_model(model)
    hf.save_pretrained(path); AutoModelForCausalLM.from_pretrained(path)

The HF config carries the ModelConfig fields verbatim; the module tree is `model.<CausalLM>`, so a state dict of
`CausalLM` loads with a `model.` prefix. `generate` works (greedy or sampled) without an HF cache: each step reads
the whole sequence, which lm-eval's generation tasks need and short answers afford.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from rla_ablate.models.config import ModelConfig
from rla_ablate.models.model import CausalLM

MODEL_TYPE = "rla_sweep"


class RLASweepConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, rla_sweep: dict | None = None, **kwargs):
        # The whole ModelConfig, validated; stored as a plain dict so that config.json stays readable.
        self.rla_sweep = ModelConfig.model_validate(rla_sweep).model_dump() if rla_sweep is not None else None
        if self.rla_sweep is not None:
            kwargs.setdefault("tie_word_embeddings", self.rla_sweep["tie_embeddings"])
            kwargs.setdefault("vocab_size", self.rla_sweep["vocab_size"])
            kwargs.setdefault("hidden_size", self.rla_sweep["hidden_size"])
            kwargs.setdefault("num_hidden_layers", self.rla_sweep["num_layers"])
        super().__init__(**kwargs)

    @property
    def model_cfg(self) -> ModelConfig:
        return ModelConfig.model_validate(self.rla_sweep)


class RLASweepForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = RLASweepConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    def __init__(self, config: RLASweepConfig):
        super().__init__(config)
        self.model = CausalLM(config.model_cfg)
        if config.model_cfg.tie_embeddings:
            self._tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}
        self.post_init()

    def _init_weights(self, module):
        # CausalLM initializes itself at construction; loading then overwrites every tensor.
        return

    @classmethod
    def from_model_config(cls, cfg: ModelConfig) -> "RLASweepForCausalLM":
        return cls(RLASweepConfig(rla_sweep=cfg.model_dump()))

    @classmethod
    def from_model(cls, model: CausalLM) -> "RLASweepForCausalLM":
        hf = cls.from_model_config(model.cfg)
        hf.model.load_state_dict(model.state_dict())
        return hf

    def get_input_embeddings(self):
        return self.model.embed

    def get_output_embeddings(self):
        return self.model.lm_head

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                labels: torch.LongTensor | None = None, **kwargs) -> CausalLMOutput:
        # past_key_values, use_cache (passed by `generate` and lm-eval) are ignored: every call reads the whole
        # sequence. A padded batch (attention_mask with zeros) runs each row's padding and its tokens as separate
        # documents of one packed batch, so a row's tokens start from a fresh state as they would alone.
        logits = self.model(input_ids, cu_seqlens=padding_documents(attention_mask, *input_ids.shape))
        loss = None
        if labels is not None:
            # HF convention: labels are the inputs; position t predicts token t + 1; -100 is ignored.
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, **kwargs) -> dict:
        # No HF cache: `generate` feeds the whole sequence at every step (the recurrent cache is CausalLM.step's),
        # with its attention_mask grown by a one a step (a left-padded batch: `padding_documents`).
        return {"input_ids": input_ids, "attention_mask": kwargs.get("attention_mask")}

    def _supports_default_dynamic_cache(self) -> bool:
        return False


def padding_documents(mask: torch.Tensor | None, B: int, T: int) -> torch.Tensor | None:
    """Document boundaries (`CausalLM.forward`'s cu_seqlens) that put each row's padding and its tokens in documents
    of their own, or None without padding. Each row's ones must be one run: left padding (0...01...1, as `generate`
    needs), right padding (1...10...0) or both; ValueError otherwise."""
    if mask is None or bool(mask.all()):
        return None
    ones = mask.to(torch.bool)
    runs = ones[:, 0].long() + (ones[:, 1:] & ~ones[:, :-1]).sum(1)  # where a run of tokens starts
    if bool((runs > 1).any()):
        b = int((runs > 1).nonzero()[0, 0])
        raise ValueError(f"attention_mask row {b} has its tokens in {int(runs[b])} runs; only padding before or after "
                         "them is supported (the tokens in one run)")
    rows, cols = (ones[:, 1:] != ones[:, :-1]).nonzero(as_tuple=True)  # where tokens meet padding, inside a row
    ends = torch.arange(0, B + 1, device=mask.device) * T  # 0 and every row's end
    return torch.cat([ends, rows * T + cols + 1]).sort().values.to(torch.int32)


AutoConfig.register(MODEL_TYPE, RLASweepConfig, exist_ok=True)
AutoModelForCausalLM.register(RLASweepConfig, RLASweepForCausalLM, exist_ok=True)
