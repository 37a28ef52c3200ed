"""Models: presets, parameter ratios of the paper, causality, gradients, bf16, test-time steps."""

import pytest
import torch

from cem.layers import Inference
from cem.model import ARCHS, LanguageModel, model_config, parameter_breakdown


def tiny(arch="cem", **kw):
    torch.manual_seed(0)
    return LanguageModel(model_config("tiny", arch, vocab_size=97, **kw))


def breakdown(size, arch, **kw):
    with torch.device("meta"):
        return parameter_breakdown(LanguageModel(model_config(size, arch, **kw)))


def test_paper_table1_sizes():
    for size, millions in [("86M", 86), ("108M", 108), ("134M", 134), ("162M", 162), ("256M", 256)]:
        total = breakdown(size, "llama")["total"]
        assert abs(total / 1e6 - millions) < 1.5, (size, total)


def test_parameter_ratios_134m():
    llama = breakdown("134M", "llama")
    cem_attn = breakdown("134M", "cem-attn")
    cem_mlp = breakdown("134M", "cem-mlp")
    full = breakdown("134M", "cem")
    matched = breakdown("134M", "cem-mlp-matched")
    assert cem_attn["attention"] / llama["attention"] == pytest.approx(0.5, abs=0.01)
    assert cem_mlp["mlp"] / llama["mlp"] == pytest.approx(2 / 3, abs=0.01)
    assert matched["mlp"] / llama["mlp"] == pytest.approx(1.0, abs=0.01)
    assert full["embeddings"] == llama["embeddings"] and full["head"] == llama["head"]
    assert full["total"] == llama["total"] - llama["attention"] + cem_attn["attention"] - llama["mlp"] + cem_mlp["mlp"]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_causal_and_gradients_reach_every_parameter(arch):
    cem = model_config("tiny", arch).recursing()  # the CEM sublayers, whose settings these are
    model = tiny(arch, **{f"{s}_{k}": v for s in cem for k, v in (("precond", "diag_lowrank"), ("steps", 2))})
    with torch.no_grad():  # V = 0 at init would leave U without gradient: move off the init
        for name, p in model.named_parameters():
            if name.endswith("precond.v"):
                p.normal_(0, 0.02)
    ids = torch.randint(0, 97, (2, 12))
    ids2 = ids.clone()
    ids2[:, 7:] = (ids2[:, 7:] + 1) % 97
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, :7], model(ids2)[:, :7])
    model.loss(ids[:, :-1], ids[:, 1:]).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("arch", ["llama", "cem-t2"])
