"""Run records as data (`cem_study.records`): finished runs as two JSON-lines tables, one reader for a run's
live folder or its row, and the committed campaigns' tables as lossless, deterministic conversions of their runs."""

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from cem_study import RunSpec, get_scale, run_sweep
from cem_study.analysis import CONTEXT_USE
from cem_study.products import recorded_times
from cem_study.records import Run, RunTable, folder_files, main, runs_in
from cem_study.sweep import run_status

REPO = Path(__file__).resolve().parents[2]
CAMPAIGNS = ("cpu", "cpu-rates", "micro", "h200/cpu", "screen64", "confirm")  # study/results/C/runs.jsonl and steps.jsonl
SPEC = RunSpec.make("micro", "llama", seed=0)


def _folder(path: Path, slug: str, loss: float = 2.5) -> Path:
    """A finished run's folder as a sweep leaves it: its record, and what is not recorded (weights, tokenizer, lock)."""
    d = path / slug
    (d / "evals").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"train": {"lr": 1e-3, "preset": "micro"}, "model": {"d": 8}, "total_steps": 4}, indent=2))
    (d / "results.json").write_text(json.dumps({"valid_loss": loss, "wall_time_s": 3.0, "sessions": [{"processor": "a CPU"}]}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": t, "loss": loss + 1 / t, "lr": 1e-3}) + "\n" for t in (1, 2, 3, 4)))
    (d / "evals" / "depth.json").write_text(json.dumps([{"T": 1, "ppl": 3.5}]))
    (d / "evals" / "times.json").write_text(json.dumps({"depth.json": 1.5}))
    (d / "train.log").write_text("step 1 loss 3.5 ± 0.1\n")
    (d / "test_time_1_2.json").write_text(json.dumps({"1": 3.0}))
    for part in ("ckpt", "tokenizer"):
        (d / part).mkdir()
        (d / part / "weights.bin").write_bytes(b"\0\1")
    (d / ".lock").write_text("")
    return d


def test_a_finished_run_is_added_and_read_back_the_same(tmp_path):
    runs = tmp_path / "res" / "runs"
    folders = [_folder(runs, "b-run"), _folder(runs, "a-run", loss=2.0)]
    assert main(["add", str(runs)]) == 0
    table = RunTable(runs)
    assert table.path == tmp_path / "res" / "runs.jsonl" and sorted(table.rows()) == ["a-run", "b-run"]
    for d in folders:
        assert table.files(d.name) == folder_files(d)  # every file of the record, nothing of the weights
        assert set(folder_files(d)) == {"run.json", "results.json", "metrics.jsonl", "evals/depth.json", "evals/times.json",
                                        "train.log", "test_time_1_2.json"}
    live = {d.name: (Run(d).read_run(), Run(d).results(), Run(d).metrics(), Run(d).eval("depth.json"), recorded_times(d)) for d in folders}
    written = table.path.read_bytes(), table.steps_path.read_bytes()
    shutil.rmtree(runs)  # the folders gone (as after `git rm`): the same run, read from its row
    for slug, got in live.items():
        run = Run(runs / slug)
        assert not run.live() and run.has_eval("depth.json") and not run.has_eval("energy.json")
        assert (run.read_run(), run.results(), run.metrics(), run.eval("depth.json"), recorded_times(run.path)) == got
    assert [r.slug for r in runs_in(runs)] == ["a-run", "b-run"]
    # the same runs give the same bytes, whatever the order they are added in
    assert table.unpack() == [runs / "a-run", runs / "b-run"]
    assert all(folder_files(d) == table.files(d.name) for d in folders)
    other = tmp_path / "again" / "runs"
    shutil.copytree(runs / "a-run", other / "a-run")
    RunTable(other).add(["a-run"])
    shutil.copytree(runs / "b-run", other / "b-run")
    RunTable(other).add(["b-run"])
    assert (RunTable(other).path.read_bytes(), RunTable(other).steps_path.read_bytes()) == written
    # readable with pandas (where installed: no dependency of cem's), one row per run and one per logged step
    pd = pytest.importorskip("pandas")
    rows, steps = pd.read_json(table.path, lines=True), pd.read_json(table.steps_path, lines=True)
    assert list(rows.columns) == ["slug", "run", "results", "evals", "files"] and len(steps) == 8
    assert steps.groupby("slug")["loss"].last().to_dict() == {"a-run": 2.25, "b-run": 2.75}


@pytest.mark.parametrize("name,value,expect", [
    ("run", {"total_steps": "many"}, "run.json (its row in {table}): total_steps must be an integer in [0, 1,000,000,000,000,000], got str 'many'"),
    ("run", {"corpus": 3}, "run.json (its row in {table}): corpus must be a string or an object, got int 3"),
    ("run", {"config": [1]}, "run.json (its row in {table}): config must be an object, got list"),
    ("results", {"sessions": "x"}, "results.json (its row in {table}): sessions must be a list, got str 'x'"),
    ("results", {"test_loss": float("inf")}, "results.json (its row in {table}): test_loss must be a finite number >= 0, got float inf"),
    ("results", {"parameters": {"total": -1}}, "results.json (its row in {table}): parameters.total must be an integer >= 0, got int -1"),
])
def test_a_row_is_checked_as_cem_checks_the_file_it_holds(tmp_path, name, value, expect):
    """Issue 63: a row's run.json or results.json is read with the schema cem reads the file with (`cem.records`); a bad
    one is a ValueError naming the run's folder, the row and the field (it was an AttributeError later, naming no run)."""
    runs = tmp_path / "res" / "runs"
    _folder(runs, "a-run")
    assert main(["add", str(runs)]) == 0
    table = RunTable(runs)
    row = {**table.row("a-run"), name: value}
    table.path.write_text(json.dumps(row) + "\n")
    shutil.rmtree(runs / "a-run")
    read = Run(runs / "a-run").read_run if name == "run" else Run(runs / "a-run").results
    with pytest.raises(ValueError) as e:
        read()
    assert str(e.value) == f"{runs / 'a-run'}/" + expect.format(table=table.path)


def test_a_folder_and_a_row_that_differ_are_an_error_naming_both(tmp_path):
    runs = tmp_path / "runs"
    d = _folder(runs, "a-run")
    RunTable(runs).add()
    results = json.loads((d / "results.json").read_text())
    (d / "results.json").write_text(json.dumps({**results, "valid_loss": 9.0}))  # trained again, not added
    with pytest.raises(ValueError, match=f"{d} and its row in {runs.parent / 'runs.jsonl'} differ \\(results.json\\)"):
        Run(d).results()
    with pytest.raises(ValueError, match="are different runs \\(results differ\\).*--replace"):
        RunTable(runs).add(["a-run"])
    (d / "results.json").unlink()  # started again: an unfinished folder and a finished row
    with pytest.raises(ValueError, match="differ \\(the folder's run is unfinished, the row's finished\\)"):
        Run(d).results()
    (d / "results.json").write_text(json.dumps({**results, "valid_loss": 9.0}))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    assert RunTable(runs).add(["a-run"], replace=True) == ["a-run"]
    assert Run(d).results()["valid_loss"] == 9.0 and Run(d).metrics() == [{"step": 1, "loss": 0.5}]
    (d / "evals" / "depth.json").write_text("[]")
    with pytest.raises(ValueError, match="differ \\(evals/depth.json\\)"):
        Run(d).eval("depth.json")
    with pytest.raises(ValueError, match="no finished run"):
        RunTable(runs).add(["missing"])
    RunTable(runs).path.write_text(RunTable(runs).path.read_text() + '{"slug": "b-run", "results": \n')
    with pytest.raises(ValueError, match=f"{runs.parent / 'runs.jsonl'} is corrupted: line 2 is not JSON"):
        Run(d).results()


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """One finished smoke run (weights kept), trained once for these tests."""
    root = tmp_path_factory.mktemp("trained") / "res"
    scale = get_scale("smoke", data=str(corpus))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CEM_CACHE_DIR", str(root.parent / "cache"))
        run_sweep([SPEC], scale, root)
    return scale, root


def _copy(trained, tmp_path) -> tuple:
    scale, root = trained
    shutil.copytree(root, tmp_path / "res")
    return scale, tmp_path / "res"


def test_a_run_only_in_the_tables_counts_as_finished_and_is_never_trained_again(trained, tmp_path, monkeypatch, capsys):
    from cem_study import sweep

    scale, root = _copy(trained, tmp_path)
    folder = scale.runs(root) / SPEC.slug
    results = json.loads((folder / "results.json").read_text())
    RunTable(scale.runs(root)).add()
    shutil.rmtree(folder)
    monkeypatch.setattr(sweep, "_train", lambda *a: pytest.fail("a run in the tables was trained again"))
    assert run_status(SPEC, scale, root) == "finished"
    capsys.readouterr()
    assert run_sweep([SPEC], scale, root)[SPEC] == results
    assert "1 runs, 1 already finished, 0 to train" in capsys.readouterr().err and not folder.exists()
    with pytest.raises(ValueError, match=f"{SPEC.slug} in {root / 'runs.jsonl'} was trained with other settings \\(.*training setting seq_len"):
        run_sweep([SPEC], replace(scale, seq_len=16), root)


def test_products_of_a_tabled_run_come_from_the_checkpoint_its_folder_kept_and_join_its_row(trained, tmp_path, monkeypatch):
    """After the conversion a finished run's folder keeps only what git ignores (its checkpoint): a product an
    experiment needs is computed from it, and `add` puts it into the run's row."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    scale, root = _copy(trained, tmp_path)
    folder = scale.runs(root) / SPEC.slug
    table = RunTable(scale.runs(root))
    table.add()
    for name in ("run.json", "results.json", "metrics.jsonl", "train.log"):
        (folder / name).unlink(missing_ok=True)
    assert run_status(SPEC, scale, root, (CONTEXT_USE,)) == "evaluate"
    run_sweep([SPEC], scale, root, products={SPEC: (CONTEXT_USE,)})
    assert CONTEXT_USE.name not in table.row(SPEC.slug)["evals"] and Run(folder).has_eval(CONTEXT_USE.name)
    assert table.add() == [SPEC.slug]
    assert table.row(SPEC.slug)["evals"][CONTEXT_USE.name] == json.loads((folder / "evals" / CONTEXT_USE.name).read_text())
    shutil.rmtree(folder)
    assert run_status(SPEC, scale, root, (CONTEXT_USE,)) == "finished" and CONTEXT_USE.name in recorded_times(folder)


def test_a_run_trained_again_leaves_the_tables_until_it_is_added(trained, tmp_path, monkeypatch):
    """A tabled run trained again (here: its product is needed and its weights are gone) loses its row when it
    starts, as its results.json went before the tables: its folder is then the one record of it."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    scale, root = _copy(trained, tmp_path)
    table = RunTable(scale.runs(root))
    table.add()
    shutil.rmtree(scale.runs(root) / SPEC.slug)
    assert run_status(SPEC, scale, root, (CONTEXT_USE,)) == "again"
    run_sweep([SPEC], scale, root, products={SPEC: (CONTEXT_USE,)})
    assert table.row(SPEC.slug) is None and Run(scale.runs(root) / SPEC.slug).live()
    assert table.add() == [SPEC.slug] and Run(scale.runs(root) / SPEC.slug).has_eval(CONTEXT_USE.name)


# what the readers read of a run: `sweep.summarize`, `costs`, `report._provenance`, `lr`, `seeds`, `sweep`'s checks
READ_RESULTS = ("test_perplexity", "test_bits_per_byte", "test_loss", "valid_loss", "valid_perplexity", "tokens_seen", "wall_time_s",
                "world_size", "device")
READ_RUN = ("train", "model", "tokenizer", "corpus", "total_steps")


@pytest.mark.parametrize("campaign", CAMPAIGNS)
def test_every_committed_row_holds_what_the_readers_read(campaign):
    table = RunTable(REPO / "study/results" / campaign / "runs")
    assert table.rows()
    for slug, row in table.rows().items():
        res, run = row["results"], row["run"]
        assert all(k in res for k in READ_RESULTS), slug
        assert {"total", "attention", "mlp"} <= set(res["parameters"]) and {"vocab_size", "context"} <= set(res["model"]), slug
        assert {"preset", "arch", "seed", "lr"} <= set(res["config"]["train"]), slug
        assert all(k in run for k in READ_RUN), slug
        steps = table.steps(slug)
        assert steps and all("step" in s for s in steps) and any("loss" in s and "grad_norm" in s for s in steps), slug


@pytest.mark.slow
@pytest.mark.parametrize("campaign", CAMPAIGNS)
def test_the_committed_tables_are_their_runs_unpacked_and_packed_again(campaign, tmp_path):
    """Every committed run, written back to its folder from its row and added again, gives the committed tables'
    bytes: the conversion keeps every file (`folder_files` == `RunTable.files`) and is deterministic."""
    committed = RunTable(REPO / "study/results" / campaign / "runs")
    copy = committed.copy(committed.rows(), tmp_path / "runs")
    folders = copy.unpack()
    assert len(folders) == len(committed.rows())
    for d in folders:
        assert folder_files(d) == committed.files(d.name), d.name
    copy.path.unlink()
    copy.steps_path.unlink()
    copy.add()
    assert copy.path.read_bytes() == committed.path.read_bytes()
    assert copy.steps_path.read_bytes() == committed.steps_path.read_bytes()


# each committed report and the command its README gives to write it again (cpu128: the findings so far, then the
# report, which checks the corpus: WikiText-2 in $CEM_DATA_DIR or /work/shared/data, else that case is skipped)
CPU128_IDS, CPU128_CPU = "lr,fig2a,fig2c,fig2d,fig3a,fig4,fig3b,positional,fig2b", "AMD EPYC (AuthenticAMD family 25 model 17 stepping 1)"
DATA = next((d for d in (os.environ.get("CEM_DATA_DIR"), "/work/shared/data") if d and (Path(d) / "wikitext-2" / "train.txt").is_file()), None)
REGENERATE = {
    "cpu": [["report", "study/results/cpu"]],
    "micro": [["report", "study/results/micro"]],
    "cpu128": [["experiment", CPU128_IDS, "--scale", "cpu128", "--results", "study/results/cpu128", "--analyse-only", "--processor", CPU128_CPU,
                "--data-dir", str(DATA)]],
    "h200/cpu128": [["report", "study/results/h200/cpu128"]],
}


def _written(root: Path, campaign: str) -> dict:
    """What a regeneration wrote in a campaign's folder: every file's bytes, a summary's without its timing."""
    out = {}
    for p in sorted((root / "study/results" / campaign).rglob("*")):
        if p.is_file() and "runs" not in p.relative_to(root).parts and p.suffix != ".jsonl":
            out[p.relative_to(root).as_posix()] = ({k: v for k, v in json.loads(p.read_text()).items() if k != "analysis_time_s"}
                                                   if p.name == "summary.json" else p.read_bytes())
    return out


@pytest.mark.slow
@pytest.mark.parametrize("campaign", REGENERATE)
def test_each_committed_report_regenerates_from_the_tables_as_from_the_run_folders(campaign, tmp_path, monkeypatch):
    """The README's command, run on the committed tables and on the same runs as folders (unpacked from the rows, the
    tables removed), writes the same bytes: the report, the verdicts and figures (matplotlib's Agg, deterministic) and
    the summaries (their `analysis_time_s` apart). Nothing needs the corpus: products and n-gram baselines are recorded."""
    from cem_study.cli import main as cem

    if campaign == "cpu128" and DATA is None:
        pytest.skip("no WikiText-2 corpus here ($CEM_DATA_DIR/wikitext-2/train.txt), which the cpu128 analysis checks")
    tables, folders = tmp_path / "tables", tmp_path / "folders"
    for root in (tables, folders):
        shutil.copytree(REPO / "study/results", root / "study/results", ignore=shutil.ignore_patterns("runs"))
    for c in CAMPAIGNS:
        t = RunTable(folders / "study/results" / c / "runs")
        t.unpack()
        t.path.unlink()
        t.steps_path.unlink()
    written = {}
    for root in (tables, folders):
        monkeypatch.chdir(root)
        for argv in REGENERATE[campaign]:
            assert cem(argv) == 0
        written[root] = _written(root, campaign)
    assert written[tables].keys() == written[folders].keys() and any(k.endswith("report.md") for k in written[tables])
    for name, content in written[tables].items():
        assert content == written[folders][name], name


def test_the_records_command_runs_as_a_module_without_a_warning(tmp_path):
    """`python -m cem_study.records add RUNS` (the command every campaign's README gives): the package imports its public
    names when first used, so the module is not imported twice (runpy's RuntimeWarning, which -W error makes an exit 1)."""
    import subprocess
    import sys

    runs = tmp_path / "res" / "runs"
    _folder(runs, "a-run")
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "cem_study.records", "add", str(runs)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "1 run added" in done.stdout and RunTable(runs).row("a-run") is not None
