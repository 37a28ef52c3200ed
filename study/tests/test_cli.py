"""The `cem-study` command line (`cem_study.cli`): experiment and report end to end at the smoke scale, and bad
input: each case of the table runs `main()` in-process and must end with a non-zero exit code and exactly one
line on stderr (`cem-study COMMAND: error: ...`), never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cem_study.cli import main


def write(rel, content):
    def setup(tmp):
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)

    return setup


def _first_slug() -> str:
    """The slug of smoke fig2a's first run (a run `--plan` and `--analyse-only` read)."""
    from cem_study import get_scale
    from cem_study.runner import _specs

    return _specs("fig2a", get_scale("smoke"))[0].slug


def bad_record(name, value, row=False):
    """{tmp}/r with smoke fig2a's first run finished, its record `name` (results.json or run.json) replaced by `value`: in
    its folder, or with `row` in its row of runs.jsonl (the folder gone, as after `git rm`)."""

    def setup(tmp):
        slug, good = _first_slug(), {"results.json": {"steps": 4, "valid_loss": 2.0, "wall_time_s": 1.0}, "run.json": {"train": {}, "total_steps": 4}}
        records = {**good, name: value}
        if row:
            line = {"slug": slug, "run": records["run.json"], "results": records["results.json"], "evals": {}, "files": {}}
            (tmp / "r" / "runs").mkdir(parents=True)
            (tmp / "r" / "runs.jsonl").write_text(json.dumps(line) + "\n")
        else:
            for file, content in records.items():
                write(f"r/runs/{slug}/{file}", content if isinstance(content, str) else json.dumps(content))(tmp)

    return setup


PLAN = ["experiment", "fig2a", "--scale", "smoke", "--processor", "Some CPU", "--results", "{tmp}/r"]
RECORD_CASES = [  # issue 63: a damaged record of a finished run, read by --plan and --analyse-only, named with its field
    ("plan, processor_inferred a list", [*PLAN, "--plan"], bad_record("results.json", {"processor_inferred": [1]}),
     "results.json: processor_inferred must be an object, got list"),
    ("analyse, processor_inferred a list", [*PLAN, "--analyse-only"], bad_record("results.json", {"processor_inferred": ["x"]}),
     "results.json: processor_inferred must be an object, got list"),
    ("plan, sessions of numbers", [*PLAN, "--plan"], bad_record("results.json", {"sessions": [1, "x"]}), "results.json: sessions[0] must be an object, got int 1"),
    ("analyse, sessions of strings", [*PLAN, "--analyse-only"], bad_record("results.json", {"sessions": ["x"]}), "results.json: sessions[0] must be an object, got str 'x'"),
    ("plan, a session's processor a number", [*PLAN, "--plan"], bad_record("results.json", {"sessions": [{"processor": 3}]}),
     "results.json: sessions[0].processor must be a string, got int 3"),
    ("plan, processor_inferred without its processor", [*PLAN, "--plan"], bad_record("results.json", {"processor_inferred": {"by": "a check"}}),
     "results.json: processor_inferred.processor is missing"),
    ("analyse, valid_loss NaN", [*PLAN, "--analyse-only"], bad_record("results.json", '{"valid_loss": NaN}'), "results.json: valid_loss must be a finite number"),
    ("analyse, wall time a word", [*PLAN, "--analyse-only"], bad_record("results.json", {"wall_time_s": "long"}), "results.json: wall_time_s must be a finite number"),
    ("analyse, results a list", [*PLAN, "--analyse-only"], bad_record("results.json", "[1]"), "results.json is corrupted: expected a JSON object"),
    ("analyse, results truncated", [*PLAN, "--analyse-only"], bad_record("results.json", '{"steps": 4, "valid_lo'), "results.json is corrupted: not JSON"),
    ("plan, the row's processor_inferred a list", [*PLAN, "--plan"], bad_record("results.json", {"processor_inferred": [1]}, row=True),
     "results.json (its row in {tmp}/r/runs.jsonl): processor_inferred must be an object, got list"),
    ("analyse, the row's sessions of numbers", [*PLAN, "--analyse-only"], bad_record("results.json", {"sessions": [2]}, row=True),
     "results.json (its row in {tmp}/r/runs.jsonl): sessions[0] must be an object, got int 2"),
    ("plan, the row's steps negative", [*PLAN, "--plan"], bad_record("results.json", {"steps": -3, "sessions": [{"processor": "x"}]}, row=True),
     "steps must be an integer in [0, 1,000,000,000,000,000], got int -3"),
    ("analyse, the row's world size zero", [*PLAN, "--analyse-only"], bad_record("results.json", {"world_size": 0}, row=True),
     "results.json (its row in {tmp}/r/runs.jsonl): world_size must be an integer >= 1, got int 0"),
]

