"""Save and load a model as a directory holding `config.json` and `model.safetensors`."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..io import fix_modes, read_json, staged_folder
from .config import ModelConfig
from .lm import LanguageModel

FORMAT = "cem-model-v1"


def save_pretrained(model: LanguageModel, directory: str | Path) -> Path:
    """Write `config.json` and `model.safetensors` into `directory`, atomically (temp dir, then rename)."""
    return save_weights(model.current_config(), model.state_dict(), directory)


def save_weights(cfg: ModelConfig, state_dict: dict, directory: str | Path) -> Path:
    """`save_pretrained` from a config and a (full, unsharded) state dict, e.g. gathered from FSDP."""
    with staged_folder(directory) as tmp:
        config = {"format": FORMAT, **cfg.to_dict()}
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
        if cfg.tie_embeddings:
            state.pop("head.weight")
        save_file(state, tmp / "model.safetensors", metadata={"format": FORMAT})
        fix_modes(tmp)
    return Path(directory)


def load_config(directory: str | Path) -> ModelConfig:
    """The `ModelConfig` stored in `directory/config.json`."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no model config at {path} (expected a directory written by save_pretrained)")
    data = read_json(path)
    if "model_type" in data and data.get("format") != FORMAT:  # transformers' config, as `cem export` writes it
        raise ValueError(f"{directory} is a Hugging Face model folder (its config.json has model_type {data['model_type']!r}; `cem export` "
                         "writes these), not a cem run or checkpoint: load it with transformers' AutoModelForCausalLM (after "
                         "`import cem.hf` for the CEM format), or give the run folder it was exported from")
    data.pop("format", None)
    try:
        return ModelConfig.from_dict(data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad model config {path}: {e}") from None


def load_pretrained(directory: str | Path, map_location: str | torch.device = "cpu") -> LanguageModel:
    """Rebuild the model from `config.json` and load `model.safetensors` (all tensors must match)."""
    cfg = load_config(directory)
    path = Path(directory) / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"no weights at {path}")
    try:
        state = load_file(path, device=str(map_location))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"corrupted weights file {path}: {e}") from None
    odd = [f"{k} ({v.dtype})" for k, v in state.items() if not v.is_floating_point()]
    if odd:
        raise ValueError(f"weights in {path} are not floating point: {', '.join(odd[:3])}{' ...' if len(odd) > 3 else ''}")
    model = LanguageModel(cfg)
    if cfg.tie_embeddings:
        state["head.weight"] = state["embed.weight"]
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state.items()}
    if expected != found:
        diff = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
        details = ", ".join(f"{k}: config {expected.get(k)} vs file {found.get(k)}" for k in diff[:3])
        raise ValueError(f"weights in {path} do not match the config ({len(diff)} tensors differ; {details})")
    model.load_state_dict(state)
    return model.to(map_location)
