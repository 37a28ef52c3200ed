"""The test-time recipes (issue 64): the screening scale, the recipes' variants, and the study end to end at the
smoke scale (the test-time study with the recipes' exit rules, the choice on validation, the plot)."""

import pytest

from cem_study import EXPERIMENTS, get_scale, run_experiment
from cem_study.analysis import EXIT_RULES_STUDIED, RECIPE_RULES, depth_product, valid_curve_product
from cem_study.runner import _specs
from cem_study.sweep import run_config


def test_the_screening_trains_every_run_at_the_cpu_campaigns_cpu64_rate_without_a_sweep():
    s = get_scale("screen64")
    assert not s.lr_sweep and s.suite == ("recipes",) and s.base == "cpu64" and s.seeds_for("recursion") == (0, 2, 3)
    assert s.train_for("cpu64") == {"lr": 8e-3} and get_scale("cpu").train_for  # the rate is the cpu campaign's choice
    specs = _specs("recipes", s)
    assert len(specs) == 7 * 3 and all(dict(x.train)["lr"] == 8e-3 for x in specs)
    assert "0.008" in s.limits and "not swept" in s.limits


def test_every_recipe_is_a_valid_config_that_differs_from_the_baseline_only_in_its_recipe():
    s = get_scale("screen64")
    variants = EXPERIMENTS["recipes"].variants(s)
    (baseline,) = [v for v in variants if v.tags.get("baseline")]
    models = {v.label: run_config(v.spec.with_seed(0), s, None).model(256) for v in variants}
    assert len({repr(m) for m in models.values()}) == len(models)  # no two recipes are the same model
    for v in variants:
        m = round(v.tags["mean_depth"])
        assert {m, 2 * m} <= set(s.eval_steps), v.label  # the test-time question is evaluable at this scale
        assert v.spec.size == baseline.spec.size and v.spec.arch == baseline.spec.arch == "cem"


def test_the_recipes_depth_study_has_its_own_file_and_the_test_time_study_keeps_its_name():
    s = get_scale("screen64")
    v = EXPERIMENTS["recipes"].variants(s)[0]
    plain, recipes = depth_product(s, v), depth_product(s, v, RECIPE_RULES)
    assert plain.name == "depth_study_1_2_3_4_6_8_12_16_32.json" and "rules" not in dict(plain.kwargs)
    assert recipes.name != plain.name and "second-difference0.01" in recipes.name and dict(recipes.kwargs)["rules"] == RECIPE_RULES
    assert RECIPE_RULES[: len(EXIT_RULES_STUDIED)] == EXIT_RULES_STUDIED
    assert valid_curve_product(s, v).name == "valid_curve_1_2_3_4_6_8_12_16_32.json"


@pytest.mark.slow
def test_the_recipes_study_end_to_end(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    scale = dict(data=str(corpus), seeds=(0,), recursion_seeds=(0, 1), eval_steps=(1, 2, 3, 4))
    out = run_experiment("recipes", "smoke", tmp_path / "res", **scale)
    labels = [v.label for v in EXPERIMENTS["recipes"].variants(get_scale("smoke", **scale))]
    assert set(out["curves"]) == set(labels)
    rules = {f"{rule} rule, tol {tol:g}" for rule, tol in RECIPE_RULES}
    assert {k.split(", ", 1)[0] for k in out["adaptive"]} and all(any(k.endswith(r) for r in rules) for k in out["adaptive"])
    choice = out["choice"]  # ranked on validation at 2m; the curriculum (m = 4) and T~PLN(3) (m = 3) are not evaluable at T <= 4
    ranked = [r["label"] for r in choice["ranked_on_valid_at_2m"]]
    assert "full CEM trained T=2" not in ranked and "full CEM, curriculum T=1→2→4" not in ranked and len(ranked) == 3  # nor T~PLN(3) (m = 3), nor middle (2 layers)
    assert [r["valid_loss_at_2m"] for r in choice["ranked_on_valid_at_2m"]] == sorted(r["valid_loss_at_2m"] for r in choice["ranked_on_valid_at_2m"])
    assert choice["confirm"] == ranked[:2] and choice["best"]["label"] == ranked[0]
    best = choice["best"]
    assert best["T"] == min(choice["valid_curves"][best["label"]], key=lambda r: r["valid_loss"])["eval_steps"]
    claims = [f["claim"] for f in out["findings"]]
    assert any(c.startswith(f"(ours) the recipe chosen on validation, {ranked[0]}") for c in claims)
    assert all(f["family"] == "ours" for f in out["findings"])
    assert (tmp_path / "res" / "recipes" / "recipes.png").exists()
