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
    for layer, kind, reuse in ((block.attn, ATTENTION_KINDS[cfg.attn.kind], cfg.attn.reuse), (block.mlp, MLP_KINDS[cfg.mlp.kind], cfg.mlp.reuse)):
        if reuse > 1:
            assert isinstance(layer, Reuse) and layer.times == reuse
            layer = layer.layer
        assert type(layer) is kind.module


def test_a_new_kind_needs_only_its_registration(monkeypatch):
    """A kind registered elsewhere is built, validated and counted like the built-in ones."""
    toy = SublayerKind(GatedMLP, build=lambda shape, c: GatedMLP(shape.dim, 8), flops=lambda shape, c, seq_len: 1000 + seq_len,
                       settings=lambda c: ("reuse",))
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
    """The model config's parts are the sublayers' typed configs, built as they are (with the model's widths)."""
    cfg = model_config("micro", "cem-t2", kq_diag="per_head", mlp_width_mult=1.5, norm_eps=1e-5)
    a, m = cfg.attn, cfg.mlp
    assert isinstance(a, AttentionConfig) and isinstance(m, MLPConfig)
    assert (a.kind, a.kq_diag, a.precond, a.recursion.steps) == ("cem", "per_head", "diag_lowrank", 2)
    assert (m.kind, m.precond, m.width_mult, m.recursion.steps) == ("cem", "diag_lowrank", 1.5, 2)
    assert (cfg.shape.dim, cfg.shape.n_heads, cfg.shape.hidden_dim, cfg.shape.eps) == (48, 4, cfg.mlp_hidden, 1e-5)
    layer = ATTENTION_KINDS["cem"].build(cfg.shape, a)
    assert layer.kq_diag.shape == (4, 48) and layer.recursion == a.recursion and layer.norm.eps == 1e-5
    assert MLP_KINDS["cem"].build(cfg.shape, m).hidden_dim == cfg.mlp_hidden


def test_a_setting_its_kind_does_not_read_is_refused_and_not_shown():
    """CEM attention always uses ALiBi: `position` is Llama attention's only (issue 61, item 9); a setting the
    kind does not read is refused, and the config's dict shows only what each sublayer's kind reads."""
    cem = model_config("micro", "cem-t2")
    assert "position" not in cem.to_dict()["attn"] and "recursion" in cem.to_dict()["attn"]
    llama = model_config("micro", "llama")
    assert llama.to_dict()["attn"] == {"kind": "llama", "position": "rope", "reuse": 1}
    assert "training" not in llama.to_dict() and "inference" not in llama.to_dict()
    assert model_config("micro", "llama-alibi").to_dict()["attn"]["alibi"] == "standard"
    with pytest.raises(ValueError, match="position='alibi' does nothing in cem attention"):
        model_config("micro", "cem", position="alibi")
    with pytest.raises(ValueError, match=r"attn_steps=2 does nothing in llama attention \(it reads position, reuse\)"):
        model_config("micro", "llama", attn_steps=2)
    with pytest.raises(ValueError, match="start='norm' does nothing: the model has no CEM sublayer"):
        model_config("micro", "llama", start="norm")


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
    scratch = ATTENTION_KINDS["cem"].kernel.scratch(cfg.attn, 2, J, 4)
    assert KernelLaunch(q, k, qd, hn, 0, None, backward=True).scores == (scratch > 0) == (name == "shared")
    monkeypatch.setattr(memory, "activation_bytes", lambda *a, **kw: (0, 0))  # the planner's terms without its probes
    logits = 2 * 64 * cfg.vocab_size * 2
    assert memory.plan_memory(cfg, 2, 64).transient == max(logits, kind.kernel_scratch(2, 64, 2)) == (4 * logits if name == "shared" else logits)
    assert ATTENTION_KINDS["llama"].kernel is None and memory.plan_memory(cfg.replace(attn={"kind": "llama"}), 2, 64).transient == logits
