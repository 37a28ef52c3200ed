"""Bad input raises a clear ValueError that names the problem."""

import pytest
import torch

from cem.layers import CEMMLP, CEMAttention, GatedMLP, Inference, LlamaAttention, Recursion, Reuse
from cem.model import LanguageModel, model_config


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: CEMAttention(10, 3), "divisible"),
        (lambda: LlamaAttention(10, 4), "divisible"),
        (lambda: CEMAttention(12, 3, kq_diag="full"), "unknown kq_diag 'full'"),
        (lambda: CEMAttention(12, 3, precond="newton"), "unknown precond 'newton'"),
        (lambda: CEMMLP(12, 8, precond="newton"), "unknown precond"),
        (lambda: CEMMLP(12, 8, energy="quadratic"), "unknown energy"),
        (lambda: LlamaAttention(12, 3, position="learned"), "unknown position 'learned'"),
        (lambda: Recursion(steps=0), "steps must be an integer >= 1"),
        (lambda: Recursion(step_size=0.0), "step_size must be > 0"),
        (lambda: Recursion(learned_steps=0), "learned_steps must be"),
        (lambda: Reuse(GatedMLP(12, 8), 0), "times must be"),
        (lambda: model_config("13M"), "unknown preset '13M'"),
        (lambda: model_config("tiny", "mamba"), "unknown arch 'mamba'"),
        (lambda: model_config("tiny", "cem", attn_step=2), "unknown model config key"),
        # bounds on what an edited config.json / run.json may ask for (issue 20: attn_steps=10**9 hung)
        (lambda: model_config("tiny", "cem", attn_steps=10**9), "attn_steps must be at most 256 .* got 1,000,000,000"),
        (lambda: model_config("tiny", "cem-t2", mlp_steps=257), "mlp_steps must be at most 256"),
        (lambda: model_config("tiny", "cem", n_layers=10**6), "n_layers must be at most 1,024"),
        (lambda: model_config("tiny", "cem", dim=1 << 20, n_heads=4), "dim must be at most 65,536"),
        (lambda: model_config("tiny", "cem", guard=1000), "guard must be at most 64"),
        (lambda: LanguageModel(model_config("tiny", "cem", vocab_size=32)).set_inference(Inference(steps=10**9)), "steps must be at most 256"),
    ],
)
def test_bad_construction(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_steps_setter_validates():
    layer = CEMAttention(12, 3)
    with pytest.raises(ValueError, match="steps"):
        layer.steps = 0


@pytest.mark.parametrize("layer", [CEMAttention(12, 3), CEMMLP(12, 8), LlamaAttention(12, 3), GatedMLP(12, 8)])
def test_bad_layer_input(layer):
    with pytest.raises(ValueError, match="rank 2"):
        layer(torch.randn(4, 12))
    with pytest.raises(ValueError, match="width 12"):
        layer(torch.randn(2, 4, 10))
    with pytest.raises(ValueError, match="floating-point"):
        layer(torch.ones(2, 4, 12, dtype=torch.long))


def test_bad_token_ids():
    model = LanguageModel(model_config("tiny", "cem", vocab_size=50, context=16))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[1, 2, 50]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="sequence too long: 17 tokens > the model's context of 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="shape"):
        model(torch.zeros(17, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        model(torch.zeros(1, 3))
    cache = model.new_cache()
    model(torch.zeros(1, 10, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="sequence too long"):
        model(torch.zeros(1, 7, dtype=torch.long), cache=cache)


def test_odd_but_valid_ids_and_bad_api_values():
    """Token ids straight from a uint16 token cache work (as int64 ids do); a batch of 0 sequences, float
    targets or targets of another shape, and non-integer generation settings are one clear ValueError."""
    model = LanguageModel(model_config("tiny", "cem", vocab_size=50, context=16), init_seed=0).eval()
    ids = torch.randint(0, 50, (2, 9))
    assert torch.equal(model(ids.to(torch.uint16)), model(ids))
    assert torch.equal(model(ids[:, :-1].to(torch.uint16), ids[:, 1:].to(torch.uint16)), model(ids[:, :-1], ids[:, 1:]))
    gen = torch.Generator().manual_seed(0)
    out = model.generate(ids[0].to(torch.uint16), 3, generator=gen)
    assert torch.equal(out, model.generate(ids[0], 3, generator=torch.Generator().manual_seed(0)))
    bad = [
        (lambda: model(torch.zeros(0, 4, dtype=torch.long)), "batch of 0 sequences"),
        (lambda: model(ids[:, :-1], ids[:, 1:].float()), "targets must be integer token ids"),
        (lambda: model(ids[:, :-1], ids[:, 2:]), "do not match the ids' shape"),
        (lambda: model.generate(ids[0], 2.5), "max_new_tokens must be an integer"),
        (lambda: model.generate(ids[0], 10**12), "max_new_tokens must be an integer in"),
        (lambda: model.generate(ids[0], 2, top_k=2.5), "top_k must be an integer"),
        (lambda: model.generate("a prompt", 2), "the prompt must be a tensor"),
        (lambda: model.generate(ids[None], 2), "the prompt must be a tensor"),
    ]
    for call, match in bad:
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize("arch", ["cem", "llama", "llama-alibi"])
def test_generate_past_the_context(arch):
    """Within the context: one cache, the same tokens as before; past it: a window of recent tokens, and a
    prompt longer than the context is cropped (the output still starts with the whole prompt)."""
    model = LanguageModel(model_config("micro", arch, vocab_size=50, context=16)).eval()
    prompt = torch.arange(1, 11)
    short = model.generate(prompt, 6, temperature=0)
    long = model.generate(prompt, 30, temperature=0)
    assert long.shape == (40,) and torch.equal(long[:16], short)
    window = model.generate(torch.arange(20) % 50, 1, temperature=0)
    assert torch.equal(window[:20], torch.arange(20)) and torch.equal(window[20:], model.generate(torch.arange(4, 20), 1, temperature=0)[16:])
    cropped = torch.cat([prompt, long[10:17]])[-12:]  # the first rebuild: the last 12 of the 17 tokens then known
    assert torch.equal(long[17], model.generate(cropped, 1, temperature=0)[-1])
