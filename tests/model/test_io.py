"""Save/load round trip as config.json + model.safetensors, and the errors of bad files."""

import json

import pytest
import torch

from cem.model import LanguageModel, load_pretrained, model_config, save_pretrained


@pytest.mark.parametrize("arch", ["llama", "cem-t2"])
def test_round_trip(tmp_path, arch):
    torch.manual_seed(0)
    model = LanguageModel(model_config("tiny", arch, vocab_size=50, **({"kq_diag": "per_head"} if arch != "llama" else {})))
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


def _committed_models() -> dict:
    """One flat model config of each kind the study's committed runs trained (attention kind, MLP kind, Llama
    positions), from their run.json files copied into tests/flat_runs (as run.json files and checkpoints
    before the nested config hold it)."""
    from pathlib import Path

    found = {}
    for path in sorted((Path(__file__).resolve().parents[1] / "flat_runs").glob("*/run.json")):
        flat = json.loads(path.read_text())["model"]
        found.setdefault((flat["attn"], flat["mlp"], flat["position"] if flat["attn"] == "llama" else "alibi"), flat)
    return found


def test_flat_checkpoints_and_exports_still_load(tmp_path):
    """A checkpoint or save_pretrained folder written before the nested config (config.json with flat keys:
    `attn_steps`, `position`, ...) loads to the same config and weights; so does an old Hugging Face export."""
    from safetensors.torch import save_file

    from cem.hf.modeling import CEMConfig
    from cem.model import ModelConfig
    from cem.model.io import FORMAT

    committed = _committed_models()
    assert {("cem", "cem", "alibi"), ("cem", "llama", "alibi"), ("llama", "cem", "rope"), ("llama", "llama", "alibi"), ("llama", "llama", "rope")} <= set(committed)
    for i, flat in enumerate(committed.values()):
        cfg = ModelConfig.from_dict(flat)
        assert cfg.flat_dict() == {**cfg.flat_dict(), **{k: v for k, v in flat.items() if k in cfg.flat_dict() and (k != "position" or cfg.attn.kind == "llama")}}
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"format": FORMAT, **flat}))
        torch.manual_seed(i)
        state = LanguageModel(cfg).state_dict()
        save_file(state, folder / "model.safetensors", metadata={"format": FORMAT})
        loaded = load_pretrained(folder)
        assert loaded.config == cfg and all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
        assert CEMConfig(**flat).to_model_config() == cfg  # an export's config.json, read by transformers