def test_bf16_autocast_forward_backward(arch):
    model = tiny(arch)
    ids = torch.randint(0, 97, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    fp32 = model.loss(ids[:, :-1], ids[:, 1:])
    assert abs(loss.item() - fp32.item()) < 0.05
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_steps_change_at_test_time():
    model = tiny("cem")
    ids = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        a = model(ids)
        model.set_inference(Inference(steps=3))
        assert {m.steps for m in model.descent_layers()} == {3}
        b = model(ids)
        model.set_inference(Inference(attn_steps=1, mlp_steps=1))
        torch.testing.assert_close(model(ids), a)
    assert not torch.allclose(a, b)


def test_test_time_sets_and_restores_the_knobs():
    model = tiny("cem")
    model.set_inference(Inference(adaptive_tol=1e-3))
    knobs = lambda: [(m.steps, m.inference.adaptive_tol, m.inference.guard) for m in model.descent_layers()]  # noqa: E731
    before = knobs()
    ids = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        with model.test_time(Inference(steps=3)):
            t3 = model(ids)
        model.set_inference(Inference(steps=3, adaptive_tol=1e-3))
        torch.testing.assert_close(t3, model(ids))  # the same as the permanent setter
        model.set_inference(Inference(steps=1, adaptive_tol=1e-3))
    assert knobs() == before
    with model.test_time(Inference(steps=2, mlp_steps=4, guard=2)):
        assert knobs() == [(2, 1e-3, 2), (4, 1e-3, 2)] * 2  # attn, mlp per block; adaptive_tol kept
        with model.test_time(Inference(attn_steps=5, adaptive_tol=0.1)):
            assert knobs() == [(5, 0.1, 2), (4, 0.1, 2)] * 2
        assert knobs() == [(2, 1e-3, 2), (4, 1e-3, 2)] * 2
    assert knobs() == before
    with pytest.raises(ValueError, match="must be an Inference"), model.test_time({"steps": 4}):
        pass
    with pytest.raises(RuntimeError, match="inside"), model.test_time(Inference(steps=4)):
        raise RuntimeError("inside")
    assert knobs() == before


@pytest.mark.parametrize(
    "knobs,match",
    [(dict(steps=2, guard=-1), "guard"), (dict(steps=2, adaptive_tol=-1.0), "adaptive_tol"), (dict(steps=2, mlp_steps=0), "mlp_steps")],
)
def test_test_time_checks_everything_before_changing_a_layer(knobs, match):
    model = tiny("cem")
    seen = []
    with pytest.raises(ValueError, match=match):
        with model.test_time(Inference(**knobs)):
            seen.append(True)
    assert not seen and {m.steps for m in model.descent_layers()} == {1}


def test_initial_loss_is_near_uniform():
    model = tiny("cem")
    ids = torch.randint(0, 97, (4, 32))
    assert model.loss(ids[:, :-1], ids[:, 1:]).item() == pytest.approx(torch.log(torch.tensor(97.0)).item(), abs=0.3)


def test_test_time_steps_survive_save(tmp_path):
    from cem.model import load_pretrained, save_pretrained

    model = tiny("cem")
    model.set_inference(Inference(attn_steps=3, guard=2))
    for m in model.descent_layers():
        if m.steps == 1:
            m.step_size = 0.5
    cfg = model.current_config()
    assert (cfg.attn.recursion.steps, cfg.mlp.recursion.steps, cfg.attn.recursion.step_size, cfg.mlp.recursion.step_size) == (3, 1, 1.0, 0.5)
    assert cfg.inference == Inference(guard=2).options()
    loaded = load_pretrained(save_pretrained(model, tmp_path / "m"))
    assert [(m.steps, m.step_size, m.inference.guard) for m in loaded.descent_layers()] == [(3, 1.0, 2), (1, 0.5, 2)] * 2
    model.blocks[0].attn.steps = 2
    with pytest.raises(ValueError, match="differ in their recursion"):
        model.current_config()


def test_generate_fills_the_context_exactly():
    model = LanguageModel(model_config("tiny", "cem", vocab_size=97, context=12))
    out = model.generate(torch.zeros(1, 4, dtype=torch.long), 9, temperature=0)  # 4 + 9 - 1 = 12 positions fed
    assert out.shape == (1, 13)


def test_forward_with_targets_returns_the_loss():
    torch.manual_seed(0)
    model = LanguageModel(model_config("tiny", "cem", vocab_size=50, context=16))
    ids = torch.randint(0, 50, (2, 9))
    x, y = ids[:, :-1], ids[:, 1:]
    per_token = model(x, y, reduction="none")
    ref = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none").view(2, 8)
    torch.testing.assert_close(per_token, ref)
    torch.testing.assert_close(model(x, y), ref.mean())
    torch.testing.assert_close(model(x, y, reduction="sum"), ref.sum())
    assert model.loss(x, y) == model(x, y)
    with pytest.raises(ValueError, match="unknown reduction"):
        model(x, y, reduction="max")


def test_common_random_numbers_across_architectures():
    """init_seed keys every weight by (seed, name): the embeddings, head, norms and every same-named,
    same-shaped weight start identical across architectures; another seed draws other values."""
    from cem.model import LanguageModel, model_config

    def build(arch, seed, **kw):
        return dict(LanguageModel(model_config("micro", arch, **kw), init_seed=seed).named_parameters())

    llama, cem, reuse = build("llama", 3), build("cem-t2", 3), build("llama", 3, attn_reuse=2)
    llama_other = build("llama", 4)
    shared = [n for n in llama if n in cem and llama[n].shape == cem[n].shape]
    for name in ("embed.weight", "head.weight", "blocks.0.attn.w_q.weight", "blocks.1.attn.w_k.weight",
                 "blocks.0.mlp.w_gate.weight", "blocks.0.mlp.w_up.weight"):
        assert name in shared
    for name in shared:
        assert torch.equal(llama[name], cem[name]), name
        if llama[name].std() > 0:  # drawn, not a constant: another seed differs
            assert not torch.equal(llama[name], llama_other[name]), name
    assert torch.equal(reuse["blocks.0.attn.layer.w_q.weight"], llama["blocks.0.attn.w_q.weight"])
    # building an extra module first (another architecture) does not shift later draws
    torch.manual_seed(0)
    a = build("cem-t2", 3)
    torch.manual_seed(1)
    b = build("cem-t2", 3)
    assert all(torch.equal(a[n], b[n]) for n in a)
