"""`cem lm-eval RUN --tasks ...`: a trained run scored by lm-evaluation-harness, offline, on the local tasks
that ship with cem (cem.hf.harness); the log-likelihoods themselves are checked against the model in
test_hf.py (test_lm_eval_hflm_scores_loglikelihood)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="needs transformers (pip install 'cem-transformers[hf]')")
pytest.importorskip("accelerate", reason="lm_eval's HFLM needs accelerate")
pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness (pip install 'cem-transformers[eval]')")

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
