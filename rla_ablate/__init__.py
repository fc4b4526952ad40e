"""rla-sweep: ablation studies of Residual Linear Attention (RLA) and Residual Delta Net (RDN)."""

__version__ = "0.1.0"
