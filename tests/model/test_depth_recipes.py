"""The training-depth recipes of a model (issue 64): random deep supervision with its monotonicity term
against autograd on an objective written here, the depth curriculum's schedule, and recursion in the middle
blocks only (`recur_layers`), at training, at test time, with the cache and in generation."""

import pytest
import torch

from cem.layers import Inference
from cem.layers.steps import curriculum_depth, draw_supervised_depths
from cem.model import LanguageModel, model_config
from cem.model.flops import forward_flops_per_token
from cem.model.loss import deep_supervision_loss

V = 32


def supervised(K, mu, **kw):
    return model_config("micro", "cem", vocab_size=V, train_depth="model", train_depth_max=3, supervise_depths=K,
                        monotonicity_weight=mu, **kw)


def test_deep_supervision_gradient_equals_autograd_on_the_objective_by_hand():
    """K = train_depth_max = 3 supervises every depth 1, 2, 3: the model's objective and its gradient equal those of
    (1/3) Σ_T L(T) + μ Σ_T max(0, L(T+1) - L(T)), each L(T) a plain model run at T by hand (float64 weights)."""
    mu = 2.0
    cfg = supervised(3, mu, step_gate=True, mlp_step_size=2.0)
    ids, targets = torch.randint(0, V, (2, 2, 9), generator=torch.Generator().manual_seed(1))
    model = LanguageModel(cfg, init_seed=2).double().train()  # a seed whose loss falls from T = 1 to 2, then rises
    by_hand = LanguageModel(cfg.replace(supervise_depths=0, monotonicity_weight=0.0, train_depth="fixed"), init_seed=2).double().train()
    by_hand.load_state_dict(model.state_dict())
    objective = model(ids, targets)
    objective.backward()
    losses = []
    for T in (1, 2, 3):
        with by_hand.test_time(Inference(steps=T)):
            losses.append(by_hand(ids, targets))
    rises = [losses[k + 1] - losses[k] for k in range(2)]
    assert any(r > 0 for r in rises) and any(r < 0 for r in rises)  # both branches of max(0, ·) are taken
    reference = sum(losses) / 3 + mu * sum(r for r in rises if r > 0)
    reference.backward()
    torch.testing.assert_close(objective, reference, rtol=1e-12, atol=1e-12)
    for (name, p), q in zip(model.named_parameters(), by_hand.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=name)
    model.eval()  # evaluation: the plain loss at each layer's own T
    with torch.no_grad():
        torch.testing.assert_close(model(ids, targets), by_hand.eval()(ids, targets))


def test_one_supervised_depth_without_monotonicity_is_the_plain_loss_at_the_deepest():
    cfg = supervised(1, 0.0)
    ids, targets = torch.randint(0, V, (2, 2, 9))
    model = LanguageModel(cfg, init_seed=0).double()
    plain = LanguageModel(cfg.replace(supervise_depths=0, train_depth="fixed"), init_seed=0).double()
    with plain.test_time(Inference(steps=3)):
        torch.testing.assert_close(model(ids, targets), plain(ids, targets), rtol=0, atol=0)
    assert deep_supervision_loss(torch.tensor([2.0, 3.0, 1.0]), 0.5) == pytest.approx(2.0 + 0.5)


def test_supervised_depths_are_distinct_end_at_the_deepest_and_follow_the_seed():
    torch.manual_seed(0)
    draws = [draw_supervised_depths(3, 6) for _ in range(200)]
    assert all(len(set(d)) == 3 and d == sorted(d) and d[-1] == 6 and d[0] >= 1 for d in draws)
    assert {x for d in draws for x in d} == set(range(1, 7))
    torch.manual_seed(4)
    first = draw_supervised_depths(3, 6)
    torch.manual_seed(4)
    assert draw_supervised_depths(3, 6) == first
    assert draw_supervised_depths(4, 4) == [1, 2, 3, 4]


CURRICULUM = {  # (curriculum, total steps) -> T of steps 0, 1, ..., total - 1
    ((1, 2, 4), 6): [1, 1, 2, 2, 4, 4],
    ((1, 2, 4), 7): [1, 1, 1, 2, 2, 4, 4],
    ((1, 2, 4), 2): [1, 2],
    ((3,), 3): [3, 3, 3],
    ((1, 2), 5): [1, 1, 1, 2, 2],
}


@pytest.mark.parametrize("curriculum,total", sorted(CURRICULUM))
def test_curriculum_schedule_against_its_table(curriculum, total):
    assert [curriculum_depth(curriculum, step, total) for step in range(total)] == CURRICULUM[curriculum, total]
    assert curriculum_depth(curriculum, total + 3, total) == curriculum[-1]  # an extended run stays at the last


