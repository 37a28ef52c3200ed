"""The recursion options against independent references (float64): step-size schedules, the start point
x^(0) = RMSNorm(h) of Algorithm 1 read literally, App. A's ALiBi slopes, random-depth training, and the
training options for test-time compute (heavy-tailed depths, truncated backpropagation, the fixed-point
penalty, the anchor)."""

from dataclasses import replace

import pytest
import torch

from cem.layers import CEMMLP, CEMAttention
from cem.layers.position import alibi_slopes
from cem.layers.steps import Inference, Recursion, StepSize
from cem.model import LanguageModel, model_config
from cem_reference import attention_head_energies, mlp_energy, precond_dense, rms_norm

B, J, D, K, M = 2, 6, 24, 3, 20


def reference_direction(layer, x, h):
    """-Σ_k P_k ∇_u ε_k (attention) or -P ∇_u ξ (MLP) at u = norm(x), by autograd on the reference energy."""
    u = rms_norm(x, layer.norm.weight, layer.norm.eps).detach().requires_grad_(True)
    if isinstance(layer, CEMAttention):
        energies = list(attention_head_energies(layer, u, h))
    else:
        energies = [mlp_energy(layer, u, h)]
    out = torch.zeros_like(h)
    for k, e in enumerate(energies):
        (g,) = torch.autograd.grad(e.sum(), u, retain_graph=True)
        if layer.precond is not None:
            g = g @ precond_dense(layer.precond, k).T
        out = out - g
    return out


def reference_recursion(layer, h, etas, start):
    """x^(0) = h or RMSNorm(h); x^(t+1) = x^(t) + η_t (-P ∇ε)(norm(x^(t)))."""
    x = h if start == "residual" else rms_norm(h, layer.norm.weight, layer.norm.eps)
    for eta in etas:
        x = x + eta * reference_direction(layer, x, h)
    return x.detach()


def build(kind, rand, **kw):
    if kind == "attention":
        layer = CEMAttention(D, K, kq_diag="none", exact_gradient=False, **kw)
    else:
        layer = CEMMLP(D, M, **kw)
    return rand(layer.double(), seed=7)


@pytest.mark.parametrize("kind", ["attention", "mlp"])
@pytest.mark.parametrize("start", ["residual", "norm"])
@pytest.mark.parametrize("schedule", ["constant", "inverse", "learned", "geometric"])
def test_recursion_equals_reference(rand, kind, start, schedule):
    layer = build(kind, rand, recursion=Recursion(steps=3, step_size=0.8, schedule=schedule, start=start), precond="diag")
    if schedule == "learned":
        with torch.no_grad():
            layer.eta.step_gains.copy_(torch.tensor([1.2, 0.5, 0.9], dtype=torch.float64))
    etas = {"constant": [0.8] * 3, "inverse": [0.8 / 3] * 3, "learned": [0.8 * 1.2, 0.8 * 0.5, 0.8 * 0.9],
            "geometric": [0.8, 0.4, 0.2]}[schedule]
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        out = layer(h)
    torch.testing.assert_close(out, reference_recursion(layer, h, etas, start), rtol=1e-10, atol=1e-10)


def test_norm_start_drops_the_raw_residual(rand):
    """With x^(0) = RMSNorm(h), a rescaled input gives the same output (RMSNorm is scale-invariant)."""
    layer = build("mlp", rand, recursion=Recursion(start="norm"))
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(h), layer(5 * h), rtol=1e-5, atol=1e-5)  # up to the norm eps
        assert not torch.allclose(build("mlp", rand)(h), build("mlp", rand)(5 * h), rtol=1e-3)


