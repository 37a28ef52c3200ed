"""cem.io: files and folders written atomically get the mode the umask asks for (group-shared run folders)."""

import os
import stat

import pytest

from cem.io import atomic_write_text, default_mode
from cem.model import LanguageModel, ModelConfig
from cem.training.checkpoint import save_checkpoint


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_atomic_writes_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = atomic_write_text(tmp_path / "run.json", "{}")
        assert mode(path) == 0o666 & ~umask == default_mode()
    finally:
        os.umask(old)


def test_checkpoint_folder_and_files_follow_the_umask(tmp_path, umask_022):
    model = LanguageModel(ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=1, context=8), init_seed=0)
    save_checkpoint(tmp_path / "ckpt", model.config, model.state_dict(), {"step": 1})
    assert mode(tmp_path / "ckpt") == 0o755  # mkdtemp would leave 0o700
    assert {mode(p) for p in (tmp_path / "ckpt").iterdir()} == {0o644}  # mkstemp would leave 0o600


@pytest.mark.parametrize("arch", ["llama", "cem"])
def test_hf_exports_follow_the_umask(tmp_path, umask_022, arch):
    pytest.importorskip("transformers")
    from cem.hf import export_hf
    from cem.model import model_config

    model = LanguageModel(model_config("micro", arch, vocab_size=32), init_seed=0)
    out = export_hf(model, tmp_path / "export")
    assert {p.name: mode(p) for p in out.iterdir()} == {p.name: 0o644 for p in out.iterdir()}
