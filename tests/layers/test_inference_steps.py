"""The inference options of the recursion (cem.layers.steps): adaptive steps and energy-guarded steps,
in float64, against plain fixed-T recursions of the same layer."""

import pytest
import torch

from cem.layers import CEMMLP, CEMAttention, Inference, Recursion
from cem.model import LanguageModel, model_config

B, J, D, K, M = 2, 7, 24, 3, 20

LAYERS = {
    "attention": lambda **kw: CEMAttention(D, K, kq_diag="none", **kw),
    "attention-exact-precond": lambda **kw: CEMAttention(D, K, kq_diag="per_head", exact_gradient=True, precond="diag_lowrank", **kw),
    "mlp": lambda **kw: CEMMLP(D, M, **kw),
    "mlp-convex": lambda **kw: CEMMLP(D, M, energy="convex", precond="diag", **kw),
}


def build(kind, rand, seed=7, **recursion):
    return rand(LAYERS[kind](recursion=Recursion(**recursion)).double(), seed=seed).eval()


def plain(layer, h, steps, step_size=None):
    """x^(steps) of the plain recursion (options off) and E(norm(x^(steps))) per position."""
    saved = layer.recursion, layer.inference
    layer.set_inference(Inference(steps=steps))
    if step_size is not None:
        layer.step_size = step_size
    try:
        x = layer(h)
        return x, layer.energy(layer.norm(x), h)
    finally:
        layer.recursion, layer.inference = saved


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_direction_energy_is_the_layer_energy(rand, kind):
    """direction(u, with_energy=True) gives the plain direction and `energy(u, h)` from the same pass."""
    layer = build(kind, rand)
    h, u = torch.randn(2, B, J, D, dtype=torch.float64)
    with torch.no_grad():
        if isinstance(layer, CEMAttention):
            hn, k, ctx, q_start = layer.context(h)
            both = layer.direction(u, k, ctx, q_start, with_energy=True)
            alone = layer.direction(u, k, ctx, q_start)
        else:
            gamma = layer.w_gate(layer.norm(h))
            both, alone = layer.direction(u, gamma, with_energy=True), layer.direction(u, gamma)
        torch.testing.assert_close(both[0], alone, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(both[1], layer.energy(u, h), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_adaptive_steps_follow_the_stopping_rule(rand, kind):
    """Each position's output is the plain recursion run for its own number of steps n_i, and n_i is the
    first step whose relative energy decrease is <= tol (or T)."""
    T = 6
    layer = build(kind, rand, steps=T, step_size=0.3)
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        runs = [(h, layer.energy(layer.norm(h), h))] + [plain(layer, h, t) for t in range(1, T + 1)]
        energies = torch.stack([e for _, e in runs])  # (T + 1, B, J)
        decrease = (energies[:-1] - energies[1:]) / energies[:-1].abs()  # after step t + 1
        middle = decrease[1:].flatten().sort().values[decrease[1:].numel() // 2 - 1 :][:2]
        tol = float(middle.mean())  # between two decreases (no tie): stops some positions early
        layer.set_inference(Inference(adaptive_tol=tol))
        layer.reset_steps_used()
        out = layer(h)
    steps = layer.last_steps_used
    assert steps.min() >= 1 and steps.max() <= T and len(steps.unique()) > 1
    for b in range(B):
        for i in range(J):
            n = int(steps[b, i])
            torch.testing.assert_close(out[b, i], runs[n][0][b, i], rtol=1e-12, atol=1e-12)
            assert all(decrease[t, b, i] > tol for t in range(n - 1))
            assert n == T or decrease[n - 1, b, i] <= tol
    assert layer.steps_used() == pytest.approx(steps.double().mean().item())


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_update_rule_stops_on_the_step_size_without_the_energy(rand, kind, monkeypatch):
    """`adaptive_rule="update"`: position i's output is the plain recursion run for n_i steps, n_i the first
    step t with ‖x^(t) - x^(t-1)‖ <= tol · ‖x^(t-1)‖ (or T); no energy is computed on the way."""
    T = 6
    layer = build(kind, rand, steps=T, step_size=0.3, schedule="geometric", decay=0.7)
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        xs = [h] + [plain(layer, h, t)[0] for t in range(1, T + 1)]
        rel = torch.stack([(b - a).norm(dim=-1) / a.norm(dim=-1) for a, b in zip(xs, xs[1:])])  # step t + 1
        middle = rel[1:].flatten().sort().values[rel[1:].numel() // 2 - 1 :][:2]
        tol = float(middle.mean())
        layer.set_inference(Inference(adaptive_tol=tol, adaptive_rule="update"))
        monkeypatch.setattr(layer, "energy", lambda *a: pytest.fail("the update rule computed an energy"))
        if isinstance(layer, CEMMLP):
            monkeypatch.setattr(layer, "_energy", lambda *a: pytest.fail("the update rule computed an energy"))
        else:
            direction = layer.direction
            monkeypatch.setattr(layer, "direction", lambda *a, with_energy=False, **k: direction(*a, **k) if not with_energy else pytest.fail("energy"))
        out = layer(h)
    steps = layer.last_steps_used
    assert len(steps.unique()) > 1
    for b in range(B):
        for i in range(J):
            n = int(steps[b, i])
            torch.testing.assert_close(out[b, i], xs[n][b, i], rtol=1e-12, atol=1e-12)
            assert all(rel[t, b, i] > tol for t in range(n - 1))
            assert n == T or rel[n - 1, b, i] <= tol


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_adaptive_extremes_equal_fixed_steps(rand, kind):
    layer = build(kind, rand, steps=4, step_size=0.2)
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        layer.set_inference(Inference(adaptive_tol=1e9))  # every position stops after its first step
        torch.testing.assert_close(layer(h), plain(layer, h, 1)[0], rtol=1e-12, atol=1e-12)
        assert layer.steps_used() == 1
        layer.reset_steps_used()
        layer.set_inference(Inference(adaptive_tol=0.0))  # stops only where a step raised the energy
        out = layer(h)
        if bool((layer.last_steps_used == 4).all()):
            torch.testing.assert_close(out, plain(layer, h, 4)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_guard_never_raises_the_energy(rand, kind):
    """With a large η the plain steps raise the energy somewhere; the guarded ones never do, at any step."""
    T, eta = 4, 8.0
    layer = build(kind, rand, steps=T, step_size=eta, seed=3)
    h = torch.randn(B, J, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        e0 = layer.energy(layer.norm(h), h)
        unguarded = torch.stack([e0] + [plain(layer, h, t)[1] for t in range(1, T + 1)])
        if kind != "mlp-convex":  # on the convex energy (App. B) even these steps happen to descend
            assert bool((unguarded[1:] > unguarded[:-1]).any()), "the plain steps should raise the energy somewhere"
        layer.set_inference(Inference(guard=12))
        energies = [e0]
        for t in range(1, T + 1):
            layer.steps = t
            x = layer(h)
            energies.append(layer.energy(layer.norm(x), h))
    for before, after in zip(energies, energies[1:]):
        assert bool((after <= before).all())
    assert bool((energies[-1] < energies[0]).any())


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_guard_with_tiny_steps_is_the_plain_step(rand, kind):
    layer = build(kind, rand, steps=3, step_size=1e-4)
    layer.set_inference(Inference(guard=5))
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(h), plain(layer, h, 3)[0], rtol=1e-13, atol=1e-13)
    assert bool((layer.last_steps_used == 3).all())


def test_options_are_refused_in_training_and_validated():
    layer = CEMMLP(D, M, recursion=Recursion(steps=2))
    h = torch.randn(B, J, D)
    for option, value in (("adaptive_tol", 1e-3), ("guard", 2)):
        layer.set_inference(Inference(**{option: value}))
        with pytest.raises(ValueError, match=option):
            layer(h)
        with torch.no_grad():
            layer(h)  # no_grad (or eval mode) is inference
        layer.set_inference(Inference())
    for option, bad in (("adaptive_tol", -1e-3), ("adaptive_tol", float("nan")), ("guard", -1), ("guard", 1.5)):
        with pytest.raises(ValueError, match=option):
            Inference(**{option: bad})
        with pytest.raises(ValueError, match=option):
            model_config("micro", "cem", **{option: bad})


def test_model_steps_used_and_config():
    model = LanguageModel(model_config("micro", "cem", vocab_size=32, attn_steps=3, mlp_steps=2)).eval()
    ids = torch.randint(0, 32, (2, 9))
    with torch.no_grad():
        model(ids)
        used = model.steps_used()
        assert (used["attn"], used["mlp"], used["all"]) == (3, 2, 2.5)
        model.reset_steps_used()
        assert model.steps_used()["all"] is None
        model.set_inference(Inference(adaptive_tol=1e9, guard=2))
        model(ids)
    assert model.steps_used()["all"] == 1 and set(model.steps_used()["layers"].values()) == {1.0}
    cfg = model.current_config()
    assert cfg.inference == Inference(adaptive_tol=1e9, guard=2, adaptive_rule="energy")
    assert all(m.inference == cfg.inference for m in LanguageModel(cfg).descent_layers())
    model.set_inference(Inference(adaptive_tol=1e-2, adaptive_rule="update"))
    assert model.current_config().inference.adaptive_rule == "update"
    assert all(m.inference.adaptive_rule == "update" for m in LanguageModel(model.current_config()).descent_layers())
    with model.test_time(Inference(adaptive_rule="energy")):
        assert all(m.inference.adaptive_rule == "energy" for m in model.descent_layers())
    assert all(m.inference.adaptive_rule == "update" for m in model.descent_layers())
    with pytest.raises(ValueError, match="adaptive_rule"):
        model.set_inference(Inference(adaptive_tol=1e-2, adaptive_rule="kl"))


@pytest.mark.parametrize(
    "field,bad",
    [("steps", 0), ("steps", 257), ("attn_steps", 1.5), ("mlp_steps", True), ("adaptive_tol", -1e-3), ("adaptive_tol", float("nan")),
     ("adaptive_rule", "kl"), ("guard", -1), ("guard", 65)],
)
def test_inference_is_checked_once_with_one_set_of_bounds(field, bad):
    """`Inference` refuses a bad setting, naming it, and is the one value `set_inference`, `test_time` and
    `generate` take; a model's config (its flat keys) and the layers' T refuse the same values with the same
    words (one set of bounds)."""
    with pytest.raises(ValueError, match=field) as made:
        Inference(**{field: bad})
    model = LanguageModel(model_config("micro", "cem", vocab_size=32))
    layer = model.descent_layers()[0]
    elsewhere = [lambda: model_config("micro", "cem", **{field: bad})] if field != "steps" else [lambda: setattr(layer, field, bad)]
    for call in elsewhere:
        with pytest.raises(ValueError, match=field) as raised:
            call()
        assert str(raised.value) == str(made.value)
    for call in (lambda: model.set_inference({field: bad}), lambda: model.test_time({field: bad}).__enter__(),
                 lambda: layer.test_time({field: bad}).__enter__()):
        with pytest.raises(ValueError, match="must be an Inference"):
            call()
    assert {(m.steps, m.inference) for m in model.descent_layers()} == {(1, Inference().options())}


def test_inference_value():
    """Frozen; `depth` is a sublayer kind's own T before `steps`; `changed` takes what another gives (None keeps);
    `options` is the options exactly as given, without depths (what a layer and a config hold)."""
    import dataclasses

    both = Inference(steps=3, mlp_steps=5, guard=2)
    assert (both.depth("attn"), both.depth("mlp"), Inference().depth("attn")) == (3, 5, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        both.steps = 4
    assert both.changed(Inference(guard=0, attn_steps=1)) == Inference(steps=3, attn_steps=1, mlp_steps=5, guard=0) and both.guard == 2
    assert both.options() == Inference(adaptive_rule="energy", guard=2)
    assert Inference().options() == Inference(adaptive_tol=None, adaptive_rule="energy", guard=0)


def test_inference_reaches_every_layer_unchanged():
    """`test_time` and `generate` pass one `Inference` to every CEM layer, which runs at its settings inside
    the block and has its own back afterwards."""
    model = LanguageModel(model_config("micro", "cem", vocab_size=32, mlp_steps=2)).eval()
    inference = Inference(steps=3, mlp_steps=4, adaptive_tol=1e-2, adaptive_rule="update", guard=2)
    with model.test_time(inference):
        options = Inference(adaptive_tol=1e-2, adaptive_rule="update", guard=2)
        assert [(m.steps, m.inference) for m in model.descent_layers()] == [(3, options), (4, options)] * 2
    assert [m.steps for m in model.descent_layers()] == [1, 2] * 2 and {m.inference.guard for m in model.descent_layers()} == {0}
    prompt = torch.tensor([1, 2, 3])
    with torch.no_grad():
        as_value = model.generate(prompt, 4, temperature=0, inference=inference)
        with model.test_time(inference):
            plain = model.generate(prompt, 4, temperature=0)
    assert torch.equal(as_value, plain)
    with pytest.raises(ValueError, match="must be an Inference"):
        model.generate(prompt, 4, inference={"steps": 3})


@pytest.mark.parametrize("kind", ["attention", "mlp"])
def test_second_difference_rule_stops_on_the_step_sizes_curvature(rand, kind, monkeypatch):
    """`adaptive_rule="second-difference"` (arXiv 2509.23314): position i's output is the plain recursion run for
    n_i steps, n_i the first step count n >= 3 with |s_{n-1} - 2 s_{n-2} + s_{n-3}| <= tol · ‖x^(n-1)‖, s_t =
    ‖x^(t+1) - x^(t)‖ (or T), computed here by hand from the plain recursions; no energy is computed."""
    T = 6
    layer = build(kind, rand, steps=T, step_size=0.3, schedule="geometric", decay=0.7)
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        xs = [h] + [plain(layer, h, t)[0] for t in range(1, T + 1)]
        s = [(b - a).norm(dim=-1) for a, b in zip(xs, xs[1:])]  # s_t, t = 0..T-1
        crit = {t: (s[t] - 2 * s[t - 1] + s[t - 2]).abs() / xs[t].norm(dim=-1) for t in range(2, T)}
        values = torch.stack([crit[t] for t in range(2, T - 1)]).flatten().sort().values
        tol = float(values[values.numel() // 2 - 1 : values.numel() // 2 + 1].mean())  # between two: no tie
        layer.set_inference(Inference(adaptive_tol=tol, adaptive_rule="second-difference"))
        monkeypatch.setattr(layer, "energy", lambda *a: pytest.fail("the rule computed an energy"))
        out = layer(h)
    steps = layer.last_steps_used
    assert steps.min() >= 3 and len(steps.unique()) > 1  # it needs three steps before it can fire
    for b in range(B):
        for i in range(J):
            n = int(steps[b, i])
            expected = next((t + 1 for t in range(2, T) if crit[t][b, i] <= tol), T)
            assert n == expected
            torch.testing.assert_close(out[b, i], xs[n][b, i], rtol=1e-12, atol=1e-12)
