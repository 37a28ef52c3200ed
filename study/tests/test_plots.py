"""The experiments' figures: each one drawn from rows of the shape its experiment's variants give at the cpu
scale (a control group with one point, several sizes, five seeds), so a figure cannot fail only after a
suite of many hours has trained its runs."""

from dataclasses import replace

import numpy as np
import pytest

from cem_study import EXPERIMENTS, get_scale
from cem_study.plots import plot_gains

ROWS_ONLY = ("fig2a", "fig2b", "fig2c", "fig2d", "fig3b", "fig3c", "fig4", "step-size", "positional", "readings")  # plots that read the rows alone


def rows_of(exp_id: str, seed: int = 0) -> tuple[list[dict], list[int]]:
    """Rows as `summarize` writes them, with random per-seed perplexities, for the experiment's cpu variants."""
    s = get_scale("cpu")
    s = replace(s, chosen_lrs=tuple((z, 4e-3) for z in s.sizes))
    exp, rng = EXPERIMENTS[exp_id], np.random.default_rng(seed)
    seeds = list(s.seeds_for(exp.seeds))
    rows = []
    for v in exp.variants(s):
        ppl = list(rng.uniform(3.0, 6.0, len(seeds)))
        rows.append({"label": v.label, "size": v.spec.size, "arch": v.spec.arch, **v.tags, "seeds": seeds,
                     "test_perplexity": float(np.mean(ppl)), "test_perplexity_per_seed": ppl,
                     "parameters": 1e5 * (1 + s.sizes.index(v.spec.size)) * rng.uniform(0.8, 1.2)})
    return rows, seeds


@pytest.mark.parametrize("exp_id", ROWS_ONLY)
def test_every_figure_draws_its_experiments_rows(exp_id, tmp_path):
    rows, seeds = rows_of(exp_id)
    path = tmp_path / f"{exp_id}.png"
    EXPERIMENTS[exp_id].plot({"rows": rows, "seeds": seeds}, exp_id, path)
    assert path.stat().st_size > 10_000


def test_gains_draw_a_group_with_its_one_step_point_only(tmp_path, monkeypatch):
    """fig3c and fig4's learned-step control has T=1 only: its point is drawn, and no line joins it; the CEM sublayer
    applied twice has its x2 point only, joined to the one pass it starts from (CEM T=1's point, drawn again there)."""
    import matplotlib.axes

    rows, seeds = rows_of("fig4")
    assert any(sum(r["group"] == g for r in rows) == 1 for g in {r["group"] for r in rows})
    joined = []
    real = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda self, *a, **k: joined.append(a) or real(self, *a, **k))
    plot_gains({"rows": rows, "seeds": seeds}, "fig4", tmp_path / "fig4.png")
    pairs = sum(sum(r["group"] == g for r in rows) == 2 for g in {r["group"] for r in rows})
    assert pairs == 3 and len(joined) == pairs + 1
    assert all(len(x) == len(y) == 2 for x, y in joined)
    one, twice = (next(r for r in rows if r["label"] == label) for label in ("CEM attention T=1", "CEM attention x2"))
    assert [y for _, y in joined].count([one["test_perplexity"], twice["test_perplexity"]]) == 1


def test_recursion_figures_draw_the_training_gap(tmp_path):
    """fig2c and fig2d add a panel of T=2's training loss minus T=1's through training when the summary has it."""
    rows, seeds = rows_of("fig2c")
    gap = {"a": "CEM attention T=2", "b": "CEM attention T=1", "seeds": seeds, "edges": [0, 100, 200, 300],
           "mean": [0.06, 0.01, 0.003], "low": [0.05, 0.008, 0.002], "high": [0.07, 0.012, 0.004]}
    plain, with_gap = tmp_path / "plain.png", tmp_path / "gap.png"
    EXPERIMENTS["fig2c"].plot({"rows": rows, "seeds": seeds}, "fig2c", plain)
    EXPERIMENTS["fig2c"].plot({"rows": rows, "seeds": seeds, "training_gap": [gap]}, "fig2c", with_gap)
    import matplotlib.image

    assert matplotlib.image.imread(with_gap).shape[1] > 1.5 * matplotlib.image.imread(plain).shape[1]  # two panels


def test_the_confirmations_lower_panels_cut_the_loss_axis_near_each_sizes_lowest_point(tmp_path, monkeypatch):
    """recipes-confirm: a panel per size of every T, and below it the same cut at ZOOM_NATS above the size's lowest
    loss (a curve's or the deeper Llama's), where differences of a few hundredths of a nat are read."""
    import matplotlib.pyplot as plt
    from cem_study.plots import ZOOM_NATS, plot_recipes_confirm

    rng, ts = np.random.default_rng(0), [1, 2, 3, 4, 8, 16]
    rows, curves, lowest = [], {}, {}
    for size, floor in (("cpu96", 1.3), ("cpu128", 1.1)):
        for label, tags, shape in (("fixed", {"steps": 2}, lambda t: floor + 0.1 + 0.5 * abs(t - 2)),
                                   ("recipe", {"steps": 3, "mean_depth": 2}, lambda t: floor + 0.12 + 0.01 * abs(t - 2))):
            rows.append({"label": f"{label} {size}", "size": size, **tags})
            curves[f"{label} {size}"] = [{"eval_steps": t, "test_loss_per_seed": list(shape(t) + rng.normal(0, 0.005, 3)),
                                          "test_perplexity_ci": {"n": 3}} for t in ts]
        rows.append({"label": f"deeper {size}", "size": size, "kind": "deeper"})
        curves[f"deeper {size}"] = [{"eval_steps": 1, "test_loss_per_seed": [floor] * 3, "test_perplexity_ci": {"n": 3}}]
        lowest[size] = min(sum(r["test_loss_per_seed"]) / 3 for label in curves if label.endswith(f" {size}") for r in curves[label])
    drawn = []
    real = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: drawn.append(real(*a, **k)) or drawn[-1])
    path = tmp_path / "confirm.png"
    plot_recipes_confirm({"scale": {"sizes": ["cpu96", "cpu128"]}, "rows": rows, "curves": curves}, "recipes-confirm", path)
    ((_, axes),) = drawn
    assert [axes[1, i].get_ylim() for i in range(2)] == [pytest.approx((lowest[z] - 0.02, lowest[z] + ZOOM_NATS)) for z in ("cpu96", "cpu128")]
    assert all(axes[0, i].get_ylim()[1] > 1.5 + lowest[z] for i, z in enumerate(("cpu96", "cpu128")))  # the upper panels show every T
    assert lowest["cpu128"] == 1.1 and path.stat().st_size > 10_000
