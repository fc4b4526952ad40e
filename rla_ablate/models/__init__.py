"""Models: `ModelConfig`, FLA-style layers, the causal LM with decoding, analytic accounting, matched budgets,
presets and the ablation registry (docs/ARCHITECTURE.md, "models"). The names below are imported on first use
(`rla_ablate.lazy`)."""

# ruff: noqa: F401
from typing import TYPE_CHECKING

from rla_ablate.lazy import exports

if TYPE_CHECKING:  # the names for type checkers (listed in __all__ through _WHERE)
    from rla_ablate.models.ablations import ABLATIONS, Ablation, apply_ablation, get_ablation
    from rla_ablate.models.accounting import (
        count_params,
        flops_per_token,
        non_embedding_params,
        state_elements_per_layer,
    )
    from rla_ablate.models.budget import MatchedControl, MatchError, matched_params, matched_state
    from rla_ablate.models.config import BASELINE_OF, FAMILIES, LINEAR_FAMILIES, RESIDUAL_FAMILIES, ModelConfig
    from rla_ablate.models.diagnostics import aggregate_diagnostics, mixer_diagnostics
    from rla_ablate.models.model import CausalLM, build_model
    from rla_ablate.models.presets import list_presets, load_preset

_WHERE = {
    **dict.fromkeys(("ABLATIONS", "Ablation", "apply_ablation", "get_ablation"), "ablations"),
    **dict.fromkeys(("count_params", "flops_per_token", "non_embedding_params", "state_elements_per_layer"),
                    "accounting"),
    **dict.fromkeys(("MatchedControl", "MatchError", "matched_params", "matched_state"), "budget"),
    **dict.fromkeys(("BASELINE_OF", "FAMILIES", "LINEAR_FAMILIES", "RESIDUAL_FAMILIES", "ModelConfig"), "config"),
    **dict.fromkeys(("aggregate_diagnostics", "mixer_diagnostics"), "diagnostics"),
    **dict.fromkeys(("CausalLM", "build_model"), "model"),
    **dict.fromkeys(("list_presets", "load_preset"), "presets"),
}
__all__ = sorted(_WHERE)
__getattr__ = exports(__name__, _WHERE)
