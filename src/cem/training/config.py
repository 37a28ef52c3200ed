"""A run's configuration: a model preset and architecture, plus the training recipe, from presets, an
optional YAML file and `key=value` overrides."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import reprlib
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from ..device import PARALLEL, PRECISIONS
from ..checks import check_choice, check_finite, check_positive_int, parse_bool
from ..data.tokenizers import ByteTokenizer, check_spec
from ..model import ARCHS, FLAT, SIZES, ModelConfig, model_config
from ..model.config import PARTS, flat_field
from ..model.lm import CHECKPOINTING

LLAMA_VOCAB = 32_000  # the paper's Llama tokenizer: the guess for a pretrained tokenizer not loaded yet


@dataclass
class TrainConfig:
    """The paper's recipe (Table 2) as defaults: AdamW, cosine with 5% warm-up to 0.1x, clipping 1.0."""

    data: str = "shakespeare"
    """corpus: shakespeare (embedded), another named one (docs/data.md, 'Data directory'), a local file or folder, or hf:NAME[:CONFIG]"""
    data_dir: str | None = None
    """where named corpora live (default: $CEM_DATA_DIR, else ./data when it holds the corpus, else ~/.cache/cem/data, where `cem data prepare` puts them)"""
    data_encoding: str = "utf-8"
    """of local .txt/.jsonl corpora; text that does not decode is refused"""
    tokenizer: str = "byte"
    """byte, bpe:N, or a Hugging Face tokenizer name / path"""
    preset: str = "small"
    """model size"""
    arch: str = "cem"
    """architecture: which sublayers are CEM, and their variants"""
    seq_len: int | None = None
    """training sequence length (default: the model's context)"""
    batch_size: int = 16
    """sequences per micro-batch and process"""
    grad_accum: int = 1
    """micro-batches per optimiser step"""
    max_steps: int | None = None
    """optimiser steps"""
    tokens: str | None = None
    """training tokens (e.g. 5e6) or 'chinchilla' (20 per parameter of the Llama baseline), instead of max_steps (default: none)"""
    lr: float = 2e-3
    """peak learning rate"""
    beta1: float = 0.9
    """AdamW's β1"""
    beta2: float = 0.95
    """AdamW's β2"""
    eps: float = 1e-9
    """AdamW's ε"""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay"""
    grad_clip: float = 1.0
    """clip the gradient's global norm to this"""
    warmup_frac: float = 0.05
    """fraction of the steps of linear warm-up"""
    final_lr_frac: float = 0.1
    """the cosine schedule ends at this fraction of lr"""
    eval_every: int = 200
    """steps between validation evaluations (0: none)"""
    eval_batches: int = 20
    """validation batches per periodic evaluation"""
    final_eval_tokens: int | None = None
    """leading tokens of the final validation and test evaluation; 0: all (default: the whole split where that is quick, `trainer.final_eval_tokens`: at most 5% of the training tokens, else 5% of the training tokens)"""
    log_every: int = 10
    """steps between log lines"""
    save_every: int = 200
    """steps between checkpoints (0: only at the end)"""
    seed: int = 0
    """seed of the weights, the data order and sampling"""
    device: str = "auto"
    """auto (CUDA when available, else the CPU), cpu, cuda, cuda:N, mps"""
    precision: str = "auto"
    """auto (bf16 autocast where supported on GPU), bf16 or fp32"""
    compile: bool | None = None
    """run the model under torch.compile (default: `compile_by_default`, on for CUDA; on the CPU only for long runs)"""
    parallel: str = "ddp"
    """with torchrun: ddp or fsdp (FSDP2, fully_shard)"""
    activation_checkpointing: str = "none"
    """recompute activations in the backward pass: layer (each block: the least memory at any T) or step (each recursion step of a CEM sublayer: memory still grows with T, by one residual per step instead of a step's activations; cem info --memory predicts both)"""
    wandb: bool = False
    """log to Weights & Biases"""
    wandb_project: str = "cem"
    """the Weights & Biases project"""
    tensorboard: bool = True
    """TensorBoard logs, when TensorBoard is installed (the `tensorboard` extra); said once in the log otherwise"""
    hf_max_docs: int | None = None
    """hf: corpora: documents streamed per split (default: no document limit)"""
    hf_max_bytes: int | None = None
    """hf: corpora: text bytes streamed for train (default: enough for the budget)"""
    diverge_factor: float = 10.0
    """stop when the median loss of the last 10 steps exceeds this multiple of the earlier median, or a loss this multiple of ln(vocab) (0: only non-finite)"""
    diverge_warmup: int = 20
    """steps before the loss medians are compared"""

    CHOICES = {"preset": tuple(SIZES), "arch": tuple(ARCHS), "precision": PRECISIONS, "parallel": PARALLEL,
               "activation_checkpointing": CHECKPOINTING}  # fmt: skip

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError, naming the setting, for any value training could not use as meant."""
        for name in ("batch_size", "grad_accum", "log_every", "eval_batches"):
            check_positive_int(name, getattr(self, name))
        for name in ("max_steps", "seq_len", "hf_max_docs", "hf_max_bytes"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.final_eval_tokens is not None and (isinstance(self.final_eval_tokens, bool) or not isinstance(self.final_eval_tokens, int) or self.final_eval_tokens < 0):
            raise ValueError(f"final_eval_tokens must be None or an integer >= 0, got {self.final_eval_tokens!r}")
        for name in ("eval_every", "save_every", "diverge_warmup", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.seed >= 2**63:
            raise ValueError(f"seed must be < 2**63, got {self.seed}")
        check_finite("lr", self.lr, 0, low_open=True)
        check_finite("beta1", self.beta1, 0, 1, high_open=True)
        check_finite("beta2", self.beta2, 0, 1, high_open=True)
        check_finite("eps", self.eps, 0, low_open=True)
        check_finite("weight_decay", self.weight_decay, 0)
        check_finite("grad_clip", self.grad_clip, 0, low_open=True)
        check_finite("warmup_frac", self.warmup_frac, 0, 1, high_open=True)
        check_finite("final_lr_frac", self.final_lr_frac, 0, 1)
        check_finite("diverge_factor", self.diverge_factor, 0)
        if 0 < self.diverge_factor <= 1:
            raise ValueError(f"diverge_factor must be 0 (off) or > 1, got {self.diverge_factor!r}")
        for name in ("data", "tokenizer", "preset", "arch"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must name something, got {value!r}")
        check_spec(self.tokenizer)
        for name, choices in self.CHOICES.items():
            check_choice(name, getattr(self, name), choices)
        try:
            "".encode(self.data_encoding)
        except (LookupError, TypeError):
            raise ValueError(f"unknown data_encoding {self.data_encoding!r}") from None
        if self.tokens is not None:
            if self.max_steps is not None:
                raise ValueError(f"give max_steps or tokens, not both (max_steps={self.max_steps}, tokens={self.tokens!r})")
            if str(self.tokens).lower() != "chinchilla":
                try:
                    n = float(self.tokens)
                except (TypeError, ValueError):
                    raise ValueError(f"tokens must be a number or 'chinchilla', got {self.tokens!r}") from None
                if not math.isfinite(n) or n < 1:
                    raise ValueError(f"tokens must be a finite number >= 1 or 'chinchilla', got {self.tokens!r}")


@dataclass
class RunConfig:
    train: TrainConfig = field(default_factory=TrainConfig)
    model_overrides: dict = field(default_factory=dict)

    def model(self, vocab_size: int | None = None) -> ModelConfig:
        """The model config with the tokenizer's vocabulary `vocab_size` (default: `vocab_hint`, before the
        tokenizer is loaded); a `vocab_size` setting must equal it: eval, generate and export read the model
        with its tokenizer."""
        vocab_size = self.vocab_hint() if vocab_size is None else vocab_size
        given = self.model_overrides.get("vocab_size", vocab_size)
        if given != vocab_size:
            raise ValueError(
                f"vocab_size={given!r} does not match the tokenizer {self.train.tokenizer!r}, which has {vocab_size} symbols; "
                "leave vocab_size out (it is set from the tokenizer)")
        cfg = self._model_config
        return cfg if cfg.vocab_size == vocab_size else cfg.replace(vocab_size=vocab_size)

    @functools.cached_property
    def _model_config(self) -> ModelConfig:
        """Size preset + architecture + overrides, with `vocab_hint`'s vocabulary and a context of at least
        `seq_len`: the one place a run's model config is built (`model` hands it out)."""
        cfg = model_config(self.train.preset, self.train.arch, **{**self.model_overrides, "vocab_size": self.vocab_hint()})
        if self.train.seq_len and self.train.seq_len > cfg.context:
            cfg = cfg.replace(context=self.train.seq_len)
        return cfg

    def vocab_hint(self) -> int:
        """The vocabulary size of the run before its tokenizer is loaded: 257 for `byte`, else the `vocab_size`
        setting, else N for `bpe:N` (its most), LLAMA_VOCAB for a pretrained tokenizer."""
        if self.train.tokenizer == "byte":  # known before anything loads: a vocab_size setting is checked against it
            return ByteTokenizer.vocab_size
        if "vocab_size" in self.model_overrides:
            return self.model_overrides["vocab_size"]
        bpe = re.fullmatch(r"bpe:(\d+)", self.train.tokenizer)
        return int(bpe.group(1)) if bpe else LLAMA_VOCAB

    def to_dict(self) -> dict:
        return {"train": dataclasses.asdict(self.train), "model_overrides": dict(self.model_overrides)}

    @classmethod
    def from_dict(cls, d: dict, source: str = "the recorded config") -> "RunConfig":
        """The config `to_dict` wrote, its values as recorded and checked as TrainConfig and ModelConfig check
        them; a ValueError naming `source` (e.g. a run's run.json) for a record that is not one."""
        try:
            train, model = (d.get("train"), d.get("model_overrides", {})) if isinstance(d, dict) else (None, None)
            if not isinstance(train, dict) or not isinstance(model, dict):
                raise ValueError("expected a 'train' mapping of settings (and a 'model_overrides' mapping)")
            unknown = [f"train.{k}" for k in train if k not in _TRAIN_FIELDS] + [f"model.{k}" for k in model if k not in _MODEL_FIELDS]
            if unknown:
                raise ValueError(f"unknown setting {unknown[0]!r} (not a training or model setting of this cem)")
            run = cls(TrainConfig(**train), dict(model))
            run.model()
        except ValueError as e:
            raise ValueError(f"{source}: recorded settings not usable: {e}") from None
        return run


