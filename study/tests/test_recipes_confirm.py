"""The test-time recipes' confirmation (issue 64): the confirm scale, its variants before and after the screening's
choice, the FLOP matching against the deeper Llama, and the study end to end at the smoke scale."""

import json
import re
from pathlib import Path

import pytest
import torch

from cem.layers.steps import Inference
from cem.model.config import SIZES, model_config
from cem.model.flops import forward_flops_per_token
from cem.training.budget import Budget
from cem_study import EXPERIMENTS, get_scale, plan, run_experiment, run_suite
from cem_study import registry
from cem_study.analysis import beats_at, flops_matched, run_model_config
from cem_study.costs import COMMITTED
from cem_study.findings import TWICE, Context
from cem_study.records import RunTable
from cem_study.runner import _specs, format_plan, waiting
from cem_study.sweep import RunSpec, run_config

GATE = "full CEM, T~U{1..3}, gated steps"
MONOTONE = "full CEM, deep supervision at T=1..2 and 3, monotonicity μ=1"
MIDDLE = "full CEM, T~U{1..3} in the middle layers only"


def choose(tmp_path: Path, monkeypatch, summary: dict | None) -> Path:
    """Point the confirmation at a screening summary of our own (None: none written)."""
    path = tmp_path / "screen64" / "recipes" / "summary.json"
    if summary is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary))
    monkeypatch.setattr(registry, "SCREENING", path)
    return path


def chosen(*labels: str) -> dict:
    return {"seeds": list(get_scale("screen64").seeds_for("recursion")), "choice": {"confirm": list(labels)}}


def test_the_confirmation_scale_trains_each_size_at_the_cpu_campaigns_llama_rate_one_processor_a_seed():
    s = get_scale("confirm")
    assert s.sizes == ("cpu96", "cpu128") and s.base == "cpu128" and s.data == "wikitext-2" and s.tokenizer == "byte"
    assert s.seeds == s.recursion_seeds == (0, 1, 2) and s.seed_blocks and s.suite == ("recipes-confirm",)
    assert (s.seq_len, s.batch_size, s.tokens, s.runs_from) == (256, 16, "chinchilla", None)  # its own runs folder
    assert s.eval_steps == (1, 2, 3, 4, 6, 8, 12, 16) and s.test_time_batches == 32 and not s.lr_sweep
    cpu = json.loads((COMMITTED / "cpu" / "lr" / "choices.json").read_text())
    cpu128 = json.loads((COMMITTED / "cpu128" / "lr" / "choices.json").read_text())
    assert s.train_for("cpu96") == {"lr": cpu["cpu96-llama"]["lr"]} == {"lr": 8e-3}
    assert s.train_for("cpu128") == {"lr": cpu["cpu128-llama"]["lr"]} == {"lr": cpu128["cpu128-llama"]["lr"]} == {"lr": 2e-3}
    for words in ("not swept again here", "untuned", "131k test tokens", "not swept"):
        assert words in s.limits


def test_before_the_screening_chooses_the_confirmation_waits_and_says_what_it_read(tmp_path, monkeypatch):
    path = choose(tmp_path, monkeypatch, None)
    s = get_scale("confirm")
    with pytest.raises(registry.RecipesNotChosen, match="does not exist") as e:
        EXPERIMENTS["recipes-confirm"].variants(s)
    assert str(path) in str(e.value)
    choose(tmp_path, monkeypatch, {**chosen(GATE, MONOTONE), "seeds": [0]})  # an analysis of seed 0 alone
    with pytest.raises(registry.RecipesNotChosen, match=r"seeds \[0\], not on all of \[0, 2, 3\]"):
        EXPERIMENTS["recipes-confirm"].variants(s)
    choose(tmp_path, monkeypatch, {**chosen(GATE, MONOTONE), "awaits": "3 of its 21 runs to train or evaluate"})
    with pytest.raises(registry.RecipesNotChosen, match="awaits 3 of its 21 runs"):
        EXPERIMENTS["recipes-confirm"].variants(s)
    choose(tmp_path, monkeypatch, {**chosen(), "choice": {"confirm": []}})
    with pytest.raises(registry.RecipesNotChosen, match=r"no two recipes in choice\['confirm'\]"):
        EXPERIMENTS["recipes-confirm"].variants(s)
    # --plan and `all` name it and go on; named, it is refused with the same error
    assert set(waiting(("recipes", "recipes-confirm"), s)) == {"recipes-confirm"}
    p = plan("confirm", tmp_path / "res")
    assert "recipes-confirm" not in p["experiments"] and "no two recipes" in p["waiting"]["recipes-confirm"]
    assert run_suite("confirm", tmp_path / "res") == []
    with pytest.raises(registry.RecipesNotChosen):
        run_experiment("recipes-confirm", "confirm", tmp_path / "res")