def test_learned_schedule_runs_beyond_its_trained_steps():
    eta = StepSize(Recursion(step_size=0.5, schedule="learned", learned_steps=2)).double()
    with torch.no_grad():
        eta.step_gains.copy_(torch.tensor([2.0, 3.0]))
    assert [float(eta(t, 5)) for t in range(5)] == [1.0, 1.5, 1.5, 1.5, 1.5]
    assert StepSize(Recursion(step_size=0.9, schedule="inverse"))(0, 3) == pytest.approx(0.3)
    assert StepSize(Recursion(step_size=0.9))(2, 3) == 0.9
    geometric = StepSize(Recursion(step_size=0.9, schedule="geometric", decay=0.25))
    assert [geometric(t, 7) for t in range(3)] == [0.9, 0.225, 0.05625]  # the same steps whatever T
    assert geometric(2, 3) == geometric(2, 16)


def test_path_length_sums_the_step_sizes():
    """Σ_t η_t of a recursion of T steps, per schedule (the extra-steps study scales η by its ratios)."""
    assert StepSize(Recursion(step_size=0.5)).path_length(4) == 2.0
    assert [StepSize(Recursion(step_size=0.9, schedule="inverse")).path_length(t) for t in (1, 3)] == [pytest.approx(0.9)] * 2
    geometric = StepSize(Recursion(step_size=0.9, schedule="geometric", decay=0.5))
    assert geometric.path_length(4) == pytest.approx(0.9 * (1 - 0.5**4) / (1 - 0.5))
    learned = StepSize(Recursion(step_size=0.5, schedule="learned", learned_steps=2, learn_step_size=True))
    with torch.no_grad():
        learned.step_gains.copy_(torch.tensor([2.0, 3.0]))
        learned.gain.fill_(2.0)
    assert learned.path_length(3) == pytest.approx(2.0 * (1.0 + 1.5 + 1.5))


def test_app_a_slopes_and_energy(rand):
    torch.testing.assert_close(alibi_slopes(4, kind="app-a"), torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64))
    torch.testing.assert_close(alibi_slopes(8)[-1], torch.tensor(2.0**-8, dtype=torch.float64))
    layer = rand(CEMAttention(D, K, kq_diag="shared", exact_gradient=True, alibi="app-a").double(), seed=3)
    h, u = torch.randn(2, B, J, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer.energy(u, h), attention_head_energies(layer, u, h).sum(0))
        out = layer(h)
    torch.testing.assert_close(out, reference_recursion(layer, h, [1.0], "residual"), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="alibi"):
        CEMAttention(D, K, alibi="2^-k")


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(step_schedule="cosine"), "step_schedule"),
        (dict(start="zero"), "start"),
        (dict(learn_step_size=1), "learn_step_size"),
        (dict(step_decay=0.0), "step_decay"),
        (dict(step_decay=1.5), "step_decay"),
        (dict(backprop_steps=-1), "backprop_steps"),
        (dict(anchor_weight=-0.5), "anchor_weight"),
        (dict(anchor_weight=float("nan")), "anchor_weight"),
    ],
)
def test_bad_recursion_options(bad, match):
    """Recursion validates itself once, for the layers and for the config's sublayers."""
    name, value = next(iter(bad.items()))
    with pytest.raises(ValueError, match=match):
        Recursion(**{{"step_schedule": "schedule", "step_decay": "decay", "anchor_weight": "anchor"}.get(name, name): value})
    with pytest.raises(ValueError, match=match):
        model_config("micro", "cem", **bad)


def test_config_gives_one_recursion_per_sublayer():
    cfg = model_config("micro", "cem", attn_steps=2, mlp_steps=3, mlp_step_size=0.5, start="norm", step_schedule="learned",
                       learn_step_size=True, train_depth="layer", train_depth_max=4)
    assert cfg.attn.recursion == Recursion(2, 1.0, "learned", 4, "norm", True)
    assert cfg.mlp.recursion == Recursion(3, 0.5, "learned", 4, "norm", True)
    assert model_config("micro", "cem", mlp_steps=3, step_schedule="learned").mlp.recursion.learned_steps == 3  # fixed depth: T gains
    assert model_config("micro", "cem", mlp_steps=3).mlp.recursion.learned_steps is None  # no learned schedule: no gains
    assert model_config("micro", "cem", anchor_weight=0.5).attn.recursion.anchor == 0.5
    assert model_config("micro", "cem-attn", start="norm").attn.recursion.start == "norm"  # a shared key: the CEM sublayers
    with pytest.raises(ValueError, match="unknown model config key"):
        cfg.replace(head_steps=2)