_TRAIN_FIELDS = {f.name: f for f in fields(TrainConfig)}
_MODEL_FIELDS = {f.name: f for f in fields(ModelConfig)} | {key: None for key in FLAT}  # the nested fields and their flat spellings


def _parse_value(key: str, raw) -> object:
    """Convert `raw` (a string from the command line, or a YAML value) to the field's type."""
    if key in _TRAIN_FIELDS:
        hint = typing.get_type_hints(TrainConfig)[key]
    else:
        owner, f = flat_field(key)
        hint = typing.get_type_hints(owner)[f.name]
        if key in PARTS and isinstance(raw, dict):  # a nested part (YAML), checked as ModelConfig checks it
            return raw
    if typing.get_origin(hint) is tuple:  # a list of values, e.g. train_depth_curriculum=1,2,4 (or a YAML list)
        items = raw.strip().strip("[]()").split(",") if isinstance(raw, str) else raw
        if not isinstance(items, (list, tuple)) or isinstance(raw, bool):
            raise ValueError(f"bad value for {key}: {reprlib.repr(raw)} is not a list (write 1,2,4)")
        return tuple(_parse_item(key, item, typing.get_args(hint)[0]) for item in items)
    base = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    target = base[0]
    optional = type(None) in typing.get_args(hint)
    if raw is None and not optional:
        raise ValueError(f"bad value for {key}: it cannot be null (give a {target.__name__})")
    if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null") and optional):
        return None
    if isinstance(raw, bool) and target is not bool:  # YAML's yes/no/true/false are not numbers or names
        raise ValueError(f"bad value for {key}: {raw!r} is a boolean, not a {target.__name__}")
    try:
        if target is bool:
            if isinstance(raw, bool):
                return raw
            return parse_bool(key, raw)
        if target is int and isinstance(raw, str) and "e" in raw.lower():
            value = float(raw)
            if not value.is_integer():
                raise ValueError
            return int(value)
        if target is int and isinstance(raw, float):
            if not raw.is_integer():
                raise ValueError
            return int(raw)
        if target is str and not isinstance(raw, (str, int, float)):
            raise ValueError
        return target(raw)
    except (TypeError, ValueError):
        raise ValueError(f"bad value for {key}: {reprlib.repr(raw)} is not a {target.__name__}") from None


