"""Issue 39: the sha256 every manifest records is checked. A token shard altered in place (same size) is
refused when the shards are loaded, naming the file, and `cem data verify` checks shard folders, run folders
and checkpoint folders file by file."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

from cem.cli import main
from cem.data import get_tokenizer, tokenshards
from cem.data.tokenshards import load_shards, prepare_shards, token_split
from cem.model import LanguageModel, model_config
from cem.training.checkpoint import read_manifest, save_checkpoint

WORDS = "the cat sat on a mat and then ran to its home".split()


@pytest.fixture
def shards(tmp_path) -> Path:
    rng = random.Random(0)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with open(corpus / "part.jsonl", "w", encoding="utf-8") as f:
        for _ in range(300):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))}) + "\n")
    return prepare_shards(str(corpus), "byte", tmp_path / "shards", shard_tokens=5_000, workers=0, progress=False)


def _zero(path: Path) -> None:
    """Overwrite the file with zeros in place, keeping its size."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.write(bytes(size))


def test_a_shard_zeroed_in_place_is_refused_naming_it(shards):
    load_shards(shards)  # intact: loads
    _zero(shards / "train-00001.bin")
    with pytest.raises(ValueError, match=r"train-00001\.bin: corrupted, its sha256"):
        load_shards(shards)
    with pytest.raises(ValueError, match=r"train-00001\.bin"):  # what training and `cem eval` read through
        token_split(str(shards), get_tokenizer("byte"), "byte", "valid")


def test_each_shard_is_hashed_once_per_process_while_unchanged(shards, monkeypatch):
    hashed = []
    real = tokenshards.sha256_file
    monkeypatch.setattr(tokenshards, "_HASHED", {})
    monkeypatch.setattr(tokenshards, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    n_files = len(list(shards.glob("*.bin")))
    load_shards(shards)
    load_shards(shards)
    assert len(hashed) == n_files == len(set(hashed))


def test_cem_data_verify_reports_a_zeroed_shard(shards, capsys):
    assert main(["data", "verify", str(shards)]) == 0
    out = capsys.readouterr().out
    n_files = len(list(shards.glob("*.bin")))
    assert f"verified {n_files} files" in out and "all intact" in out and out.count("ok ") == n_files
    _zero(shards / "valid-00000.bin")
    assert main(["data", "verify", str(shards)]) == 1
    captured = capsys.readouterr()
    assert f"BAD {shards / 'valid-00000.bin'}: " in captured.out and "1 of" in captured.err
    assert "Traceback" not in captured.out + captured.err


def test_cem_data_verify_checks_a_run_folder_s_checkpoint(tmp_path, capsys):
    cfg = model_config("tiny", "llama", vocab_size=16, dim=8, n_heads=2, hidden_dim=16, n_layers=1, context=8)
    run = tmp_path / "run"
    save_checkpoint(run / "ckpt", cfg, LanguageModel(cfg).state_dict(), {"step": 3, "numbers": torch.arange(3)})
    assert main(["data", "verify", str(run)]) == 0
    assert "all intact" in capsys.readouterr().out
    weights = next(p for p in (run / "ckpt").iterdir() if p.suffix == ".safetensors")
    _zero(weights)
    assert main(["data", "verify", str(run)]) == 1
    assert f"BAD {weights}: " in capsys.readouterr().out
    assert main(["data", "verify", str(tmp_path / "nothing")]) == 2
    assert "no such folder" in capsys.readouterr().err


def _checkpoint(tmp_path) -> Path:
    cfg = model_config("tiny", "llama", vocab_size=16, dim=8, n_heads=2, hidden_dim=16, n_layers=1, context=8)
    save_checkpoint(tmp_path / "run" / "ckpt", cfg, LanguageModel(cfg).state_dict(), {"step": 3})
    return tmp_path / "run" / "ckpt"


def test_cem_data_verify_fails_a_checkpoint_whose_manifest_lists_no_files(tmp_path, capsys):
    """Issue 63: 'verified 0 files ... all intact', exit 0, for a manifest with its file table emptied."""
    ckpt = _checkpoint(tmp_path)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    (ckpt / "manifest.json").write_text(json.dumps({**manifest, "files": {}}))
    assert main(["data", "verify", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {ckpt} is corrupted: manifest.json: files must be a non-empty object, got an empty object" in err and len(err.splitlines()) == 1


def _outside_entries(tmp_path) -> list[str]:
    """Manifest entries naming files outside the manifest's folder: climbing out, absolute, a link leading out."""
    (tmp_path / "secret").write_bytes(b"not a shard")
    return ["../../../../../../etc/hostname", str(tmp_path / "secret"), "link.bin"]


def _list_in_shards(folder: Path, name: str) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][0]["file"] = name
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _list_in_checkpoint(folder: Path, name: str) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": 11, "sha256": "0" * 64}
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("entry", range(3))
@pytest.mark.parametrize("kind", ["shards", "checkpoint"])
def test_a_manifest_entry_outside_its_folder_is_refused_naming_both(shards, tmp_path, capsys, entry, kind):
    """Issue 63: a shard manifest entry `../../etc/hostname` was followed out of the folder and hashed; so for a
    checkpoint's. Refused where the manifest is read (loading the shards, a checkpoint) and by `cem data verify`."""
    folder, list_in, read = (shards, _list_in_shards, load_shards) if kind == "shards" else (_checkpoint(tmp_path), _list_in_checkpoint, read_manifest)
    name = _outside_entries(tmp_path)[entry]
    (folder / "link.bin").symlink_to(tmp_path / "secret")
    list_in(folder, name)
    want = f"{folder / 'manifest.json'} lists {name!r}, which is not a file in its folder"
    with pytest.raises(ValueError, match=re.escape(want)):
        read(folder)
    assert main(["data", "verify", str(folder)]) == 2
    assert want in capsys.readouterr().err
