"""One config dataclass for every model cem builds (nested: its sublayers, their recursion, its training and
inference), the flat spellings of its settings, and named size presets and architectures."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

from ..layers import SUBLAYERS, AttentionConfig, MLPConfig, Recursion, Shape
from ..checks import check_choice, check_finite, check_heads, check_nonnegative_int, check_positive_int
from ..layers.steps import DEPTH_DISTRIBUTIONS, MAX_STEPS, OFF, Inference

TRAIN_DEPTHS = ("fixed", "model", "layer", "curriculum")

# Which blocks' CEM sublayers recurse (`recur_layers`): the others keep T = 1, at training and at test time
# (middle-layer recursion: whole-model looping loses to repeating the middle layers, issue 64).
RECUR_LAYERS = {
    "all": lambda i, n: True,
    "middle": lambda i, n: 0 < i < n - 1,  # every block but the first and the last
}


@dataclass(frozen=True)
class RecursionTraining:
    """Training the recursion for test-time compute (`cem.layers.steps`): random depths
    drawn per batch, a depth curriculum, random deep supervision with a monotonicity term, and a penalty that
    pulls each CEM layer's x^(T) towards a fixed point.

    Random deep supervision (`supervise_depths` = K > 0, LoopUS, arXiv 2605.11011): a training forward draws K
    distinct depths T_1 < ... < T_K = depth_max (`cem.layers.steps.draw_supervised_depths`), runs the model with
    every recursing CEM layer at each, and its objective is (1/K) Σ_k L(T_k) + μ Σ_{k<K} max(0, L(T_{k+1}) - L(T_k))
    (`cem.model.loss.deep_supervision_loss`, μ = `monotonicity_weight`: "loss non-increasing in T" as a
    training term). The depth curriculum (`depth="curriculum"`): T = curriculum[k] in the k-th of
    len(curriculum) equal fractions of the training steps (`cem.layers.steps.curriculum_depth`)."""

    depth: str = "fixed"
    """training T: fixed (each sublayer's recursion steps), drawn per batch for the whole model (model) or each CEM layer (layer), or grown by a curriculum"""
    depth_dist: str = "uniform"
    """the drawn T: uniform on 1..depth_max, or poisson-lognormal (heavy-tailed with mean depth_mean, capped at depth_max)"""
    depth_max: int = 3
    """the deepest drawn T"""
    depth_mean: float = 2.0
    """the poisson-lognormal draw's mean, in [1, depth_max]"""
    fixed_point_weight: float = 0.0
    """λ: training loss + λ · mean over CEM layers of the next step's relative size² (0 = off)"""
    supervise_depths: int = 0
    """random deep supervision: the loss averaged over K distinct depths of one batch, the deepest depth_max (0 = off)"""
    monotonicity_weight: float = 0.0
    """μ: + μ Σ_k max(0, L(T_{k+1}) - L(T_k)) over the supervised depths, a penalty on a loss that grows with T"""
    curriculum: tuple[int, ...] = (1, 2, 4)
    """the depth curriculum's T, one per equal fraction of the training steps (train_depth=curriculum)"""

    CHOICES = {"depth": TRAIN_DEPTHS, "depth_dist": DEPTH_DISTRIBUTIONS}

    def __post_init__(self) -> None:
        check_choice("train_depth", self.depth, TRAIN_DEPTHS)
        check_choice("train_depth_dist", self.depth_dist, tuple(DEPTH_DISTRIBUTIONS))
        check_positive_int("train_depth_max", self.depth_max, MAX_STEPS)
        check_finite("train_depth_mean", self.depth_mean, 1)
        if self.depth_dist == "poisson-lognormal" and self.depth_mean > self.depth_max:  # the mean of that draw only; the default's: say what to set
            raise ValueError(f"train_depth_mean={self.depth_mean:g} is above train_depth_max={self.depth_max} (train_depth_mean "
                             f"defaults to {RecursionTraining.depth_mean:g}): set train_depth_mean={self.depth_max} (or less) as well")
        check_finite("fixed_point_weight", self.fixed_point_weight, 0)
        self._check_supervision()
        self._check_curriculum()

    def _check_supervision(self) -> None:
        k = self.supervise_depths
        check_nonnegative_int("supervise_depths", k, MAX_STEPS)
        check_finite("monotonicity_weight", self.monotonicity_weight, 0)
        if k and (self.depth, self.depth_dist) != ("model", "uniform"):
            raise ValueError(f"supervise_depths={k} draws its depths for the whole model, uniformly: it needs train_depth=model "
                             f"and train_depth_dist=uniform, got train_depth={self.depth}, train_depth_dist={self.depth_dist}")
        if k > self.depth_max:
            raise ValueError(f"supervise_depths={k} is more than the {self.depth_max} distinct depths 1..train_depth_max")
        if self.monotonicity_weight and k < 2:
            raise ValueError(f"monotonicity_weight={self.monotonicity_weight:g} compares the losses at successive supervised "
                             f"depths: it needs supervise_depths >= 2, got {k}")

    def _check_curriculum(self) -> None:
        if isinstance(self.curriculum, list):  # from YAML or JSON
            object.__setattr__(self, "curriculum", tuple(self.curriculum))
        if not isinstance(self.curriculum, tuple) or not self.curriculum:
            raise ValueError(f"train_depth_curriculum must be a non-empty list of depths, got {self.curriculum!r}")
        for depth in self.curriculum:
            check_positive_int("train_depth_curriculum", depth, MAX_STEPS)
        if self.depth != "curriculum" and self.curriculum != RecursionTraining.curriculum:
            raise ValueError(f"train_depth_curriculum={list(self.curriculum)} does nothing with train_depth={self.depth}: set train_depth=curriculum")

    def deepest(self) -> int:
        """The deepest T training draws or reaches (without a random or grown depth: none, 0)."""
        return {"fixed": 0, "curriculum": max(self.curriculum)}.get(self.depth, self.depth_max)

    def learned_steps(self, steps: int) -> int:
        """The per-step gains a `learned` schedule of T = `steps` holds: one for the deepest T it is trained at."""
        return max(steps, self.deepest())


# The largest value each size may take: a config comes from files a user may not have written (an export's
# config.json, a run's run.json), and attn_steps=10**9 there hung the first forward pass (issue 20); the depths
# are bounded by `Recursion` (MAX_STEPS). Far above any model this package trains (the 256M preset: dim 1024, 15 layers).
MAXIMA = {
    "vocab_size": 1 << 24, "dim": 1 << 16, "n_heads": 1 << 12, "n_layers": 1 << 10, "hidden_dim": 1 << 18, "context": 1 << 20,
    "attn_reuse": 256, "mlp_reuse": 256, "attn_precond_rank": 1 << 12, "mlp_precond_rank": 1 << 12,
}  # fmt: skip

# The flat spellings of the nested settings: the command line's and YAML's `attn_steps=2`, old run.json files and
# checkpoints, and the study's run names. Each names the path it sets; "*" is each sublayer that recurses (CEM).
FLAT: dict[str, tuple[str, ...]] = {
    "attn": ("attn", "kind"), "position": ("attn", "position"), "alibi": ("attn", "alibi"),
    "attn_steps": ("attn", "recursion", "steps"), "attn_step_size": ("attn", "recursion", "step_size"),
    "kq_diag": ("attn", "kq_diag"), "attn_precond": ("attn", "precond"), "attn_precond_rank": ("attn", "precond_rank"),
    "exact_gradient": ("attn", "exact_gradient"), "attn_backend": ("attn", "backend"), "attn_reuse": ("attn", "reuse"),
    "mlp": ("mlp", "kind"), "mlp_steps": ("mlp", "recursion", "steps"), "mlp_step_size": ("mlp", "recursion", "step_size"),
    "mlp_precond": ("mlp", "precond"), "mlp_precond_rank": ("mlp", "precond_rank"), "mlp_energy": ("mlp", "energy"),
    "mlp_width_mult": ("mlp", "width_mult"), "mlp_reuse": ("mlp", "reuse"),
    "start": ("*", "recursion", "start"), "step_schedule": ("*", "recursion", "schedule"), "step_decay": ("*", "recursion", "decay"),
    "learn_step_size": ("*", "recursion", "learn_step_size"), "backprop_steps": ("*", "recursion", "backprop_steps"),
    "anchor_weight": ("*", "recursion", "anchor"), "step_gate": ("*", "recursion", "gate"),
    "train_depth": ("training", "depth"), "train_depth_dist": ("training", "depth_dist"), "train_depth_max": ("training", "depth_max"),
    "train_depth_mean": ("training", "depth_mean"), "fixed_point_weight": ("training", "fixed_point_weight"),
    "supervise_depths": ("training", "supervise_depths"), "monotonicity_weight": ("training", "monotonicity_weight"),
    "train_depth_curriculum": ("training", "curriculum"),
    "adaptive_tol": ("inference", "adaptive_tol"), "adaptive_rule": ("inference", "adaptive_rule"), "guard": ("inference", "guard"),
}  # fmt: skip
PARTS = {"attn": AttentionConfig, "mlp": MLPConfig, "training": RecursionTraining, "inference": Inference}  # the nested fields
_DERIVED = {"learned_steps"}  # set from the random depths (`RecursionTraining.learned_steps`): not a setting


def flat_field(key: str) -> tuple[type, dataclasses.Field]:
    """The dataclass and field a flat key (`FLAT`) or a top-level field names (for its type, default and docstring)."""
    path = FLAT.get(key, (key,))
    owner: type = ModelConfig
    for i, name in enumerate(path):
        if name == "*":
            owner = AttentionConfig
            continue
        field = {f.name: f for f in fields(owner)}[name]
        if i < len(path) - 1:
            owner = field.default.__class__
    return owner, field


def _part(name: str, value):
    """A nested part (`PARTS`) from itself or a mapping of its fields (nested again for a sublayer's recursion)."""
    cls = PARTS[name]
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"model setting {name} must be a mapping of settings, got {type(value).__name__} {value!r}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known - _DERIVED)
    if unknown:
        raise ValueError(f"unknown model config key(s): {', '.join(f'{name}.{k}' for k in unknown)}")
    value = {k: v for k, v in value.items() if k in known}
    if isinstance(value.get("recursion"), dict):
        value["recursion"] = Recursion(**{k: v for k, v in value["recursion"].items()})
    part = cls(**value)
    if cls is Inference and part.depth("attn") is None and part.depth("mlp") is None:  # the options given, the others off
        return part.options()
    return part


@dataclass(frozen=True)
class ModelConfig:
    """A decoder language model: embeddings, `n_layers` blocks (attention then MLP, each pre-norm
    residual), a final RMSNorm and an untied output head (as Llama and the paper's Table 1 counts).

    The attention and MLP sublayers are typed parts (`attn`, `mlp`: their kind, its settings, a CEM sublayer's
    `Recursion`), with the recursion's training (`training`) and inference options (`inference`) beside them;
    `replace` and `from_dict` also take the flat spellings of `FLAT` (`attn_steps=2`)."""

    vocab_size: int = 32000
    """vocabulary size (set from the tokenizer when training)"""
    dim: int = 768
    """model width D"""
    n_layers: int = 12
    """number of blocks (attention then MLP)"""
    n_heads: int = 12
    """attention heads K (D divisible by K)"""
    hidden_dim: int = 2048
    """the MLP's intermediate width m"""
    context: int = 2048
    """the longest sequence, in tokens"""
    attn: AttentionConfig = AttentionConfig()
    """the attention sublayer"""
    mlp: MLPConfig = MLPConfig()
    """the MLP sublayer"""
    training: RecursionTraining = RecursionTraining()
    """training the CEM sublayers' recursion: random depths, a fixed-point penalty"""
    inference: Inference = OFF
    """the CEM sublayers' inference options (eval / no_grad only), saved with the model"""
    norm_eps: float = 1e-6
    """the RMSNorm epsilon"""
    init_std: float = 0.02
    """standard deviation of the initial linear and embedding weights"""
    tie_embeddings: bool = False
    """share the embedding and output weights"""
    recur_layers: str = "all"
    """the blocks whose CEM sublayers recurse (`RECUR_LAYERS`: all, or middle = all but the first and last); the others keep T = 1"""

    def __post_init__(self) -> None:
        check_heads(self.dim, self.n_heads)
        for name, high in MAXIMA.items():
            check_positive_int(name, self.flat(name), high)
        for name in ("norm_eps", "init_std", "mlp_width_mult", "attn_step_size", "mlp_step_size"):
            check_finite(name, self.flat(name), 0, low_open=True)
        for name in ("exact_gradient", "tie_embeddings"):
            if not isinstance(self.flat(name), bool):
                raise ValueError(f"{name} must be true or false, got {self.flat(name)!r}")
        for name, cls in PARTS.items():
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"model setting {name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        check_choice("recur_layers", self.recur_layers, tuple(RECUR_LAYERS))
        if self.recur_layers != "all" and not self.recursing():
            raise ValueError(f"recur_layers={self.recur_layers} does nothing: the model has no CEM sublayer (attn={self.attn.kind}, mlp={self.mlp.kind})")
        if not self.recursing() and (self.training.supervise_depths or self.training.depth == "curriculum"):
            key = f"supervise_depths={self.training.supervise_depths}" if self.training.supervise_depths else "train_depth=curriculum"
            raise ValueError(f"{key} does nothing: the model has no CEM sublayer (attn={self.attn.kind}, mlp={self.mlp.kind})")
        if not any(self.recurs(i) for i in range(self.n_layers)):
            raise ValueError(f"recur_layers={self.recur_layers} leaves no block of {self.n_layers} recursing: use more layers or recur_layers=all")
        if self.inference != self.inference.options():
            raise ValueError(f"a model's inference options hold no depths (its T is each sublayer's recursion steps), got {self.inference}")
        for sublayer in self.recursing():  # a learned schedule holds a gain for the deepest T it is trained at
            part = getattr(self, sublayer)
            learned = self.training.learned_steps(part.recursion.steps) if part.recursion.schedule == "learned" else None
            if part.recursion.learned_steps != learned:
                object.__setattr__(self, sublayer, dataclasses.replace(part, recursion=dataclasses.replace(part.recursion, learned_steps=learned)))

    def recursing(self) -> tuple[str, ...]:
        """The sublayers (`SUBLAYERS` names) whose kind recurses (reads a `Recursion`: CEM)."""
        return tuple(s for s in SUBLAYERS if "recursion" in SUBLAYERS[s].kinds[getattr(self, s).kind].settings(getattr(self, s)))

    def recurs(self, block: int) -> bool:
        """Whether the CEM sublayers of block `block` (0-based) recurse (`recur_layers`); the others keep T = 1."""
        return RECUR_LAYERS[self.recur_layers](block, self.n_layers)

    def layer_config(self, block: int) -> "ModelConfig":
        """The config block `block` is built from: this one, or at T = 1 for a block that does not recurse."""
        return self if self.recurs(block) else self.at(Inference(steps=1))

    def at(self, inference: Inference) -> "ModelConfig":
        """This config at test-time settings: each CEM sublayer's T from `inference` (`Inference.depth`; None keeps
        it) and the inference options it gives in place of these (None keeps them)."""
        parts = {}
        for s in self.recursing():
            part, depth = getattr(self, s), inference.depth(s)
            if depth is not None:
                parts[s] = dataclasses.replace(part, recursion=dataclasses.replace(part.recursion, steps=depth))
        return self.replace(inference=self.inference.changed(inference).options(), **parts)

    def flat(self, key: str):
        """The value of a flat key (`FLAT`) or top-level field; a "*" path reads the recursing sublayers' (which
        agree), else its default."""
        path = FLAT.get(key, (key,))
        if path[0] == "*":
            values = {_get(getattr(self, s), path[1:]) for s in self.recursing()}
            if len(values) > 1:
                raise ValueError(f"the CEM sublayers differ in {key} {sorted(values, key=str)}: no flat value")
            return values.pop() if values else _get(Recursion(), path[2:])
        return _get(self, path)

    def flat_dict(self) -> dict:
        """Every flat key (`FLAT`) and top-level setting with its value: the spelling of a run's overrides."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in PARTS}
        return {**out, **{key: self.flat(key) for key in FLAT}}

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def mlp_hidden(self) -> int:
        """Intermediate width m (times the MLP's width_mult, rounded to a multiple of 8)."""
        if self.mlp.width_mult == 1:
            return self.hidden_dim
        return int(math.ceil(self.hidden_dim * self.mlp.width_mult / 8)) * 8

    @property
    def shape(self) -> Shape:
        """The widths the sublayers are built with."""
        return Shape(self.dim, self.n_heads, self.mlp_hidden, self.norm_eps)

    def replace(self, **overrides) -> "ModelConfig":
        """A copy with some settings changed (validated): top-level fields, the nested parts (`PARTS`, each given
        whole, as itself or a mapping) and the flat keys of `FLAT` (sublayer kinds first); unknown keys raise
        ValueError."""
        field_names = {f.name for f in fields(self)}
        nested = {k: v for k, v in overrides.items() if k in field_names and not (k in FLAT and isinstance(v, str))}
        flat = {k: v for k, v in overrides.items() if k not in nested}
        unknown = sorted(k for k in flat if k not in FLAT)
        if unknown:
            raise ValueError(f"unknown model config key(s): {', '.join(unknown)} (see `cem info --keys`)")
        for key, value in flat.items():  # a kind, a depth or an inference option, checked under its flat name
            if FLAT[key][-1] == "kind":
                check_choice(key, value, tuple(SUBLAYERS[FLAT[key][0]].kinds))
            if key in Inference.CHECKS and value is not None:
                Inference.check(key, value)
        tree = {f.name: getattr(self, f.name) for f in fields(self)}
        tree.update({k: _part(k, v) if k in PARTS else v for k, v in nested.items()})
        tree.update({k: dataclasses.asdict(tree[k]) for k in PARTS})
        kinds = {k: v for k, v in flat.items() if FLAT[k][-1] == "kind"}
        for key, value in {**kinds, **flat}.items():
            path = FLAT[key]
            if path[0] == "*":
                targets = [s for s in SUBLAYERS if "recursion" in SUBLAYERS[s].kinds[tree[s]["kind"]].settings(_part(s, {"kind": tree[s]["kind"]}))]
                if not targets and value != _get(Recursion(), path[2:]):
                    raise ValueError(f"{key}={value!r} does nothing: the model has no CEM sublayer (attn={tree['attn']['kind']}, mlp={tree['mlp']['kind']})")
            else:
                targets = [path[0]]
            for target in targets:
                node = tree[target]
                for name in path[1:-1]:
                    node = node[name]
                node[path[-1]] = value
        try:
            return ModelConfig(**{k: _part(k, v) if k in PARTS else v for k, v in tree.items()})
        except ValueError as e:  # a part's message names its field: name the flat key that was given
            text = str(e)
            for key, value in flat.items():
                path = FLAT[key]
                if path[0] in SUBLAYERS and text.startswith(f"{path[1]}=") and " does nothing in " in text:
                    raise ValueError(f"{key}={value!r}{text[text.index(' does nothing in '):]}") from None
                name = path[-1]
                for head in (f"{name} ", f"unknown {name} "):
                    if text.startswith(head):
                        raise ValueError(head.replace(name, key) + text[len(head):]) from None
            raise

    def to_dict(self) -> dict:
        """The config as plain values, nested as the dataclass is; a sublayer shows the settings its kind reads,
        and `training` and `inference` are shown for a model with a CEM sublayer only."""
        out: dict = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SUBLAYERS:
                used = SUBLAYERS[f.name].kinds[value.kind].settings(value)
                value = {"kind": value.kind, **{k: v for k, v in dataclasses.asdict(value).items() if k in used}}
                if "recursion" in value:
                    value["recursion"] = {k: v for k, v in value["recursion"].items() if k not in _DERIVED}
            elif f.name in ("training", "inference"):
                if not self.recursing():
                    continue
                value = {k: v for k, v in dataclasses.asdict(value).items() if f.name == "training" or k in ("adaptive_tol", "adaptive_rule", "guard")}
                value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}  # plain values: the curriculum as a list
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """The config `to_dict` wrote, or the flat one of older run.json files and checkpoints (`FLAT`)."""
        if not isinstance(d, dict):
            raise ValueError(f"a model config must be a mapping of settings, got {type(d).__name__}")
        return cls().replace(**d)


def _get(obj, path: tuple[str, ...]):
    for name in path:
        obj = getattr(obj, name)
    return obj


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
    # cpu128 twice as deep (8 layers at its width)
    "cpu128-l8": dict(dim=128, n_layers=8, n_heads=4, hidden_dim=352, context=256, vocab_size=512),
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
