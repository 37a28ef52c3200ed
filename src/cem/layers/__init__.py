"""CEM layers and their Llama baselines. Each maps the residual stream h (B, J, D) to h' (B, J, D)."""

from .kinds import ATTENTION_KINDS, MLP_KINDS, SUBLAYERS, AttentionConfig, KernelPath, MLPConfig, Shape, Sublayer, SublayerKind
from .llama import GatedMLP, LlamaAttention  # first: the Llama kinds are listed first
from .cem_attention import KQ_DIAGONALS, CEMAttention, KQDiagonalKind
from .position import ALIBI_SLOPES, POSITIONS
from .cem_mlp import MLP_ENERGIES, CEMMLP, silu_integral
from .norm import RMSNorm
from .precond import PRECONDITIONERS, Preconditioner, make_preconditioner
from .reuse import Reuse
from .steps import STARTS, STEP_SCHEDULES, Inference, Recursion, set_inference

__all__ = [
    "ALIBI_SLOPES",
    "ATTENTION_KINDS",
    "MLP_KINDS",
    "STARTS",
    "STEP_SCHEDULES",
    "SUBLAYERS",
    "AttentionConfig",
    "CEMAttention",
    "CEMMLP",
    "GatedMLP",
    "Inference",
    "KQDiagonalKind",
    "KQ_DIAGONALS",
    "KernelPath",
    "LlamaAttention",
    "MLPConfig",
    "MLP_ENERGIES",
    "POSITIONS",
    "PRECONDITIONERS",
    "Preconditioner",
    "RMSNorm",
    "Recursion",
    "Reuse",
    "Shape",
    "Sublayer",
    "SublayerKind",
    "make_preconditioner",
    "set_inference",
    "silu_integral",
]
