"""CEM attention against autograd on an independent energy (float64), the DESIGN.md formula, descent, causality."""

import pytest
import torch

from cem.layers import CEMAttention, Recursion
from cem_reference import attention_head_energies, attention_update_formula, precond_dense, rms_norm

B, J, D, K = 2, 7, 24, 3


def make(rand, **kw):
    layer = CEMAttention(D, K, **kw).double()
    return rand(layer, seed=hash(tuple(sorted(kw.items()))) % 1000)


def autograd_update(layer, h):
    """-η Σ_k P_k ∇_u ε_k at u = norm(h), from autograd on the reference energy."""
    u = rms_norm(h, layer.norm.weight, layer.norm.eps).detach().requires_grad_(True)
    energies = attention_head_energies(layer, u, h)
    upd = torch.zeros_like(h)
    for k in range(layer.n_heads):
        (g,) = torch.autograd.grad(energies[k].sum(), u, retain_graph=True)
        if layer.precond is not None:
            g = g @ precond_dense(layer.precond, k).T
        upd = upd - layer.step_size * g
    return upd


@pytest.mark.parametrize("precond", ["identity", "diag", "diag_lowrank"])
@pytest.mark.parametrize("kq_diag,exact", [("none", False), ("shared", True), ("per_head", True)])
@pytest.mark.parametrize("backend", ["eager", "sdpa", "cpu"])
def test_step_equals_autograd_on_energy(rand, precond, kq_diag, exact, backend):
    layer = make(rand, kq_diag=kq_diag, precond=precond, exact_gradient=exact, recursion=Recursion(step_size=0.7), backend=backend)
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        step = layer(h) - h
    torch.testing.assert_close(step, autograd_update(layer, h).detach(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kq_diag", ["shared", "per_head"])
@pytest.mark.parametrize("precond", ["identity", "diag_lowrank"])
def test_default_step_equals_design_formula(rand, kq_diag, precond):
    layer = make(rand, kq_diag=kq_diag, precond=precond, recursion=Recursion(step_size=0.9))
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        step = layer(h) - h
        expected = attention_update_formula(layer, h)
    torch.testing.assert_close(step, expected, rtol=1e-10, atol=1e-10)
    # the default drops the value-side diagonal term, so it differs from the exact gradient
    assert not torch.allclose(step, autograd_update(layer, h).detach(), atol=1e-6)


@pytest.mark.parametrize("kq_diag", ["none", "shared", "per_head"])
def test_layer_energy_matches_reference(rand, kq_diag):
    layer = make(rand, kq_diag=kq_diag)
    h, u = torch.randn(2, B, J, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer.energy(u, h), attention_head_energies(layer, u, h).sum(0))


@pytest.mark.parametrize("precond", ["identity", "diag"])
def test_small_steps_descend(rand, precond):
    layer = make(rand, kq_diag="shared", exact_gradient=True, precond=precond)
    with torch.no_grad():
        layer.norm.weight.fill_(1.0)  # norm(x) then has a symmetric PSD Jacobian, so descent in x descends in u
        if layer.precond is not None:
            layer.precond.p.fill_(0.3)  # P = c·I, c > 0
    h = torch.randn(B, J, D, dtype=torch.float64)
    layer.step_size = 1e-3
    energies = []
    with torch.no_grad():
        for steps in range(1, 6):
            layer.steps = steps
            x = layer(h) if steps > 0 else h
            energies.append(layer.energy(layer.norm(x), h))
        e0 = layer.energy(layer.norm(h), h)
    energies = torch.stack([e0, *energies])  # (T+1, B, J)
    assert (energies[1:] < energies[:-1]).all(), "every step must lower the energy at every position"


def test_steps_recompute_queries_with_fixed_keys(rand):
    layer = make(rand, kq_diag="shared", exact_gradient=True, recursion=Recursion(step_size=0.5))
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        layer.steps = 2
        x2 = layer(h)
        layer.steps = 1
        x1 = layer(h)
        # second step from x1 with the context still norm(h)
        u = rms_norm(x1, layer.norm.weight, layer.norm.eps)
    u = u.requires_grad_(True)
    e = attention_head_energies(layer, u, h).sum()
    (g,) = torch.autograd.grad(e, u)
    torch.testing.assert_close(x2, x1 - 0.5 * g, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_causal(rand, backend):
    layer = make(rand, kq_diag="per_head", precond="diag_lowrank", recursion=Recursion(steps=2), backend=backend)
    h = torch.randn(B, J, D, dtype=torch.float64)
    h2 = h.clone()
    h2[:, 4:] = torch.randn(B, J - 4, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(h)[:, :4], layer(h2)[:, :4])
        assert not torch.allclose(layer(h)[:, 4:], layer(h2)[:, 4:])


def test_parameters_and_shapes():
    layer = CEMAttention(D, K, kq_diag="per_head", precond="diag_lowrank", precond_rank=4)
    assert layer.kq_diag.shape == (K, D) and torch.all(layer.kq_diag == 0)
    assert layer.self_bias.shape == (K,)
    assert layer.precond.p.shape == (K, D) and layer.precond.u.shape == (K, D, 4) and layer.precond.v.shape == (K, D, 4)
    torch.testing.assert_close(layer.precond.p, torch.full((K, D), D**-0.5))
    assert torch.all(layer.precond.v == 0) and layer.precond.u.std() < 0.04
    assert CEMAttention(D, K).kq_diag.shape == (D,)
    assert CEMAttention(D, K, kq_diag="none").kq_diag is None
    assert CEMAttention(D, K).precond is None
    n = sum(p.numel() for p in CEMAttention(D, K, kq_diag="none").parameters())
    assert n == 2 * D * D + D + K  # W_Q, W_K, norm gain, self bias: half of Llama's 4 D²


def test_learned_step_size(rand):
    layer = make(rand, recursion=Recursion(step_size=0.5, learn_step_size=True))
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        layer.eta.gain.fill_(2.0)
        a = layer(h) - h
        layer.eta.gain.fill_(1.0)
        layer.step_size = 1.0
        torch.testing.assert_close(a, layer(h) - h)


def test_preconditioner_apply_matches_dense(rand):
    layer = make(rand, precond="diag_lowrank")
    y = torch.randn(5, K, D, dtype=torch.float64)
    dense = torch.stack([precond_dense(layer.precond, k) for k in range(K)])
    with torch.no_grad():
        torch.testing.assert_close(layer.precond(y), torch.einsum("kde,bke->bkd", dense, y))
        torch.testing.assert_close(layer.precond.leading(y.transpose(0, 1)), layer.precond(y).transpose(0, 1))  # (K, rows, D)
        torch.testing.assert_close(layer.precond.dense(), dense)


@pytest.mark.parametrize("kq_diag", ["none", "shared", "per_head"])
@pytest.mark.parametrize("precond", ["diag", "diag_lowrank"])
def test_few_tokens_apply_the_preconditioner_per_position(rand, kq_diag, precond, monkeypatch):
    """A forward of fewer tokens than the head width (a decoding step) does not fold P into the output weight
    (`folds`), and gives the folded forward's output (float64), also with the cache."""
    layer = make(rand, kq_diag=kq_diag, precond=precond, recursion=Recursion(steps=2))
    if layer.precond.v is not None:
        with torch.no_grad():
            layer.precond.v.normal_(0, 0.1)
    few = layer.head_dim - 1
    assert layer.folds(layer.head_dim) and not layer.folds(few)
    h = torch.randn(1, few, D, dtype=torch.float64)
    with torch.no_grad():
        w_out = layer.output_weight()
        folded = layer.descend(h, layer.norm(h), lambda u, with_energy=False: layer.direction(u, layer._heads(layer.w_k(layer.norm(h))),
                                                                                              layer.norm(h), 0, w_out, with_energy))
        monkeypatch.setattr(layer, "output_weight", lambda: pytest.fail("a step of few tokens folded the preconditioner"))
        torch.testing.assert_close(layer(h), folded, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kq_diag", ["none", "shared", "per_head"])
@pytest.mark.parametrize("precond", ["diag", "diag_lowrank"])
def test_folded_preconditioner_equals_per_head_form(rand, kq_diag, precond):
    """Σ_k P_k W_Q^kᵀ o^k through the folded output weight (once per forward) equals P_k applied per head,
    in the output and in every parameter's gradient (float64, two steps)."""
    layer = make(rand, kq_diag=kq_diag, precond=precond, recursion=Recursion(steps=2))
    if layer.precond.v is not None:
        with torch.no_grad():
            layer.precond.v.normal_(0, 0.1)  # off the zero init, so the low-rank part matters
    h = torch.randn(B, J, D, dtype=torch.float64)

    def per_head(u, k, hn, q_start=0, w_out=None, with_energy=False):
        o = layer._attend(layer._heads(layer.w_q(u)), k, layer._diagonal(u, hn), q_start, None)
        y = torch.einsum("bkjd,kdD->bjkD", o, layer.w_q.weight.view(K, D // K, D))
        return layer.precond(y).sum(dim=2)

    results = []
    for direction in (layer.direction, per_head):
        layer.direction = direction
        out = layer(h)
        grads = torch.autograd.grad(out.sin().sum(), list(layer.parameters()), allow_unused=True)
        results.append([out, *grads])
        del layer.direction
    for a, b in zip(*results):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
