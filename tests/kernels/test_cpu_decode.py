"""The CPU decode kernels of CEM attention (`cem.kernels.decode_kernels`): against float64 references, and bf16 cached
decoding steps through them against the same steps through PyTorch's GEMMs (the plain path)."""

import pytest
import torch

import cem.layers.attention_core as core
from cem.kernels import decode_kernels, reference_decode_attention
from cem.layers.attention_core import decode_kernels as chosen_kernels
from cem.layers.cem_attention import CEMAttention
from cem.layers.steps import Recursion
from cem.model.cache import CacheSlot

needs_kernel = pytest.mark.skipif(decode_kernels() is None, reason="no AVX512-BF16 CPU or no C++ compiler: the kernel does not run here")


def test_the_kernels_run_for_eager_bf16_cpu_inference_only():
    bf16, fp32 = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(2, 64)
    assert chosen_kernels(fp32) is None and chosen_kernels(bf16, fp32) is None and chosen_kernels(bf16.double()) is None
    assert chosen_kernels(bf16, q_start=torch.tensor(5)) is None  # a static cache's position
    assert chosen_kernels(bf16.requires_grad_()) is None  # no backward
    with torch.no_grad():
        assert chosen_kernels(bf16) is decode_kernels()
    assert chosen_kernels(bf16.detach(), q_start=5) is decode_kernels()


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "batch, n, dim, heads, per_head, q_start",
    [(1, 8198, 768, 12, 1, 8197), (2, 300, 64, 4, 3, 297), (1, 5, 32, 2, 2, 3), (3, 1000, 128, 5, 1, 999), (1, 130, 96, 3, 7, 100)],
)
def test_kernel_matches_the_float64_reference(batch, n, dim, heads, per_head, q_start, threads):
    """Every path: tails of rows and of queries (padding), row strides of a cache buffer, causal masking within a
    block and whole blocks masked (several new tokens), rows split over threads. Within bf16's rounding."""
    g = torch.Generator().manual_seed(n)
    hn = torch.randn(batch, n + 9, dim, generator=g).to(torch.bfloat16)[:, :n]  # a cache buffer's view
    q = (torch.randn(batch, heads * per_head, dim, generator=g) * 2 / dim**0.5).to(torch.bfloat16)
    slopes, self_bias = torch.rand(heads, generator=g) * 0.1, torch.randn(heads, generator=g)
    want = reference_decode_attention(hn, q, slopes, self_bias, q_start)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = decode_kernels().attention(hn, q, slopes, self_bias, q_start)
    finally:
        torch.set_num_threads(before)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    assert (got.double() - want).abs().max() <= 0.01 * want.abs().max()


@needs_kernel
@pytest.mark.parametrize("tokens, groups, rows, dim", [(1, 12, 768, 768), (3, 12, 768, 768), (5, 1, 2048, 768), (1, 1, 33, 64), (6, 4, 100, 96)])
def test_per_head_products_match_float64(tokens, groups, rows, dim):
    """rows_dot (y = W^g x^g) and rows_axpy (y = Σ_r x^g_r W^g_r) for every group g of rows, tails of rows and of
    tokens, a weight with a row stride: within bf16's rounding."""
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(rows, dim + 32, generator=g).to(torch.bfloat16)[:, :dim]
    x, xr = torch.randn(tokens, groups, dim, generator=g).to(torch.bfloat16), torch.randn(tokens, groups, rows // groups, generator=g).to(torch.bfloat16)
    blocks = w.double().view(groups, rows // groups, dim)
    for got, want in ((decode_kernels().rows_dot(x, w), torch.einsum("ngd,grd->ngr", x.double(), blocks)),
                      (decode_kernels().rows_axpy(xr, w), torch.einsum("ngr,grd->ngd", xr.double(), blocks))):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        assert (got.double() - want).abs().max() <= 0.01 * want.abs().max()


@needs_kernel
@pytest.mark.parametrize("kq_diag, precond", [("shared", "identity"), ("per_head", "identity"), ("shared", "diag_lowrank")])
@pytest.mark.parametrize("new_tokens", [1, 3])
def test_cached_bf16_steps_through_the_kernels_match_the_plain_path(monkeypatch, kq_diag, precond, new_tokens):
    """A 134M-width layer (D = 768, 12 heads, T = 2) decoding in bf16 with the kernels and with PyTorch's GEMMs
    (the kernels switched off): the same outputs up to bf16 rounding, the kernels' as close to float64 as the
    plain path's."""
    torch.manual_seed(0)
    layer = CEMAttention(768, 12, kq_diag=kq_diag, precond=precond, recursion=Recursion(steps=2)).double().eval()
    with torch.no_grad():
        layer.kq_diag.normal_(0, 0.3)
        layer.self_bias.normal_(0, 0.3)
        if layer.precond is not None:  # V starts at 0: a low-rank term of its own
            layer.precond.u.normal_(0, 0.05)
            layer.precond.v.normal_(0, 0.05)
            layer.precond.p.normal_(0, 0.05)
    h = 0.5 * torch.randn(1, 40, 768, dtype=torch.float64)
    used = []

    def decode(model, kernels_on):
        def choose(*args, **kwargs):
            chosen = chosen_kernels(*args, **kwargs) if kernels_on else None
            used.append(chosen is not None)
            return chosen

        monkeypatch.setattr(core, "decode_kernels", choose)
        dtype = model.w_q.weight.dtype
        cache = CacheSlot(40)
        with torch.no_grad():
            model(h[:, :28].to(dtype), cache=cache)
            steps = [model(h[:, t : t + new_tokens].to(dtype), cache=cache) for t in range(28, 40, new_tokens)]
        return torch.cat(steps, dim=1).double()

    ref = decode(layer, kernels_on=True)  # float64: never the kernels
    assert not any(used)
    low = layer.to(torch.bfloat16)
    fast = decode(low, kernels_on=True)
    assert sum(used) >= 3 * 2 * (12 // new_tokens), "the bf16 steps did not reach the kernels"
    plain = decode(low, kernels_on=False)
    scale = ref.abs().max()
    assert (fast - plain).abs().max() <= 0.02 * scale
    assert (fast - ref).abs().max() <= 1.5 * (plain - ref).abs().max() + 1e-3 * scale


@pytest.mark.parametrize("raw, on", [("0", False), ("off", False), ("False", False), (" no ", False), (" 0", False),
                                     ("1", True), ("ON", True), ("yes", True)])
def test_the_switch_reads_any_boolean(monkeypatch, raw, on):
    """CEM_CPU_DECODE_KERNEL is read as a boolean (issue 63: off, false, no and ' 0' left the kernels on)."""
    import cem.kernels.cpu_decode as module

    sentinel = object()
    monkeypatch.setattr(module, "cpu_has_avx512_bf16", lambda: True)
    monkeypatch.setattr(module, "_build", lambda: sentinel)
    monkeypatch.setattr(module, "_self_check", lambda kernels: True)
    monkeypatch.setenv(module.ENV_SWITCH, raw)
    module.decode_kernels.cache_clear()
    try:
        assert (module.decode_kernels() is sentinel) is on
    finally:
        module.decode_kernels.cache_clear()


def test_a_switch_that_is_no_boolean_is_an_error_naming_it(monkeypatch):
    import cem.kernels.cpu_decode as module

    monkeypatch.setenv(module.ENV_SWITCH, "disable")
    module.decode_kernels.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"\$CEM_CPU_DECODE_KERNEL must be one of .*'disable'"):
            module.decode_kernels()
    finally:
        module.decode_kernels.cache_clear()