@pytest.mark.parametrize("per", ["model", "layer"])
def test_random_depth_draws_in_training_only(per):
    cfg = model_config("micro", "cem", vocab_size=32, attn_steps=2, mlp_steps=2, train_depth=per, train_depth_max=4, step_schedule="learned")
    torch.manual_seed(0)
    model = LanguageModel(cfg)
    layers = model.descent_layers()
    assert all(m.eta.step_gains.numel() == 4 for m in layers)  # one learned gain per step up to the deepest T
    ids = torch.randint(0, 32, (2, 9))
    draws = []
    for _ in range(30):
        model(ids)
        draws.append(tuple(m.depth() for m in layers))
    assert {d for row in draws for d in row} == {1, 2, 3, 4}
    if per == "model":
        assert all(len(set(row)) == 1 for row in draws)
    else:
        assert any(len(set(row)) > 1 for row in draws)
    torch.manual_seed(5)  # the draws come from torch's generator: a resumed run redraws the same depths
    first = model.draw_depths()
    torch.manual_seed(5)
    assert model.draw_depths() == first
    model.eval()
    assert all(m.depth() == 2 for m in layers)
    with torch.no_grad():
        out = model(ids)
        model.set_inference(Inference(steps=2))
        torch.testing.assert_close(out, model(ids))


def test_fixed_depth_never_draws():
    model = LanguageModel(model_config("micro", "cem", vocab_size=32, attn_steps=2))
    model(torch.randint(0, 32, (1, 5)))
    assert all(m.drawn_steps is None and m.depth() == m.steps for m in model.descent_layers())


def test_layer_test_time_is_temporary(rand):
    layer = build("mlp", rand, recursion=Recursion(steps=2))
    h = torch.randn(B, J, D, dtype=torch.float64)
    with torch.no_grad():
        with layer.test_time(Inference(steps=3, guard=1), step_size=0.5) as same:
            assert same is layer and (layer.steps, layer.inference, layer.step_size) == (3, Inference(guard=1).options(), 0.5)
            out = layer(h)
        assert (layer.steps, layer.inference, layer.step_size) == (2, Inference().options(), 1.0)
        layer.set_inference(Inference(steps=3, guard=1))
        layer.step_size = 0.5
        torch.testing.assert_close(out, layer(h))
        layer.set_inference(Inference(steps=2))
        layer.step_size = 1.0
        assert not torch.allclose(out, layer(h))
        with pytest.raises(ValueError, match="step_size"), layer.test_time(Inference(steps=4), step_size=-1.0):
            pass
        with pytest.raises(ValueError, match="must be an Inference"), layer.test_time({"steps": 4}):
            pass
        with pytest.raises(ValueError, match="keeps its recursion's schedule"):
            layer.recursion = Recursion(steps=2, schedule="inverse")
    assert (layer.steps, layer.inference, layer.step_size) == (2, Inference().options(), 1.0)


