"""A stranger's first day, as the README tells it, in an empty folder with no data beside it and no network:
prepare a corpus from a local copy, train, stop and resume, run the same command again, extend, evaluate,
generate past the context, export, and load the export with transformers' Auto classes and pipeline."""

from __future__ import annotations

import json
import random

import pytest

from cem.cli import main
from cem.data import load_tokenizer

pytest.importorskip("transformers")


@pytest.fixture
def stranger(tmp_path, monkeypatch):
    """An empty working folder, a fresh cache, no $CEM_DATA_DIR, and a local copy of tinyshakespeare."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CEM_DATA_DIR", raising=False)
    rng = random.Random(0)
    words = "to be or not that is the question whether tis nobler in the mind suffer slings and arrows".split()
    lines = [f"{rng.choice(['HAMLET', 'OPHELIA'])}:\n" + " ".join(rng.choice(words) for _ in range(12)) + ".\n" for _ in range(400)]
    (tmp_path / "copy" / "tinyshakespeare").mkdir(parents=True)
    (tmp_path / "copy" / "tinyshakespeare" / "input.txt").write_text("\n".join(lines))
    return tmp_path


def _results(out):
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_readme_walkthrough(stranger, capsys):
    import transformers

    assert main(["data", "prepare", "tinyshakespeare", "--from", str(stranger / "copy")]) == 0
    first = ["train", "--preset", "micro", "--data", "tinyshakespeare", "--tokenizer", "bpe:300", "--max-steps", "6",
             "--out", "runs/cem-micro", "--quiet", "context=32", "batch_size=4", "tensorboard=false", "eval_every=0"]
    assert main([*first, "--stop-at", "3"]) == 0  # stopped with a checkpoint, like Ctrl-C
    out = stranger / "work" / "runs" / "cem-micro"
    assert not (out / "results.json").exists()
    assert main(["train", "--out", "runs/cem-micro", "--resume", "--quiet"]) == 0  # every setting from the run
    done = _results(out)
    assert done["steps"] == 6 and done["config"]["train"]["tokenizer"] == "bpe:300"
    capsys.readouterr()

    # the same command again: nothing to do (exit 0), with or without --resume
    assert main(first) == 0
    assert main(["train", "--out", "runs/cem-micro", "--resume"]) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert _results(out) == done
    # more steps: the finished run is extended from its final checkpoint
    assert main(["train", "--out", "runs/cem-micro", "--resume", "--max-steps", "8", "--quiet"]) == 0
    assert _results(out)["steps"] == 8
    # a different setting in the same folder: refused, with what to do
    assert main([*first, "lr=1e-3"]) == 2
    assert "--overwrite" in capsys.readouterr().err

    assert main(["eval", "--ckpt", "runs/cem-micro", "--split", "test", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["data"] == "tinyshakespeare" and metrics["tokens"] > 0
    assert main(["generate", "--ckpt", "runs/cem-micro", "--prompt", "HAMLET:", "--max-new-tokens", "60", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("HAMLET:")

    assert main(["export", "runs/cem-micro", "export/cem"]) == 0
    tok = transformers.AutoTokenizer.from_pretrained("export/cem")
    import cem.hf  # noqa: F401 - the safe route: the installed class loads it, nothing in the folder runs

    model = transformers.AutoModelForCausalLM.from_pretrained("export/cem")
    assert tok("HAMLET: to be")["input_ids"] == load_tokenizer(out / "tokenizer").encode("HAMLET: to be")
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tok)
    text = pipe("HAMLET:", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert text.startswith("HAMLET:")

    # a plain Llama with the byte tokenizer goes out as LlamaForCausalLM; --overwrite starts a folder again
    llama = ["train", "--preset", "micro", "--arch", "llama", "--data", "tinyshakespeare", "--max-steps", "2", "--quiet",
             "--out", "runs/llama", "context=32", "batch_size=4", "tensorboard=false", "eval_every=0"]
    assert main(llama) == 0 and main([*llama, "--overwrite"]) == 0
    assert main(["export", "runs/llama", "--format", "llama", "export/llama"]) == 0
    assert json.loads((stranger / "work/export/llama/config.json").read_text())["model_type"] == "llama"
    pipe = transformers.pipeline("text-generation", model="export/llama", tokenizer="export/llama")
    assert pipe("OPHELIA:", max_new_tokens=5, do_sample=False)[0]["generated_text"].startswith("OPHELIA:")
    assert main(["export", "runs/cem-micro", "--format", "llama", "export/x"]) == 2  # not a plain Llama
    assert main(["export", "runs/cem-micro", "--remote-code", "export/shim"]) == 0
    assert (stranger / "work/export/shim/modeling_cem.py").exists() and not (stranger / "work/export/cem/modeling_cem.py").exists()
    assert "auto_map" not in json.loads((stranger / "work/export/cem/config.json").read_text())
