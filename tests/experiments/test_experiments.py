"""The experiment suite: one tiny experiment end to end, resume/skip, findings logic, Akima, report."""

import random

import pytest

from cem.experiments import ALL_IDS, EXPERIMENTS, RunSpec, akima_optimum, get_scale, run_experiment, write_report
from cem.experiments.registry import close, lower


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    rng = random.Random(1)
    words = "energy step layer attention gate key query value descent norm".split()
    for split, n in (("train", 3000), ("valid", 300), ("test", 300)):
        (d / f"{split}.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(n // 8)) + "\n")
    return d


def tiny_scale(corpus):
    return dict(data=str(corpus), seeds=(0, 1), max_steps=3, sizes=("tiny",), seq_len=32, batch_size=4)


def test_every_experiment_is_defined_at_every_scale():
    assert set(ALL_IDS) == {"fig2a", "fig2b", "fig2c", "fig2d", "fig3a", "fig3b", "fig3c", "fig4", "table3", "positional", "test-time", "energy"}
    for scale in ("cpu", "gpu", "paper"):
        s = get_scale(scale)
        for exp in EXPERIMENTS.values():
            variants = exp.variants(s)
            assert variants and len({v.label for v in variants}) == len(variants)


def test_slugs_are_unique_and_stable():
    a = RunSpec.make("tiny", "cem-attn", attn_steps=2, attn_precond="diag")
    assert a.slug == RunSpec.make("tiny", "cem-attn", attn_precond="diag", attn_steps=2).slug
    assert a.slug != RunSpec.make("tiny", "cem-attn", attn_steps=2, attn_precond="diag_lowrank").slug
    assert a.slug != a.with_seed(1).slug
    assert RunSpec.make("tiny", "llama", train={"lr": 1e-3}).slug != RunSpec.make("tiny", "llama", train={"lr": 2e-3}).slug


def test_akima_optimum_finds_the_minimum():
    lrs = [5e-4, 1e-3, 2e-3, 4e-3, 8e-3]
    ppl = [(x - 1.7) ** 2 + 10 for x in (-11, -10, -9, -8, -7)]  # minimum near log2(lr) = -8.3
    lr, p = akima_optimum(lrs, [(l - 2**-8.3) ** 2 * 1e5 + 10 for l in lrs])
    assert 2e-3 < lr < 4.5e-3 and p >= 10 - 1e-9
    del ppl


def rows(**ppl):
    return [{"label": k, "test_perplexity": v[0], "test_perplexity_std": v[1], "seeds": 3} for k, v in ppl.items()]


def test_finding_verdicts():
    assert lower(rows(a=(10, 0.1), b=(11, 0.1)), "a", "b", "a<b").verdict == "held"
    assert lower(rows(a=(11, 0.1), b=(10, 0.1)), "a", "b", "a<b").verdict == "not held"
    assert lower(rows(a=(10, 2.0), b=(10.5, 2.0)), "a", "b", "a<b").verdict == "inconclusive"
    assert close(rows(a=(10, 0), b=(10.2, 0)), "a", "b", "a~b", 0.05).verdict == "held"
    assert close(rows(a=(10, 0), b=(12, 0)), "a", "b", "a~b", 0.05).verdict == "not held"
    from cem.experiments.registry import _reuse_findings

    clear = rows(r1=(10, 0.01), r2=(10, 0.01), c1=(10, 0.01), c2=(9, 0.01))
    assert [f.verdict for f in _reuse_findings(clear, ("r1", "r2"), [("c1", "c2")], "x")] == ["held", "held"]
    noisy = rows(r1=(10, 0.5), r2=(10.1, 0.5), c1=(10, 0.5), c2=(10, 0.5))
    assert [f.verdict for f in _reuse_findings(noisy, ("r1", "r2"), [("c1", "c2")], "x")] == ["inconclusive", "inconclusive"]


def test_fig2c_end_to_end_with_resume_and_report(corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    summary = run_experiment("fig2c", "cpu", tmp_path / "res", **tiny_scale(corpus))
    labels = [r["label"] for r in summary["rows"]]
    assert labels == ["Llama tiny", "CEM attention T=1 diag", "CEM attention T=2 diag", "CEM attention T=1 diag_lowrank", "CEM attention T=2 diag_lowrank"]
    assert all(r["seeds"] == 2 and r["test_perplexity_std"] > 0 for r in summary["rows"])
    assert len(summary["findings"]) == 4 and {f["verdict"] for f in summary["findings"]} <= {"held", "not held", "inconclusive"}
    assert (tmp_path / "res" / "fig2c" / "fig2c.png").stat().st_size > 1000
    assert len(list((tmp_path / "res" / "runs").iterdir())) == 10
    capsys.readouterr()
    again = run_experiment("fig2c", "cpu", tmp_path / "res", **tiny_scale(corpus))  # everything finished: no training
    assert "0 to train" in capsys.readouterr().err
    assert again["rows"] == summary["rows"]
    with pytest.raises(ValueError, match="trained with other settings"):
        run_experiment("fig2c", "cpu", tmp_path / "res", **{**tiny_scale(corpus), "max_steps": 4})
    report = write_report(tmp_path / "res").read_text()
    assert "## fig2c" in report and "![fig2c](fig2c/fig2c.png)" in report and "Llama tiny" in report


def test_test_time_and_energy(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    scale = {**tiny_scale(corpus), "seeds": (0,)}
    tt = run_experiment("test-time", "cpu", tmp_path / "res", **scale)
    curve = tt["curves"]["full CEM trained T=2"]
    assert [r["eval_steps"] for r in curve] == [1, 2, 3, 4, 5, 6]
    assert len(tt["findings"]) == 2
    en = run_experiment("energy", "cpu", tmp_path / "res", **scale)
    layers = en["energy"]
    assert len(layers) == 2 * 2  # tiny: 2 blocks x (attention, MLP)
    assert all(len(r["energy"]) == 5 and r["trained_steps"] == 2 for r in layers)
    assert (tmp_path / "res" / "energy" / "energy.png").exists()


def test_unknown_experiment():
    with pytest.raises(ValueError, match="unknown experiment 'fig9'"):
        run_experiment("fig9")