def test_set_inference_on_a_users_own_model():
    """`cem.layers.set_inference` sets T on every CEM layer of any module, by kind, from one checked `Inference`."""
    import pydoc

    from torch import nn

    from cem.layers import CEMMLP, CEMAttention, set_inference

    class Mine(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Sequential(CEMAttention(16, 2), CEMMLP(16, 32)) for _ in range(2)])
            self.head = nn.Linear(16, 3)

    model = Mine()
    assert set_inference(model, Inference(steps=3)) == 4
    assert [m.steps for m in model.modules() if isinstance(m, (CEMAttention, CEMMLP))] == [3, 3, 3, 3]
    assert set_inference(model, Inference(steps=2, mlp_steps=5)) == 4
    assert [(type(m).__name__, m.steps) for m in model.modules() if isinstance(m, (CEMAttention, CEMMLP))] == [
        ("CEMAttention", 2), ("CEMMLP", 5), ("CEMAttention", 2), ("CEMMLP", 5)]
    set_inference(model, Inference(attn_steps=4))
    assert [m.steps for m in model.modules() if isinstance(m, (CEMAttention, CEMMLP))] == [4, 5, 4, 5]
    with pytest.raises(ValueError, match="mlp_steps"):
        set_inference(model, Inference(steps=1, mlp_steps=0))
    with pytest.raises(ValueError, match="must be an Inference"):
        set_inference(model, 3)
    assert [m.steps for m in model.modules() if isinstance(m, CEMMLP)] == [5, 5]  # nothing changed
    assert set_inference(nn.Linear(2, 2), Inference(steps=3)) == 0
    # the constructors' arguments are documented where help() looks
    for cls, words in ((CEMAttention, ("kq_diag", "backend", "n_heads")), (CEMMLP, ("hidden_dim", "energy"))):
        text = pydoc.render_doc(cls)
        assert "Initialize internal Module state" not in text and all(w in cls.__init__.__doc__ for w in words)
    assert "normalised" in CEMAttention.energy.__doc__ and "raw residual" in CEMAttention.energy.__doc__


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(train_depth_dist="zipf"), "train_depth_dist"),
        (dict(train_depth_dist="poisson-lognormal", train_depth_mean=5.0), "train_depth_mean"),  # above train_depth_max = 3
        (dict(train_depth_mean=0.5), "train_depth_mean"),
        (dict(backprop_steps=1.5), "backprop_steps"),
        (dict(fixed_point_weight=-0.1), "fixed_point_weight"),
        (dict(fixed_point_weight=float("inf")), "fixed_point_weight"),
        (dict(adaptive_rule="kl"), "adaptive_rule"),
    ],
)
def test_bad_depth_training_options(bad, match):
    with pytest.raises(ValueError, match=match):
        model_config("micro", "cem", **bad)


def test_poisson_lognormal_depths_are_heavy_tailed_with_the_asked_mean():
    """Huginn's draw: T = 1 + Poisson(e^τ), τ ~ N(log(m - 1) - σ²/2, σ²), so E[T] = m; capped at the maximum."""
    from cem.layers.steps import draw_depths

    torch.manual_seed(0)
    depths = torch.tensor(draw_depths("poisson-lognormal", 40_000, 256, 4.0), dtype=torch.float64)
    assert depths.min() >= 1 and abs(depths.mean().item() - 4.0) < 0.05
    poisson_var = 3.0  # 1 + Poisson(3) has variance 3; the log-normal rate makes the tail heavier
    assert depths.var().item() > 1.5 * poisson_var and (depths >= 12).float().mean() > 1e-3
    capped = draw_depths("poisson-lognormal", 5_000, 5, 4.0)
    assert max(capped) == 5 and min(capped) >= 1
    assert draw_depths("poisson-lognormal", 10, 8, 1.0) == [1] * 10
    torch.manual_seed(3)
    first = draw_depths("poisson-lognormal", 50, 16, 3.0)
    torch.manual_seed(3)
    assert draw_depths("poisson-lognormal", 50, 16, 3.0) == first  # torch's generator: a resumed run redraws them
    cfg = model_config("micro", "cem", vocab_size=32, attn_steps=3, mlp_steps=3, train_depth="layer",
                       train_depth_dist="poisson-lognormal", train_depth_max=8, train_depth_mean=3.0)
    model = LanguageModel(cfg)
    drawn = [d for _ in range(200) for d in model.draw_depths()]
    assert max(drawn) <= 8 and len(set(drawn)) >= 5 and abs(sum(drawn) / len(drawn) - 3.0) < 0.3


def truncated_reference(layer, h, steps, k):
    """x^(T) with only the last k steps differentiated and the first T - k read as the identity, written out
    with the layer's `direction` (not `descend`): x^(T-k) = c + h - stop_gradient(h), c from a no-grad run."""
    with torch.no_grad(), layer.test_time(Inference(steps=steps - k)):
        c = layer(h)
    if isinstance(layer, CEMAttention):
        _, keys, ctx, q_start = layer.context(h)
        direction = lambda u: layer.direction(u, keys, ctx, q_start)  # noqa: E731
    else:
        gamma = layer.w_gate(layer.norm(h))
        direction = lambda u: layer.direction(u, gamma)  # noqa: E731
    x = c + h - h.detach()
    for t in range(steps - k, steps):
        x = x + layer.eta(t, steps) * direction(layer.norm(x))
    return x


