"""Models: `ModelConfig`, FLA-style layers, the causal LM with decoding, analytic accounting, matched budgets,
presets and the ablation registry (docs/ARCHITECTURE.md, "models")."""

from rla_ablate.models.ablations import ABLATIONS, Ablation, apply_ablation, get_ablation
from rla_ablate.models.accounting import count_params, flops_per_token, non_embedding_params, state_elements_per_layer
from rla_ablate.models.budget import MatchedControl, MatchError, matched_params, matched_state
from rla_ablate.models.config import BASELINE_OF, FAMILIES, LINEAR_FAMILIES, RESIDUAL_FAMILIES, ModelConfig
from rla_ablate.models.diagnostics import aggregate_diagnostics, mixer_diagnostics
from rla_ablate.models.model import CausalLM, build_model
from rla_ablate.models.presets import list_presets, load_preset

__all__ = [
    "ABLATIONS", "Ablation", "apply_ablation", "get_ablation",
    "count_params", "flops_per_token", "non_embedding_params", "state_elements_per_layer",
    "MatchedControl", "MatchError", "matched_params", "matched_state",
    "BASELINE_OF", "FAMILIES", "LINEAR_FAMILIES", "RESIDUAL_FAMILIES", "ModelConfig",
    "CausalLM", "build_model", "aggregate_diagnostics", "mixer_diagnostics", "list_presets", "load_preset",
]
