"""Issue 39: a checkpoint's files are checked against the sha256 its manifest records whenever it is read:
on resume and on eval of a run folder, and also when the checkpoint folder itself is given (`cem eval
--ckpt RUN/ckpt`, generate, export), which loaded unchecked. A model folder without a manifest
(`save_pretrained`) is read without the check."""

from __future__ import annotations

import re

import pytest

from cem.model import LanguageModel, model_config, save_pretrained
from cem.training import RunDir, save_checkpoint


def test_a_checkpoint_folder_given_itself_is_verified(tmp_path):
    cfg = model_config("tiny", "llama", vocab_size=16, dim=8, n_heads=2, hidden_dim=16, n_layers=1, context=8)
    model = LanguageModel(cfg)
    ckpt = tmp_path / "run" / "ckpt"
    save_checkpoint(ckpt, cfg, model.state_dict(), {"step": 1})
    RunDir(ckpt).load_model()  # intact: loads
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one bit of a weight: the file still parses, with the same size
    weights.write_bytes(bytes(data))
    for folder in (tmp_path / "run", ckpt):
        with pytest.raises(ValueError, match=re.escape(f"checkpoint {ckpt} is corrupted: model.safetensors does not match its checksum")):
            RunDir(folder).load_model()
    save_pretrained(model, tmp_path / "model")  # no manifest, no recorded hashes: read without the check
    assert RunDir(tmp_path / "model").load_model().config == model.config
