"""Llama baselines: SDPA attention against an explicit softmax, RoPE/ALiBi, causality, layer reuse."""

import math

import pytest
import torch

from cem.layers import GatedMLP, LlamaAttention, Reuse
from cem_reference import rms_norm

B, J, D, K = 2, 6, 16, 4


def explicit_attention(layer, h):
    hn = rms_norm(h, layer.norm.weight, layer.norm.eps)
    d = D // K
    q, k, v = (hn @ w.weight.T for w in (layer.w_q, layer.w_k, layer.w_v))
    q, k, v = (t.view(B, J, K, d).transpose(1, 2) for t in (q, k, v))
    pos = torch.arange(J, dtype=torch.float64)
    if layer.position == "rope":
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        ang = pos[:, None] * inv[None]
        def rot(x):
            x1, x2 = x[..., : d // 2], x[..., d // 2 :]
            return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1)
        q, k = rot(q), rot(k)
    logits = q @ k.transpose(-1, -2) / math.sqrt(d)
    i, j = pos[:, None], pos[None, :]
    if layer.position == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (m + 1) / K) for m in range(K)], dtype=torch.float64)
        logits = logits - slopes[:, None, None] * (i - j)
    logits = logits.masked_fill(j > i, float("-inf"))
    o = (torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(B, J, D)
    return h + o @ layer.w_o.weight.T


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_attention_matches_explicit(rand, position):
    layer = rand(LlamaAttention(D, K, position).double())
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(h), explicit_attention(layer, h))


def test_gated_mlp(rand):
    layer = rand(GatedMLP(D, 24).double())
    h = torch.randn(B, J, D, dtype=torch.float64)
    hn = rms_norm(h, layer.norm.weight, layer.norm.eps)
    gate, up = hn @ layer.w_gate.weight.T, hn @ layer.w_up.weight.T
    expected = h + (gate * torch.nn.functional.silu(up)) @ layer.w_down.weight.T
    with torch.no_grad():
        torch.testing.assert_close(layer(h), expected)
    assert sum(p.numel() for p in layer.parameters()) == 3 * 24 * D + D


def test_reuse_applies_same_layer_with_residual(rand):
    inner = rand(GatedMLP(D, 24).double())
    twice = Reuse(inner, 2)
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(twice(h), inner(inner(h)))
    assert sum(p.numel() for p in twice.parameters()) == sum(p.numel() for p in inner.parameters())


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_causal(rand, position):
    layer = rand(LlamaAttention(D, K, position).double())
    h = torch.randn(B, J, D, dtype=torch.float64)
    h2 = h.clone()
    h2[:, 3:] += 1
    with torch.no_grad():
        torch.testing.assert_close(layer(h)[:, :3], layer(h2)[:, :3])


def test_cached_rope_tables_equal_fresh_ones():
    from cem.layers.position import rope_cos_sin, rope_tables

    for start, n in ((0, 5), (3, 9), (0, 40), (17, 1)):  # grows the cached table, then slices it
        cos, sin = rope_cos_sin(8, start, n, 10000.0, torch.device("cpu"), torch.float32)
        ref_cos, ref_sin = rope_tables(8, torch.arange(start, start + n))
        torch.testing.assert_close(cos, ref_cos.float(), rtol=0, atol=0)
        torch.testing.assert_close(sin, ref_sin.float(), rtol=0, atol=0)


def test_tables_cached_under_inference_mode_serve_training():
    from cem.layers.position import _ALIBI_CACHE, _ROPE_CACHE

    _ALIBI_CACHE.clear(), _ROPE_CACHE.clear()
    for position in ("rope", "alibi"):
        layer = LlamaAttention(16, 2, position)
        h = torch.randn(1, 5, 16)
        with torch.inference_mode():
            layer(h)
        layer(h).sum().backward()  # the cached tables are ordinary tensors
