"""Cached decoding equals the full forward pass, for every attention kind; cache sizes per token."""

import pytest
import torch

from cem.model import LanguageModel, model_config

VARIANTS = {
    "llama-rope": dict(arch="llama"),
    "llama-alibi": dict(arch="llama-alibi"),
    "llama-reuse": dict(arch="llama-reuse"),
    "cem-nodiag": dict(arch="cem", kq_diag="none"),
    "cem-shared": dict(arch="cem", kq_diag="shared"),
    "cem-perhead": dict(arch="cem", kq_diag="per_head", attn_precond="diag_lowrank"),
    "cem-exact": dict(arch="cem", kq_diag="shared", exact_gradient=True),
    "cem-eager": dict(arch="cem", attn_backend="eager"),
    "cem-norm-start-app-a": dict(arch="cem", start="norm", alibi="app-a", step_schedule="learned"),
    "llama-alibi-app-a": dict(arch="llama-alibi", alibi="app-a"),
}


def build(variant, steps):
    kw = dict(VARIANTS[variant])
    arch = kw.pop("arch")
    torch.manual_seed(0)
    model = LanguageModel(model_config("tiny", arch, vocab_size=61, attn_steps=steps, mlp_steps=steps, **kw)).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "kq_diag" in name or "self_bias" in name:
                p.normal_(0, 0.3)  # off the zero init, so the terms matter
    return model.eval()


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cached_logits_equal_full_forward(variant, steps):
    model = build(variant, steps)
    ids = torch.randint(0, 61, (2, 13))
    with torch.no_grad():
        full = model(ids)
        cached = cached_run(model, ids)
    torch.testing.assert_close(cached, full, rtol=1e-10, atol=1e-10)


def cached_run(model, ids, cache_len=20):
    """Logits of `ids` fed to a cache as a prefill of 5, a single token, a chunk of 3, then single tokens."""
    cache = model.new_cache(cache_len)
    parts = [model(ids[:, :5], cache=cache), model(ids[:, 5:6], cache=cache), model(ids[:, 6:9], cache=cache)]
    parts += [model(ids[:, t : t + 1], cache=cache) for t in range(9, ids.shape[1])]
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("options", [dict(adaptive_tol=0.02), dict(adaptive_tol=0.05, guard=3), dict(guard=4)])
@pytest.mark.parametrize("variant", ["cem-shared", "cem-perhead", "cem-exact", "cem-norm-start-app-a"])
def test_cached_inference_options_equal_full_forward(variant, options):
    """With adaptive or guarded steps every position takes its own steps, from its own u and causal context:
    decoding with the cache takes the same steps (same totals) and gives the same logits as the full pass."""
    model = build(variant, 5)
    model.set_steps(5 if "guard" not in options else 3)
    if "guard" in options:
        for m in model.descent_layers():
            m.step_size = 4.0  # large enough that the guard halves some steps
    model.set_inference(**options)
    ids = torch.randint(0, 61, (2, 13))
    with torch.no_grad():
        full = model(ids)
        totals = [m.steps_total for m in model.descent_layers()]
        full_used = model.steps_used()
        model.reset_steps_used()
        cached = cached_run(model, ids)
    torch.testing.assert_close(cached, full, rtol=1e-10, atol=1e-10)
    assert [m.steps_total for m in model.descent_layers()] == totals
    assert model.steps_used() == full_used
    if "adaptive_tol" in options:
        assert 1 <= full_used["all"] < model.descent_layers()[0].steps  # some positions stopped early
    if "guard" in options and variant != "cem-exact":  # the guard changed some steps (exact gradients
        # at this init never raise the energy, even with large steps: u = norm(x) stays on the sphere)
        model.set_inference()
        with torch.no_grad():
            assert not torch.allclose(model(ids), full)


def test_generate_matches_greedy_full_forward():
    model = build("cem-perhead", 2)
    prompt = torch.randint(0, 61, (2, 4))
    out = model.generate(prompt, 6, temperature=0)
    ids = prompt
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def test_generate_steps_override_is_temporary():
    model = build("cem-shared", 1)
    prompt = torch.randint(0, 61, (5,))
    out = model.generate(prompt, 3, temperature=0.8, top_k=10, top_p=0.9, steps=3, generator=torch.Generator().manual_seed(1))
    assert out.shape == (8,) and torch.equal(out[:5], prompt)
    assert {m.steps for m in model.descent_layers()} == {1}