CASES = [
    ("experiment --jobs 0", ["experiment", "fig2a", "--scale", "smoke", "--jobs", "0", "--results", "{tmp}/r"], None, "jobs must be an integer >= 1"),
    ("experiment seeds not numbers", ["experiment", "fig2a", "--scale", "smoke", "--seeds", "a,b", "--results", "{tmp}/r"], None, "seeds"),
    ("experiment seeds negative", ["experiment", "fig2a", "--scale", "smoke", "--seeds", "-1", "--results", "{tmp}/r"], None, "seed"),
    ("experiment seeds empty", ["experiment", "fig2a", "--scale", "smoke", "--seeds", ",", "--results", "{tmp}/r"], None, "seeds"),
    ("report of nothing", ["report", "{tmp}/no-results"], None, None),
    ("report of a file", ["report", "{tmp}/afile"], write("afile", "x"), "afile"),
    ("report with a damaged summary", ["report", "{tmp}/res"], write("res/fig2a/summary.json", "{"), "summary.json"),
    ("report with a summary that is a list", ["report", "{tmp}/res"], write("res/fig2a/summary.json", "[1, 2]"), "summary.json"),
    ("experiment unknown id", ["experiment", "fig9", "--scale", "smoke", "--results", "{tmp}/r"], None, "fig9"),
    ("experiment seeds repeated", ["experiment", "fig2a", "--scale", "smoke", "--seeds", "1,1", "--results", "{tmp}/r"], None, "seeds"),
    ("experiment results in a file", ["experiment", "fig2a", "--scale", "smoke", "--results", "{tmp}/afile"], write("afile", "x"), "afile"),
    ("experiment unknown scale", ["experiment", "fig2a", "--scale", "huge", "--results", "{tmp}/r"], None, "scale"),
    ("experiment empty id list", ["experiment", ",", "--scale", "smoke", "--results", "{tmp}/r"], None, None),
    ("experiment device unknown", ["experiment", "fig2a", "--scale", "smoke", "--device", "gpu9", "--results", "{tmp}/r"], None, "device"),
    ("report of a results folder with only runs", ["report", "{tmp}/res"], write("res/runs/x/results.json", "{}"), "no experiment results"),
    ("experiment --results empty", ["experiment", "fig2a", "--scale", "smoke", "--results", ""], None, "--results is empty"),
    ("experiment plan unknown id", ["experiment", "fig9", "--plan", "--scale", "smoke", "--results", "{tmp}/r"], None, "unknown experiment 'fig9'"),
    ("experiment plan empty id", ["experiment", "", "--plan", "--scale", "smoke", "--results", "{tmp}/r"], None, "unknown experiment ''"),
    ("experiment plan unknown scale", ["experiment", "fig2a", "--plan", "--scale", "huge"], None, "argument --scale: invalid choice"),
    ("experiment plan --jobs 0", ["experiment", "fig2a", "--plan", "--scale", "smoke", "--jobs", "0", "--results", "{tmp}/r"], None, "--jobs must be an integer >= 1"),
    ("experiment plan --jobs negative", ["experiment", "fig2a", "--plan", "--scale", "smoke", "--jobs", "-3", "--results", "{tmp}/r"], None, "--jobs must be an integer >= 1"),
    ("experiment plan --results empty", ["experiment", "fig2a", "--plan", "--scale", "smoke", "--results", " "], None, "--results is empty"),
    ("experiment plan --results a file", ["experiment", "fig2a", "--plan", "--scale", "smoke", "--results", "{tmp}/afile"], write("afile", "x"), "afile is a file"),
    ("experiment plan --processor empty", ["experiment", "fig2a", "--plan", "--scale", "smoke", "--processor", "", "--results", "{tmp}/r"], None, "--processor is empty"),
    # -- flags that mean nothing or contradict (issue 63: `cem_study.cli.FLAGS`); --plan checks the run's flags as the run would
    ("experiment plan and analyse-only", ["experiment", "fig2a", "--plan", "--analyse-only", "--scale", "smoke", "--results", "{tmp}/r"], None,
     "--analyse-only has no effect with --plan: give one of them"),
    ("experiment plan --nproc-per-run 0", ["experiment", "fig2a", "--plan", "--scale", "smoke", "--nproc-per-run", "0", "--results", "{tmp}/r"], None,
     "--nproc-per-run must be an integer >= 1"),
    ("experiment plan --until tomorrow", ["experiment", "fig2a", "--plan", "--scale", "smoke", "--until", "tomorrow", "--results", "{tmp}/r"], None, "--until 'tomorrow'"),
    ("experiment --until empty", ["experiment", "fig2a", "--scale", "smoke", "--until", "", "--results", "{tmp}/r"], None, "--until is empty"),
    ("experiment local --cpus-per-run 0", ["experiment", "fig2a", "--scale", "smoke", "--launcher", "local", "--cpus-per-run", "0", "--results", "{tmp}/r"], None,
     "--cpus-per-run must be an integer >= 1"),
    ("experiment local --time-min 0", ["experiment", "fig2a", "--scale", "smoke", "--launcher", "local", "--time-min", "0", "--results", "{tmp}/r"], None,
     "--time-min must be an integer >= 1"),
    ("experiment local --partition", ["experiment", "fig2a", "--scale", "smoke", "--launcher", "local", "--partition", "gpu", "--results", "{tmp}/r"], None,
     "--partition has no effect without --launcher slurm"),
    ("experiment process --cpus-per-run", ["experiment", "fig2a", "--scale", "smoke", "--cpus-per-run", "2", "--results", "{tmp}/r"], None,
     "--cpus-per-run has no effect with --launcher process"),
    ("experiment plan seeds not numbers", ["experiment", "fig2a", "--plan", "--scale", "smoke", "--seeds", "x", "--results", "{tmp}/r"], None, "--seeds must be"),
    ("experiment sizes not the scale's", ["experiment", "fig2a", "--scale", "micro", "--sizes", "cpu96", "--results", "{tmp}/r"], None,
     "--sizes must be distinct sizes of the micro scale, comma-separated (micro, tiny); got 'cpu96'"),
    ("experiment plan sizes repeated", ["experiment", "fig2a", "--plan", "--scale", "micro", "--sizes", "tiny,tiny", "--results", "{tmp}/r"], None,
     "--sizes must be distinct sizes"),
    ("experiment sizes empty", ["experiment", "fig2a", "--scale", "micro", "--sizes", ",", "--results", "{tmp}/r"], None, "--sizes must be"),
    ("experiment plan sizes without a sweep's base", ["experiment", "fig2a", "--plan", "--scale", "cpu", "--sizes", "cpu96", "--results", "{tmp}/r"], None,
     "--sizes cpu96: the cpu scale sweeps learning rates, and its other sizes' grids are centred on its base size's choice: include cpu64"),
]


