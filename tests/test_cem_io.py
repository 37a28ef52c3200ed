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


def test_staged_folder_moves_in_on_success_only(tmp_path, monkeypatch):
    """What is written into the staged folder reaches the target only when the block ends normally, config.json
    last; a failure leaves the target as it was, and no temp folder behind."""
    from cem import io as cio

    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("old")
    with pytest.raises(OSError, match="disk full"):
        with cio.staged_folder(target) as tmp:
            (tmp / "config.json").write_text("new")
            raise OSError(28, "disk full")
    assert (target / "config.json").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    moved, real = [], os.replace
    monkeypatch.setattr(cio.os, "replace", lambda a, b: (moved.append(os.path.basename(b)), real(a, b)))
    with cio.staged_folder(target) as tmp:
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (tmp / name).write_text("new " + name)
    moved.remove(cio.MOVING)  # the note saying a move is under way (`half_moved`), written first
    assert moved[-1] == "config.json" and sorted(moved) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (target / "config.json").read_text() == "new config.json" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(__import__("resource"), "RLIMIT_FSIZE"), reason="needs RLIMIT_FSIZE")
@pytest.mark.parametrize("arch", ["attn='cem', mlp='cem'", "attn='llama', mlp='llama', position='rope'"], ids=["cem-format", "llama-format"])
def test_an_export_cut_short_by_a_file_size_limit_leaves_the_folder_as_it_was(tmp_path, arch):
    """`ulimit -f` (or a full disk) in the middle of an export: one line saying so, and the output folder keeps
    what it held (here: nothing, then an earlier complete export), never a folder without weights."""
    import resource
    import subprocess
    import sys

    pytest.importorskip("transformers")
    code = (
        "import sys\nfrom cem.model import LanguageModel, ModelConfig\nfrom cem.hf import export_hf, export_llama\n"
        f"m = LanguageModel(ModelConfig.from_dict(dict(vocab_size=300, dim=64, n_layers=2, n_heads=2, context=32, {arch})))\n"
        + ("export_llama(m, sys.argv[1])\n" if "llama" in arch else "export_hf(m, sys.argv[1])\n")  # each public entry point
    )
    out = tmp_path / "export"

    def run(limit=None):
        pre = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))) if limit else None
        return subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, preexec_fn=pre, timeout=300)

    assert run(limit=20_000).returncode != 0
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    assert run().returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "model.safetensors" in before and "config.json" in before
    assert (b'"llama"' in before["config.json"]) == ("llama" in arch)  # the format asked for
    assert run(limit=20_000).returncode != 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and sorted(p.name for p in tmp_path.iterdir()) == ["export"]
