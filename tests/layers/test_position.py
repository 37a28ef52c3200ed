"""`Positions`: the ALiBi bias with the learned self bias of an attention layer, its cached constant part,
and the CEM layer reading its parameter at each use."""

import pytest
import torch

from cem.layers import CEMAttention
from cem.layers.position import Positions, alibi_slopes


@pytest.mark.parametrize("kind", ["standard", "app-a"])
@pytest.mark.parametrize("q_start,n_q,n_k", [(0, 5, 5), (3, 2, 5), (4, 1, 5)])
def test_bias_is_the_formula(kind, q_start, n_q, n_k):
    """b_kij = -m_k (i - j) + s_k [i = j] over absolute positions i = q_start.., -inf where j > i (float64)."""
    K = 3
    s = torch.randn(K, dtype=torch.float64)
    m = alibi_slopes(K, kind=kind)
    bias = Positions(kind, K, s).bias(q_start, n_q, n_k, torch.float64, "cpu")
    assert bias.shape == (K, n_q, n_k)
    for k in range(K):
        for r in range(n_q):
            i = q_start + r
            for j in range(n_k):
                expected = float("-inf") if j > i else -m[k] * (i - j) + s[k] * (i == j)
                assert bias[k, r, j] == expected


def test_alibi_is_the_cached_constant_part():
    """`alibi` is `bias` without s_k, 4-D, without autograd graph; one tensor is reused for the full forward."""
    s = torch.randn(4, requires_grad=True)
    positions = Positions("app-a", 4, s)
    full = positions.alibi(0, 6, 6, torch.float32, "cpu")
    assert full is positions.alibi(0, 6, 6, torch.float32, "cpu") and not full.requires_grad
    torch.testing.assert_close(full, Positions("app-a", 4).bias(0, 6, 6, torch.float32, "cpu").unsqueeze(0), rtol=0, atol=0)
    step = positions.alibi(5, 1, 6, torch.float32, "cpu")  # decoding: built, not cached
    torch.testing.assert_close(step, full[:, :, 5:], rtol=0, atol=0)
    assert positions.bias(0, 6, 6, torch.float32, "cpu").requires_grad


def test_the_layer_reads_its_self_bias_at_each_use():
    """The layer's `positions` carry its slopes kind and its parameter s_k, still the one in use after loading
    replaced the parameter object; the state dict keeps the key `self_bias`."""
    layer = CEMAttention(8, 2, alibi="app-a")
    assert layer.positions.kind == "app-a" and layer.positions.self_bias is layer.self_bias
    layer.load_state_dict({**layer.state_dict(), "self_bias": torch.ones(2)}, assign=True)
    assert layer.positions.self_bias is layer.self_bias and torch.equal(layer.positions.self_bias, torch.ones(2))
    assert "self_bias" in layer.state_dict() and not any("positions" in key for key in layer.state_dict())
    assert layer.to(torch.bfloat16).positions.slopes().dtype == torch.float64  # never rounded
