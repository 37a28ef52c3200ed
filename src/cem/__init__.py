"""cem: Causal Energy Minimization Transformer layers and language models (reference implementation)."""

__version__ = "0.1.0"
