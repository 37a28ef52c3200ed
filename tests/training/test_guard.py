"""The divergence guard on its own: bounds before and after its warm-up, weight norms, its saved state."""

import math

from cem.training.guard import DivergenceGuard


def test_before_the_warmup_the_loss_is_judged_against_a_uniform_guess():
    guard = DivergenceGuard(factor=10.0, warmup=3, vocab_size=257)
    assert guard.loss_bound()[0] == 10.0 * math.log(257)
    assert guard.problem(5.0, 1e9) is None  # the gradient norm is not judged yet
    assert "uniform guess" in guard.problem(10.0 * math.log(257) + 1, 1.0)
    assert "not finite" in guard.problem(float("nan"), 1.0) and "not finite" in guard.problem(1.0, float("inf"))


def test_after_the_warmup_the_running_medians_decide():
    guard = DivergenceGuard(factor=10.0, warmup=3, vocab_size=257)
    for loss, grad in ((2.0, 1.0), (3.0, 2.0), (4.0, 3.0)):
        guard.add(loss, grad)
    assert guard.loss_bound()[0] == 30.0
    assert guard.problem(29.0, 19.0) is None
    assert "running median 3" in guard.problem(31.0, 1.0)
    assert "gradient norm 21" in guard.problem(1.0, 21.0)


def test_weight_norms_and_factor_zero():
    guard = DivergenceGuard(factor=10.0, warmup=2, vocab_size=257)
    assert guard.weight_problem(1.0) is None and guard.start_weight_norm == 1.0
    assert "its value at the start" in guard.weight_problem(11.0)
    assert guard.weight_problem(float("inf")) == "the weights are no longer finite"
    off = DivergenceGuard(factor=0.0, warmup=2, vocab_size=257)
    assert off.problem(1e30, 1e30) is None and off.weight_problem(1e30) is None
    assert off.problem(float("nan"), 1.0) is not None


def test_state_round_trip():
    guard = DivergenceGuard(factor=10.0, warmup=2, vocab_size=257)
    guard.add(2.0, 1.0)
    guard.weight_problem(3.0)
    again = DivergenceGuard(factor=10.0, warmup=2, vocab_size=257)
    again.load_state_dict(guard.state_dict())
    assert again.state_dict() == guard.state_dict() == {"losses": [2.0], "grad_norms": [1.0], "weight_norms": [3.0], "start_weight_norm": 3.0}