@pytest.mark.parametrize("kind", ["attention", "mlp"])
@pytest.mark.parametrize("schedule", ["constant", "geometric"])
def test_truncated_backprop_value_gradients_and_memory(rand, kind, schedule):
    """`backprop_steps` = k: the output is the full recursion's; the gradients (parameters and input) are
    those of the last k steps with the skipped steps read as the identity; the graph holds k steps' tensors
    whatever T."""
    T, k = 5, 2
    h = torch.randn(B, J, D, dtype=torch.float64, requires_grad=True)
    w = torch.randn(B, J, D, dtype=torch.float64)
    full = build(kind, rand, recursion=Recursion(steps=T, step_size=0.7, schedule=schedule), precond="diag")
    layer = build(kind, rand, recursion=Recursion(steps=T, step_size=0.7, schedule=schedule, backprop_steps=k), precond="diag")
    out = layer(h)
    torch.testing.assert_close(out, full(h), rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad((out * w).sum(), [h, *layer.parameters()])
    ref = torch.autograd.grad((truncated_reference(layer, h, T, k) * w).sum(), [h, *layer.parameters()])
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    untruncated = torch.autograd.grad((full(h) * w).sum(), [h, *full.parameters()])
    assert any(not torch.allclose(a, b) for a, b in zip(grads, untruncated))  # it does truncate

    def saved(m, steps):
        count = [0]

        def pack(t):
            count[0] += t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), m.test_time(Inference(steps=steps)):
            m(h)
        return count[0]

    # the memory of k steps whatever T (plus one norm: with T > k the first kept step does not start at ĥ)
    assert saved(layer, k + 1) == saved(layer, T) == saved(layer, 8) < saved(full, T)
    assert saved(layer, 8) - saved(layer, k) < saved(full, k + 1) - saved(full, k)
    with torch.no_grad():
        torch.testing.assert_close(layer(h), full(h), rtol=1e-12, atol=1e-12)  # no-grad / eval: the plain loop


@pytest.mark.parametrize("kind", ["attention", "mlp"])
def test_fixed_point_residual_is_the_next_steps_relative_size(rand, kind):
    """r = mean_i ‖η_T d(u_i^(T))‖² / ‖x_i^(T)‖², d by autograd on the layer's energy (independent of `direction`)."""
    T = 2
    layer = build(kind, rand, recursion=Recursion(steps=T, step_size=0.6, schedule="geometric", decay=0.5))
    layer.train()
    layer.track_fixed_point = True
    h = torch.randn(B, J, D, dtype=torch.float64)
    x = layer(h)
    nxt = 0.6 * 0.5**T * reference_direction(layer, x.detach(), h)
    expected = (nxt.pow(2).sum(-1) / x.detach().pow(2).sum(-1)).mean()
    torch.testing.assert_close(layer.fixed_point_residual.detach(), expected, rtol=1e-10, atol=1e-14)
    (g,) = torch.autograd.grad(layer.fixed_point_residual, [layer.w_up.weight if kind == "mlp" else layer.w_k.weight])
    assert g.abs().max() > 0  # the penalty trains the layer
    layer.fixed_point_residual = None
    with torch.no_grad():
        layer(h)
    layer.eval()
    layer(h)
    assert layer.fixed_point_residual is None  # only training forwards that record gradients compute it


