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
