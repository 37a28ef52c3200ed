import pytest
import torch


def randomize(module, scale=0.3, seed=0):
    """Fresh random values for every parameter (never the zeros of the init), in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * noise)
            elif name.endswith("precond.p"):
                p.add_(0.05 * noise)
            else:
                p.copy_(scale * noise)
    return module


@pytest.fixture
def rand():
    return randomize
