"""The divergence guard on its own: bounds before and after its warm-up, weight norms, its saved state."""

import math

from cem.training.guard import RECENT, DivergenceGuard


def test_a_loss_beyond_a_multiple_of_the_uniform_guess_stops_at_once():
    guard = DivergenceGuard(factor=10.0, warmup=3, vocab_size=257)
    assert guard.loss_bound()[0] == 10.0 * math.log(257)
    assert guard.problem(5.0, 1e9) is None  # the gradient norm is never judged, only whether it is finite
    assert "uniform guess" in guard.problem(10.0 * math.log(257) + 1, 1.0)
    assert "not finite" in guard.problem(float("nan"), 1.0) and "not finite" in guard.problem(1.0, float("inf"))


def test_single_spikes_stop_nothing_a_sustained_explosion_does():
    """Issue 20: a healthy small-batch run had one gradient norm 11x its running median at loss 0.6 and
    was stopped; one-step spikes of the loss or the gradient norm are noise, a loss that stays up is not."""
    guard = DivergenceGuard(factor=10.0, warmup=3, vocab_size=257)
    for i in range(2 * RECENT):
        guard.add(0.5 + 0.1 * (i % 3), 1.0)
    assert guard.problem(0.6, 1000.0) is None  # a gradient-norm spike
    assert guard.problem(5.5, 1.0) is None  # one bad batch, 9x the median
    for _ in range(RECENT // 2 - 1):
        guard.add(7.0, 1.0)
    assert guard.problem(7.0, 1.0) is None  # half the recent window: the median is between
    guard.add(7.0, 1.0)
    assert "median loss of the last 10 steps, 7, exceeds diverge_factor=10 x the median of the 16 steps before, 0.6" in guard.problem(7.0, 1.0)


def test_the_loss_is_judged_by_its_medians_only_after_the_warmup():
    guard = DivergenceGuard(factor=10.0, warmup=30, vocab_size=257)
    for _ in range(20):
        guard.add(0.1, 1.0)
    for _ in range(9):
        guard.add(5.0, 1.0)
    assert guard.problem(5.0, 1.0) is None  # 29 values: before the warm-up
    guard.add(5.0, 1.0)
    assert "steps before, 0.1" in guard.problem(5.0, 1.0)


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