CASES += RECORD_CASES


@pytest.mark.parametrize("name,argv,setup,expect", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(name, argv, setup, expect, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if setup is not None:
        setup(tmp_path)
    args = [a.format(tmp=tmp_path) for a in argv]
    try:
        code = main(args)
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err
    assert code not in (0, None), f"{name}: accepted: {err}"
    assert "Traceback" not in err and err.count("\n") == 1 and err.endswith("\n"), f"{name}: {err!r}"
    assert err.startswith(f"cem-study {argv[0]}: error: ") or err.startswith("cem-study: error: "), f"{name}: {err!r}"
    if expect is not None:
        assert expect.format(tmp=tmp_path) in err, f"{name}: {err!r}"


@pytest.mark.parametrize("launch", [["-m", "cem_study"], ["-c", "import sys; from cem_study.cli import main; sys.exit(main())"]],
                         ids=["python -m cem_study", "the cem-study script"])
def test_the_command_runs_as_a_module_and_as_its_script(launch, tmp_path):
    """`python -m cem_study` and the console script (`cem_study.cli:main`) are the same command: its help and its errors."""
    done = subprocess.run([sys.executable, *launch, "experiment", "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("usage: cem-study experiment") and "--until" in done.stdout
    done = subprocess.run([sys.executable, *launch, "report", str(tmp_path / "nothing")], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 2 and done.stderr.startswith("cem-study report: error: ") and done.stderr.count("\n") == 1


def test_smoke_experiment_ends_with_its_report_and_exit_0(corpus, tmp_path, monkeypatch, capsys):
    """The smoke scale's runs are a few steps by design: `cem-study experiment ... --scale smoke` writes the report
    (first line: not the paper's protocol) and exits 0, instead of exit 2 and 'not trained to the budget'."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "data" / "tinyshakespeare").mkdir(parents=True)  # the smoke scale's corpus, made of the test corpus
    (tmp_path / "data" / "tinyshakespeare" / "input.txt").write_text("".join((corpus / f"{s}.txt").read_text() for s in ("train", "valid", "test")))
    monkeypatch.setenv("CEM_DATA_DIR", str(tmp_path / "data"))
    res = tmp_path / "res"
    assert main(["experiment", "fig2c", "--scale", "smoke", "--results", str(res), "--seeds", "0"]) == 0
    report, out = (res / "report.md").read_text(), capsys.readouterr().out
    assert report.startswith("> **Not the paper's protocol: a pipeline check") and "report:" in out
    assert "fig2c: pipeline check: " in out and not any(w in out for w in ("[held]", "[not held]", "[inconclusive]", "paired seeds would detect"))


@pytest.mark.slow
def test_rehearse_runs_a_scales_suite_in_shape_at_a_few_steps(corpus, tmp_path, monkeypatch, capsys):
    """--rehearse keeps the cpu scale's corpus, sizes, learning-rate sweep and analyses but trains each run 3
    steps (and the GP study at its tiny setting), into results/cpu-rehearsal, and writes the report marked
    short (exit 0)."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "data" / "wikitext-2").mkdir(parents=True)  # the cpu scale's corpus, made of the test corpus
    for split in ("train", "valid", "test"):
        (tmp_path / "data" / "wikitext-2" / f"{split}.txt").write_text((corpus / f"{split}.txt").read_text())
    monkeypatch.setenv("CEM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", "lr,fig4,table3", "--scale", "cpu", "--rehearse", "--seeds", "0"]) == 0
    res = tmp_path / "results" / "cpu-rehearsal"
    report = (res / "report.md").read_text()
    assert report.startswith("> **Not the paper's protocol") and "3 steps per run" in report
    runs = [json.loads((d / "results.json").read_text()) for d in (res / "runs").iterdir()]
    assert {r["config"]["train"]["preset"] for r in runs} == {"cpu64", "cpu96", "cpu128"}  # every size's sweep
    assert {r["steps"] for r in runs} == {3} and {r["config"]["train"]["seq_len"] for r in runs} == {32}
    assert {r["config"]["train"]["final_eval_tokens"] for r in runs} == {4096}  # not the whole splits
    assert (res / "fig4" / "fig4.png").is_file() and "regime" in json.loads((res / "lr" / "summary.json").read_text())
    assert not (tmp_path / "results" / "cpu").exists()
    gp = [json.loads(line) for line in (res / "table3" / "rows.jsonl").read_text().splitlines()]
    assert {r["scale"] for r in gp} == {"tiny"}  # the GP study scaled down too


def test_analyse_only_trains_nothing_and_says_what_each_experiment_waits_for(tmp_path, capsys):
    """`cem-study experiment ... --analyse-only` on a campaign that has not started: no run, no report, and for each
    experiment one line naming what it waits for."""
    assert main(["experiment", "fig2c,fig2d", "--scale", "cpu128", "--results", str(tmp_path / "cpu128"), "--analyse-only"]) == 0
    out = capsys.readouterr().out
    assert "fig2c: not analysed, waiting for the Llama rate sweep at cpu128 (3 runs to train)" in out
    assert "fig2d: not analysed" in out and "no report written" in out
    assert not (tmp_path / "cpu").exists() and not (tmp_path / "cpu128" / "report.md").exists()


def test_every_flag_of_experiment_and_report_has_its_rules():
    """`cem_study.cli.FLAGS` knows each subcommand's flags, read from the parser: a new flag without an entry fails."""
    import argparse

    from cem_study.cli import FLAGS, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {name: {a.dest for a in p._actions if a.dest != "help"} for name, p in sub.choices.items()} == {k: set(v) for k, v in FLAGS.items()}


TRAINING_ONLY = {"--jobs": "2", "--nproc-per-run": "2", "--until": "23:59", "--launcher": "local", "--data-dir": "d", "--device": "cpu", "--allow-short": None}


@pytest.mark.parametrize("mode", ["--plan", "--analyse-only"])
@pytest.mark.parametrize("flag,value", TRAINING_ONLY.items())
def test_a_flag_only_training_reads_is_checked_and_named_in_a_warning_under_plan_and_analyse_only(mode, flag, value, tmp_path, monkeypatch, capsys):
    """Under --plan (and --analyse-only) a flag only the run reads is checked as for the run and named in one warning
    line, exit 0; one both read, none. What the command ran with is stubbed: its flags are the question."""
    import cem_study

    monkeypatch.setattr(cem_study, "plan", lambda *a, **kw: {})
    monkeypatch.setattr(cem_study, "format_plan", lambda plan: "the plan")
    monkeypatch.setattr(cem_study, "analyse_finished", lambda *a, **kw: ([], {}))
    reads = {"--plan": (), "--analyse-only": ("--data-dir", "--device", "--allow-short")}[mode]  # the analyses read these
    argv = ["experiment", "fig2a", "--scale", "smoke", "--results", str(tmp_path / "r"), mode, flag, *([value] if value else [])]
    assert main(argv) == 0
    err = capsys.readouterr().err
    if flag in reads:
        assert err == ""
    else:
        assert err.count("\n") == 1 and err.startswith("cem-study experiment: warning: ") and f"{flag} has no effect with {mode}" in err, err


def test_sizes_trains_those_sizes_and_leaves_the_analysis_to_every_size(tmp_path, monkeypatch, capsys):
    """--sizes narrows what trains (and what --plan counts); the analysis, whose families of findings span the sizes,
    is not run on a part of them: the command says so, exit 0; under --analyse-only --sizes means nothing (one warning,
    every size analysed); all the scale's sizes are the plain command."""
    import cem_study

    calls = []
    monkeypatch.setattr(cem_study, "run_suite", lambda *a, **kw: calls.append(("run", kw)) or [])
    monkeypatch.setattr(cem_study, "plan", lambda *a, **kw: calls.append(("plan", kw)) or {})
    monkeypatch.setattr(cem_study, "format_plan", lambda plan: "the plan")
    monkeypatch.setattr(cem_study, "analyse_finished", lambda *a, **kw: calls.append(("analyse", kw)) or ([], {}))
    base = ["experiment", "fig2a", "--scale", "micro", "--results", str(tmp_path / "r")]
    assert main([*base, "--sizes", "tiny"]) == 0
    assert calls[-1] == ("run", {"analyse": False, "sizes": ("tiny",)})
    assert "trained the runs of tiny: not analysed, as the analysis reads every size of the micro scale" in capsys.readouterr().out
    assert main([*base, "--sizes", "tiny", "--plan"]) == 0 and calls[-1] == ("plan", {"sizes": ("tiny",)})
    assert main([*base, "--sizes", "tiny", "--analyse-only"]) == 0 and calls[-1] == ("analyse", {})
    assert "--sizes has no effect with --analyse-only" in capsys.readouterr().err
    assert main([*base, "--sizes", "tiny,micro"]) == 0 and calls[-1] == ("run", {})  # every size, in any order: the plain command
