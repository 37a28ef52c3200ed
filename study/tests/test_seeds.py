"""A recursion experiment's T=1/T=2 pair adds seeds where its first seeds do not resolve half their observed
validation difference (`cem_study.seeds`): decided on validation, from finished runs only, on the
scale's processor; the runner trains the added seeds and the plan counts them."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cem_study import get_scale, seeds
from cem_study.records import RunTable
from cem_study.registry import EXPERIMENTS
from cem_study.runner import _runs, plan
from cem.io import atomic_write_json

REPO = Path(__file__).resolve().parents[2]


def _scale(**kw):
    return replace(get_scale("smoke", lr_sweep=True, lrs=(1e-3, 2e-3, 4e-3)), chosen_lrs=(("micro", 2e-3),),
                   recursion_seeds=(0, 1, 2), more_pair_seeds=(("fig4", (3, 4)),), **kw)


def _finish(sc, root, losses: dict, processor=None) -> None:
    """Results of the fig4 pair's first seeds with the given validation losses ({label: [loss per seed]})."""
    for v in EXPERIMENTS["fig4"].variants(sc):
        for seed, loss in enumerate(losses.get(v.label, ())):
            res = {"valid_loss": loss, "test_loss": 0.0}
            if processor:
                res["sessions"] = [{"processor": processor}]
            atomic_write_json(sc.runs(root) / v.spec.with_seed(seed).slug / "results.json", res)


def _seeds_of(sc, exp_id="fig4") -> dict:
    out: dict = {}
    for v, s in _runs(exp_id, sc):
        out.setdefault(v.label, []).append(s)
    return out


@pytest.mark.parametrize("t2, more", [((1.10, 1.12, 1.09), (3, 4)),  # T=1 - T=2 of 0.000 +- 0.02: not resolved
                                      ((1.19, 1.189, 1.1895), ())])  # 0.0105 +- 0.0005: three seeds resolve half of it
def test_a_pair_adds_seeds_only_where_its_first_seeds_do_not_resolve_half_the_difference(tmp_path, t2, more):
    sc = _scale()
    _finish(sc, tmp_path, {"CEM attention T=1": [1.2, 1.2, 1.2]})
    assert seeds.decide(sc, "fig4", tmp_path) is None and seeds.undecided(sc, ("fig4",), tmp_path) == ["fig4"]  # T=2 not in
    _finish(sc, tmp_path, {"CEM attention T=1": [1.2, 1.2, 1.2], "CEM attention T=2": list(t2)})
    d = seeds.decide(sc, "fig4", tmp_path)
    assert d.more == more and d.diffs == pytest.approx([1.2 - x for x in t2]) and d.seeds == (0, 1, 2) + more
    assert ("more than half" in d.text()) == bool(more)
    got = _seeds_of(seeds.decided(sc, ("fig4", "fig2c"), tmp_path))
    pair = ("CEM attention T=1", "CEM attention T=2")
    assert all(got[label] == [0, 1, 2, *more] for label in pair)
    assert all(s == [0, 1, 2] for label, s in got.items() if label not in pair)  # the controls keep the first seeds
    assert seeds.undecided(sc, ("fig4",), tmp_path) == []


def test_test_loss_never_decides_and_another_processor_is_not_counted(tmp_path):
    sc = _scale(processor="AMD EPYC")
    _finish(sc, tmp_path, {"CEM attention T=1": [1.2, 1.2, 1.2], "CEM attention T=2": [1.19, 1.189, 1.1895]}, processor="AMD EPYC")
    assert seeds.decide(sc, "fig4", tmp_path).more == ()
    for n, res in enumerate(sorted(sc.runs(tmp_path).glob("*/results.json"))):  # a noisy test split changes nothing
        res.write_text(json.dumps({**json.loads(res.read_text()), "test_loss": 1.0 + 0.1 * (n % 3)}))
    assert seeds.decide(sc, "fig4", tmp_path).more == ()
    _finish(sc, tmp_path, {"CEM attention T=2": [1.19]}, processor="Intel Xeon")  # seed 0 trained on another machine
    assert seeds.decide(sc, "fig4", tmp_path) is None


def test_a_scale_without_the_rule_adds_nothing(tmp_path):
    sc = replace(_scale(), more_pair_seeds=())
    _finish(sc, tmp_path, {"CEM attention T=1": [1.2, 1.2, 1.2], "CEM attention T=2": [1.1, 1.12, 1.09]})
    assert seeds.decide(sc, "fig4", tmp_path) is None and seeds.decided(sc, ("fig4",), tmp_path) == sc


def test_the_plan_counts_the_added_seeds_once_decided(tmp_path):
    sc = _scale()
    kw = dict(lr_sweep=True, lrs=(1e-3, 2e-3, 4e-3), recursion_seeds=(0, 1, 2), more_pair_seeds=(("fig4", (3, 4)),))
    before = plan("smoke", tmp_path, ("fig4",), **kw)
    assert before["seeds_undecided"] == {"fig4": [3, 4]} and before["pair_seeds"] == {}
    _finish(sc, tmp_path, {"CEM attention T=1": [1.2, 1.2, 1.2], "CEM attention T=2": [1.1, 1.12, 1.09]})
    after = plan("smoke", tmp_path, ("fig4",), **kw)
    assert after["seeds_undecided"] == {} and after["pair_seeds"] == {"fig4": (0, 1, 2, 3, 4)}
    assert after["experiments"]["fig4"]["train"] == before["experiments"]["fig4"]["train"] - 6 + 4  # six runs in, four added


def test_the_committed_cpu128_pairs_add_seeds_on_validation_as_they_did_on_test(tmp_path):
    """fig2c's and fig2d's pairs trained seeds 3-4 after a decision read on test loss; on validation, the rule's
    split, the committed runs give the same decision (fig2c: -0.0018 observed, 0.0019 resolved; fig2d: -0.0013, 0.0229)."""
    sc = replace(get_scale("cpu128"), chosen_lrs=(("cpu128", 2e-3),))
    pairs = [v.spec.with_seed(s).slug for exp_id in ("fig2c", "fig2d") for v in EXPERIMENTS[exp_id].variants(sc) for s in (0, 1, 2) if v.paired]
    RunTable(REPO / "study/results/cpu/runs").copy(pairs, tmp_path / "cpu" / "runs")  # the committed runs' rows
    root = tmp_path / "cpu128"
    fig2c, fig2d = (seeds.decide(sc, i, root) for i in ("fig2c", "fig2d"))
    assert fig2c.more == fig2d.more == (3, 4)
    assert sum(fig2c.diffs) / 3 == pytest.approx(-0.0018, abs=5e-5) and fig2c.resolves == pytest.approx(0.0019, abs=5e-5)
    assert sum(fig2d.diffs) / 3 == pytest.approx(-0.0013, abs=5e-5) and fig2d.resolves == pytest.approx(0.0229, abs=5e-5)
    assert seeds.decide(sc, "fig4", root) is None  # its runs are not in this folder
    assert _seeds_of(seeds.decided(sc, ("fig2c",), root), "fig2c")["CEM attention T=2"] == [0, 1, 2, 3, 4]