def _parse_item(key: str, item, target: type) -> object:
    """One item of a list setting, as `target` (an int: a whole number)."""
    try:
        if isinstance(item, bool) or (isinstance(item, float) and not item.is_integer()):
            raise ValueError
        return target(item.strip() if isinstance(item, str) else item)
    except (TypeError, ValueError):
        raise ValueError(f"bad value for {key}: {reprlib.repr(item)} is not a {target.__name__}") from None


def apply_overrides(run: RunConfig, items: dict) -> RunConfig:
    """Set training fields and model fields by name (`train.X` / `model.X` prefixes also accepted)."""
    train = dataclasses.asdict(run.train)
    model = dict(run.model_overrides)
    for key, raw in items.items():
        if not isinstance(key, str):
            raise ValueError(f"config keys must be names, got {key!r}")
        scope, _, name = key.rpartition(".")
        if scope not in ("", "train", "model"):
            raise ValueError(f"unknown config key {key!r}")
        if name in _TRAIN_FIELDS and scope in ("", "train"):
            train[name] = _parse_value(name, raw)
        elif name in _MODEL_FIELDS and scope in ("", "model"):
            model[name] = _parse_value(name, raw)
        else:
            raise ValueError(f"unknown config key {key!r} (not a training or model setting; see `cem info --keys`)")
    return RunConfig(TrainConfig(**train), model)


