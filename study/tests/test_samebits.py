"""study/results/cpu128/samebits.py --infer: the processor of runs that predate the CPU's family record, inferred
only where checks on one processor vouch for every one of their sessions' commits."""

import importlib.util
import json
import shutil
from pathlib import Path

from cem_study.records import RunTable
from cem.provenance import recorded_processors

SCRIPT = Path(__file__).resolve().parents[2] / "study" / "results" / "cpu128" / "samebits.py"
ZEN4, ZEN2 = "AMD EPYC (AuthenticAMD family 25 model 17 stepping 1)", "AMD EPYC (AuthenticAMD family 23 model 49 stepping 0)"


def _script(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("samebits", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(mod, "CHECKS", tmp_path / "samebits.json")
    return mod


def _run(tmp_path, slug, *commits, **extra):
    d = tmp_path / "runs" / slug
    d.mkdir(parents=True)
    sessions = [{"processor": "AMD EPYC", "device": "AMD EPYC (1 thread)", "commit": c, **extra} for c in commits]
    (d / "results.json").write_text(json.dumps({"device": "AMD EPYC (1 thread)", **({"sessions": sessions} if commits else {})}))


def test_infer_names_only_runs_whose_every_commit_is_vouched_for_on_one_processor(tmp_path, monkeypatch):
    mod = _script(tmp_path, monkeypatch)
    _run(tmp_path, "cpu128-a", "a" * 40)  # checked itself
    _run(tmp_path, "cpu128-b", "b" * 40)  # checked itself
    _run(tmp_path, "cpu128-ab", "a" * 40, "b" * 40)  # both commits vouched for by other runs
    _run(tmp_path, "cpu128-ac", "a" * 40, "c" * 40)  # c: no check
    _run(tmp_path, "cpu128-d", "d" * 40)  # d: checked and not reproduced
    _run(tmp_path, "cpu128-d2", "d" * 40)
    _run(tmp_path, "cpu128-old")  # predates provenance: no sessions
    _run(tmp_path, "cpu128-old2")
    _run(tmp_path, "cpu128-old3")  # predates provenance, and was not reproduced: no run before provenance vouches for another
    _run(tmp_path, "cpu128-z", "e" * 40, cpu_id="AuthenticAMD family 23 model 49 stepping 0")  # recorded its CPU
    mod.CHECKS.write_text(json.dumps({ZEN4: {"same": ["cpu128-a", "cpu128-b", "cpu128-old"], "differs": ["cpu128-d", "cpu128-old3"]},
                                      ZEN2: {"same": [], "differs": ["cpu128-a"]}}))
    table = RunTable(tmp_path / "runs")
    table.add()  # the runs' rows, as committed; one run also keeps its finished folder
    for d in (tmp_path / "runs").iterdir():
        if d.is_dir() and d.name != "cpu128-a":
            shutil.rmtree(d)
    assert mod.infer() == 0
    got = {slug: row["results"] for slug, row in table.rows().items()}
    assert json.loads((tmp_path / "runs" / "cpu128-a" / "results.json").read_text()) == got["cpu128-a"]  # the folder too
    named = {slug: recorded_processors(r) for slug, r in got.items() if "processor_inferred" in r}
    assert named == {"cpu128-a": [ZEN4], "cpu128-b": [ZEN4], "cpu128-ab": [ZEN4], "cpu128-old": [ZEN4]}
    assert got["cpu128-a"]["processor_inferred"]["by"].startswith("this run's first 50 steps were reproduced to the bit")
    assert "(aaaaaaa, bbbbbbb)" in got["cpu128-ab"]["processor_inferred"]["by"]
    assert recorded_processors(got["cpu128-ac"]) == ["AMD EPYC"] and recorded_processors(got["cpu128-z"]) == [ZEN2]
    assert recorded_processors(got["cpu128-d2"]) == ["AMD EPYC"]  # not vouched for: never inferred
    assert recorded_processors(got["cpu128-old2"]) == recorded_processors(got["cpu128-old3"]) == ["AMD EPYC"]


def test_a_check_keeps_its_outcome_under_this_machines_processor(tmp_path, monkeypatch):
    mod = _script(tmp_path, monkeypatch)
    monkeypatch.setattr(mod, "processor", lambda: ZEN4)
    mod._keep("cpu128-a", True)
    mod._keep("cpu128-b", False)
    mod._keep("cpu128-a", False)  # checked again: the later outcome stands
    assert json.loads(mod.CHECKS.read_text()) == {ZEN4: {"same": [], "differs": ["cpu128-a", "cpu128-b"]}}
