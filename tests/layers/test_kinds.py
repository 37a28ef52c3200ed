"""The sublayer kinds and key-query diagonal registries: what a model config builds, counts and plans is looked up,
never branched on."""

import math

import pytest
import torch

from cem.layers import (ATTENTION_KINDS, KQ_DIAGONALS, MLP_KINDS, SUBLAYERS, CEMMLP, AttentionConfig, CEMAttention, GatedMLP,
                        LlamaAttention, MLPConfig, Reuse, SublayerKind)
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


def test_each_layer_says_which_sublayer_it_is():
    """The sublayer is told one way: `SUBLAYERS`' names, which every registered kind's class carries as `sublayer`."""
    assert list(SUBLAYERS) == ["attn", "mlp"] and [s.label for s in SUBLAYERS.values()] == ["attention", "mlp"]
    for sublayer, s in SUBLAYERS.items():
        assert s.kinds and all(kind.module.sublayer == sublayer for kind in s.kinds.values())
    with torch.device("meta"):
        model = LanguageModel(model_config("micro", "cem", mlp="llama", attn_reuse=2))
    assert [(m.sublayer, type(m)) for m in (model.blocks[0].attn.layer, model.blocks[0].mlp)] == [("attn", CEMAttention), ("mlp", GatedMLP)]


def test_builders_take_their_sublayers_typed_config():
    cfg = model_config("micro", "cem-t2", kq_diag="per_head", mlp_width_mult=1.5, norm_eps=1e-5)
    a, m = cfg.attention_config(), cfg.mlp_config()
    assert isinstance(a, AttentionConfig) and isinstance(m, MLPConfig)
    assert (a.dim, a.n_heads, a.kq_diag, a.precond, a.eps, a.recursion) == (48, 4, "per_head", "diag_lowrank", 1e-5, cfg.recursion("attn"))
    assert (m.hidden_dim, m.precond, m.recursion) == (cfg.mlp_hidden, "diag_lowrank", cfg.recursion("mlp"))
    layer = ATTENTION_KINDS["cem"].build(a)
    assert layer.kq_diag.shape == (4, 48) and layer.steps == 2 and layer.norm.eps == 1e-5
    assert MLP_KINDS["cem"].build(m).hidden_dim == cfg.mlp_hidden


def test_an_unknown_key_query_diagonal_is_refused_naming_the_kinds():
    message = "unknown kq_diag 'full'; expected one of 'none', 'shared', 'per_head'"
    with pytest.raises(ValueError, match=message):
        CEMAttention(12, 3, kq_diag="full")
    with pytest.raises(ValueError, match=message):
        model_config("micro", "cem", kq_diag="full")


@pytest.mark.parametrize("name", list(KQ_DIAGONALS))
def test_each_key_query_diagonal_means_the_same_to_layer_kernel_and_planner(name, monkeypatch):
    """One kind, one meaning: the layer's parameter has the registered shape and its FLOPs count it; the
    term the layer hands the attention core is the kernel's kind of that name, which reads it as a score
    matrix exactly where the kind says the kernel allocates scratch; the memory planner counts that scratch."""
    from cem.kernels import KernelLaunch, kq_diag_of
    from cem.model import memory

    kind, D, K, J = KQ_DIAGONALS[name], 48, 4, 16
    layer = CEMAttention(D, K, kq_diag=name)
    shape = kind.shape(D, K)
    assert (None if layer.kq_diag is None else tuple(layer.kq_diag.shape)) == shape
    assert kind.flops(J, D, K) == 2 * J * (0 if shape is None else math.prod(shape))
    u, hn = torch.randn(2, J, D), torch.randn(2, J, D)
    diag = layer._diagonal(u, hn)
    qd = None if diag is None else diag.qd
    assert kq_diag_of(qd) == name
    q = k = torch.randn(2, K, J, D // K)
    cfg = model_config("micro", "cem-attn", kq_diag=name, vocab_size=32)
    scratch = ATTENTION_KINDS["cem"].kernel.scratch(cfg.attention_config(), 2, J, 4)
    assert KernelLaunch(q, k, qd, hn, 0, None, backward=True).scores == (scratch > 0) == (name == "shared")
    monkeypatch.setattr(memory, "activation_bytes", lambda *a, **kw: (0, 0))  # the planner's terms without its probes
    logits = 2 * 64 * cfg.vocab_size * 2
    assert memory.plan_memory(cfg, 2, 64).transient == max(logits, kind.kernel_scratch(2, 64, 2)) == (4 * logits if name == "shared" else logits)
    assert ATTENTION_KINDS["llama"].kernel is None and memory.plan_memory(cfg.replace(attn="llama"), 2, 64).transient == logits
