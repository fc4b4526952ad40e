"""Analytic size and cost of a `ModelConfig`, without building it (the planner calls these for every job).

`count_params(cfg)` equals `sum(p.numel() for p in build_model(cfg).parameters())` (tested for every family).

`state_elements_per_layer(cfg)`: what one layer carries from token to token, per sequence.
    linear baselines (sgla, gdn): H * dk * dv                 (S)
    residual (rla, rdn):          2 * H * dk * dv             (S and R; docs/MATH.md)
    transformer:                  2 * H_kv * head_dim         (K and V cache added per token of context)
The short conv's W - 1 cached inputs are not counted: they are the same for a model and its controls.

`flops_per_token(cfg, seq_len)`: matmul FLOPs of one training token, forward + backward = 3 x forward
(backward computes two matmuls per forward matmul), 2 FLOPs per multiply-add:
    dense:      every Linear, incl. the LM head (tied or not): 2 * D_in * D_out per token
    recurrence: the chunked form of rla_ablate/ops/chunk.py (chunk C = 64, the last chunk shorter), per head and
                chunk of length c, in multiply-adds:
        output read       c*c*dk (q k^T) + c*c*dv (scores @ u) + c*dk*dv (q S_0^T)
        state carry       c*dk*dv (S_0 -> S_c)
        delta rule        + c*c*dk (k k^T) + c*dk*dv (S_0 k) + c*(c-1)/2*dv (triangular solve for u)
        fit=residual/none + c*dk*dv (S_{t-1} k read, if not already counted) + c*c*dk (k k^T, idem)
                          + c*c*dv (intra-chunk part of S_{t-1} k)
        fit=residual      + c*c*dv + c*dk*dv (R_t q read) + c*dk*dv (R carry)
                          delta rule: + c*dk*dv (R_0 k) + c*(c-1)/2*dv (solve for w)
    softmax attention: causal, position t attends to t + 1 keys: per token 2 * H * head_dim * (t + 1)
                multiply-adds (q k^T and p v), averaged over t < seq_len: H * head_dim * (seq_len + 1).
Norms, gates, activations and the softmax are elementwise and left out (a few percent at most at small width).
"""

from __future__ import annotations

from rla_ablate.models.config import ModelConfig

CHUNK_SIZE = 64


def _mixer_params(cfg: ModelConfig) -> tuple[int, int]:
    """(matmul weights, other parameters) of one mixer."""
    D, H, K = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    if cfg.family == "transformer":
        Hkv = cfg.num_kv_heads
        return D * H * K + 2 * D * Hkv * K + H * K * D, 0
    V = cfg.head_v_dim
    matmul = 2 * D * H * K + D * H * V  # q, k, v
    matmul += D * H * V + H * V * D  # output gate g_proj, o_proj
    other = V  # o_norm weight
    if cfg.use_short_conv:
        other += (2 * H * K + H * V) * cfg.conv_size
    if cfg.family in ("sgla", "rla"):
        matmul += D * H
        other += H  # gk_proj bias
    else:
        matmul += D * H
        other += 2 * H  # A_log, dt_bias
    if cfg.beta == "learned":
        matmul += D * H  # b_proj
    if cfg.is_residual and not cfg.tied_gamma:
        matmul += D * H  # c_proj
    return matmul, other


def _block_matmul_params(cfg: ModelConfig) -> int:
    return _mixer_params(cfg)[0] + 3 * cfg.hidden_size * cfg.intermediate_size


def count_params(cfg: ModelConfig) -> int:
    """Exact number of parameters of `build_model(cfg)` (shared embedding counted once)."""
    D = cfg.hidden_size
    mixer_matmul, mixer_other = _mixer_params(cfg)
    per_block = mixer_matmul + mixer_other + 3 * D * cfg.intermediate_size + 2 * D  # + attn_norm, mlp_norm
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * D
    return cfg.vocab_size * D + cfg.num_layers * per_block + D + head


def non_embedding_params(cfg: ModelConfig) -> int:
    """Parameters outside the embedding and the LM head."""
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size
    return count_params(cfg) - cfg.vocab_size * cfg.hidden_size - head


def state_elements_per_layer(cfg: ModelConfig) -> int:
    """Recurrent state elements per layer and sequence (transformer: KV-cache elements per token of context)."""
    if cfg.family == "transformer":
        return 2 * cfg.num_kv_heads * cfg.head_dim
    base = cfg.num_heads * cfg.head_dim * cfg.head_v_dim
    # fit="none" rebuilds R_t = r_t k_t^T at every token and never reads R_{t-1}: only S is carried.
    return 2 * base if cfg.fit == "residual" else base


def _chunk_macs(cfg: ModelConfig, c: int) -> int:
    """Multiply-adds of the chunked recurrence for one chunk of length c, one head (see the module docstring)."""
    K, V = cfg.head_dim, cfg.head_v_dim
    delta = cfg.rule == "delta"
    macs = c * c * K + c * c * V + c * K * V  # output read (q k^T, scores @ u, q S_0^T)
    macs += c * K * V  # carry S
    if delta:
        macs += c * c * K + c * K * V + c * (c - 1) // 2 * V
    if cfg.fit != "off":
        if not delta:
            macs += c * K * V + c * c * K
        macs += c * c * V
    if cfg.fit == "residual":
        macs += c * c * V + c * K * V + c * K * V
        if delta:
            macs += c * K * V + c * (c - 1) // 2 * V
    return macs


def _recurrence_macs_per_head(cfg: ModelConfig, seq_len: int) -> int:
    """Multiply-adds over one sequence: full chunks of CHUNK_SIZE and a shorter last one."""
    full, rest = divmod(seq_len, CHUNK_SIZE)
    return full * _chunk_macs(cfg, CHUNK_SIZE) + (_chunk_macs(cfg, rest) if rest else 0)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training (forward + backward) matmul FLOPs per token at context length `seq_len`."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1 (got {seq_len})")
    dense_macs = cfg.num_layers * _block_matmul_params(cfg) + cfg.vocab_size * cfg.hidden_size
    if cfg.family == "transformer":
        mix_macs_per_token = cfg.num_layers * cfg.num_heads * cfg.head_dim * (seq_len + 1)
    else:
        mix_macs_per_token = cfg.num_layers * cfg.num_heads * _recurrence_macs_per_head(cfg, seq_len) / seq_len
    return 3 * 2 * (dense_macs + mix_macs_per_token)
