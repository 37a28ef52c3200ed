"""`cem lm-eval RUN --tasks ...`: a trained run scored by lm-evaluation-harness, offline, on the local tasks
that ship with cem (cem.hf.harness); the log-likelihoods themselves are checked against the model in
test_hf.py (test_lm_eval_hflm_scores_loglikelihood)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="needs transformers (pip install -e '.[hf]')")
pytest.importorskip("accelerate", reason="lm_eval's HFLM needs accelerate")
pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness (pip install -e '.[eval]')")

from cem.cli import main  # noqa: E402
from cem.hf.harness import LOCAL_CHOICE, LOCAL_TEXT, write_local_tasks  # noqa: E402


@pytest.mark.slow
def test_lm_eval_on_a_trained_run_offline(tiny_args, tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--data", tiny_args["data"], "--preset", "tiny", "--arch", "cem-t2", "--max-steps", "2", "--batch-size", "2",
                 "--out", out, "--quiet", "context=64", "tensorboard=false"]) == 0
    capsys.readouterr()
    assert main(["lm-eval", out, "--tasks", "cem_local_text,cem_local_choice", "--device", "cpu", "--batch-size", "4", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    text, choice = results["cem_local_text"], results["cem_local_choice"]
    assert text["sample_len"] == len(LOCAL_TEXT) and choice["sample_len"] == len(LOCAL_CHOICE)
    assert 1 < text["byte_perplexity"] < 300 and 0 < text["bits_per_byte"] < 9  # bytes: at most log2(257)-ish when untrained
    assert 0 <= choice["acc"] <= 1 and 0 <= choice["acc_norm"] <= 1
    assert main(["lm-eval", out, "--tasks", "cem_local_choice", "--limit", "3", "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cem_local_choice"]["sample_len"] == 3
    assert main(["lm-eval", out, "--tasks", "no_such_task", "--device", "cpu"]) == 2
    assert "unknown lm-eval task(s) no_such_task" in capsys.readouterr().err
    assert main(["lm-eval", out, "--tasks", ",", "--device", "cpu"]) == 2


def test_local_tasks_are_plain_yaml_and_json_lines(tmp_path):
    folder = write_local_tasks(tmp_path / "tasks")
    assert sorted(p.name for p in folder.iterdir()) == ["cem_local_choice.jsonl", "cem_local_choice.yaml", "cem_local_text.jsonl", "cem_local_text.yaml"]
    rows = [json.loads(line) for line in (folder / "cem_local_choice.jsonl").read_text().splitlines()]
    assert all(0 <= r["label"] < len(r["choices"]) for r in rows) and len(rows) == len(LOCAL_CHOICE)


@pytest.mark.parametrize("missing", ["lm_eval", "transformers"])
def test_lm_eval_without_the_eval_extra_names_it(missing, tmp_path, monkeypatch, capsys):
    """Issue 38: without transformers it was an "unexpected" error naming only transformers, and the hint named a
    package-index release that does not exist; the install is from the clone."""
    import sys

    monkeypatch.setitem(sys.modules, missing, None)  # import fails as if not installed
    if missing == "transformers":  # cem.hf imported afresh fails at its first line; imported afresh with transformers
        for name in [m for m in sys.modules if m == "cem.hf" or m.startswith("cem.hf.")]:  # it would register a
            monkeypatch.delitem(sys.modules, name)  # second CEMConfig with the Auto classes, for good
    assert main(["lm-eval", str(tmp_path), "--tasks", "cem_local_text"]) == 2
    err = capsys.readouterr().err
    assert f"cem lm-eval needs the eval extra ({missing} is missing): pip install -e '.[eval]' in the cem clone" in err
    assert "unexpected" not in err and "cem-transformers[" not in err


def test_lm_eval_records_cems_commit_without_a_git_error(tmp_path, monkeypatch, capfd):
    """Issue 38: lm-eval ran `git describe` in the working directory, printing "fatal: not a git repository" outside a clone."""
    import lm_eval.evaluator as evaluator

    from cem.hf.harness import _commit_of_cem
    from cem.provenance import code_version

    monkeypatch.chdir(tmp_path)
    original = evaluator.get_git_commit_hash
    with _commit_of_cem():
        assert evaluator.get_git_commit_hash() == code_version()["commit"]
    assert evaluator.get_git_commit_hash is original
    assert "fatal" not in capfd.readouterr().err


def test_no_source_file_names_a_package_index_release():
    """cem is installed from a clone (pip install -e '.[extra]'): no hint may name `cem-transformers[extra]`."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "cem"
    assert not [p for p in src.rglob("*.py") if "cem-transformers[" in p.read_text()]


@pytest.mark.slow
def test_the_documented_lm_eval_command_line_finds_the_local_tasks(tmp_path):
    """Issue 38: docs/huggingface.md's lm-eval command line named tasks lm-eval could not find (no --include_path);
    its commands, run as written on a tiny export (with --limit 2), score both local tasks."""
    import os
    import shlex
    import subprocess
    import sys

    import torch

    from cem.data.tokenizers import ByteTokenizer
    from cem.hf import export_hf
    from cem.model import LanguageModel, model_config

    from test_docs import ROOT, blocks

    code = next(c for _, _, mark, c in blocks(ROOT / "docs" / "huggingface.md")
                if mark.endswith("::test_the_documented_lm_eval_command_line_finds_the_local_tasks"))
    commands = [shlex.split(line, comments=True) for line in code.replace("\\\n", " ").splitlines()]
    commands = [c for c in commands if c]
    torch.manual_seed(0)
    export_hf(LanguageModel(model_config("tiny", "cem", vocab_size=257)), tmp_path / "hf" / "134M-cem", tokenizer=ByteTokenizer())
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    for command in commands:
        assert command[0] == "python"
        done = subprocess.run([sys.executable, *command[1:], *(["--limit", "2"] if "--tasks" in command else [])], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    assert "cem_local_choice" in done.stdout and "cem_local_text" in done.stdout and "bits_per_byte" in done.stdout
