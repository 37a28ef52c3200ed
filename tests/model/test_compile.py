"""torch.compile captures a whole block (and the whole model) as one graph, for Llama and CEM."""

import pytest
import torch

from cem.model import Block, LanguageModel, model_config


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "llama-alibi", "cem", "cem-t2", "llama-reuse"])
def test_block_compiles_full_graph(arch):
    torch._dynamo.reset()
    cfg = model_config("tiny", arch, vocab_size=64, **({"kq_diag": "per_head"} if arch.startswith("cem") else {}))  # a CEM setting
    block = Block(cfg)
    h = torch.randn(2, 12, cfg.dim, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out = compiled(h)
    out.sum().backward()
    torch.testing.assert_close(out, block(h))


def test_model_compiles_full_graph():
    torch._dynamo.reset()
    model = LanguageModel(model_config("tiny", "cem", vocab_size=64))
    ids = torch.randint(0, 64, (2, 10))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(ids), model(ids))
