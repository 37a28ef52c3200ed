"""CEM MLP against autograd on an independent element-wise energy (float64), descent, causality."""

import pytest
import torch

from cem.layers import CEMMLP, Recursion, silu_integral
from cem_reference import mlp_energy, precond_dense, rms_norm, silu_integral as ref_phi, silu_integral_closed_form

B, J, D, M = 2, 5, 12, 20


def make(rand, **kw):
    return rand(CEMMLP(D, M, **kw).double(), seed=len(kw))


def test_silu_integral_matches_closed_form():
    z = torch.linspace(-12, 12, 97, dtype=torch.float64)
    expected = torch.from_numpy(silu_integral_closed_form(z.numpy()))
    torch.testing.assert_close(silu_integral(z), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ref_phi(z), expected, rtol=1e-12, atol=1e-12)


def test_silu_integral_is_exact_everywhere_and_its_gradient_is_silu():
    """The package's φ (closed form with a Bernoulli series for Li2, a Taylor series near 0) against scipy's
    dilogarithm far out and the quadrature near 0 (where the closed form cancels), in float64 and float32."""
    far = torch.cat([torch.linspace(-60, -0.5, 600, dtype=torch.float64), torch.linspace(0.5, 60, 600, dtype=torch.float64)])
    near = torch.linspace(-0.7, 0.7, 1401, dtype=torch.float64)
    near = near[near != 0]
    for z, expected in ((far, torch.from_numpy(silu_integral_closed_form(far.numpy()))), (near, ref_phi(near))):
        torch.testing.assert_close(silu_integral(z), expected, rtol=1e-13, atol=0)
        torch.testing.assert_close(silu_integral(z.float()).double(), expected, rtol=5e-6, atol=0)
    z = torch.cat([far, near]).requires_grad_(True)
    (grad,) = torch.autograd.grad(silu_integral(z).sum(), z)
    torch.testing.assert_close(grad, torch.nn.functional.silu(z.detach()), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("precond", ["identity", "diag", "diag_lowrank"])
@pytest.mark.parametrize("energy", ["gated", "convex"])
def test_step_equals_autograd_on_energy(rand, precond, energy):
    layer = make(rand, precond=precond, energy=energy, recursion=Recursion(step_size=0.6))
    h = torch.randn(B, J, D, dtype=torch.float64)
    u = rms_norm(h, layer.norm.weight, layer.norm.eps).detach().requires_grad_(True)
    (g,) = torch.autograd.grad(mlp_energy(layer, u, h).sum(), u)
    if layer.precond is not None:
        g = g @ precond_dense(layer.precond, 0).T
    with torch.no_grad():
        step = layer(h) - h
    torch.testing.assert_close(step, -0.6 * g, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("energy", ["gated", "convex"])
def test_layer_energy_matches_reference(rand, energy):
    layer = make(rand, energy=energy)
    h, u = torch.randn(2, B, J, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer.energy(u, h), mlp_energy(layer, u, h))


def test_small_steps_descend(rand):
    layer = make(rand)
    with torch.no_grad():
        layer.norm.weight.fill_(1.0)
    layer.step_size = 1e-3
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        es = [layer.energy(layer.norm(h), h)]
        for steps in range(1, 6):
            layer.steps = steps
            es.append(layer.energy(layer.norm(layer(h)), h))
    es = torch.stack(es)
    assert (es[1:] < es[:-1]).all()


def test_tied_parameters():
    layer = CEMMLP(D, M)
    assert {n for n, _ in layer.named_parameters()} == {"norm.weight", "w_gate.weight", "w_up.weight"}
    assert sum(p.numel() for p in layer.parameters()) == 2 * M * D + D  # vs 3 m D for SwiGLU


def test_position_wise(rand):
    layer = make(rand, recursion=Recursion(steps=3), precond="diag_lowrank")
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        full = layer(h)
        for i in range(J):
            torch.testing.assert_close(full[:, i : i + 1], layer(h[:, i : i + 1]))


def test_convex_sign_uses_straight_through_gradient():
    layer = CEMMLP(D, M, energy="convex")
    h = torch.randn(B, J, D)
    layer(h).sum().backward()
    assert layer.w_gate.weight.grad.abs().sum() > 0


def test_folded_preconditioner_equals_applying_it_per_token(rand):
    """P Vᵀ g through the folded down projection V P equals P applied to every token's Vᵀ g (float64,
    output and every gradient, two steps)."""
    layer = make(rand, recursion=Recursion(steps=2), precond="diag_lowrank")
    with torch.no_grad():
        layer.precond.v.normal_(0, 0.1)
    h = torch.randn(2, (layer.hidden_dim + 1) // 2, layer.dim, dtype=torch.float64)  # enough tokens to fold

    def per_token(u, gamma, w_out=None, with_energy=False):
        y = (gamma * torch.nn.functional.silu(layer.w_up(u))) @ layer.w_up.weight
        return layer.precond(y.unsqueeze(-2)).squeeze(-2)

    results = []
    for direction in (layer.direction, per_token):
        layer.direction = direction
        out = layer(h)
        results.append([out, *torch.autograd.grad(out.sin().sum(), list(layer.parameters()))])
        del layer.direction
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