def test_with_a_choice_each_size_has_fixed_t2_the_two_recipes_as_screened_and_a_llama_twice_as_deep_on_the_same_steps(tmp_path, monkeypatch):
    choose(tmp_path, monkeypatch, chosen(MIDDLE, GATE))
    s, screen = get_scale("confirm"), get_scale("screen64")
    variants = EXPERIMENTS["recipes-confirm"].variants(s)
    screened = {v.label: v for v in EXPERIMENTS["recipes"].variants(screen)}
    assert len(variants) == 4 * 2 and len({v.label for v in variants}) == len(variants)
    vocab = 257
    for size in s.sizes:
        here = [v for v in variants if v.spec.size == size]
        assert [v.label for v in here] == [f"full CEM trained T=2 {size}", f"{MIDDLE} {size}", f"{GATE} {size}", f"Llama with 8 layers {size}"]
        baseline, *recipes, deeper = here
        assert baseline.tags["baseline"] and [v.tags["recipe"] for v in recipes] == [0, 1] and deeper.tags["kind"] == "deeper"
        assert all(run_config(v.spec, s, None).train.lr == s.train_for(size)["lr"] for v in here)  # the spec leaves out the default 2e-3
        shape = {k: x for k, x in SIZES[size].items() if k != "vocab_size"}
        for v in (baseline, *recipes):  # the screening's model, at this size
            screening = screened[v.label.removesuffix(f" {size}")]
            assert v.spec.arch == screening.spec.arch and v.spec.model == screening.spec.model
            ours = run_config(v.spec, s, None).model(vocab)
            assert ours == run_config(screening.spec, screen, None).model(vocab).replace(**shape) and ours.dim == SIZES[size]["dim"]
        run = run_config(deeper.spec, s, None)
        cfg = run.model(vocab)
        assert cfg.n_layers == 2 * SIZES[size]["n_layers"] == 8 and cfg.dim == SIZES[size]["dim"] and cfg.attn.kind == cfg.mlp.kind == "llama"
        llama = run_config(RunSpec.make(size, "llama", train=s.train_for(size)), s, None)
        steps = Budget.of(run.train, cfg, run.train.seq_len).steps
        assert steps == Budget.of(llama.train, llama.model(vocab), llama.train.seq_len).steps == {"cpu96": 2406, "cpu128": 4247}[size]
    assert len(_specs("recipes-confirm", s)) == 8 * 3


def test_a_scale_that_cannot_build_a_chosen_recipe_leaves_the_confirmation_out_of_plan_and_all_and_refuses_it_by_name(tmp_path, monkeypatch):
    choose(tmp_path, monkeypatch, chosen(MIDDLE, GATE))  # middle-layer recursion needs 3 layers: not a recipe at micro
    with pytest.raises(registry.RecipesNotAtSize, match=r"\['full CEM, T~U\{1..3\} in the middle layers only'\] are not recipes at size micro"):
        EXPERIMENTS["recipes-confirm"].variants(get_scale("smoke"))
    assert set(waiting(("recipes", "recipes-confirm"), get_scale("smoke"))) == {"recipes-confirm"}
    p = plan("smoke", tmp_path / "res")  # the smoke scale's suite is every experiment
    assert "recipes-confirm" not in p["experiments"] and "recipes" in p["experiments"]
    assert p["waiting"]["recipes-confirm"].startswith("this scale cannot build its models: the screening's recipes")
    assert "recipes-confirm: not counted, this scale cannot build its models" in format_plan(p)
    with pytest.raises(registry.RecipesNotAtSize):
        run_experiment("recipes-confirm", "smoke", tmp_path / "res")
    assert set(waiting(("recipes-confirm",), get_scale("confirm"))) == set()  # its own scale builds both