def test_model_follows_the_curriculum_at_its_training_progress():
    cfg = model_config("micro", "cem", vocab_size=V, train_depth="curriculum", train_depth_curriculum=(1, 2, 4), step_schedule="learned")
    model = LanguageModel(cfg)
    assert all(m.eta.step_gains.numel() == 4 for m in model.descent_layers())  # a gain per step of the deepest T
    ids = torch.randint(0, V, (1, 5))
    with pytest.raises(ValueError, match="set_training_progress"):
        model(ids)
    for step, T in enumerate([1, 1, 2, 2, 4, 4]):
        model.set_training_progress(step, 6)
        model(ids)
        assert [m.depth() for m in model.descent_layers()] == [T] * 4
    model.eval()
    assert [m.depth() for m in model.descent_layers()] == [1] * 4  # evaluation: each layer's own T


def middle(**kw):
    return model_config("micro", "cem", vocab_size=V, n_layers=4, recur_layers="middle", **kw)


def test_middle_recursion_keeps_the_first_and_last_blocks_at_one_step():
    """recur_layers=middle: blocks 1..n-2 recurse; the first and last keep T = 1 when built, at test time
    (`set_inference`, `test_time`) and in random-depth training; the full forward is that of a model where those
    layers are set to T = 1 by hand."""
    cfg = middle(attn_steps=3, mlp_steps=3, train_depth="model", train_depth_max=4)
    model = LanguageModel(cfg, init_seed=0).double()
    by_depth = lambda: [[m.depth() for m in b.modules() if hasattr(m, "recurs")] for b in model.blocks]
    model.eval()
    assert by_depth() == [[1, 1], [3, 3], [3, 3], [1, 1]]
    reference = LanguageModel(cfg.replace(recur_layers="all"), init_seed=0).double().eval()
    for i in (0, 3):
        for m in reference.blocks[i].modules():
            if hasattr(m, "recurs"):
                m.steps = 1
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids), rtol=0, atol=0)
        with model.test_time(Inference(steps=5)):
            assert by_depth() == [[1, 1], [5, 5], [5, 5], [1, 1]]
        model.set_inference(Inference(attn_steps=2))
        assert by_depth() == [[1, 1], [2, 3], [2, 3], [1, 1]]
    assert model.current_config() == cfg.at(Inference(attn_steps=2))  # the recursing layers' T
    model.train()
    for _ in range(10):
        model(ids)
        rows = by_depth()
        assert rows[0] == rows[-1] == [1, 1] and len({T for row in rows[1:-1] for T in row}) == 1


def test_middle_recursion_generates_as_the_full_forward_and_counts_its_flops():
    model = LanguageModel(middle(step_gate=True), init_seed=0).double().eval()
    prompt = torch.randint(0, V, (2, 4))
    inference = Inference(steps=3)
    out = model.generate(prompt, 5, temperature=0, inference=inference)
    ids = prompt
    with torch.no_grad(), model.test_time(inference):
        for _ in range(5):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)
    per_block = lambda c: (forward_flops_per_token(c) - 2 * c.dim * c.vocab_size) // c.n_layers
    at = lambda T, layers: middle().at(Inference(steps=T)).replace(recur_layers=layers)
    assert forward_flops_per_token(at(3, "middle")) == 2 * per_block(at(3, "all")) + 2 * per_block(at(1, "all")) + 2 * 48 * V


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(supervise_depths=2), "supervise_depths=2 .* train_depth=model"),
        (dict(supervise_depths=4, train_depth="model", train_depth_max=3), "supervise_depths=4 is more than"),
        (dict(supervise_depths=2, train_depth="model", train_depth_dist="poisson-lognormal"), "train_depth_dist=uniform"),
        (dict(supervise_depths=-1, train_depth="model"), "supervise_depths must be an integer >= 0"),
        (dict(supervise_depths=True, train_depth="model"), "supervise_depths must be an integer"),
        (dict(monotonicity_weight=0.5, supervise_depths=1, train_depth="model"), "monotonicity_weight=0.5 .* supervise_depths >= 2"),
        (dict(monotonicity_weight=-1.0, supervise_depths=2, train_depth="model"), "monotonicity_weight must be"),
        (dict(train_depth_curriculum=(1, 2)), "train_depth_curriculum=.* does nothing with train_depth=fixed"),
        (dict(train_depth="curriculum", train_depth_curriculum=()), "train_depth_curriculum must be a non-empty"),
        (dict(train_depth="curriculum", train_depth_curriculum=(1, 0)), "train_depth_curriculum must be an integer >= 1"),
        (dict(train_depth="curriculum", train_depth_curriculum=(1, 1000)), "train_depth_curriculum must be"),
        (dict(recur_layers="ends"), "recur_layers"),
        (dict(recur_layers="middle"), "recur_layers=middle leaves no block of 2"),
        (dict(step_gate="yes"), "step_gate must be true or false"),
        (dict(adaptive_rule="second"), "adaptive_rule"),
    ],
)
def test_bad_recipe_settings(bad, match):
    with pytest.raises(ValueError, match=match):
        model_config("micro", "cem", **bad)


@pytest.mark.parametrize("bad", [dict(recur_layers="middle", n_layers=4), dict(supervise_depths=1, train_depth="model"),
                                 dict(train_depth="curriculum"), dict(step_gate=True)])
def test_recipes_are_refused_without_a_cem_sublayer(bad):
    with pytest.raises(ValueError, match="does nothing"):
        model_config("micro", "llama", **bad)
