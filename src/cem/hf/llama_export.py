"""The Llama baseline in native `transformers.LlamaForCausalLM` format, both ways.

A cem model with Llama attention (RoPE) and the SwiGLU MLP, without layer reuse, *is* a Llama: the same
pre-norm blocks, RMSNorm, RoPE convention ("rotate halves": dimension i is paired with i + d/2, the
`rotate_half` of `transformers`, inverse frequencies theta^(-2i/d)) and softmax scale 1/sqrt(d). Only names
differ, and the MLP's two input projections swap names:

    cem                             transformers (LlamaForCausalLM)
    embed.weight                    model.embed_tokens.weight
    blocks.i.attn.norm.weight       model.layers.i.input_layernorm.weight
    blocks.i.attn.w_{q,k,v,o}       model.layers.i.self_attn.{q,k,v,o}_proj
    blocks.i.mlp.norm.weight        model.layers.i.post_attention_layernorm.weight
    blocks.i.mlp.w_up   (in SiLU)   model.layers.i.mlp.gate_proj
    blocks.i.mlp.w_gate (linear)    model.layers.i.mlp.up_proj
    blocks.i.mlp.w_down             model.layers.i.mlp.down_proj
    norm.weight                     model.norm.weight
    head.weight                     lm_head.weight (absent when tied)

`export_llama` writes config.json, generation_config.json and model.safetensors directly (no
`transformers` model is built); `import_llama` reads them back into a `LanguageModel`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from transformers import GenerationConfig, LlamaConfig

from ..io import fix_modes, staged_folder
from ..layers import ATTENTION_KINDS, MLP_KINDS, GatedMLP, LlamaAttention
from ..model import LanguageModel, ModelConfig
from .tokenizer import save_tokenizer, special_token_ids, transformers_tokenizer

DEFAULT_ROPE_THETA = 10000.0  # the only theta ModelConfig builds (LlamaAttention's default)

_LAYER_MAP = (
    # (cem name inside blocks.i, transformers name inside model.layers.i)
    ("attn.norm.weight", "input_layernorm.weight"),
    ("attn.w_q.weight", "self_attn.q_proj.weight"),
    ("attn.w_k.weight", "self_attn.k_proj.weight"),
    ("attn.w_v.weight", "self_attn.v_proj.weight"),
    ("attn.w_o.weight", "self_attn.o_proj.weight"),
    ("mlp.norm.weight", "post_attention_layernorm.weight"),
    ("mlp.w_up.weight", "mlp.gate_proj.weight"),  # the branch through SiLU
    ("mlp.w_gate.weight", "mlp.up_proj.weight"),  # the linear branch
    ("mlp.w_down.weight", "mlp.down_proj.weight"),
)


def llama_blockers(cfg: ModelConfig) -> list[str]:
    """Why a model of `cfg` is not a plain Llama (empty list when it is)."""
    reasons = []
    attn, mlp = ATTENTION_KINDS[cfg.attn.kind].module, MLP_KINDS[cfg.mlp.kind].module
    if attn is not LlamaAttention:
        reasons.append(f"attention is {cfg.attn.kind!r} ({attn.__name__}), not Llama")
    elif cfg.attn.position != "rope":
        reasons.append(f"positions are {cfg.attn.position!r}, not RoPE")
    if mlp is not GatedMLP:
        reasons.append(f"the MLP is {cfg.mlp.kind!r} ({mlp.__name__}), not SwiGLU")
    if cfg.attn.reuse != 1 or cfg.mlp.reuse != 1:
        reasons.append(f"layer reuse (attn_reuse={cfg.attn.reuse}, mlp_reuse={cfg.mlp.reuse})")
    return reasons


def is_plain_llama(model: LanguageModel) -> bool:
    """True when `model` exports to `LlamaForCausalLM` (Llama attention with RoPE, SwiGLU MLP, no reuse)."""
    return not llama_blockers(model.config)


def _rope_theta(model: LanguageModel) -> float:
    thetas = {m.rope_theta for m in model.modules() if isinstance(m, LlamaAttention)}
    if len(thetas) != 1:
        raise ValueError(f"the attention layers use different RoPE thetas {sorted(thetas)}")
    return float(thetas.pop())


def llama_config(model: LanguageModel, **token_ids) -> LlamaConfig:
    """The `LlamaConfig` of a plain-Llama cem model (ValueError otherwise); `token_ids` are
    bos_token_id / eos_token_id / pad_token_id (None by default: cem models have no special tokens)."""
    cfg = model.config
    reasons = llama_blockers(cfg)
    if reasons:
        raise ValueError(
            "cannot export to the LlamaForCausalLM format: " + "; ".join(reasons)
            + ". Use cem.hf.export_hf (CEM format, loaded with `import cem.hf`) instead."
        )
    dtype = next(model.parameters()).dtype
    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.mlp_hidden,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.context,
        initializer_range=cfg.init_std,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=_rope_theta(model),  # stored as rope_parameters by transformers 5, rope_theta by 4
        tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=False,
        attention_dropout=0.0,
        mlp_bias=False,
        bos_token_id=token_ids.get("bos_token_id"),
        eos_token_id=token_ids.get("eos_token_id"),
        pad_token_id=token_ids.get("pad_token_id"),
        architectures=["LlamaForCausalLM"],
        dtype=str(dtype).removeprefix("torch."),
    )


def to_llama_state_dict(model: LanguageModel) -> dict[str, Tensor]:
    """cem parameter names -> `LlamaForCausalLM` names (tensors detached, contiguous, on the CPU)."""
    sd = model.state_dict()
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"]}
    for i in range(model.config.n_layers):
        for ours, theirs in _LAYER_MAP:
            out[f"model.layers.{i}.{theirs}"] = sd[f"blocks.{i}.{ours}"]
    if not model.config.tie_embeddings:
        out["lm_head.weight"] = sd["head.weight"]
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}


def from_llama_state_dict(state: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """`LlamaForCausalLM` names -> cem names (inverse of `to_llama_state_dict`)."""
    state = dict(state)
    state.pop("model.rotary_emb.inv_freq", None)  # a buffer some old checkpoints saved
    for i in range(cfg.n_layers):
        state.pop(f"model.layers.{i}.self_attn.rotary_emb.inv_freq", None)
    out = {"embed.weight": state.pop("model.embed_tokens.weight"), "norm.weight": state.pop("model.norm.weight")}
    for i in range(cfg.n_layers):
        for ours, theirs in _LAYER_MAP:
            out[f"blocks.{i}.{ours}"] = state.pop(f"model.layers.{i}.{theirs}")
    head = state.pop("lm_head.weight", None)
    out["head.weight"] = out["embed.weight"] if cfg.tie_embeddings or head is None else head
    if state:
        raise ValueError(f"unexpected tensors in the Llama checkpoint: {sorted(state)[:5]}")
    return out


def export_llama(
    model: LanguageModel,
    out_dir: str | Path,
    *,
    tokenizer=None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Path:
    """Write a plain-Llama cem model as a `transformers.LlamaForCausalLM` checkpoint in `out_dir`.

    Writes config.json, generation_config.json, model.safetensors and, when given, the tokenizer (whose
    special token ids fill any id not given). Raises ValueError for a model with CEM layers, ALiBi or reuse.
    """
    tokenizer = transformers_tokenizer(tokenizer)
    config = llama_config(model, **special_token_ids(tokenizer, bos_token_id, eos_token_id, pad_token_id))
    state = to_llama_state_dict(model)
    with staged_folder(out_dir) as out:  # an export cut short leaves out_dir as it was (cem.io.staged_folder)
        config.save_pretrained(out)
        GenerationConfig.from_model_config(config).save_pretrained(out)
        save_file(state, out / "model.safetensors", metadata={"format": "pt"})
        fix_modes(out)
        if tokenizer is not None:
            save_tokenizer(tokenizer, out, model.config.context)
    return Path(out_dir)


def _rope_of(config) -> tuple[str, float]:
    params = getattr(config, "rope_parameters", None)
    if params:
        if any(isinstance(v, dict) for v in params.values()):
            raise ValueError("per-layer-type RoPE parameters are not supported")
        return params.get("rope_type", "default"), float(params.get("rope_theta", DEFAULT_ROPE_THETA))
    scaling = getattr(config, "rope_scaling", None) or {}
    return scaling.get("rope_type", scaling.get("type", "default")), float(getattr(config, "rope_theta", DEFAULT_ROPE_THETA))


def model_config_from_llama(config) -> ModelConfig:
    """The `ModelConfig` of a `LlamaConfig` that cem can build exactly (ValueError otherwise)."""
    problems = []
    if getattr(config, "model_type", "llama") != "llama":
        problems.append(f"model_type is {config.model_type!r}")
    heads, dim = config.num_attention_heads, config.hidden_size
    if (config.num_key_value_heads or heads) != heads:
        problems.append(f"grouped-query attention ({config.num_key_value_heads} key-value heads for {heads})")
    if getattr(config, "head_dim", None) not in (None, dim // heads):
        problems.append(f"head_dim {config.head_dim} != hidden_size / heads = {dim // heads}")
    if config.hidden_act != "silu":
        problems.append(f"hidden_act {config.hidden_act!r}")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        problems.append("attention or MLP biases")
    rope_type, theta = _rope_of(config)
    if rope_type != "default":
        problems.append(f"RoPE scaling {rope_type!r}")
    if theta != DEFAULT_ROPE_THETA:
        problems.append(f"rope_theta {theta} (cem's ModelConfig builds {DEFAULT_ROPE_THETA} only)")
    if problems:
        raise ValueError("cannot import this Llama checkpoint into cem: " + "; ".join(problems))
    return ModelConfig(
        vocab_size=config.vocab_size,
        dim=dim,
        n_layers=config.num_hidden_layers,
        n_heads=heads,
        hidden_dim=config.intermediate_size,
        context=config.max_position_embeddings,
        norm_eps=config.rms_norm_eps,
        init_std=getattr(config, "initializer_range", 0.02),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )


def _read_safetensors(path: Path) -> dict[str, Tensor] | None:
    single = path / "model.safetensors"
    if single.is_file():
        return load_file(single)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        state: dict[str, Tensor] = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(load_file(path / shard))
        return state
    return None


def import_llama(source, dtype: torch.dtype = torch.float32) -> LanguageModel:
    """A cem `LanguageModel` (Llama arch, `dtype`) from a `LlamaForCausalLM` object or checkpoint directory."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        config = LlamaConfig.from_pretrained(path)
        state = _read_safetensors(path)
        if state is None:  # .bin or other formats: let transformers read them
            from transformers import LlamaForCausalLM

            state = LlamaForCausalLM.from_pretrained(path).state_dict()
    else:
        config, state = source.config, source.state_dict()
    cfg = model_config_from_llama(config)
    model = LanguageModel(cfg)
    model.load_state_dict(from_llama_state_dict(state, cfg))
    return model.to(dtype)