def test_the_flop_match_is_the_deepest_t_within_the_deeper_llamas_forward_flops():
    # one CEM block (width 8, MLP 16, 2 heads, context 4, vocabulary 10; shared key-query diagonal, no preconditioner):
    # attention 2D² + T(4D² + 6JD) = 128 + 448T, MLP 2Dm + 4TDm = 256 + 512T, head 2DV = 160
    cem = model_config("micro", "cem", dim=8, n_heads=2, hidden_dim=16, n_layers=1, vocab_size=10, context=4)
    table = {1: 1504, 2: 2464, 3: 3424, 4: 4384}
    assert {t: forward_flops_per_token(cem.at(Inference(steps=t)), 4) for t in table} == table
    # the Llama with twice the layers: 2 x (8D² + 4JD + 6Dm) + 2DV
    llama = model_config("micro", "llama", dim=8, n_heads=2, hidden_dim=16, n_layers=2, vocab_size=10, context=4)
    assert forward_flops_per_token(llama, 4) == 2 * (512 + 128 + 768) + 160 == 2976
    assert flops_matched(cem, (1, 2, 3, 4), 2976, 4) == (2, 2464)
    assert flops_matched(cem, (1, 2, 3, 4), 3424, 4) == (3, 3424)  # at most the budget: equal fits
    assert flops_matched(cem, (1, 3, 4), 2976, 4) == (1, 1504)  # only the evaluated T
    assert flops_matched(cem, (1, 2, 3, 4), 1503, 4) is None


def test_a_comparison_at_two_depths_leaves_out_a_seed_whose_runs_ran_on_two_processors():
    rows = [{"label": "A", "seeds": [0, 1, 2], "processor_per_seed": ["x", "x", "y"]},
            {"label": "B", "seeds": [0, 1, 2], "processor_per_seed": ["x", "x", "x"]}]
    curve = lambda *losses: [{"eval_steps": 2, "test_loss_per_seed": list(losses)}]  # noqa: E731
    c = Context(get_scale("smoke"), rows, [], Path("/nonexistent"), Path("/nonexistent"))
    f = beats_at(c, {"A": curve(1.0, 1.1, 0.0), "B": curve(1.5, 1.59, 9.0)}, ("A", 2), ("B", 2), "A beats B")
    assert f.difference["n"] == 2 and f.difference["mean"] == pytest.approx(0.495) and "1 seed left out" in f.evidence
    assert f.family == "ours" and f.contrast == "B at T=2 - A at T=2" and f.verdict == "held"


