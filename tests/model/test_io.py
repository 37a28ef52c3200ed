"""Save/load round trip as config.json + model.safetensors, and the errors of bad files."""

import json

import pytest
import torch

from cem.model import LanguageModel, load_pretrained, model_config, save_pretrained


@pytest.mark.parametrize("arch", ["llama", "cem-t2"])
def test_round_trip(tmp_path, arch):
    torch.manual_seed(0)
    model = LanguageModel(model_config("tiny", arch, vocab_size=50, kq_diag="per_head"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_pretrained(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temp leftovers
    loaded = load_pretrained(tmp_path / "m")
    assert loaded.config == model.config
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)


def test_tied_embeddings_round_trip(tmp_path):
    model = LanguageModel(model_config("tiny", "cem", vocab_size=50, tie_embeddings=True))
    assert model.head.weight is model.embed.weight
    loaded = load_pretrained(save_pretrained(model, tmp_path / "m"))
    assert loaded.head.weight is loaded.embed.weight
    torch.testing.assert_close(loaded.embed.weight, model.embed.weight)


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config"):
        load_pretrained(tmp_path)
    model = LanguageModel(model_config("tiny", "cem", vocab_size=50))
    d = save_pretrained(model, tmp_path / "m")
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="corrupted weights"):
        load_pretrained(d)
    save_pretrained(model, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["dim"] = 32
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="do not match"):
        load_pretrained(d)
    cfg["not_a_key"] = 1
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unknown model config key"):
        load_pretrained(d)
