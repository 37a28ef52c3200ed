"""The preconditioner kinds: what each builds, and their FLOP cost against torch's FLOP counter."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from cem.layers import PRECONDITIONERS, make_preconditioner

D, R, N = 12, 3, 5


@pytest.mark.parametrize("kind", sorted(PRECONDITIONERS))
def test_kind_builds_its_preconditioner(kind):
    spec = PRECONDITIONERS[kind]
    p = make_preconditioner(kind, 2, D, R)
    assert (p is not None) == spec.diagonal
    if p is not None:
        assert p.rank == (R if spec.low_rank else 0)


@pytest.mark.parametrize("kind", ["diag", "diag_lowrank"])
def test_matmul_flops_are_what_torch_counts(kind):
    spec = PRECONDITIONERS[kind]
    p = make_preconditioner(kind, 1, D, R)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        p(torch.randn(N, 1, D))
    assert counter.get_total_flops() == N * spec.matmul_flops(D, R)
    assert spec.flops(D, R) == 2 * D + spec.matmul_flops(D, R)
    assert spec.folded_flops(7, D, R, 4) == 7 * spec.flops(D, R) // 4
    assert PRECONDITIONERS["identity"].flops(D, R) == 0