@pytest.mark.slow
def test_the_confirmation_end_to_end(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    choose(tmp_path, monkeypatch, chosen(GATE, MONOTONE))
    scale = dict(data=str(corpus), sizes=("micro", "tiny"), seeds=(0,), recursion_seeds=(0, 1), eval_steps=(1, 2, 3, 4))
    out = run_experiment("recipes-confirm", "smoke", tmp_path / "res", **scale)
    s = get_scale("smoke", **scale)
    labels = [v.label for v in EXPERIMENTS["recipes-confirm"].variants(s)]
    assert set(out["curves"]) == set(labels) and len(labels) == 8
    assert all(len(r["seeds"]) == 2 for r in out["rows"])
    findings = {f["claim"]: f for f in out["findings"]}
    assert len(findings) == 4 * 2
    twice = [f for f in out["findings"] if f["family"] == TWICE]
    assert [f["claim"].split(":")[0] for f in twice] == [f"(ours) {r} {z}" for z in ("micro", "tiny") for r in (GATE, MONOTONE)]
    assert all(f["p"] is not None and f["difference"]["n"] == 2 for f in out["findings"])
    runs = s.runs(tmp_path / "res")
    for size in ("micro", "tiny"):
        entry = out["confirmation"][size]
        assert entry["recipes"] == [f"{GATE} {size}", f"{MONOTONE} {size}"] and entry["first"] == f"{GATE} {size}"
        assert entry["valid_best_T"] == min(entry["valid_curve"], key=lambda r: r["valid_loss"])["eval_steps"]
        ours = [f for f in out["findings"] if f["family"] == "ours" and f["claim"].startswith(f"(ours) {size}:")]
        assert len(ours) == 2 and f"at its validation-best T={entry['valid_best_T']} beats full CEM trained T=2 {size} at T=2" in ours[0]["claim"]
        # the FLOP match, against the depth study's own count (`flops_at`) of the same runs
        first, deeper = out["curves"][entry["first"]], out["curves"][entry["deeper"]]
        assert entry["deeper_flops_per_token"] == deeper[0]["flops_per_token"]
        at = {r["eval_steps"]: r["flops_per_token"] for r in first}
        t = entry["matched_T"]
        assert at[t] == entry["flops_per_token"] <= entry["deeper_flops_per_token"] < at.get(t + 1, float("inf"))
        assert entry["flops_ratio"] == pytest.approx(at[t] / deeper[0]["flops_per_token"])
        assert f"at T={t}, the deepest T within the forward FLOPs per token of {entry['deeper']}" in ours[1]["claim"]
        assert f"ratio {entry['flops_ratio']:.3f}" in ours[1]["evidence"]
        spec = next(v.spec for v in EXPERIMENTS["recipes-confirm"].variants(s) if v.label == entry["deeper"])
        assert not list((runs / spec.with_seed(0).slug / "evals").glob("valid_curve*"))  # the deeper Llama is evaluated as trained only
        assert list((runs / spec.with_seed(0).slug / "evals").glob("depth_study_1_*"))
    summary = json.loads((tmp_path / "res" / "recipes-confirm" / "summary.json").read_text())
    assert summary["confirmation"] == out["confirmation"] and summary["experiment"] == "recipes-confirm"
    assert (tmp_path / "res" / "recipes-confirm" / "recipes-confirm.png").stat().st_size > 1000


def test_sizes_narrows_the_confirmation_to_one_sizes_runs(tmp_path, monkeypatch, capsys):
    """`--sizes cpu96 --seeds 1`: one block (size, seed) of the campaign, the four cpu96 models of seed 1 (a session's
    lanes can finish a block; the cpu128 runs are left to a later one)."""
    from cem_study.cli import main

    choose(tmp_path, monkeypatch, chosen(MIDDLE, GATE))
    s = get_scale("confirm", sizes=("cpu96",), seeds=(1,), recursion_seeds=(1,))
    assert [(x.size, x.seed) for x in _specs("recipes-confirm", s)] == [("cpu96", 1)] * 4
    assert main(["experiment", "recipes-confirm", "--scale", "confirm", "--plan", "--sizes", "cpu96", "--seeds", "1", "--results", str(tmp_path / "res")]) == 0
    assert re.search(r"recipes-confirm\s+0\s+4\s+0\s+0", capsys.readouterr().out)


def test_the_flop_match_reads_a_runs_model_from_its_row_where_its_folder_is_gone(tmp_path):
    """A campaign's seeds train on several machines, so the analysis meets runs that only its tables hold (their
    folders went with the machine): the deeper Llama's and the recipe's model configs are read from their rows."""
    committed = RunTable(COMMITTED / "confirm" / "runs")
    slugs = [s for s in committed.rows() if s.startswith("cpu96-llama-n_layers=8") and s.endswith("-s0")]
    runs = tmp_path / "confirm" / "runs"
    committed.copy(slugs, runs)
    cfg, seq_len = run_model_config(runs / slugs[0])
    assert (cfg.n_layers, cfg.dim, cfg.attn.kind, seq_len) == (8, 96, "llama", 256) and not (runs / slugs[0]).exists()
    with pytest.raises(ValueError, match="has no run.json, and no row in .*runs.jsonl holds it"):
        run_model_config(runs / "cpu96-llama-s9")


def test_the_plan_counts_another_processors_blocks_apart_and_not_in_the_hours(tmp_path, monkeypatch, capsys):
    """`--plan` in a campaign of seed blocks: a run to train whose block (size, seed) another processor has started is
    counted 'elsewhere' (the block and its processor named) and left out of the hours, as `run_sweep` leaves it; the
    runs of blocks none has started, or this machine has, are to train here."""
    from cem_study.cli import main

    choose(tmp_path, monkeypatch, chosen(MIDDLE, GATE))
    committed = RunTable(COMMITTED / "confirm" / "runs")
    seed0 = [s for s in committed.rows() if s.startswith("cpu96-") and s.endswith("-s0")]
    deeper = next(s for s in seed0 if "n_layers=8" in s)
    committed.copy([s for s in seed0 if s != deeper], tmp_path / "confirm" / "runs")  # seed 0's block, its Llama not trained
    argv = ["experiment", "recipes-confirm", "--scale", "confirm", "--plan", "--sizes", "cpu96", "--results", str(tmp_path / "confirm")]

    def planned(processor: str) -> dict:
        return plan("confirm", tmp_path / "confirm", ("recipes-confirm",), sizes=("cpu96",), processor=processor)

    elsewhere = planned("Another CPU")
    assert elsewhere["experiments"]["recipes-confirm"] == {"finished": 3, "train": 8, "evaluate": 0, "again": 0, "elsewhere": 1}
    assert main(argv + ["--processor", "Another CPU"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"recipes-confirm\s+3\s+8\s+0\s+0\s+1\n", out)
    assert re.search(r"'elsewhere': runs of \(size, seed\) blocks another processor holds \(seed 0 at cpu96 on .*model 207 stepping 2\)\), left to it", out)
    owner = "Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 207 stepping 2)"  # seed 0's block at cpu96
    here = planned(owner)
    assert here["experiments"]["recipes-confirm"] == {"finished": 3, "train": 9, "evaluate": 0, "again": 0, "elsewhere": 0}
    assert here["core_hours"] > elsewhere["core_hours"] and here["elsewhere"] == "" and elsewhere["elsewhere"] == f"seed 0 at cpu96 on {owner}"


@pytest.mark.parametrize("recur_layers", ["all", "middle"])
def test_the_flops_of_the_steps_a_model_reports_are_those_of_its_config_at_that_t(recur_layers):
    """`flops_at` reads `LM.steps_used` (per kind, the mean over every CEM layer, the blocks `recur_layers` keeps at
    T = 1 included): measured on a model run at each T, it is `forward_flops_per_token` of the config at T."""
    from cem.model import LanguageModel
    from cem_study.analysis import flops_at

    cfg = model_config("micro", "cem", dim=8, n_heads=2, hidden_dim=16, n_layers=4, vocab_size=10, context=4, recur_layers=recur_layers)
    model = LanguageModel(cfg).eval()
    for t in (1, 2, 3, 5):
        model.set_inference(Inference(steps=t))
        model.reset_steps_used()
        with torch.no_grad():
            model(torch.randint(0, 10, (2, 4)))
        used = model.steps_used()
        assert flops_at(cfg, 4, used["attn"], used["mlp"]) == pytest.approx(forward_flops_per_token(cfg.at(Inference(steps=t)), 4), rel=1e-12)
    assert recur_layers == "all" or used["attn"] < 5  # the kept blocks ran one step: the mean is below T


def test_a_depth_study_counted_before_the_kept_blocks_were_reads_its_flops_again():
    """The committed cpu128 middle-layers run's depth study was computed when `flops_at` counted the kept blocks as
    recursing (3.65 MFLOP at T=4): `counted` gives each T its config's FLOPs, keeps a fully recursing run's, and
    leaves every exit rule's loss at the fixed curve's equal FLOPs as it was (the old count was affine in the new)."""
    import numpy as np
    from cem_study.analysis import counted

    runs = RunTable(COMMITTED / "confirm" / "runs").rows()
    for key, recount in (("recur_layers=middle", True), ("-cem-attn_steps=2-mlp_steps=2-", False)):
        slug = next(s for s in runs if s.startswith("cpu128-") and key in s and s.endswith("-s1"))
        (study,) = [v for k, v in runs[slug]["evals"].items() if k.startswith("depth_study_")]
        cfg, seq_len = run_model_config(COMMITTED / "confirm" / "runs" / slug)
        again = counted(COMMITTED / "confirm" / "runs" / slug, study)
        assert [r["flops_per_token"] for r in again["curve"]] == [forward_flops_per_token(cfg.at(Inference(steps=r["eval_steps"])), seq_len)
                                                                 for r in study["curve"]]
        assert ([r["flops_per_token"] for r in again["curve"]] != [r["flops_per_token"] for r in study["curve"]]) == recount
        flops, fixed = [r["flops_per_token"] for r in again["curve"]], [r["test_loss"] for r in again["curve"]]
        for rule in again["rules"]:
            assert float(np.interp(rule["flops_per_token"], flops, fixed)) == pytest.approx(rule["fixed_loss_at_flops"], abs=1e-9)
