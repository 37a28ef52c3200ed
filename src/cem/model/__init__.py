"""Language models built from CEM and Llama sublayers, with presets, generation and save/load."""

from .cache import Cache, CacheSlot
from .config import ARCHS, FLAT, SIZES, ModelConfig, RecursionTraining, model_config
from .generate import generate, sample_next
from .io import load_config, load_pretrained, save_pretrained, save_weights
from .lm import Block, LanguageModel
from .params import format_breakdown, parameter_breakdown

__all__ = [
    "ARCHS",
    "FLAT",
    "Block",
    "Cache",
    "CacheSlot",
    "LanguageModel",
    "ModelConfig",
    "RecursionTraining",
    "SIZES",
    "format_breakdown",
    "generate",
    "load_config",
    "load_pretrained",
    "model_config",
    "parameter_breakdown",
    "sample_next",
    "save_pretrained",
    "save_weights",
]