def test_model_objective_adds_the_fixed_point_penalty():
    lam = 0.5
    cfg = model_config("micro", "cem", vocab_size=32, attn_steps=2, mlp_steps=2, fixed_point_weight=lam)
    torch.manual_seed(0)
    model = LanguageModel(cfg, init_seed=0).double()
    ids, targets = torch.randint(0, 32, (2, 2, 9))
    objective = model(ids, targets)
    penalty = model.fixed_point_penalty()
    assert penalty > 0 and len([m for m in model.descent_layers() if m.fixed_point_residual is not None]) == 4
    with torch.no_grad():
        plain = model(ids, targets)  # no gradients: the loss alone
        torch.testing.assert_close(objective, plain + lam * penalty, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(model(ids, targets, reduction="none").mean(), plain, rtol=1e-6, atol=0)  # float32 loss
    model.eval()
    torch.testing.assert_close(model(ids, targets), plain, rtol=1e-12, atol=1e-12)
    off = LanguageModel(cfg.replace(fixed_point_weight=0.0), init_seed=0).double()
    assert not any(m.track_fixed_point for m in off.descent_layers())
    with pytest.raises(RuntimeError, match="fixed_point_weight"):
        off.fixed_point_penalty()


def anchored_reference(layer, h, etas, lam):
    """x^(0) = h; x^(t+1) = x^(t) + η_t ((-P ∇ε)(norm(x^(t))) - λ (x^(t) - h))."""
    x = h
    for eta in etas:
        x = x + eta * (reference_direction(layer, x, h) - lam * (x - h))
    return x.detach()


@pytest.mark.parametrize("kind", ["attention", "mlp"])
def test_anchor_pulls_every_step_back_to_the_start(rand, kind):
    """`anchor` = λ: the recursion equals the reference, on every path that takes its steps (plain, checkpointed,
    truncated backprop, the checked loop of the inference options); T = 1 is the plain layer's."""
    T, eta, lam = 3, 0.8, 0.7
    layer = build(kind, rand, recursion=Recursion(steps=T, step_size=eta, anchor=lam), precond="diag")
    h = torch.randn(B, J, D, dtype=torch.float64)
    expected = anchored_reference(layer, h, [eta] * T, lam)
    with torch.no_grad():
        torch.testing.assert_close(layer(h), expected, rtol=1e-10, atol=1e-10)
        plain = build(kind, rand, recursion=Recursion(steps=T, step_size=eta), precond="diag")
        assert not torch.allclose(plain(h), expected, rtol=1e-3)
        with layer.test_time(Inference(steps=1)), plain.test_time(Inference(steps=1)):
            torch.testing.assert_close(layer(h), plain(h), rtol=0, atol=0)  # the first step starts at x^(0): no pull
        with layer.test_time(Inference(adaptive_tol=0.0, adaptive_rule="update")):  # the checked loop, never stopping
            torch.testing.assert_close(layer(h), expected, rtol=1e-10, atol=1e-10)
    layer.train()
    layer.checkpoint_steps = True
    torch.testing.assert_close(layer(h.requires_grad_(True)).detach(), expected, rtol=1e-10, atol=1e-10)
    layer.checkpoint_steps, layer.recursion = False, replace(layer.recursion, backprop_steps=1)
    torch.testing.assert_close(layer(h).detach(), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["attention", "mlp"])
def test_anchored_guard_never_raises_the_anchored_objective(rand, kind):
    """With an anchor the guarded steps descend E(norm(x)) + λ/2 ‖x - x^(0)‖², position by position."""
    lam = 0.5
    layer = build(kind, rand, recursion=Recursion(steps=1, step_size=4.0, anchor=lam))
    h = torch.randn(B, J, D, dtype=torch.float64)

    def path(guard):
        out = []
        for T in range(1, 7):
            with layer.test_time(Inference(steps=T, guard=guard)):
                x = layer(h)
            out.append(layer.energy(layer.norm(x), h) + 0.5 * lam * (x - h).pow(2).sum(-1))
        return torch.stack([layer.energy(layer.norm(h), h)] + out)

    with torch.no_grad():
        guarded, plain = path(8), path(0)
    assert (guarded[1:] <= guarded[:-1] + 1e-12).all()
    assert (plain[1:] > plain[:-1]).any()  # the plain steps of this size do raise it: the guard acted


@pytest.mark.parametrize("kind", ["attention", "mlp"])
def test_anchor_bounds_the_drift_the_plain_recursion_has(rand, kind):
    """Without an anchor, once u = norm(x) settles the steps keep adding d(u), so x moves away from h about
    linearly in T; with an anchor the recursion settles at a fixed point a bounded distance from h."""
    h = torch.randn(B, J, D, dtype=torch.float64)

    def drift(lam, T):
        layer = build(kind, rand, recursion=Recursion(steps=T, anchor=lam))
        with torch.no_grad():
            return (layer(h) - h).norm(dim=-1).mean().item()

    assert drift(0.0, 256) > 1.9 * drift(0.0, 128) > 1.9**2 * drift(0.0, 64)
    for lam in (0.5, 1.0):
        assert abs(drift(lam, 256) - drift(lam, 128)) < 0.01 * drift(lam, 128) < drift(0.0, 128) / 10


def gated_reference(layer, h, etas, lam=0.0):
    """x^(0) = h; x^(t+1) = x^(t) + σ(w · u^(t) + b) η_t ((-P ∇ε)(u^(t)) - λ (x^(t) - h)), u^(t) = norm(x^(t))."""
    x = h
    for eta in etas:
        u = rms_norm(x, layer.norm.weight, layer.norm.eps)
        g = torch.sigmoid((u * layer.gate.w).sum(-1, keepdim=True) + layer.gate.b)
        x = x + g * eta * (reference_direction(layer, x, h) - lam * (x - h))
    return x.detach()


@pytest.mark.parametrize("kind", ["attention", "mlp"])
def test_step_gate_equals_reference_and_its_limits(rand, kind):
    """`gate`: x^(t+1) = x^(t) + g(u^(t)) η_t d(u^(t)) against the reference (with and without an anchor, on the
    plain and the checked loop); g forced to 0 is no step (x = h), g forced to 1 the plain layer's step."""
    T, eta = 3, 0.8
    h = torch.randn(B, J, D, dtype=torch.float64)
    for lam in (0.0, 0.7):
        layer = build(kind, rand, recursion=Recursion(steps=T, step_size=eta, anchor=lam, gate=True), precond="diag")
        expected = gated_reference(layer, h, [eta] * T, lam)
        with torch.no_grad():
            torch.testing.assert_close(layer(h), expected, rtol=1e-10, atol=1e-10)
            with layer.test_time(Inference(adaptive_tol=0.0, adaptive_rule="update")):  # the checked loop, never stopping
                torch.testing.assert_close(layer(h), expected, rtol=1e-10, atol=1e-10)
    plain = build(kind, rand, recursion=Recursion(steps=T, step_size=eta), precond="diag")
    gated = build(kind, rand, recursion=Recursion(steps=T, step_size=eta, gate=True), precond="diag")
    missing = gated.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["gate.b", "gate.w"]
    with torch.no_grad():
        gated.gate.b.fill_(float("-inf"))
        torch.testing.assert_close(gated(h), h, rtol=0, atol=0)
        gated.gate.b.fill_(float("inf"))
        torch.testing.assert_close(gated(h), plain(h), rtol=0, atol=0)


def test_step_gate_starts_near_one_and_is_kept_by_a_built_layer():
    """The gate starts at w = 0, b = +3 (g = σ(3) for every u), also in a model whose weights are drawn from a
    seed; a built layer keeps whether it has a gate (its parameters are made for it)."""
    model = LanguageModel(model_config("micro", "cem", step_gate=True), init_seed=0)
    gates = [m.gate for m in model.descent_layers()]
    assert len(gates) == 4 and all(bool((g.w == 0).all()) and float(g.b.detach()) == 3.0 for g in gates)
    u = torch.randn(2, 3, 48)
    torch.testing.assert_close(gates[0](u), torch.full((2, 3, 1), torch.sigmoid(torch.tensor(3.0)).item()))
    with pytest.raises(ValueError, match="gate"):
        model.descent_layers()[0].recursion = replace(model.descent_layers()[0].recursion, gate=False)
    with pytest.raises(ValueError, match="step_gate must be true or false"):
        Recursion(gate=1)