class _ConfigLoader(yaml.SafeLoader):
    """`yaml.safe_load`'s loader without aliases (`*name`: a few lines of them expand to any size, the
    "billion laughs"), with values nested at most `MAX_DEPTH` levels (deeper ones overflowed the stack), and
    without a key given twice in a mapping (YAML keeps the last: the first would mean nothing)."""

    MAX_DEPTH = 8

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a config file", event.start_mark)
        self.depth = getattr(self, "depth", 0) + 1
        try:
            if self.depth > self.MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"values nested more than {self.MAX_DEPTH} levels deep", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_run_config(yaml_path: str | Path | None = None, overrides: list[str] | dict | None = None, base: RunConfig | None = None, **train_kw) -> RunConfig:
    """Defaults (or `base`, e.g. a run directory's recorded config), then a YAML file (flat keys, or
    `train:`/`model:` sections), then `key=value` overrides."""
    run = base or RunConfig()
    if yaml_path is not None:
        path = Path(yaml_path)
        if path.is_dir():
            raise ValueError(f"config file {path} is a folder; give a YAML file")
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        try:
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=_ConfigLoader) or {}
        except UnicodeDecodeError:
            raise ValueError(f"config file {path} is not UTF-8 text") from None
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            line = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ValueError(f"config file {path}: invalid YAML{line}: {problem} (only plain values; no !!python tags, no aliases)") from None
        if not isinstance(data, dict):
            raise ValueError(f"config file {path} must hold a mapping of keys to values")
        flat = {}
        for k, v in data.items():
            flat.update({f"{k}.{kk}": vv for kk, vv in v.items()} if k in ("train", "model") and isinstance(v, dict) else {k: v})
        named: dict[str, str] = {}  # a setting given flat and in its section
        for k in map(str, flat):
            name = k.rpartition(".")[2]
            if name in named:
                raise ValueError(f"config file {path}: {named[name]} and {k} set the same setting; give it once")
            named[name] = k
        run = apply_overrides(run, flat)
    run = apply_overrides(run, {k: v for k, v in train_kw.items() if v is not None})
    if isinstance(overrides, dict):
        return apply_overrides(run, overrides)
    pairs = {}
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value")
        k, v = item.split("=", 1)
        pairs[k.strip()] = v.strip()
    run = apply_overrides(run, pairs)
    run.model()  # the model settings are checked now, not after the data loads
    return run
