"""The sublayer kinds registries: what a model config builds and counts is looked up, never branched on."""

import pytest
import torch

from cem.layers import ATTENTION_KINDS, MLP_KINDS, CEMMLP, CEMAttention, GatedMLP, LlamaAttention, Reuse, SublayerKind
from cem.model import ARCHS, LanguageModel, model_config
from cem.model.flops import attention_flops, forward_flops_per_token, mlp_flops


def test_registered_kinds():
    assert {k: v.module for k, v in ATTENTION_KINDS.items()} == {"llama": LlamaAttention, "cem": CEMAttention}
    assert {k: v.module for k, v in MLP_KINDS.items()} == {"llama": GatedMLP, "cem": CEMMLP}
    with pytest.raises(ValueError, match="unknown attn 'mamba'; expected one of 'llama', 'cem'"):
        model_config("micro", "llama", attn="mamba")


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_blocks_are_built_by_their_kind(arch):
    cfg = model_config("micro", arch)
    with torch.device("meta"):
        block = LanguageModel(cfg).blocks[0]
    for layer, kind, reuse in ((block.attn, ATTENTION_KINDS[cfg.attn], cfg.attn_reuse), (block.mlp, MLP_KINDS[cfg.mlp], cfg.mlp_reuse)):
        if reuse > 1:
            assert isinstance(layer, Reuse) and layer.times == reuse
            layer = layer.layer
        assert type(layer) is kind.module


def test_a_new_kind_needs_only_its_registration(monkeypatch):
    """A kind registered elsewhere is built, validated and counted like the built-in ones."""
    toy = SublayerKind(GatedMLP, build=lambda cfg: GatedMLP(cfg.dim, 8), flops=lambda cfg, seq_len: 1000 + seq_len)
    monkeypatch.setitem(MLP_KINDS, "toy", toy)
    cfg = model_config("micro", "cem-attn", mlp="toy", mlp_reuse=2)
    model = LanguageModel(cfg)
    assert model.blocks[0].mlp.layer.hidden_dim == 8
    assert mlp_flops(cfg, 50) == 2 * 1050
    assert forward_flops_per_token(cfg, 50) == cfg.n_layers * (attention_flops(cfg, 50) + 2100) + 2 * cfg.dim * cfg.vocab_size