def test_generate_inference_options_are_temporary_and_match_full_forward():
    model = build("cem-shared", 4)
    prompt = torch.randint(0, 61, (2, 4))
    out = model.generate(prompt, 5, temperature=0, adaptive_tol=0.02, guard=2)
    assert all((m.adaptive_tol, m.guard) == (None, 0) for m in model.descent_layers())
    model.set_inference(adaptive_tol=0.02, guard=2)
    ids = prompt
    with torch.no_grad():
        for _ in range(5):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def cache_bytes(arch, **kw):
    model = LanguageModel(model_config("tiny", arch, vocab_size=61, **kw))
    cache = model.new_cache(8)
    with torch.no_grad():
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    return cache.bytes_per_token()


def test_cache_bytes_per_token():
    cfg = model_config("tiny", "llama")
    per_layer = cfg.dim * 4  # float32
    assert cache_bytes("llama") == 2 * per_layer * cfg.n_layers  # keys and values
    assert cache_bytes("cem", kq_diag="none") == per_layer * cfg.n_layers  # keys only: they are the values
    for kw in (dict(kq_diag="shared"), dict(kq_diag="per_head"), dict(kq_diag="shared", exact_gradient=True), dict(arch_t2=True)):
        arch = "cem-t2" if kw.pop("arch_t2", False) else "cem"
        assert cache_bytes(arch, **kw) == per_layer * cfg.n_layers  # the diagonal term is read from the keys
    assert cache_bytes("llama-reuse") == 4 * per_layer * cfg.n_layers
    assert cache_bytes("cem", kq_diag="none", attn_steps=3) == per_layer * cfg.n_layers  # recursion reuses keys


def test_last_only_logits():
    model = build("cem-shared", 2)
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, last_only=True), model(ids)[:, -1:])


def ill_conditioned(model):
    with torch.no_grad():
        for block in model.blocks:
            block.attn.w_k.weight[0] = block.attn.w_k.weight[1] * (1 + 1e-9)  # two rows (almost) equal
    return model


@pytest.mark.parametrize("variant", ["cem-shared", "cem-perhead", "cem-exact"])
def test_badly_conditioned_keys_fall_back_to_storing_the_context(variant):
    model = ill_conditioned(build(variant, 2))
    ids = torch.randint(0, 61, (2, 9))
    cache = model.new_cache(12)
    with torch.no_grad(), pytest.warns(UserWarning, match=r"cond\(W_K\) = .* stores ĥ besides the keys"):
        parts = [model(ids[:, :5], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(5, 9)]
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(parts, dim=1), model(ids), rtol=1e-10, atol=1e-10)
    assert cache.bytes_per_token() == 2 * model.config.dim * 8 * model.config.n_layers  # keys + ĥ, float64


@pytest.mark.parametrize("variant", ["cem-shared", "cem-perhead", "cem-exact"])
def test_keys_only_cache_in_bfloat16(variant):
    """With a well-conditioned W_K (here orthogonal) the keys-only cache (W_K^{-1} in float32) stays within
    bf16 tolerance of the full forward; a random W_K (cond in the hundreds) keeps ĥ in bf16."""
    model = build(variant, 2).float()
    with torch.no_grad():
        for block in model.blocks:
            w = block.attn.w_k.weight
            w.copy_(torch.linalg.qr(torch.randn_like(w))[0] * 0.5)
    ids = torch.randint(0, 61, (2, 12))
    with torch.no_grad():
        ref = model(ids)
        model = model.bfloat16()
        full = model(ids).float()
        cache = model.new_cache(12)
        parts = [model(ids[:, :6], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(6, 12)]
    cached = torch.cat(parts, dim=1).float()
    assert all("hn" not in slot.buffers for slot in cache._slots.values())
    assert (cached - ref).abs().max() <= 2 * (full - ref).abs().max()  # bf16's own error against float32
    random_w = build(variant, 1).bfloat16()
    with torch.no_grad(), pytest.warns(UserWarning, match="stores ĥ"):
        random_w(ids[:, :3], cache=(cache := random_w.new_cache(4)))
    assert "hn" in cache.slot("blocks.0.attn").buffers
