"""The scales (`cem_study.scales`): what a scale asks of the library's data layer."""

import pytest

from cem.data.tokenshards import find_shards


@pytest.mark.parametrize("size", ["86M", "162M"])
def test_the_paper_scale_trains_on_shards(size, tmp_path):
    """The `paper` scale's budgets are too large to hold in memory: its runs need prepared shards, and the
    error names the command whose token count covers the budget."""
    from cem_study.scales import get_scale
    from cem.training import load_run_config
    from cem.training.budget import hf_bytes_for_budget

    run = load_run_config(None, [], preset=size, **get_scale("paper").train_settings())
    t, budget = run.train, hf_bytes_for_budget(run)
    with pytest.raises(ValueError, match=f"cem data prepare {t.data} --tokenizer {t.tokenizer} --tokens") as info:
        find_shards(t.data, t.tokenizer, tmp_path, budget)
    suggested = int(float(str(info.value).split("--tokens ")[1].split()[0]))
    assert suggested >= 0.99 * budget / 4 and suggested <= 3.3e9  # the README's 3.3e9 covers every size


def test_the_gpu8_scale_trains_fig4s_alibi_quartet_at_cpu128_twice_as_deep_on_its_own_budget():
    """gpu8: the four position-matched variants of fig4 at cpu128-l8 (cpu128's width, 8 layers), three seeds each (12
    runs), every run on 20 tokens per parameter of its Llama-ALiBi x1 (embeddings and head included) with the paper's
    5% warm-up, at the fixed rate 2e-3 (no sweep: said in its limits) on WikiText-2 bytes."""
    import torch

    from cem.model import LanguageModel, model_config
    from cem.model.params import parameter_breakdown
    from cem.training.budget import Budget
    from cem_study.registry import FIG4_ALIBI, fig4_alibi_variants, fig4_variants
    from cem_study.scales import get_scale
    from cem_study.sweep import run_config

    s = get_scale("gpu8")
    deep, base = model_config("cpu128-l8", "llama-alibi"), model_config("cpu128", "llama-alibi")
    assert (deep.n_layers, base.n_layers) == (8, 4)
    assert {k: v for k, v in deep.flat_dict().items() if k != "n_layers"} == {k: v for k, v in base.flat_dict().items() if k != "n_layers"}
    variants = fig4_alibi_variants(s)
    assert [v.label for v in variants] == list(FIG4_ALIBI) and len(FIG4_ALIBI) == 4
    assert [v.spec for v in variants] == [v.spec for v in fig4_variants(s) if v.label in FIG4_ALIBI]  # fig4's own runs
    specs = [v.spec.with_seed(k) for v in variants for k in (v.seeds or s.seeds_for("recursion"))]
    assert len(set(specs)) == 12 and s.suite == ("fig4-alibi",) and (s.data, s.tokenizer) == ("wikitext-2", "byte")
    with torch.device("meta"):
        llama = LanguageModel(model_config("cpu128-l8", "llama-alibi", vocab_size=257, context=256))
    per_param = 20 * parameter_breakdown(llama)["total"]
    assert per_param == 33_472_000
    for spec in specs:
        run = run_config(spec, s, None)
        budget = Budget.of(run.train, run.model(), run.train.seq_len)
        assert (budget.tokens, budget.steps, run.train.lr, run.train.warmup_frac) == (per_param, 2043, 2e-3, 0.05)
    assert "NO LEARNING-RATE SWEEP" in s.limits and "2e-3" in s.limits
