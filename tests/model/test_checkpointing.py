"""Activation checkpointing (`LanguageModel.set_activation_checkpointing`): the same loss and gradients as
the plain path, in float64, for each mode and architecture, with random depths, under torch.compile, and
through `transformers`' `gradient_checkpointing_enable`."""

import pytest
import torch

from cem.model import LanguageModel, model_config

ARCHS = {
    "llama": {},
    "cem": {},
    "cem-t2": {},  # T=2 with preconditioners
    "cem T=3 learned steps": {"attn_steps": 3, "mlp_steps": 3, "step_schedule": "learned"},
}


def build(arch: str, mode: str, **extra) -> LanguageModel:
    name = arch.split()[0]
    model = LanguageModel(model_config("micro", name, vocab_size=40, context=24, **ARCHS[arch], **extra), init_seed=3).double()
    model.set_activation_checkpointing(mode)
    return model


def loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(ids[:, :-1], ids[:, 1:])
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("mode", ["layer", "step"])
def test_gradients_equal_the_plain_path(arch, mode):
    ids = torch.randint(0, 40, (2, 17), generator=torch.Generator().manual_seed(0))
    plain_loss, plain = loss_and_grads(build(arch, "none"), ids)
    loss, grads = loss_and_grads(build(arch, mode), ids)
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain.keys() and len(grads) > 5
    for name in plain:
        torch.testing.assert_close(grads[name], plain[name], rtol=1e-12, atol=1e-14, msg=name)


def test_random_depth_training_recomputes_the_same_depths():
    """With random-depth training the depth is drawn once per forward; the recomputation in the backward
    pass must use it again (non-reentrant checkpointing replays the same Python state)."""
    ids = torch.randint(0, 40, (2, 17), generator=torch.Generator().manual_seed(1))
    results = []
    for mode in ("none", "step", "layer"):
        model = build("cem", mode, train_depth="layer", train_depth_max=3).train()
        torch.manual_seed(5)
        results.append(loss_and_grads(model, ids))
    for loss, grads in results[1:]:
        assert torch.equal(loss, results[0][0])
        for name, g in results[0][1].items():
            torch.testing.assert_close(grads[name], g, rtol=1e-12, atol=1e-14)


def test_checkpointing_is_off_without_gradients_and_refuses_unknown_modes():
    model = build("cem-t2", "step").eval()
    with torch.no_grad():
        out = model(torch.randint(0, 40, (1, 9)))
    assert out.shape == (1, 9, 40)
    with pytest.raises(ValueError, match="unknown activation_checkpointing 'block'"):
        model.set_activation_checkpointing("block")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["step"])  # the per-step regions inside a layer; "layer" wraps whole blocks the same way
def test_under_torch_compile(mode):
    ids = torch.randint(0, 40, (2, 17), generator=torch.Generator().manual_seed(2))
    plain_loss, plain = loss_and_grads(build("cem-t2", "none").float(), ids)
    model = build("cem-t2", mode).float()
    compiled = torch.compile(model, backend="aot_eager")
    compiled.zero_grad()
    loss = compiled(ids[:, :-1], ids[:, 1:])
    loss.backward()
    torch.testing.assert_close(loss.detach(), plain_loss, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, plain[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers 5 renames these activation_checkpointing_*
def test_transformers_gradient_checkpointing_enable():
    pytest.importorskip("transformers")
    import cem.hf as ch

    ids = torch.randint(0, 40, (2, 17), generator=torch.Generator().manual_seed(4))
    plain_loss, plain = loss_and_grads(build("cem-t2", "none"), ids)
    hf = ch.to_hf(build("cem-t2", "none")).train()
    hf.gradient_checkpointing_enable()
    assert hf.is_gradient_checkpointing and all(b.gradient_checkpointing for b in hf.model.blocks)
    out = hf(input_ids=ids[:, :-1], labels=ids[:, :-1])
    ours = hf.model(ids[:, :-1], ids[:, 1:])
    ours.backward()
    torch.testing.assert_close(ours.detach(), plain_loss, rtol=1e-12, atol=1e-14)
    for name, p in hf.model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, plain[name], rtol=1e-12, atol=1e-14)
    assert torch.isfinite(out.loss)
    hf.gradient_checkpointing_disable()
    assert not any(b.gradient_checkpointing for b in hf.model.blocks)
