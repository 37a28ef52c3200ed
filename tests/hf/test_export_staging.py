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


def _model_folder(tmp_path: Path) -> Path:
    """A saved model with its tokenizer: what `cem export` exports."""
    from cem.data import get_tokenizer
    from cem.model import save_pretrained

    folder = tmp_path / "model"
    save_pretrained(LanguageModel(model_config("tiny", "llama", vocab_size=257, dim=8, n_heads=2, hidden_dim=16, n_layers=1, context=8)), folder)
    get_tokenizer("byte").save(folder / "tokenizer")
    return folder


def killed_while_moving(model: Path, out: Path) -> None:
    """`cem export MODEL OUT` killed with SIGKILL right after its first file is renamed into OUT (a forked child)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            import cem.io

            real = os.replace

            def replace(src, dst):
                real(src, dst)
                if Path(dst).parent == out and Path(dst).name != cem.io.MOVING:
                    os.kill(os.getpid(), signal.SIGKILL)

            cem.io.os.replace = replace
            from cem.cli import main

            main(["export", str(model), str(out)])
        finally:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == signal.SIGKILL


def test_an_export_killed_while_moving_its_files_in_is_completed_by_the_rerun(tmp_path, capsys):
    """Issue 63: kill -9 during the renames left OUT holding only generation_config.json beside its staging folder,
    and the same export was then refused ("holds other files and no earlier export"), the staging folder never cleaned."""
    from cem.cli import main

    model, out = _model_folder(tmp_path), tmp_path / "out"
    killed_while_moving(model, out)
    assert not (out / "config.json").exists() and [p.name for p in out.iterdir() if p.name != ".moving-in"]
    staging = [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert staging
    assert main(["export", str(model), str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds part of an export killed while moving its files in" in err and str(staging[0]) in err
    assert not any(p.exists() for p in staging) and not (out / ".moving-in").exists()
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert main(["export", str(model), str(tmp_path / "other")]) == 0  # an export runs whole: the note goes once it is in
    other = tmp_path / "other"
    assert sorted(p.name for p in other.iterdir()) == sorted(p.name for p in out.iterdir())


def test_a_folder_of_other_files_is_still_refused(tmp_path, capsys):
    from cem.cli import main

    model, out = _model_folder(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / ".moving-in").write_text(".out.abcdefgh\n")  # a note naming no abandoned staging folder of out's
    assert main(["export", str(model), str(out)]) == 2
    assert "holds other files and no earlier export" in capsys.readouterr().err


def test_an_export_to_a_folder_of_the_longest_name_is_staged_beside_it(tmp_path):
    """Issue 63: a valid 250-byte folder name failed on its staging folder's name (ten bytes longer)."""
    out = tmp_path / ("é" * 100 + "x" * 50)  # 250 bytes in UTF-8
    model = LanguageModel(model_config("tiny", "llama", vocab_size=16, dim=8, n_heads=2, hidden_dim=16, n_layers=1, context=8))
    stale = killed_staging(out)
    assert len(stale.name.encode()) <= 255
    ch.export_hf(model, out, format="llama")
    assert (out / "config.json").is_file() and not stale.exists()
