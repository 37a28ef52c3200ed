"""Issue 39: `cem export` killed with kill -9 leaves its hidden staging folder (`.OUT.XXXXXXXX`) beside OUT;
the next export to OUT removes it. Only such a folder of OUT's whose writer is dead goes: not one a live
writer holds, not one of another folder, not an older cem's (no lock: its writer cannot be told), never
through a link."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the Hugging Face integration needs transformers (pip install 'cem-transformers[hf]')")

import cem.hf as ch  # noqa: E402
from cem.io import lock_folder, make_temp_dir, staged_folder  # noqa: E402
from cem.model import LanguageModel, model_config  # noqa: E402


def killed_staging(out: Path) -> Path:
    """The staging folder a writer of `out` leaves when it is killed with SIGKILL mid-write (a forked child)."""
    before = set(out.parent.iterdir())
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            with staged_folder(out) as tmp:
                (tmp / "model.safetensors").write_bytes(b"half")
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == signal.SIGKILL
    (left,) = set(out.parent.iterdir()) - before
    return left


@pytest.mark.parametrize("format", ["llama", "cem"])
def test_an_export_removes_the_staging_folders_killed_exports_left(tmp_path, format):
    model = LanguageModel(model_config("tiny", "llama", vocab_size=16, dim=8, n_heads=2, hidden_dim=16, n_layers=1, context=8))
    out = tmp_path / "out"
    stale = [killed_staging(out), killed_staging(out)]
    other = killed_staging(tmp_path / "other")  # another folder's
    unlocked = make_temp_dir(tmp_path, ".out.")  # as an older cem left it: no lock, so its writer may be alive
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / ".lock").write_text("999999999\n")  # looks abandoned: only a link leads to it
    (tmp_path / ".out.linked01").symlink_to(victim)
    live = make_temp_dir(tmp_path, ".out.")
    with lock_folder(live, "a live export"):  # a writer still at it
        ch.export_hf(model, out, format=format)
        assert all(p.is_dir() for p in (other, unlocked, live)) and (victim / ".lock").is_file() and (tmp_path / ".out.linked01").is_symlink()
    assert not any(p.exists() for p in stale)
    assert (out / "config.json").is_file() and not (out / ".lock").exists()
