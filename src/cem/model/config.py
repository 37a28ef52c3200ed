"""One config dataclass for every model cem builds, with named size presets and architectures."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

from ..layers import ALIBI_SLOPES, KQ_DIAGONALS, MLP_ENERGIES, POSITIONS, PRECONDITIONERS, SUBLAYERS, AttentionConfig, MLPConfig, Recursion
from ..checks import check_choice, check_finite, check_heads, check_nonnegative_int, check_positive_int
from ..layers.attention_core import check_backend
from ..layers.steps import DEPTH_DISTRIBUTIONS, MAX_STEPS, Inference

TRAIN_DEPTHS = ("fixed", "model", "layer")


# The largest value each size and depth may take: a config comes from files a user may not have written (an
# export's config.json, a run's run.json), and attn_steps=10**9 there hung the first forward pass (issue 20).
# Far above any model this package trains (the 256M preset: dim 1024, 15 layers; depths of at most 5).
MAXIMA = {
    "vocab_size": 1 << 24, "dim": 1 << 16, "n_heads": 1 << 12, "n_layers": 1 << 10, "hidden_dim": 1 << 18, "context": 1 << 20,
    "attn_steps": MAX_STEPS, "mlp_steps": MAX_STEPS, "attn_reuse": 256, "mlp_reuse": 256, "train_depth_max": MAX_STEPS,
    "attn_precond_rank": 1 << 12, "mlp_precond_rank": 1 << 12,
}  # fmt: skip


@dataclass
class ModelConfig:
    """A decoder language model: embeddings, `n_layers` blocks (attention then MLP, each pre-norm
    residual), a final RMSNorm and an untied output head (as Llama and the paper's Table 1 counts)."""

    vocab_size: int = 32000
    dim: int = 768
    n_layers: int = 12
    n_heads: int = 12
    hidden_dim: int = 2048
    context: int = 2048
    # attention sublayer
    attn: str = "llama"  # "llama" | "cem"
    position: str = "rope"  # Llama attention only: "rope" | "alibi" (CEM attention always uses ALiBi)
    alibi: str = "standard"  # ALiBi slopes: "standard" 2^(-8k/K) | "app-a" 2^(-k) (the paper's App. A example)
    attn_steps: int = 1
    attn_step_size: float = 1.0
    kq_diag: str = "shared"  # "none" | "shared" | "per_head"
    attn_precond: str = "identity"  # "identity" | "diag" | "diag_lowrank"
    attn_precond_rank: int = 4
    exact_gradient: bool = False
    attn_backend: str = "auto"  # "auto" | "eager" | "sdpa" | "flex" | "triton" | "cpu" (cem.layers.attention_core.BACKENDS)
    attn_reuse: int = 1  # plain layer reuse of the attention sublayer (Llama control for recursion)
    # MLP sublayer
    mlp: str = "llama"  # "llama" | "cem"
    mlp_steps: int = 1
    mlp_step_size: float = 1.0
    mlp_precond: str = "identity"
    mlp_precond_rank: int = 16
    mlp_energy: str = "gated"  # "gated" | "convex" (App. B)
    mlp_width_mult: float = 1.0  # 1.5 gives the parameter-matched CEM MLP (m' = 1.5 m)
    mlp_reuse: int = 1
    # recursion, shared by both CEM sublayers (cem.layers.steps)
    start: str = "residual"  # x^(0): "residual" (= h, docs/design.md) | "norm" (= RMSNorm(h), Algorithm 1 read literally)
    step_schedule: str = "constant"  # η_t: "constant" (η) | "inverse" (η / T) | "learned" (η · learned gain per step) | "geometric" (η · step_decay^t)
    step_decay: float = 0.5  # ρ of the geometric schedule, in (0, 1]
    learn_step_size: bool = False
    # training the recursion for test-time compute (cem.layers.steps): random depths, truncated backprop, a fixed-point penalty, an anchor
    train_depth: str = "fixed"  # training T: "fixed" (attn_steps / mlp_steps) | "model" / "layer" (drawn per batch for the model / each CEM layer)
    train_depth_dist: str = "uniform"  # the drawn T: "uniform" on 1..train_depth_max | "poisson-lognormal" (heavy-tailed, mean train_depth_mean, capped)
    train_depth_max: int = 3
    train_depth_mean: float = 2.0  # the poisson-lognormal draw's mean, in [1, train_depth_max]
    backprop_steps: int = 0  # differentiate only the last k steps of each CEM layer (0 = all)
    fixed_point_weight: float = 0.0  # λ: training loss + λ · mean over CEM layers of the next step's relative size² (0 = off)
    anchor_weight: float = 0.0  # λ: each step also pulls x back towards x^(0), x += η_t (d(u) - λ (x - x^(0))) (0 = off)
    # inference options of the recursion (cem.layers.steps; eval / no_grad only), saved with the model
    adaptive_tol: float | None = None  # stop a position once the exit rule's quantity <= adaptive_tol (None = off)
    adaptive_rule: str = "energy"  # the exit rule: "energy" (relative energy decrease) | "update" (relative step size)
    guard: int = 0  # energy-guarded steps: halve η_t per position up to `guard` times until E does not rise (0 = off)
    norm_eps: float = 1e-6
    init_std: float = 0.02
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        check_heads(self.dim, self.n_heads)
        for name, high in MAXIMA.items():
            check_positive_int(name, getattr(self, name), high)
        for name in ("attn_step_size", "mlp_step_size", "norm_eps", "init_std", "mlp_width_mult"):
            check_finite(name, getattr(self, name), 0, low_open=True)
        for name in ("exact_gradient", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for sublayer, s in SUBLAYERS.items():  # the fields `attn` and `mlp` name their sublayer's kind
            check_choice(sublayer, getattr(self, sublayer), tuple(s.kinds))
        check_choice("position", self.position, POSITIONS)
        check_choice("kq_diag", self.kq_diag, tuple(KQ_DIAGONALS))
        self.attn_backend = check_backend(self.attn_backend, "attn_backend")  # an old name becomes its name now
        check_choice("attn_precond", self.attn_precond, tuple(PRECONDITIONERS))
        check_choice("mlp_precond", self.mlp_precond, tuple(PRECONDITIONERS))
        check_choice("mlp_energy", self.mlp_energy, MLP_ENERGIES)
        check_choice("alibi", self.alibi, ALIBI_SLOPES)
        check_choice("train_depth", self.train_depth, TRAIN_DEPTHS)
        check_choice("train_depth_dist", self.train_depth_dist, tuple(DEPTH_DISTRIBUTIONS))
        check_finite("train_depth_mean", self.train_depth_mean, 1)
        if self.train_depth_mean > self.train_depth_max:  # e.g. train_depth_max=1 with the default mean: say what to set
            raise ValueError(f"train_depth_mean={self.train_depth_mean:g} is above train_depth_max={self.train_depth_max} (train_depth_mean "
                             f"defaults to {ModelConfig.train_depth_mean:g}): set train_depth_mean={self.train_depth_max} (or less) as well")
        check_nonnegative_int("backprop_steps", self.backprop_steps, MAXIMA["attn_steps"])
        check_finite("fixed_point_weight", self.fixed_point_weight, 0)
        for name in ("adaptive_tol", "adaptive_rule", "guard"):
            Inference.check(name, getattr(self, name))  # the bounds of every test-time setting
        for sublayer in SUBLAYERS:
            self.recursion(sublayer)  # the recursion checks start, step_schedule, step_decay, learn_step_size and anchor_weight

    def recursion(self, kind: str) -> Recursion:
        """The recursion of the CEM `kind` sublayer ("attn" or "mlp"): its own T and η, the schedule, start
        and learned gain both share; a `learned` schedule holds a gain for the deepest T it is trained at."""
        own = {"attn": (self.attn_steps, self.attn_step_size), "mlp": (self.mlp_steps, self.mlp_step_size)}
        check_choice("sublayer", kind, tuple(SUBLAYERS))
        steps, step_size = own[kind]
        learned_steps = max(steps, self.train_depth_max) if self.train_depth != "fixed" else steps
        return Recursion(steps, step_size, self.step_schedule, learned_steps, self.start, self.learn_step_size,
                         self.step_decay, self.backprop_steps or None, self.anchor_weight)

    def attention_config(self) -> AttentionConfig:
        """What the attention sublayer is built and counted from (`cem.layers.ATTENTION_KINDS`)."""
        return AttentionConfig(dim=self.dim, n_heads=self.n_heads, eps=self.norm_eps, position=self.position, alibi=self.alibi,
                               recursion=self.recursion("attn"), kq_diag=self.kq_diag, precond=self.attn_precond,
                               precond_rank=self.attn_precond_rank, exact_gradient=self.exact_gradient, backend=self.attn_backend)

    def mlp_config(self) -> MLPConfig:
        """What the MLP sublayer is built and counted from (`cem.layers.MLP_KINDS`)."""
        return MLPConfig(dim=self.dim, hidden_dim=self.mlp_hidden, eps=self.norm_eps, recursion=self.recursion("mlp"),
                         precond=self.mlp_precond, precond_rank=self.mlp_precond_rank, energy=self.mlp_energy)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def mlp_hidden(self) -> int:
        """Intermediate width m (times mlp_width_mult, rounded to a multiple of 8)."""
        if self.mlp_width_mult == 1:
            return self.hidden_dim
        return int(math.ceil(self.hidden_dim * self.mlp_width_mult / 8)) * 8

    def replace(self, **overrides) -> "ModelConfig":
        """A copy with some fields changed (validated); unknown keys raise ValueError."""
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"unknown model config key(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        if not isinstance(d, dict):
            raise ValueError(f"a model config must be a mapping of settings, got {type(d).__name__}")
        return cls().replace(**d)


# Sizes: the paper's Table 1 (vocab 32,000, context 2,048) plus a 256M on the same line, and small presets
# for CPU work. 256M is ours: width 1024 with 16 heads of 64 (the 134M head width), MLP 2752 ≈ 8/3·D,
# 15 layers, which gives 255.9M parameters for Llama with untied 32k embeddings.
SIZES: dict[str, dict] = {
    "86M": dict(dim=672, n_layers=8, n_heads=8, hidden_dim=1792),
    "108M": dict(dim=672, n_layers=12, n_heads=12, hidden_dim=1792),
    "134M": dict(dim=768, n_layers=12, n_heads=12, hidden_dim=2048),
    "162M": dict(dim=864, n_layers=12, n_heads=12, hidden_dim=2304),
    "256M": dict(dim=1024, n_layers=15, n_heads=16, hidden_dim=2752),
    # CPU presets (vocab set by the tokenizer at training time); `micro` and `tiny` are the micro scale's
    "micro": dict(dim=48, n_layers=2, n_heads=4, hidden_dim=128, context=128, vocab_size=512),
    "tiny": dict(dim=64, n_layers=2, n_heads=4, hidden_dim=176, context=128, vocab_size=512),
    "small": dict(dim=128, n_layers=4, n_heads=4, hidden_dim=352, context=256, vocab_size=512),
    # the cpu experiment scale: 4 layers, heads of width 32, context 256, MLP ≈ 8/3·D; named by their width
    "cpu64": dict(dim=64, n_layers=4, n_heads=2, hidden_dim=176, context=256, vocab_size=512),
    "cpu96": dict(dim=96, n_layers=4, n_heads=3, hidden_dim=256, context=256, vocab_size=512),
    "cpu128": dict(dim=128, n_layers=4, n_heads=4, hidden_dim=352, context=256, vocab_size=512),
    "medium": dict(dim=256, n_layers=6, n_heads=8, hidden_dim=688, context=256, vocab_size=8192),
}

# Architectures: which sublayers are CEM, and the paper's variants of them.
ARCHS: dict[str, dict] = {
    "llama": dict(attn="llama", mlp="llama"),
    "llama-alibi": dict(attn="llama", mlp="llama", position="alibi"),
    "llama-reuse": dict(attn="llama", mlp="llama", attn_reuse=2, mlp_reuse=2),
    "cem-attn": dict(attn="cem", mlp="llama"),
    "cem-mlp": dict(attn="llama", mlp="cem"),
    "cem-mlp-matched": dict(attn="llama", mlp="cem", mlp_width_mult=1.5),
    "cem": dict(attn="cem", mlp="cem"),
    # the paper's best full-CEM setting (§4.3): T = 2 and diagonal-plus-low-rank preconditioners
    "cem-t2": dict(attn="cem", mlp="cem", attn_steps=2, mlp_steps=2, attn_precond="diag_lowrank", mlp_precond="diag_lowrank"),
}


def model_config(size: str = "small", arch: str = "llama", **overrides) -> ModelConfig:
    """The config of a named size and architecture, with field overrides."""
    check_choice("preset", size, tuple(SIZES))
    check_choice("arch", arch, tuple(ARCHS))
    return ModelConfig().replace(**SIZES[size]).replace(**ARCHS[arch]).replace(**overrides)
