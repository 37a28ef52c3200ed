"""The static-shape decoding path: a `StaticCache` (fixed buffers, a position tensor) equals the full forward,
`generate(static=True)` the eager generation, and a compiled step never recompiles over 64 steps."""

import pytest
import torch

from cem.layers import Inference
from cem.model import LanguageModel, model_config
from cem.model.cache import StaticCache
from cem.model.generate import compiled_step, static_step

from model.test_cache import VARIANTS, build


def static_run(model, ids, step, cache_len=20):
    """Logits of `ids` after a prefill of 5 (the model's forward), then one token at a time through `step`."""
    cache = StaticCache(cache_len)
    parts = [model(ids[:, :5], cache=cache)]
    cache.advance(5)
    for t in range(5, ids.shape[1]):
        parts.append(step(model, ids[:, t : t + 1], cache)[:, None].clone())
        cache.advance(1)
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_static_cache_equals_full_forward(variant, steps):
    model = build(variant, steps)
    ids = torch.randint(0, 61, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(static_run(model, ids, static_step), model(ids), rtol=1e-10, atol=1e-10)


def test_static_cache_holds_max_len_positions_written_in_place():
    model = build("cem-shared", 1)
    cache = StaticCache(9)
    with torch.no_grad():
        model(torch.randint(0, 61, (1, 4)), cache=cache)
    cache.advance(4)
    slot = cache.slot("blocks.0.attn")
    buf = slot.buffers["hn"]
    assert buf.shape[-2] == 9 and int(cache.position) == 4 and cache.length == 4
    assert buf[..., :4, :].abs().sum() > 0 and not buf[..., 4:, :].any()  # zero past the position
    with torch.no_grad():
        static_step(model, torch.randint(0, 61, (1, 1)), cache)
    assert slot.buffers["hn"].data_ptr() == buf.data_ptr() and buf[..., 4, :].abs().sum() > 0
    with pytest.raises(ValueError, match="too long"):
        cache.advance(6)


@pytest.mark.parametrize("variant", ["llama-rope", "cem-shared", "cem-nodiag", "llama-reuse"])
def test_generate_static_equals_eager(variant):
    model = build(variant, 2)
    prompt = torch.randint(0, 61, (2, 5))
    eager = model.generate(prompt, 20, temperature=0)  # tiny context 64: no window rebuild; see the next test
    assert torch.equal(model.generate(prompt, 20, temperature=0, static=True), eager)


def test_generate_static_past_the_context_equals_eager():
    model = build("cem-shared", 1)
    model.config = model.config.replace(context=12)
    prompt = torch.randint(0, 61, (1, 6))
    assert torch.equal(model.generate(prompt, 20, temperature=0, static=True), model.generate(prompt, 20, temperature=0))


def test_compile_refuses_adaptive_steps():
    model = build("cem-shared", 2)
    with pytest.raises(ValueError, match="fixed steps"):
        model.generate(torch.randint(0, 61, (1, 3)), 2, temperature=0, compile=True, inference=Inference(adaptive_tol=0.1))


def float_model(arch, **kw):
    torch.manual_seed(0)
    return LanguageModel(model_config("tiny", arch, vocab_size=61, context=128, **kw)).eval()


@pytest.mark.slow
@pytest.mark.parametrize("arch,kw", [("llama", {}), ("cem-t2", {}), ("cem", {"kq_diag": "none"})])
def test_traced_step_does_not_recompile_over_64_steps(arch, kw):
    """Dynamo alone (backend "eager"): one graph, no graph break, and no recompilation over 64 decode steps
    (5-35 s each on the shared CPU, most of it dynamo's first trace)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = float_model(arch, **kw)
    traced = torch.compile(static_step, backend="eager", fullgraph=True, dynamic=False)
    ids = torch.randint(0, 61, (2, 70))
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        got = static_run(model, ids, traced, cache_len=80)
        ref = static_run(model, ids, static_step, cache_len=80)
    assert counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(got, ref, rtol=0, atol=0)  # the same ops: exact


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "cem-t2"])
def test_compiled_step_matches_eager_without_recompiling(arch):
    """Inductor on the CPU (what `generate(compile=True)` runs): 64 decode steps, one compilation, logits
    within 1e-4 of the eager static path in float32 (the compiler fuses and reorders float32 sums)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = float_model(arch)
    ids = torch.randint(0, 61, (1, 69))
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        got = static_run(model, ids, compiled_step(ids.device), cache_len=80)
        ref = static_run(model, ids, static_step, cache_len=80)
    assert counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(model.generate(ids[:, :5], 8, temperature=0, compile=True), model.generate(ids[:, :5], 8, temperature=0))
