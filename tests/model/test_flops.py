"""Forward FLOPs per token: the counts equal those of the formulas before the kinds registered their own
(values frozen from them), including the folded and the per-head preconditioner and the exact gradient."""

import pytest

from cem.model import model_config
from cem.model.flops import attention_flops, forward_flops_per_token, mlp_flops

# (size, arch, overrides, (attention, mlp, model) at the full context, (attention, mlp, model) at 100 tokens)
FROZEN = [
    ('small', 'llama', {}, (262144, 270336, 2260992), (182272, 270336, 1941504)),
    ('small', 'llama-reuse', {}, (524288, 540672, 4390912), (364544, 540672, 3751936)),
    ('small', 'cem', {}, (294912, 270336, 2392064), (175104, 270336, 1912832)),
    ('small', 'cem-t2', {}, (559232, 473440, 4261760), (323010, 509132, 3459640)),
    ('tiny', 'cem', {'kq_diag': 'per_head', 'exact_gradient': True, 'attn_precond': 'diag_lowrank', 'attn_precond_rank': 3, 'attn_steps': 3}, (568832, 67584, 1338368), (461312, 67584, 1123328)),
    ('tiny', 'cem', {'kq_diag': 'none', 'exact_gradient': True, 'attn_precond': 'diag', 'mlp_precond': 'diag', 'mlp_width_mult': 1.5}, (57408, 101640, 383632), (50257, 101713, 369476)),
    ('tiny', 'cem', {'kq_diag': 'shared', 'exact_gradient': True, 'attn_precond': 'diag', 'attn_steps': 2, 'mlp_steps': 4, 'mlp_precond': 'diag_lowrank', 'mlp_precond_rank': 5}, (271360, 206448, 1021152), (221184, 207482, 922868)),
    ('small', 'cem-attn', {'kq_diag': 'per_head'}, (491520, 270336, 3178496), (251904, 270336, 2220032)),
    ('small', 'cem-mlp-matched', {}, (262144, 405504, 2801664), (182272, 405504, 2482176)),
    ('134M', 'cem-t2', {'kq_diag': 'per_head', 'attn_reuse': 2, 'mlp_reuse': 3}, (187976832, 47485440, 2874699264), (20799160, 53320089, 938582988)),
]


@pytest.mark.parametrize("size,arch,overrides,full,short", FROZEN)
def test_flops_equal_the_frozen_counts(size, arch, overrides, full, short):
    cfg = model_config(size, arch, **overrides)
    assert (attention_flops(cfg, cfg.context), mlp_flops(cfg), forward_flops_per_token(cfg)) == full
    assert (attention_flops(cfg, 100), mlp_flops(cfg, 100), forward_flops_per_token(cfg, 100)) == short
