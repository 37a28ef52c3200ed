"""A run's configuration: a model preset and architecture, plus the training recipe, from presets, an
optional YAML file and `key=value` overrides."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from ..model import ModelConfig, model_config


@dataclass
class TrainConfig:
    """The paper's recipe (Table 2) as defaults: AdamW, cosine with 5% warm-up to 0.1x, clipping 1.0."""

    data: str = "python-stdlib"
    data_dir: str | None = None
    tokenizer: str = "byte"
    preset: str = "small"
    arch: str = "cem"
    seq_len: int | None = None  # default: the model's context
    batch_size: int = 16  # sequences per micro-batch (per process)
    grad_accum: int = 1
    max_steps: int | None = None
    tokens: str | None = None  # a number of training tokens, or "chinchilla" (20 per Llama-baseline parameter)
    lr: float = 2e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-9
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    warmup_frac: float = 0.05
    final_lr_frac: float = 0.1
    eval_every: int = 200
    eval_batches: int = 20  # validation batches per periodic evaluation (the final test uses the whole split)
    log_every: int = 10
    save_every: int = 200
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # "auto" (bf16 autocast where supported on GPU), "bf16", "fp32"
    compile: bool | None = None  # None: `compile_by_default` (on for CUDA; on the CPU only for long runs)
    parallel: str = "ddp"  # with torchrun: "ddp" or "fsdp" (FSDP2, fully_shard)
    wandb: bool = False
    wandb_project: str = "cem"
    tensorboard: bool = True


@dataclass
class RunConfig:
    train: TrainConfig = field(default_factory=TrainConfig)
    model_overrides: dict = field(default_factory=dict)

    def model(self, vocab_size: int) -> ModelConfig:
        """The model config: size preset + architecture + overrides, vocabulary from the tokenizer."""
        overrides = {"vocab_size": vocab_size, **self.model_overrides}
        cfg = model_config(self.train.preset, self.train.arch, **overrides)
        if self.train.seq_len and self.train.seq_len > cfg.context:
            cfg = cfg.replace(context=self.train.seq_len)
        return cfg

    def to_dict(self) -> dict:
        return {"train": dataclasses.asdict(self.train), "model_overrides": dict(self.model_overrides)}

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return cls(TrainConfig(**d["train"]), dict(d.get("model_overrides", {})))


_TRAIN_FIELDS = {f.name: f for f in fields(TrainConfig)}
_MODEL_FIELDS = {f.name: f for f in fields(ModelConfig)}


def _parse_value(key: str, raw) -> object:
    """Convert `raw` (a string from the command line, or a YAML value) to the field's type."""
    hint = typing.get_type_hints(TrainConfig).get(key) if key in _TRAIN_FIELDS else typing.get_type_hints(ModelConfig)[key]
    base = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    target = base[0]
    if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null") and type(None) in typing.get_args(hint)):
        return None
    try:
        if target is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("1", "true", "yes", "on"):
                return True
            if str(raw).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if target is int and isinstance(raw, str):
            return int(float(raw)) if "e" in raw.lower() else int(raw)
        return target(raw)
    except (TypeError, ValueError):
        raise ValueError(f"bad value for {key}: {raw!r} is not a {target.__name__}") from None


def apply_overrides(run: RunConfig, items: dict) -> RunConfig:
    """Set training fields and model fields by name (`train.X` / `model.X` prefixes also accepted)."""
    train = dataclasses.asdict(run.train)
    model = dict(run.model_overrides)
    for key, raw in items.items():
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


def load_run_config(yaml_path: str | Path | None = None, overrides: list[str] | dict | None = None, **train_kw) -> RunConfig:
    """Defaults, then a YAML file (flat keys, or `train:`/`model:` sections), then `key=value` overrides."""
    run = RunConfig()
    if yaml_path is not None:
        path = Path(yaml_path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"config file {path} must hold a mapping of keys to values")
        flat = {}
        for k, v in data.items():
            if k in ("train", "model") and isinstance(v, dict):
                flat.update({f"{k}.{kk}": vv for kk, vv in v.items()})
            else:
                flat[k] = v
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
    return apply_overrides(run, pairs)
