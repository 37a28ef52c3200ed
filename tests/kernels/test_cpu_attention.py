"""The CPU path of the attention core (`cem.kernels.cpu_attention`, the backend "cpu"), through the core's
arguments, against `cem_attention_eager`: exact in float64 with every gradient, and the fused CPU flash kernel
in bf16 / fp16 as close to float64 as the eager path."""

import pytest
import torch

from cem.kernels import cpu_attention
from cem.layers import attention_core as core
from cem.layers.attention_core import Diagonal
from cem.layers.position import Positions


def _fresh(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(True)


@pytest.mark.parametrize("diag", ["shared", "head", None, "values"])
@pytest.mark.parametrize("q_start,n_q", [(0, 13), (0, 7), (6, 5), (11, 1)])
@pytest.mark.parametrize("block", [4, 64])
@pytest.mark.parametrize("alibi", ["standard", "app-a"])
def test_fast_path_equals_eager_in_float64(diag, q_start, n_q, block, alibi):
    """The CPU path (causal query blocks, cached bias, diagonal-only self bias, and without a diagonal the
    fused kernel with its custom backward) gives the eager output and every gradient, fresh random inputs."""
    g = torch.Generator().manual_seed(q_start * 100 + n_q)
    B, K, d, D = 2, 3, 4, 12
    n_k = q_start + n_q  # ragged: n_q and n_k are not multiples of the block
    q, k, hn, sb = _fresh(g, B, K, n_q, d), _fresh(g, B, K, n_k, d), _fresh(g, B, n_k, D), _fresh(g, K)
    qd = {"shared": _fresh(g, B, n_q, D), "head": _fresh(g, B, K, n_q, D), None: None, "values": _fresh(g, B, n_q, D)}[diag]
    v = _fresh(g, B, K, n_k, d + D) if diag == "values" else None
    diagonal = None if qd is None else Diagonal(qd, hn)
    positions = Positions(alibi, K, sb)
    inputs = [t for t in (q, k, qd, hn, v, sb) if t is not None]
    weights = torch.randn(B, K, n_q, v.shape[-1] if v is not None else d, generator=g, dtype=torch.float64)
    results = []
    for fn in (core.cem_attention_eager, lambda *a, **kw: core.cem_attention_cpu(*a, block=block, **kw)):
        out = fn(q, k, diagonal, positions, q_start=q_start, v=v)
        grads = torch.autograd.grad((out * weights).sum(), inputs, allow_unused=True)
        results.append([out, *grads])
    for a, b in zip(*results):
        if a is None:
            assert b is None or torch.count_nonzero(b) == 0
        else:
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_start,n_q", [(0, 70), (40, 1), (30, 9)])
def test_fused_kernel_in_low_precision_is_as_close_to_float64_as_the_blocked_path(dtype, q_start, n_q):
    """bf16 / fp16 without a diagonal run the fused CPU flash kernel (also in decoding); its output and every
    gradient are as close to the float64 eager result as the eager path in the same dtype."""
    g = torch.Generator().manual_seed(n_q)
    B, K, d = 2, 3, 16
    n_k = q_start + n_q
    q, k, sb = _fresh(g, B, K, n_q, d), _fresh(g, B, K, n_k, d), _fresh(g, K)
    weights = torch.randn(B, K, n_q, d, generator=g, dtype=torch.float64)

    def run(fn, dt):
        inputs = [t.detach().to(dt).requires_grad_(True) for t in (q, k, sb)]
        out = fn(inputs[0], inputs[1], None, Positions("standard", K, inputs[2]), q_start=q_start)
        grads = torch.autograd.grad((out * weights.to(dt)).sum(), inputs)
        return [t.double() for t in (out, *grads)]

    exact = run(core.cem_attention_eager, torch.float64)
    fused = run(core.cem_attention_cpu, dtype)
    plain = run(core.cem_attention_eager, dtype)
    assert cpu_attention._fused_ok(q.to(dtype), None, None)
    for e, f, b in zip(exact, fused, plain):
        scale = e.abs().max()
        assert (f - e).abs().max() <= 2 * (b - e).abs().max() + 4e-3 * scale


def test_fast_path_without_diagonal_uses_the_fused_kernel(monkeypatch):
    calls = []
    original = cpu_attention.FusedKeyAttention.apply
    monkeypatch.setattr(cpu_attention.FusedKeyAttention, "apply", lambda *a: calls.append(1) or original(*a))
    q = k = torch.randn(1, 2, 5, 4)
    core.cem_attention_cpu(q, k, None, Positions("standard", 2, torch.randn(2)))
    assert calls == [1]
